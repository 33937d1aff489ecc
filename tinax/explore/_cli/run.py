"""``tinax run``: the run at a glance, with how far its layers moved and where NaN began."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TextIO

import pandas as pd

from tinax.explore._cli import terminal as term
from tinax.explore._cli.args import _run_parser
from tinax.explore._cli.output import _csv, _dump, _progress, _records, _say, _seconds
from tinax.explore._cli.terminal import Column
from tinax.explore._run_view.drift import drift_table
from tinax.explore._run_view.scan import scan_run
from tinax.explore._run_view.table import run_table


def _run_columns(table: pd.DataFrame) -> list[Column]:
    """The run table's columns: the known ones, then its metrics as numbers."""
    known = {
        "name": Column("name", "name", priority=0),
        "step": Column("step", "step", term.number, priority=1, right=True),
        "status": Column("status", "status", priority=0),
        "nbytes": Column("nbytes", "size", term.human_bytes, priority=3, right=True),
        "committed": Column("committed", "committed", term.human_age, priority=6),
        "kept": Column("kept", "kept", priority=2),
        "save_blocked_s": Column("save_blocked_s", "blocked", _seconds, priority=5, right=True),
        "save_total_s": Column("save_total_s", "save", _seconds, priority=4, right=True),
        "tier": Column("tier", "tier", priority=2),
        "promotion": Column("promotion", "promotion", priority=3),
    }
    skipped = {"path", "age", "checkpointables"}
    columns = []
    for name in table.columns:
        if name in known:
            columns.append(known[name])
        elif name not in skipped and pd.api.types.is_numeric_dtype(table[name].dtype):
            columns.append(Column(name, name, term.number, priority=2, right=True))
    return columns


def _run(argv: Sequence[str], out: TextIO, err: TextIO, prog: str) -> int:
    args = _run_parser(prog).parse_args(argv)
    if args.csv and args.drift and args.scan:
        raise ValueError("--csv prints one table: give --drift or --scan, not both")
    table = run_table(args.root)
    with _progress(err, "drift", unit="pairs") as progress:
        drift = drift_table(args.root, progress=progress) if args.drift else None
    with _progress(err, "scan", unit="checkpoints") as progress:
        scan = scan_run(args.root, progress=progress) if args.scan else None
    if args.json:
        record: dict[str, Any] = {"root": args.root, "checkpoints": _records(table)}
        if drift is not None:
            record["drift"] = _records(drift)
        if scan is not None:
            record["scan"] = _records(scan)
            record["first_nonfinite_step"] = scan.attrs.get("first_nonfinite_step")
            record["rollback_step"] = scan.attrs.get("rollback_step")
        _dump(record, out)
        return 0
    if args.csv:
        _csv(drift if drift is not None else scan if scan is not None else table, out)
        return 0
    total = term.width()
    term.render(table, _run_columns(table), out, total)
    errors: dict[str, str] = table.attrs.get("errors", {})
    for where, problem in errors.items():
        print(f"unreadable: {where}: {problem}", file=err)
    if drift is not None:
        print(file=out)
        _show_drift(drift, out, total, args.top)
    if scan is not None:
        print(file=out)
        _show_scan(scan, out, total)
    return 0


def _show_drift(drift: pd.DataFrame, out: TextIO, total: int, top: int) -> None:
    """The pairs' subtrees that moved most first, under a line naming the largest."""
    if drift.empty:
        _say("drift: fewer than two complete checkpoints to compare", out, total)
        return
    ranked = drift.sort_values(
        ["rel_update", "step"], ascending=[False, True], na_position="last", kind="stable"
    ).reset_index(drop=True)
    first = ranked.iloc[0]
    if not term.is_missing(first["rel_update"]):
        _say(
            f"drift: {first['subtree']} moved most, by {term.number(first['rel_update'])} of "
            f"its norm, from step {first['previous_step']} to {first['step']}",
            out,
            total,
        )
    columns = (
        Column("subtree", "subtree", priority=0),
        Column("previous_step", "from", term.number, priority=2, right=True),
        Column("step", "step", term.number, priority=0, right=True),
        Column("rel_update", "rel_update", term.number, priority=0, right=True),
        Column("cosine", "cosine", term.number, priority=3, right=True),
        Column("max_abs_diff", "max_abs_diff", term.number, priority=4, right=True),
        Column("nan", "nan", term.number, priority=5, right=True),
        Column("inf", "inf", term.number, priority=6, right=True),
    )
    shown = ranked if top <= 0 else ranked.head(top)
    term.render(shown, columns, out, total)
    if len(shown) < len(ranked):
        _say(f"… {len(ranked) - len(shown)} more (--top 0 shows all, --csv prints all)", out, total)


def _show_scan(scan: pd.DataFrame, out: TextIO, total: int) -> None:
    columns = (
        Column("name", "name", priority=0),
        Column("step", "step", term.number, priority=3, right=True),
        Column("verdict", "verdict", priority=0),
        Column("nan", "nan", term.number, priority=1, right=True),
        Column("inf", "inf", term.number, priority=1, right=True),
        Column("nonfinite_leaves", "leaves", term.number, priority=2, right=True),
    )
    term.render(scan, columns, out, total)
    first = scan.attrs.get("first_nonfinite_step")
    back = scan.attrs.get("rollback_step")
    if first is None:
        _say("scan: no NaN or Inf in any checkpoint", out, total)
    elif back is None:
        _say(f"scan: NaN/Inf from step {first} on; no sound checkpoint before it", out, total)
    else:
        _say(f"scan: NaN/Inf from step {first} on; roll back to step {back}", out, total)
    for where, problem in scan.attrs.get("problems", {}).items():
        _say(f"not sound: {where}: {problem}", out, total)
