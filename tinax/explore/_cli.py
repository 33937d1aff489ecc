"""``python -m tinax.explore``: the tables in a terminal, or as JSON or CSV for scripts.

Text output fits the terminal's width (``COLUMNS``, else the terminal's, else 80
characters): sizes in KiB/MiB, times as ages, floats to four significant digits,
secondary columns dropped and long keys shortened in the middle when the line would
be wider. ``--json`` and ``--csv`` print every column at full precision under the
tables' own column names.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pandas as pd

from tinax import _paths
from tinax._format import layout, words
from tinax.explore import _terminal as term
from tinax.explore._checkpoint import checkpoint_table, read_leaf
from tinax.explore._diff import diff_table
from tinax.explore._export import CAST_DTYPES, export_safetensors
from tinax.explore._listing import list_checkpoints
from tinax.explore._summary import leaf_summary
from tinax.explore._terminal import Column, jsonable
from tinax.explore._verify import verify

__all__ = ["jsonable", "main"]

_PROG = "python -m tinax.explore"
# The first argument names a command only when more follow: a directory called
# "diff" or "verify" is still shown with ``python -m tinax.explore diff``.
_COMMANDS = ("diff", "verify", "export")

_LISTING = (
    Column("name", "name", priority=0, flexible=True),
    Column("step", "step", term.number, priority=1, right=True),
    Column("status", "status", priority=0),
    Column("nbytes", "size", term.human_bytes, priority=2, right=True),
    Column("committed", "committed", term.human_age, priority=3),
    Column("checkpointables", "checkpointables", priority=4),
    Column("path", "path", priority=9),
)
_LEAVES = (
    Column("key", "key", term.key, priority=0, flexible=True),
    Column("kind", "kind", priority=6),
    Column("shape", "shape", term.shape, priority=1),
    Column("dtype", "dtype", priority=1),
    Column("nbytes", "size", term.human_bytes, priority=2, right=True),
    Column("value", "value", priority=4),
    Column("chunk_shape", "chunks", term.shape, priority=7),
    Column("sharding", "sharding", priority=8),
)
_DIFF = (
    Column("checkpointable", "checkpointable", priority=3),
    Column("key", "key", term.key, priority=0, flexible=True),
    Column("status", "status", priority=0),
    Column("shape_a", "shape_a", term.shape, priority=4),
    Column("dtype_a", "dtype_a", priority=5),
    Column("rel_change", "rel_change", term.number, priority=1, right=True),
    Column("max_abs_diff", "max_abs_diff", term.number, priority=6, right=True),
    Column("cosine", "cosine", term.number, priority=7, right=True),
    Column("nan_a", "nan_a", term.number, priority=8, right=True),
    Column("nan_b", "nan_b", term.number, priority=8, right=True),
    Column("inf_a", "inf_a", term.number, priority=9, right=True),
    Column("inf_b", "inf_b", term.number, priority=9, right=True),
)
_FINDINGS = (
    Column("severity", "severity", priority=0),
    Column("part", "part", priority=1),
    Column("message", "message", priority=0, flexible=True, wrap=True),
)
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def _add_output(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true", help="print JSON instead of text")
    group.add_argument("--csv", action="store_true", help="print CSV instead of text")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description=(
            "Show a run directory's checkpoints, a checkpoint's leaves, or one leaf. "
            "Reads metadata only, except for the one leaf asked for. Other commands: "
            f"'{_PROG} diff A B' compares two checkpoints, '{_PROG} verify PATH' "
            f"checks one, '{_PROG} export CKPT OUT' writes safetensors."
        ),
    )
    parser.add_argument("path", help="a run directory or a checkpoint directory")
    parser.add_argument(
        "--leaf",
        nargs=2,
        metavar=("CHECKPOINTABLE", "KEY"),
        help="summarise one leaf, e.g. --leaf model \"['dense']['w']\"",
    )
    _add_output(parser)
    return parser


def _diff_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{_PROG} diff",
        description=(
            "Compare two checkpoints leaf by leaf, largest relative change first. "
            "Arrays are read region by region in bounded memory."
        ),
    )
    parser.add_argument("a", help="the checkpoint compared from")
    parser.add_argument("b", help="the checkpoint compared to")
    parser.add_argument(
        "--stored-order", action="store_true", help="keep the stored order of leaves"
    )
    parser.add_argument(
        "--changed", action="store_true", help="show only leaves that are not the same"
    )
    _add_output(parser)
    return parser


def _verify_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{_PROG} verify",
        description=(
            "Check that a checkpoint is whole and loadable. Exits 0 when it is sound, "
            "1 when it is not (or cannot be checked)."
        ),
    )
    parser.add_argument("path", help="a checkpoint directory")
    parser.add_argument(
        "--data", action="store_true", help="also read every chunk and count NaN/Inf values"
    )
    parser.add_argument(
        "--strict", action="store_true", help="warnings (NaN/Inf values among them) fail too"
    )
    parser.add_argument("--quiet", action="store_true", help="print the verdict only")
    _add_output(parser)
    return parser


def parse_size(text: str) -> int:
    """``5GB`` (10⁹ bytes, as the Hugging Face hub counts), ``512MiB``, ``1000000``.

    Raises:
      argparse.ArgumentTypeError: If ``text`` is not a positive size.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size such as 5GB, 500MB or 2GiB (a number of bytes and a unit)"
        )
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive size")
    return size


