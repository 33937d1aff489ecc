"""``tinax ls``: a run's checkpoints, with the metric its ``TrainingRun`` keeps the best by,
why each is kept and its health; or the runs of a folder of runs.

Quick on purpose: a run is listed from each checkpoint's commit record (the quick
listing, ``deep=False``: ``tinax verify`` reads the rest), and its text is printed from
plain rows, so that ``tinax ls`` imports neither pandas nor tensorstore; ``--json``,
``--csv`` and a folder of runs make the tables as the library gives them.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from tinax import _paths
from tinax._cli import terminal as term
from tinax._cli import verdicts
from tinax._cli.terminal import Column, Rows
from tinax._format.storage.location import Location
from tinax.explore._listing import listed_rows
from tinax.explore._run_view.retention import _reasons

LISTING = (
    Column("name", "name", priority=0),
    Column("step", "step", term.number, priority=3, right=True),
    Column("status", "status", priority=0),
    Column("nbytes", "size", term.human_bytes, priority=2, right=True),
    Column("committed", "committed", term.human_age, priority=4),
    Column("metric", "metric", term.measured, priority=1, right=True),
    Column("health", "health", priority=1),
    Column("kept", "kept", priority=1),
    Column("tier", "tier", priority=1),
    Column("promotion", "promotion", priority=2),
    Column("checkpointables", "checkpointables", priority=5),
    Column("path", "path", priority=9),
)


def show_listing(path: str, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    """``tinax ls ROOT`` (and ``tinax ROOT`` of a run)."""
    # Listed once: the listing, the run's record and its policy are read through it.
    root = _paths.listed_directory(path)
    found = listed_rows(root, None, False)
    rows = found.listing.rows
    if not rows:
        _show_runs(root, args, out, err)
        return
    if args.json or args.csv:
        _machine_listing(root, args.json, out)
        return
    kept = {row[0]: row for row in _reasons(found.record, found.run)}
    for row in rows:
        reasons = kept.get(str(row["name"]))
        row["metric"] = None if reasons is None else reasons[3]
        row["kept"] = None if reasons is None else reasons[2]
    shown = [c.source for c in LISTING]
    if not kept or all(row["kept"] is None for row in rows):
        shown = [c for c in shown if c not in ("kept", "metric")]
    policy = None if found.record is None else found.record.get("policy")
    metric = policy.get("best_by") if isinstance(policy, dict) else None
    columns = tuple(
        Column(c.source, str(metric), c.format, c.priority, c.right)
        if c.source == "metric" and metric
        else c
        for c in LISTING
    )
    table = Rows(rows, shown)
    total = term.width()
    term.render(table, columns, out, total)
    for line in verdicts.health_notes(table):
        term.say(line, out, total)
    for where, problem in found.listing.attrs.get("errors", {}).items():
        print(f"invalid: {where}: {problem}", file=err)


def _machine_listing(root: Location, as_json: bool, out: TextIO) -> None:
    """``--json`` and ``--csv``: the run's table as ``run_listing`` gives it, with each
    row's error."""
    import pandas as pd

    from tinax._cli.output import _machine
    from tinax.explore._run_view.retention import run_listing

    table = run_listing(root)
    errors = table.attrs.get("errors", {})
    if table["kept"].isna().all():
        table = table.drop(columns=["kept", "metric"])
    table = table.assign(error=pd.array([errors.get(p) for p in table["path"]], dtype="string"))
    _machine(table, as_json, out)


def _show_runs(root: Location, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    """A folder of runs, not a run: its runs, one line each."""
    from tinax._cli import runs
    from tinax._cli.output import _machine

    found = runs.runs_table(root)
    if len(found) or args.json or args.csv:
        if args.json or args.csv:
            _machine(found, args.json, out)
        else:
            title = f"{root}: {len(found)} run{'s' * (len(found) != 1)}"
            print(term.shorten_middle(title, term.width()), file=out)
            term.render(found, runs.RUNS, out, term.width())
        return
    print(f"{root}: no checkpoint and no run in it", file=err)
