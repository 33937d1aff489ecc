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
from tinax._format import layout
from tinax.explore._checkpoint import checkpoint_table, read_leaf
from tinax.explore._listing import list_checkpoints
from tinax.explore._summary import leaf_summary

_PROG = "python -m tinax.explore"
_MAX_COLUMN_WIDTH = 60


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description=(
            "Show a run directory's checkpoints, a checkpoint's leaves, or one leaf. "
            "Reads metadata only, except for the one leaf asked for."
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


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data: tuples as lists, missing as null, times as ISO 8601.

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


def main(
    argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Runs the command line; returns the exit status (1 for an unreadable path)."""
    out = out or sys.stdout
    err = err or sys.stderr
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
        else:
            _show_listing(args.path, args.json, out, err)
    except (FileNotFoundError, ValueError, TypeError) as e:
        print(f"{_PROG}: error: {e}", file=err)
        return 1
    return 0
