"""How the explorer's run list shows a run: its columns, each row's look, the run's
policy and reasons for keeping each checkpoint, and the run counted in words."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from tinax.vocabulary import COMPLETE, DIVERGED, IN_PROGRESS, INCOMPLETE, INTERRUPTED

from ._nonfinite import NONFINITE_COLOR
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


# The integrity word as the list shows it: with the listing's status where that says
# more (``incomplete (interrupted)``).
INTEGRITY_SHOWN = "integrity_shown"


def integrity_text(integrity: Any, status: Any) -> str:
    """``sound``, ``damaged``, or ``incomplete (in progress)``: the library's word, and
    the status that made a checkpoint incomplete."""
    word = "" if integrity is None or integrity is pd.NA else str(integrity)
    if word == INCOMPLETE and status is not None and status is not pd.NA:
        return f"{word} ({status})"
    return word


def checkpoint_look(row: pd.Series) -> RowLook:
    status = str(row.get("status", ""))
    if status == COMPLETE:
        reason = row.get("health_reason")
        tip = None if reason is None or reason is pd.NA else f"{row.get('health')}: {reason}"
        if str(row.get("health", "")) == DIVERGED:
            return RowLook(color=NONFINITE_COLOR, tooltip=tip)
        return RowLook(tooltip=tip)
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


# The run list's metric columns: ``metric:NAME`` shows a metric as logged (a number,
# or the word for a value logged non-finite), ``metric:NAME:order`` sorts it.
METRIC_FIELD = "metric:"
_ORDER = ":order"


def _format_metric(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None or value is pd.NA:
        return ""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return format_cell(value)
    return "" if math.isnan(number) else f"{number:.4g}"


def metric_columns(names: Sequence[str]) -> tuple[Column, ...]:
    """A column per metric: the first (the one the run is kept by) shown longest on a
    narrow output, the others given up before it."""
    return tuple(
        Column(
            f"{METRIC_FIELD}{name}",
            name,
            _format_metric,
            align="right",
            essential=False,
            priority=0 if i == 0 else 2,
            sort_by=f"{METRIC_FIELD}{name}{_ORDER}",
        )
        for i, name in enumerate(names)
    )


def checkpoint_columns(metrics: Sequence[str]) -> tuple[Column, ...]:
    """The run list's columns with the run's ``metrics`` after the step."""
    return (*CHECKPOINT_COLUMNS[:2], *metric_columns(metrics), *CHECKPOINT_COLUMNS[2:])


def metric_names(table: pd.DataFrame, kept_by: str | None) -> list[str]:
    """A ``run_table``'s metrics, the one the run is kept by first."""
    names = [str(m) for m in table.attrs.get("metrics", [])]
    return sorted(names, key=lambda m: m != kept_by)


def with_metrics(
    listing: pd.DataFrame, metrics: pd.DataFrame, names: Sequence[str]
) -> pd.DataFrame:
    """The listing (indexed by path) with a column per metric from ``run_table``'s
    ``metrics``: the value as logged, ``NaN`` or ``Inf`` where it was logged so
    (``nonfinite_metrics``), blank where none was; and the column that sorts it."""
    if not names or metrics.empty:
        return listing
    by_path = metrics.set_index(metrics["path"].astype(str))
    by_path = by_path[~by_path.index.duplicated()]
    rows = by_path.reindex(listing.index)
    said = rows.get("nonfinite_metrics", pd.Series(None, index=rows.index, dtype=object))
    logged_bad = [set() if not isinstance(v, str) else set(v.split(", ")) for v in said]
    columns: dict[str, Any] = {}
    for name in names:
        values = rows[name] if name in rows else pd.Series(math.nan, index=listing.index)
        shown: list[Any] = []
        for value, bad in zip(values, logged_bad, strict=True):
            number = math.nan if value is None or value is pd.NA else float(value)
            if name in bad:
                shown.append("NaN" if math.isnan(number) else "Inf" if number > 0 else "-Inf")
            else:
                shown.append(None if math.isnan(number) else number)
        columns[f"{METRIC_FIELD}{name}"] = pd.Series(shown, index=listing.index, dtype=object)
        order = pd.to_numeric(values, errors="coerce").astype("float64")
        columns[f"{METRIC_FIELD}{name}{_ORDER}"] = order.where(order.map(math.isfinite), math.nan)
    return listing.assign(**columns)


CHECKPOINT_COLUMNS = (
    Column("name", "checkpoint", key=True),
    Column("step", "step", align="right", descending_first=True),
    # The library's two words: health (can a run go on from here?) and integrity (are
    # these the bytes saved?), the reason for the first on the row's hover.
    Column("health", "health"),
    Column(INTEGRITY_SHOWN, "integrity"),
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
    recorded nothing, the integrity word with its status (``INTEGRITY_SHOWN``), its policy in words (``attrs["policy"]``) and the metric it
    keeps its best checkpoints by (``attrs["best_by"]``)."""
    shown = table.assign(
        kept=table["kept"].fillna("").astype("string"),
        **{
            INTEGRITY_SHOWN: [
                integrity_text(i, s)
                for i, s in zip(table["integrity"], table["status"], strict=True)
            ]
        },
    )
    shown.attrs = dict(table.attrs)
    policy = table.attrs.get("policy")
    if policy is not None:
        shown.attrs["policy"] = _policy_text(policy)
        shown.attrs["best_by"] = policy.get("best_by")
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
    diverged = int((table["health"] == DIVERGED).sum()) if "health" in table and done else 0
    if diverged:
        parts[0] += f" ({diverged:,} diverged)"
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