def _export_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{_PROG} export",
        description=(
            "Write a checkpointable's arrays as .safetensors files, streamed from the "
            "checkpoint with its checksums checked. Over --max-file-size, several files "
            "and the Hugging Face hub's model.safetensors.index.json."
        ),
    )
    parser.add_argument("checkpoint", help="a checkpoint directory (local or gs://)")
    parser.add_argument("out", help="a new directory for the files")
    parser.add_argument("--checkpointable", default="model", help="what to export (model)")
    parser.add_argument(
        "--keys",
        nargs="+",
        metavar="KEY",
        help="only leaves whose key or tensor name contains one of these",
    )
    parser.add_argument(
        "--dtype",
        choices=CAST_DTYPES,
        metavar="DTYPE",
        help=f"cast floating-point arrays to DTYPE ({', '.join(CAST_DTYPES)})",
    )
    parser.add_argument(
        "--max-file-size", type=parse_size, metavar="SIZE", help="e.g. 5GB: split the files"
    )
    parser.add_argument(
        "--verify", action="store_true", help="read the written files back and compare"
    )
    return parser


def _records(table: pd.DataFrame) -> list[dict[str, Any]]:
    columns = list(table.columns)
    return [
        {column: jsonable(cell) for column, cell in zip(columns, row, strict=True)}
        for row in table.itertuples(index=False, name=None)
    ]


def _machine(table: pd.DataFrame, as_json: bool, out: TextIO) -> None:
    """``table`` as JSON records or as CSV with the table's own column names."""
    if as_json:
        json.dump(_records(table), out)
        print(file=out)
        return
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(list(table.columns))
    for row in table.itertuples(index=False, name=None):
        writer.writerow([term.csv_cell(cell) for cell in row])


