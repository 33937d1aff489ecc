"""``tinax derive`` and ``tinax average``: new checkpoints made from old ones, and the
line ``tinax show`` gives a checkpoint's lineage."""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Sequence
from typing import Any, TextIO

import pandas as pd

from tinax._cli import terminal as term
from tinax._cli.args import _CHECKPOINT, _add_cast, _add_output, _command
from tinax._cli.output import _dump, _progress, _records, _say
from tinax._format.metadata.layout import Checkpoint
from tinax.explore._checkpoint import checkpoint_table
from tinax.explore._lineage import lineage, lineage_summary


def _derive_parser(prog: str) -> argparse.ArgumentParser:
    destination = "the new checkpoint's directory (must not exist)"
    parser = _command(prog, "derive", source=_CHECKPOINT, destination=destination)
    _add_selection(parser, "(blocks.0.up.kernel) this regular expression finds")
    _add_cast(parser, "--cast", "store floating-point arrays as DTYPE")
    rename = """rewrite dotted keys: a regular expression, =, its replacement (\\1 for a
        group; split at the last =)"""
    parser.add_argument(
        "--rename", nargs="+", metavar="PATTERN=REPLACEMENT", help=" ".join(rename.split())
    )
    _add_output(parser, csv_too=False)
    return parser


def _average_parser(prog: str) -> argparse.ArgumentParser:
    parser = _command(prog, "average")
    parser.add_argument("sources", nargs="+", help="two or more checkpoint directories")
    out = "the new checkpoint's directory"
    parser.add_argument("--out", required=True, metavar="DST", help=out)
    weights = "one non-negative weight per source (normalised); equal by default"
    parser.add_argument("--weights", nargs="+", type=float, metavar="W", help=weights)
    left_out = """this regular expression finds (an RNG counter that differs between
        steps can be left out so)"""
    _add_selection(parser, " ".join(left_out.split()))
    _add_output(parser, csv_too=False)
    return parser


def _add_selection(parser: argparse.ArgumentParser, keys: str) -> None:
    """``--only NAME…`` and ``--keys REGEX``: what of the sources the new checkpoint
    holds (``keys`` ends the help of ``--keys``)."""
    parser.add_argument(
        "--only", nargs="+", metavar="NAME", help="only these checkpointables (e.g. model)"
    )
    parser.add_argument("--keys", metavar="REGEX", help=f"only leaves whose dotted key {keys}")
    diverged = """make it from a source that diverged (NaN or Inf in its state, or a NaN
        logged metric), which is refused otherwise"""
    parser.add_argument("--allow-diverged", action="store_true", help=" ".join(diverged.split()))


def run(command: str, argv: Sequence[str], out: TextIO, err: TextIO, prog: str) -> int:
    """Runs ``derive`` or ``average``; returns the exit status (errors are raised)."""
    # tinax.checkpointing brings JAX and Orbax: imported only by these two commands.
    from tinax.checkpointing import average_checkpoints, derive_checkpoint

    start = time.perf_counter()
    if command == "derive":
        args = _derive_parser(prog).parse_args(argv)
        destination, doing = args.destination, "deriving"
        work = functools.partial(
            derive_checkpoint,
            args.source,
            destination,
            cast=args.cast,
            rename=args.rename,
            allow_diverged=args.allow_diverged,
        )
    else:
        args = _average_parser(prog).parse_args(argv)
        destination, doing = args.out, "averaging"
        work = functools.partial(
            average_checkpoints,
            args.sources,
            destination,
            weights=args.weights,
            allow_diverged=args.allow_diverged,
        )
    term.set_wide(args.wide)
    with _progress(err, doing) as progress:
        work(checkpointables=args.only, keys=args.keys, progress=progress)
    _report(destination, time.perf_counter() - start, args.json, out)
    return 0


def _report(destination: str, seconds: float, as_json: bool, out: TextIO) -> None:
    table = checkpoint_table(destination)
    made = lineage(destination)
    nbytes = int(pd.to_numeric(table["nbytes"], errors="coerce").fillna(0).sum())
    if as_json:
        record: dict[str, Any] = {
            "checkpoint": destination,
            "operation": made.attrs.get("operation"),
            "arguments": made.attrs.get("arguments"),
            "sources": _records(made.drop(columns=["arguments", "operation"])),
            "checkpointables": list(dict.fromkeys(str(n) for n in table["checkpointable"])),
            "leaves": len(table),
            "nbytes": nbytes,
            "seconds": round(seconds, 3),
        }
        _dump(record, out)
        return
    total = term.width()
    count = table["checkpointable"].nunique()
    _say(
        f"{destination}: {len(table):,} leaves in {count} checkpointable"
        f"{'s' if count != 1 else ''}, {term.human_bytes(nbytes)}, written in {seconds:.1f} s",
        out,
        total,
    )
    _say(lineage_summary(made, full_paths=True), out, total)


def lineage_line(path: str | Checkpoint) -> str:
    """What ``tinax show`` says of a checkpoint's lineage (``""`` for none)."""
    return lineage_summary(lineage(path), full_paths=True)
