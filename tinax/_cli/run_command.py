"""``tinax run``: the run at a glance, with how far its layers moved and where NaN began."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any, TextIO

import pandas as pd

from tinax._cli import terminal as term
from tinax._cli import verdicts
from tinax._cli.output import _csv, _dump, _progress, _records, _say, _seconds
from tinax._cli.terminal import Column, jsonable
from tinax._format.integrity.health import overall
from tinax.explore import display
from tinax.explore._run_view.drift import drift_table
from tinax.explore._run_view.run_table import run_table
from tinax.explore._run_view.scan import scan_run


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
        "health": Column("health", "health", priority=1),
        "promotion": Column("promotion", "promotion", priority=3),
    }
    columns = []
    for name in table.columns:
        if name in known:
            columns.append(known[name])
        elif name in table.attrs.get("metrics", ()):
            columns.append(Column(name, name, term.measured, priority=2, right=True))
    return columns


def _as_logged(table: pd.DataFrame) -> pd.DataFrame:
    """The run table with what was not recorded as ``None`` and what was logged as NaN
    kept NaN (``nonfinite_metrics`` says which is which), so that text shows ``nan``
    apart from a blank and JSON a null apart from a NaN."""
    named = [
        set() if pd.isna(found) else {n.strip() for n in str(found).split(",")}
        for found in table.get("nonfinite_metrics", pd.Series([None] * len(table)))
    ]
    shown = table.copy()
    for column in table.columns:
        if not pd.api.types.is_float_dtype(table[column].dtype):
            continue
        values = table[column].astype(object).tolist()
        shown[column] = pd.Series(
            [
                None if isinstance(v, float) and math.isnan(v) and column not in named[i] else v
                for i, v in enumerate(values)
            ],
            index=table.index,
            dtype=object,
        )
    return shown


def run_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``tinax run ROOT``: the run at a glance (with ``--drift``, ``--scan``)."""
    if args.csv and args.drift and args.scan:
        raise ValueError("--csv prints one table: give --drift or --scan, not both")
    found = run_table(args.root)
    table = _as_logged(found)
    table.attrs = found.attrs
    with _progress(err, "drift", unit="pairs") as progress:
        drift = drift_table(args.root, depth=args.depth, progress=progress) if args.drift else None
    with _progress(err, "scan", unit="checkpoints") as progress:
        scan = scan_run(args.root, progress=progress) if args.scan else None
    if args.json:
        record: dict[str, Any] = {"root": args.root, "checkpoints": _records(table)}
        if drift is not None:
            record["drift"] = _records(drift)
            # The leaves not compared, with why: never silently left out.
            record["drift_unreadable"] = jsonable(drift.attrs.get("unreadable") or [])
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
    for line in verdicts.health_notes(table):
        _say(line, out, total)
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
    """The subtrees that moved most first, under a line naming the largest; then the
    pairs that hold NaN or Inf, one line each; then the leaves that could not be
    compared. Nothing is left out silently."""
    if drift.empty:
        _say("drift: fewer than two complete checkpoints to compare", out, total)
        return
    nonfinite = (drift["nan"].fillna(0) > 0) | (drift["inf"].fillna(0) > 0)
    finite = drift[~nonfinite]
    ranked = finite.sort_values(
        ["rel_update", "step"], ascending=[False, True], na_position="last", kind="stable"
    ).reset_index(drop=True)
    if len(ranked) and not term.is_missing(ranked.iloc[0]["rel_update"]):
        first = ranked.iloc[0]
        _say(
            f"drift: {first['subtree']} moved most, by {term.number(first['rel_update'])} of "
            f"its norm, from step {first['previous_step']} to {first['step']}",
            out,
            total,
        )
    if len(ranked):
        # NaN and Inf are in rows of their own below: these rows have none.
        columns = (
            Column("subtree", "subtree", priority=0),
            Column("previous_step", "from", term.number, priority=2, right=True),
            Column("step", "step", term.number, priority=0, right=True),
            Column("rel_update", "rel_update", term.number, priority=0, right=True),
            Column("cosine", "cosine", term.number, priority=3, right=True),
            Column("max_abs_diff", "max_abs_diff", term.number, priority=4, right=True),
            Column("unreadable", "unreadable", term.count_if_any, priority=5, right=True),
        )
        _render_top(ranked, columns, out, total, top, "more (--top 0 shows all, --csv prints all)")
    if nonfinite.any():
        checkpointable = str(drift.attrs.get("checkpointable") or "model")
        _show_nonfinite_pairs(drift[nonfinite], out, total, top, checkpointable)
    unreadable = drift.attrs.get("unreadable") or []
    if unreadable:
        print(file=out)
        _say(
            f"not compared: {len(unreadable)} lea{'f' if len(unreadable) == 1 else 'ves'} "
            "(damaged on a side, or not the same leaf on both):",
            out,
            total,
        )
        for row in unreadable[: top if top > 0 else len(unreadable)]:
            _say(
                f"  step {row['previous_step']} → {row['step']}: {row['checkpointable']} "
                f"{display.readable_key(str(row['key']))}: {row['status']}",
                out,
                total,
            )


