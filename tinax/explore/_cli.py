"""``python -m tinax.explore``: the tables in a terminal, or as JSON for scripts."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np
import pandas as pd

from tinax import _paths
from tinax._format import layout, words
from tinax.explore._checkpoint import checkpoint_table, read_leaf
from tinax.explore._diff import diff_table
from tinax.explore._listing import list_checkpoints
from tinax.explore._summary import leaf_summary
from tinax.explore._verify import verify

_PROG = "python -m tinax.explore"
_MAX_COLUMN_WIDTH = 60
# The first argument names a command only when more follow: a directory called
# "diff" or "verify" is still shown with ``python -m tinax.explore diff``.
_COMMANDS = ("diff", "verify")
# Columns of the diff printed as text; --json has all of them.
_DIFF_TEXT_COLUMNS = (
    "checkpointable",
    "key",
    "status",
    "shape_a",
    "dtype_a",
    "rel_change",
    "max_abs_diff",
    "cosine",
    "nan_a",
    "nan_b",
    "inf_a",
    "inf_b",
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description=(
            "Show a run directory's checkpoints, a checkpoint's leaves, or one leaf. "
            "Reads metadata only, except for the one leaf asked for. Other commands: "
            f"'{_PROG} diff A B' compares two checkpoints, '{_PROG} verify PATH' "
            "checks one."
        ),
    )
    parser.add_argument("path", help="a run directory or a checkpoint directory")
    parser.add_argument(
        "--leaf",
        nargs=2,
        metavar=("CHECKPOINTABLE", "KEY"),
        help="summarise one leaf, e.g. --leaf model \"['dense']['w']\"",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
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
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
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
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    return parser


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data: tuples as lists, missing as null, times as ISO 8601,
    durations as seconds.

    Non-finite floats become the strings ``"nan"``, ``"inf"`` and ``"-inf"``.
    """
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    if isinstance(value, pd.Timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    return str(value)


def _records(table: pd.DataFrame) -> list[dict[str, Any]]:
    columns = list(table.columns)
    return [
        {column: jsonable(cell) for column, cell in zip(columns, row, strict=True)}
        for row in table.itertuples(index=False, name=None)
    ]


def _print_table(table: pd.DataFrame, out: TextIO) -> None:
    if table.empty:
        print("(no rows)", file=out)
    else:
        print(table.to_string(index=False, max_colwidth=_MAX_COLUMN_WIDTH), file=out)


def _show_listing(path: str, as_json: bool, out: TextIO, err: TextIO) -> None:
    table = list_checkpoints(path)
    errors: dict[str, str] = table.attrs.get("errors", {})
    if as_json:
        records = _records(table)
        for record in records:
            record["error"] = errors.get(record["path"])
        json.dump(records, out)
        print(file=out)
        return
    _print_table(table, out)
    for where, problem in errors.items():
        print(f"invalid: {where}: {problem}", file=err)


def _show_leaf(path: str, checkpointable: str, key: str, as_json: bool, out: TextIO) -> None:
    value = read_leaf(path, checkpointable, key)
    summary = leaf_summary(value)
    is_array = isinstance(value, np.ndarray)
    if as_json:
        record: dict[str, Any] = {"checkpointable": checkpointable, "key": key, **summary}
        if not is_array:
            record["value"] = value
        json.dump(jsonable(record), out, indent=1)
        print(file=out)
        return
    print(f"checkpointable: {checkpointable!r}", file=out)
    print(f"key: {key}", file=out)
    for field, item in summary.items():
        if item is not None:
            print(f"{field}: {item}", file=out)
    if not is_array:
        print(f"value: {value!r}", file=out)


def _diff(argv: Sequence[str], out: TextIO) -> int:
    args = _diff_parser().parse_args(argv)
    table = diff_table(args.a, args.b, sort=not args.stored_order)
    if args.changed:
        table = table[table["status"] != words.SAME].reset_index(drop=True)
    if args.json:
        # Statistics that do not apply (or are undefined, as a zero vector's cosine) are null.
        json.dump(_records(table.astype(object).where(table.notna(), None)), out)
        print(file=out)
        return 0
    counts = table["status"].value_counts()
    _print_table(table[list(_DIFF_TEXT_COLUMNS)], out)
    print(", ".join(f"{n} {status}" for status, n in counts.items()), file=out)
    return 0


def _verify(argv: Sequence[str], out: TextIO, err: TextIO) -> int:
    args = _verify_parser().parse_args(argv)
    tty = getattr(err, "isatty", lambda: False)()

    def progress(done: int, total: int) -> None:
        if total:
            print(f"\rreading data: {100 * done / total:5.1f}%", end="", file=err, flush=True)

    result = verify(args.path, data=args.data, progress=progress if tty and args.data else None)
    if tty and args.data:
        print(file=err)
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
    if not args.quiet and len(result.findings):
        _print_table(result.findings, out)
    print(str(result), file=out)
    return 1 if failed else 0


def main(
    argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Runs the command line; returns the exit status.

    ``diff A B`` and ``verify PATH`` are commands; anything else shows a run, a
    checkpoint or a leaf. The status is 1 for an unreadable path, and for
    ``verify`` also for a checkpoint that is not sound.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) > 1 and argv[0] in _COMMANDS:
        try:
            if argv[0] == "diff":
                return _diff(argv[1:], out)
            return _verify(argv[1:], out, err)
        except (OSError, ValueError, TypeError) as e:
            print(f"{_PROG} {argv[0]}: error: {e}", file=err)
            return 1
    args = _parser().parse_args(argv)
    try:
        if args.leaf:
            _show_leaf(args.path, args.leaf[0], args.leaf[1], args.json, out)
        elif layout.looks_like_checkpoint(_paths.existing_directory(args.path)):
            table = checkpoint_table(args.path)
            if args.json:
                json.dump(_records(table), out)
                print(file=out)
            else:
                _print_table(table, out)
                without = sorted(n for n, has in table.attrs["checksums"].items() if not has)
                if without:
                    print(
                        f"checksums: none recorded for {', '.join(map(repr, without))} "
                        "(written without tinax checksums; data cannot be checked)",
                        file=out,
                    )
        else:
            _show_listing(args.path, args.json, out, err)
    except (OSError, ValueError, TypeError) as e:
        print(f"{_PROG}: error: {e}", file=err)
        return 1
    return 0