def _show_listing(path: str, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    table = list_checkpoints(path)
    errors: dict[str, str] = table.attrs.get("errors", {})
    if args.json:
        records = _records(table)
        for record in records:
            record["error"] = errors.get(record["path"])
        json.dump(records, out)
        print(file=out)
        return
    if args.csv:
        _machine(table.assign(error=[errors.get(p) for p in table["path"]]), False, out)
        return
    term.render(table, _LISTING, out, term.width())
    for where, problem in errors.items():
        print(f"invalid: {where}: {problem}", file=err)


def _show_checkpoint(path: str, args: argparse.Namespace, out: TextIO) -> None:
    table = checkpoint_table(path)
    if args.json or args.csv:
        _machine(table, args.json, out)
        return
    total = term.width()
    # One block per checkpointable: its name once, and the width for the keys.
    for name, rows in table.groupby("checkpointable", sort=False):
        nbytes = term.human_bytes(rows["nbytes"].sum()) if rows["nbytes"].notna().any() else ""
        count = f"{len(rows)} lea{'f' if len(rows) == 1 else 'ves'}"
        title = f"{name or '(unnamed)'}: {count}" + (f", {nbytes}" if nbytes else "")
        print(term.shorten_middle(title, total), file=out)
        term.render(rows.reset_index(drop=True), _LEAVES, out, total)
        print(file=out)
    without = sorted(n for n, has in table.attrs["checksums"].items() if not has)
    if without:
        note = (
            f"checksums: none recorded for {', '.join(map(repr, without))} (written "
            "without tinax checksums; data cannot be checked)"
        )
        for line in _wrap(note, total):
            print(line, file=out)


def _wrap(text: str, total: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, total, break_on_hyphens=False) or [""]


def _show_leaf(
    path: str, checkpointable: str, key: str, args: argparse.Namespace, out: TextIO
) -> None:
    value = read_leaf(path, checkpointable, key)
    summary = leaf_summary(value)
    is_array = isinstance(value, np.ndarray)
    if args.json or args.csv:
        record: dict[str, Any] = {"checkpointable": checkpointable, "key": key, **summary}
        if not is_array:
            record["value"] = value
        if args.json:
            json.dump(jsonable(record), out, indent=1)
            print(file=out)
        else:
            _machine(pd.DataFrame([record]), False, out)
        return
    total = term.width()
    fields: list[tuple[str, str]] = [("checkpointable", checkpointable), ("key", key)]
    for field, item in summary.items():
        if term.is_missing(item):
            continue
        shown = term.shape(item) if field == "shape" else term.text(item)
        # "size" means bytes in every view; a summary's size counts elements.
        fields.append(("elements" if field == "size" else field, shown))
    if not is_array:
        # Numbers to four significant digits, like the tables (--json has them whole).
        plain = isinstance(value, int | float | np.number) and not isinstance(value, bool)
        fields.append(("value", term.number(value) if plain else repr(value)))
    for field, shown in fields:
        print(term.shorten_middle(f"{field}: {shown}", total), file=out)


def _diff(argv: Sequence[str], out: TextIO) -> int:
    args = _diff_parser().parse_args(argv)
    table = diff_table(args.a, args.b, sort=not args.stored_order)
    if args.changed:
        table = table[table["status"] != words.SAME].reset_index(drop=True)
    if args.json or args.csv:
        # Statistics that do not apply (or are undefined, as a zero vector's cosine) are null.
        _machine(table.astype(object).where(table.notna(), None), args.json, out)
        return 0
    total = term.width()
    term.render(table, _DIFF, out, total)
    counts = table["status"].value_counts()
    for line in _wrap(", ".join(f"{n} {status}" for status, n in counts.items()), total):
        print(line, file=out)
    return 0


@contextlib.contextmanager
def _progress(err: TextIO, description: str) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on ``err`` when it is a terminal (rich's), else nothing."""
    if not getattr(err, "isatty", lambda: False)():
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(file=err, width=term.width()),
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total or None)

        yield update


def _verify(argv: Sequence[str], out: TextIO, err: TextIO) -> int:
    args = _verify_parser().parse_args(argv)
    with _progress(err, "reading data") as progress:
        result = verify(args.path, data=args.data, progress=progress if args.data else None)
    failed = not result.ok or (args.strict and (result.findings["severity"] == words.WARNING).any())
    if args.json:
        record = {
            "path": result.path,
            "ok": result.ok,
            "verdict": result.verdict,
            "data": result.data,
            "findings": _records(result.findings),
            "leaves": _records(result.leaves),
        }
        json.dump(record, out)
        print(file=out)
        return 1 if failed else 0
    if args.csv:
        _machine(result.findings, False, out)
        return 1 if failed else 0
    total = term.width()
    if not args.quiet and len(result.findings):
        term.render(result.findings, _FINDINGS, out, total)
    for line in _wrap(str(result), total):
        print(line, file=out)
    return 1 if failed else 0


def _export(argv: Sequence[str], out: TextIO, err: TextIO) -> int:
    args = _export_parser().parse_args(argv)
    with _progress(err, "exporting") as progress:
        files = export_safetensors(
            args.checkpoint,
            args.out,
            checkpointable=args.checkpointable,
            keys=args.keys,
            dtype=args.dtype,
            max_file_bytes=args.max_file_size,
            verify=args.verify,
            progress=progress,
        )
    total = term.width()
    sizes = [Path(f).stat().st_size for f in files]
    title = f"{len(files)} file{'s' if len(files) > 1 else ''}, {term.human_bytes(sum(sizes))}"
    print(term.shorten_middle(f"{files[0].parent}: {title}", total), file=out)
    rows = pd.DataFrame({"file": [f.name for f in files], "nbytes": sizes})
    columns = (
        Column("file", "file", priority=0, flexible=True),
        Column("nbytes", "size", term.human_bytes, priority=1, right=True),
    )
    term.render(rows, columns, out, total)
    return 0


def main(
    argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Runs the command line; returns the exit status.

    ``diff A B``, ``verify PATH`` and ``export CKPT OUT`` are commands; anything
    else shows a run, a checkpoint or a leaf. The status is 1 for an unreadable
    path, and for ``verify`` also for a checkpoint that is not sound.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) > 1 and argv[0] in _COMMANDS:
        try:
            if argv[0] == "diff":
                return _diff(argv[1:], out)
            if argv[0] == "export":
                return _export(argv[1:], out, err)
            return _verify(argv[1:], out, err)
        except BrokenPipeError:
            raise
        except (OSError, ValueError, TypeError) as e:
            print(f"{_PROG} {argv[0]}: error: {e}", file=err)
            return 1
    args = _parser().parse_args(argv)
    try:
        if args.leaf:
            _show_leaf(args.path, args.leaf[0], args.leaf[1], args, out)
        elif layout.looks_like_checkpoint(_paths.existing_directory(args.path)):
            _show_checkpoint(args.path, args, out)
        else:
            _show_listing(args.path, args, out, err)
    except BrokenPipeError:
        raise
    except (OSError, ValueError, TypeError) as e:
        print(f"{_PROG}: error: {e}", file=err)
        return 1
    return 0