def _show_nonfinite_pairs(
    rows: pd.DataFrame, out: TextIO, total: int, top: int, checkpointable: str
) -> None:
    """The pairs holding NaN or Inf: one line each, with how many subtrees, and the
    NaN and Inf of the later checkpoint's ``checkpointable`` (what a scan of that
    checkpoint counts there: each leaf once)."""
    pairs = (
        rows.groupby(["previous_step", "step"], sort=True)
        .agg(subtrees=("subtree", "size"), nan=("nan_b", "sum"), inf=("inf_b", "sum"))
        .reset_index()
    )
    where = pairs.iloc[0]
    print(file=out)
    _say(
        f"non-finite: {len(pairs)} pair{'s' * (len(pairs) != 1)} hold NaN or Inf, the first "
        f"from step {where['previous_step']} to {where['step']}, whose {checkpointable} "
        f"holds {int(where['nan']):,} NaN and {int(where['inf']):,} Inf (each pair's later "
        "checkpoint counted below, as --scan counts it)",
        out,
        total,
    )
    columns = (
        Column("previous_step", "from", term.number, priority=0, right=True),
        Column("step", "step", term.number, priority=0, right=True),
        Column("subtrees", "subtrees", term.number, priority=1, right=True),
        Column("nan", "nan", term.number, priority=0, right=True),
        Column("inf", "inf", term.number, priority=0, right=True),
    )
    _render_top(pairs, columns, out, total, top, "more pairs (--top 0 shows all)")


def _render_top(
    rows: pd.DataFrame,
    columns: Sequence[Column],
    out: TextIO,
    total: int,
    top: int,
    more: str,
) -> None:
    """The first ``top`` rows (all for ``top`` ≤ 0), then a line counting the rest:
    ``… N`` and ``more``."""
    shown = rows if top <= 0 else rows.head(top)
    term.render(shown, columns, out, total)
    if len(shown) < len(rows):
        _say(f"… {len(rows) - len(shown)} {more}", out, total)


def _show_scan(scan: pd.DataFrame, out: TextIO, total: int) -> None:
    # One word a row, as every view says it: the integrity where it is not sound, else
    # the health the scan found.
    scan = scan.assign(
        verdict=[overall(i, h) for i, h in zip(scan["integrity"], scan["health"], strict=True)]
    )
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
    else:
        rollback = "no sound checkpoint before it" if back is None else f"roll back to step {back}"
        _say(f"scan: NaN/Inf from step {first} on; {rollback}", out, total)
        # The first one's counts by checkpointable: the model's is what --drift counts.
        healths = scan.attrs.get("health", {})
        for path, step in zip(scan["path"], scan["step"], strict=True):
            found = healths.get(str(path))
            if step == first and found is not None and found.counts:
                parts = ", ".join(
                    f"{name} {c.nan:,} NaN" + (f" {c.inf:,} Inf" if c.inf else "")
                    for name, c in found.counts.items()
                    if c.leaves
                )
                _say(f"step {first}: {parts}", out, total)
                break
    for where, problem in scan.attrs.get("problems", {}).items():
        _say(f"not sound: {where}: {problem}", out, total)
