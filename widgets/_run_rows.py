"""How the explorer's run list shows a run: its columns, each row's look, the run's
policy and reasons for keeping each checkpoint, and the run counted in words."""

from __future__ import annotations

import html
from typing import Any

import pandas as pd

from tinax.vocabulary import COMPLETE, IN_PROGRESS, INTERRUPTED

from ._table import Column, RowLook, format_cell
from ._text import format_age, format_bytes


def _format_time(value: Any) -> str:
    if value is None or value is pd.NaT or (isinstance(value, float) and pd.isna(value)):
        return ""
    try:
        return pd.Timestamp(value).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError):
        return format_cell(value)


def _format_names(value: Any) -> str:
    if isinstance(value, tuple | list):
        return ", ".join(str(v) for v in value)
    return format_cell(value)


def checkpoint_look(row: pd.Series) -> RowLook:
    status = str(row.get("status", ""))
    if status == COMPLETE:
        return RowLook()
    if status == IN_PROGRESS:
        return RowLook(
            color="#8a6d00",
            pickable=False,
            tooltip="a save in progress: not opened until it commits",
        )
    if status == INTERRUPTED:
        return RowLook(
            color="#8a6d00",
            pickable=False,
            tooltip="an interrupted save: its writer is gone, it never loads; remove it below",
        )
    return RowLook(color="#b00020", pickable=False, tooltip=f"{status}: cannot be opened")


CHECKPOINT_COLUMNS = (
    Column("name", "checkpoint", key=True),
    Column("step", "step", align="right", descending_first=True),
    Column("status", "status"),
    Column("nbytes", "size on disk", format_bytes, align="right", descending_first=True),
    Column("kept", "kept because", essential=False),
    # A two-tier run's rows only (blank, so hidden, elsewhere).
    Column("tier", "tier", essential=False),
    Column("promotion", "promotion", essential=False, priority=1),
    Column("age", "age", format_age, align="right", essential=False, priority=1),
    Column("committed", "committed (UTC)", _format_time, essential=False, priority=3),
    Column("checkpointables", "checkpointables", _format_names, essential=False, priority=2),
)


def _policy_text(policy: dict[str, Any]) -> str:
    """A training run's policy in a few words: "every 50 steps · keeps newest 2 + best 1 by loss"."""
    every = policy.get("save_every")
    parts = [f"every {every:,} steps" if isinstance(every, int) else "forced saves only"]
    keep, best = policy.get("keep"), policy.get("keep_best")
    kept = [f"newest {keep}"] if isinstance(keep, int) else ["all"]
    if isinstance(best, int) and best > 0 and policy.get("best_by"):
        kept.append(f"best {best} by {policy['best_by']} ({policy.get('best_mode', 'min')})")
    return " · ".join([*parts, "keeps " + " + ".join(kept)])


def with_policy_text(table: pd.DataFrame) -> pd.DataFrame:
    """``run_listing``'s table as the run list shows it: ``kept`` blank where the run
    recorded nothing, and its policy in words (``attrs["policy"]``)."""
    shown = table.assign(kept=table["kept"].fillna("").astype("string"))
    shown.attrs = dict(table.attrs)
    policy = table.attrs.get("policy")
    if policy is not None:
        shown.attrs["policy"] = _policy_text(policy)
    else:
        shown.attrs.pop("policy", None)
    return shown


def listing_summary(table: pd.DataFrame) -> str:
    """The run's checkpoints counted in words: "5 checkpoints, 1 interrupted save"."""
    counts = table["status"].value_counts() if len(table) else pd.Series(dtype=int)

    def plural(n: int, one: str, many: str) -> str:
        return f"{n:,} {one if n == 1 else many}"

    done = int(counts.get(COMPLETE, 0))
    parts = [plural(done, "checkpoint", "checkpoints")]
    for status, n in counts.items():
        n = int(n)
        if status == COMPLETE:
            continue
        if status == INTERRUPTED:
            parts.append(plural(n, "interrupted save", "interrupted saves"))
        elif status == IN_PROGRESS:
            parts.append(plural(n, "save in progress", "saves in progress"))
        else:
            parts.append(f"{n:,} {status}")
    return ", ".join(parts)


def run_heading(root: str, summary: str) -> str:
    """The explorer's first line: the run's path and its checkpoints counted."""
    text = f"<b>Run</b> <code>{html.escape(root)}</code>"
    return text + (f" · {html.escape(summary)}" if summary else "")
