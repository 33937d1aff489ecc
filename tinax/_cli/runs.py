"""``tinax ls`` of a folder of runs: one line per run it holds."""

from __future__ import annotations

import pandas as pd

from tinax import _paths
from tinax._cli import terminal as term
from tinax._cli.terminal import Column
from tinax._format.naming import words
from tinax._format.records import tiers
from tinax._format.storage.location import FILE, Location
from tinax.explore._listing import listing as checkpoints_listed

RUNS = (
    Column("name", "run", priority=0),
    Column("checkpoints", "checkpoints", term.number, priority=0, right=True),
    Column("newest_step", "newest step", term.number, priority=1, right=True),
    Column("nbytes", "size", term.human_bytes, priority=2, right=True),
    Column("committed", "last commit", term.human_age, priority=3),
    Column("not_complete", "not complete", term.number, priority=4, right=True),
    Column("local", "local tier", priority=5),
    Column("path", "path", priority=9),
)


def runs_table(root: str | Location) -> pd.DataFrame:
    """The runs in the folder ``root`` (its directories holding checkpoints): one row
    each, ``name``, ``path``, ``checkpoints`` (complete), ``newest_step``, ``nbytes``,
    ``committed`` (the newest commit), ``not_complete`` (saves in progress,
    interrupted or set aside), ``local`` (a two-tier run's local tier). A two-tier
    run is one row however many of its tiers the folder holds: its checkpoints
    counted once a step, its size that of both tiers. The folder is listed once;
    each run is read through that listing."""
    folder = _paths.listed_directory(root)
    rows = []
    subdirectories = [n for n, e in sorted(folder.entries().items()) if e.kind != FILE]
    for name in subdirectories:
        where = folder / name
        run = tiers.two_tier_run(where)
        local = None if run is None else run.local
        if (
            run is not None
            and local is not None
            and tiers.same_directory(where, local)
            and any(tiers.same_directory(folder / n, run.durable) for n in subdirectories)
        ):
            continue  # the local tier of a run listed here: one run, in its durable row
        try:
            found = checkpoints_listed(where, deep=False)
        except (OSError, ValueError):
            continue
        if found.empty:
            continue
        complete = found[found["status"] == words.COMPLETE]
        # A step in both tiers is one row of the listing, and two copies on disk.
        both = found["tier"] == words.TIER_BOTH if "tier" in found else None
        nbytes = found["nbytes"].fillna(0)
        rows.append(
            {
                "name": name,
                "path": str(where),
                "checkpoints": len(complete),
                "newest_step": complete["step"].max() if len(complete) else pd.NA,
                "nbytes": int(nbytes.sum() + (0 if both is None else nbytes[both].sum())),
                "committed": complete["committed"].max() if len(complete) else pd.NaT,
                "not_complete": len(found) - len(complete),
                "local": None
                if local is None or tiers.same_directory(where, local)
                else str(local),
            }
        )
    table = pd.DataFrame(rows, columns=[c.source for c in RUNS if c.source != "path"] + ["path"])
    table["local"] = pd.array(table["local"], dtype="string")
    for column in ("checkpoints", "newest_step", "nbytes", "not_complete"):
        table[column] = pd.array(table[column], dtype="Int64")
    return table
