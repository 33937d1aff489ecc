"""How the explorer's run list shows a run: its columns, each row's look, the run's
policy and reasons for keeping each checkpoint, and the run counted in words."""

from __future__ import annotations

import html
from typing import Any

import pandas as pd

from tinax import explore
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


def with_retention(table: pd.DataFrame, root: str) -> pd.DataFrame:
    """The listing with the run's reasons for keeping each checkpoint (``kept``) and
    its policy (``attrs["policy"]``), where ``TrainingRun`` recorded them."""
    try:
        policy = explore.run_policy(root)
        reasons = explore.retention_table(root) if policy is not None else None
    except (OSError, ValueError):
        # A single checkpoint, or a record that cannot be read: the listing says enough.
        policy = reasons = None
    kept = pd.Series("", index=table.index, dtype="string")
    if reasons is not None and len(reasons) and len(table):
        by_name = dict(zip(reasons["name"].astype(str), reasons["kept"].astype(str), strict=True))
        kept = table["name"].astype(str).map(by_name).fillna("").astype("string")
    table = table.assign(kept=kept)
    if policy is not None:
        table.attrs["policy"] = _policy_text(policy)
    return table


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
