"""Showing a checkpoint against the chosen restore targets, and whether they can be loaded."""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Collection, Mapping
from typing import Any

import ipywidgets as w
import pandas as pd

from tinax import explore
from tinax._format import words
from tinax._format.keys import KeyPath

from ._choice import inside
from ._table import Column, PagedTable, RowLook

# Stored leaves of what is unticked: not asked for, so not a problem.
LEFT_OUT = "left out"
# Statuses that make Orbax refuse the load (a dtype difference is cast on restore).
BLOCKING = frozenset(
    {
        words.SHAPE_DIFFERS,
        words.KIND_DIFFERS,
        words.MISSING_FROM_CHECKPOINT,
        words.NOT_IN_TARGET,
    }
)
WARNING = frozenset({words.DTYPE_DIFFERS})
_SHOWN_PROBLEMS = 3


def _leaves(n: int) -> str:
    return f"{n} leaf" if n == 1 else f"{n} leaves"


def _side_title(column: str) -> str:
    """``shape_checkpoint`` → ``stored shape``; ``dtype_target`` → ``target dtype``."""
    base, _, side = column.rpartition("_")
    if side == "checkpoint":
        return f"stored {base}"
    if side == "target":
        return f"target {base}"
    return column.replace("_", " ")


def _look(row: pd.Series) -> RowLook:
    status = str(row.get("status", ""))
    if status in BLOCKING:
        return RowLook(color="#b00020", background="#fde7e9")
    if status in WARNING:
        return RowLook(color="#7a4f01", background="#fff4ce")
    if status == LEFT_OUT:
        return RowLook(color="#888888")
    return RowLook()


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether the chosen targets can be loaded from the checkpoint.

    Attributes:
      comparison: ``compare_table`` with leaves left out marked ``left out``.
      reason: Why the load is refused, or ``""``.
      casts: How many leaves will be cast to the target's dtype.
    """

    comparison: pd.DataFrame
    reason: str
    casts: int


def judge(
    path: str, chosen: Mapping[str, Any], left_out: Mapping[str, Collection[KeyPath]]
) -> Verdict:
    """Compares the checkpoint at ``path`` with the ``chosen`` targets.

    Args:
      path: The checkpoint.
      chosen: Name → abstract target, for the ticked checkpointables.
      left_out: Name → key paths of the unticked subtrees.

    Raises:
      ValueError, OSError: If the checkpoint cannot be read.
    """
    comparison = explore.compare_table(path, dict(chosen)).reset_index(drop=True)
    ticked = comparison["checkpointable"].isin(list(chosen))
    comparison.loc[~ticked, "status"] = LEFT_OUT
    for name, subtrees in left_out.items():
        rows = ticked & (comparison["checkpointable"] == name)
        comparison.loc[rows & inside(comparison["key"], subtrees), "status"] = LEFT_OUT
    blocking = comparison[comparison["status"].isin(list(BLOCKING))]
    reason = ""
    if len(blocking):
        problems = [
            f"{r['checkpointable']} {r['key']}: {r['status']}"
            for _, r in blocking.head(_SHOWN_PROBLEMS).iterrows()
        ]
        more = len(blocking) - len(problems)
        reason = (
            f"{_leaves(len(blocking))} cannot be restored: "
            + "; ".join(problems)
            + (f"; and {more} more" if more else "")
        )
    casts = int(comparison["status"].isin(list(WARNING)).sum())
    return Verdict(comparison=comparison, reason=reason, casts=casts)


class ComparisonView(w.VBox):
    """The comparison as a paged table, differences first and highlighted."""

    def __init__(self, *, page_size: int) -> None:
        self._page_size = page_size
        self.title = w.HTML("")
        self.box = w.VBox([])
        super().__init__([self.title, self.box])

    def clear(self, path: str | None) -> None:
        """Shows no table, only which checkpoint is compared."""
        self.box.children = ()
        self.title.value = (
            "" if path is None else f"<b>Compared with</b> <code>{html.escape(path)}</code>"
        )

    def show(self, path: str, comparison: pd.DataFrame) -> None:
        """Shows ``comparison``, with its status counts in the title."""
        fields = ["checkpointable", "key", "status"]
        extra = [
            c
            for c in comparison.columns
            if c not in fields and any(part in c for part in ("kind", "shape", "dtype"))
        ]
        columns = [
            Column("checkpointable", "checkpointable", "9em"),
            Column("key", "key", None),
            Column("status", "status", "11em"),
            *[Column(c, _side_title(c), "7.5em") for c in extra],
        ]
        view = self.box.children[0] if self.box.children else None
        if not isinstance(view, PagedTable) or [c.field for c in view.columns] != [
            c.field for c in columns
        ]:
            view = PagedTable(columns, page_size=self._page_size, look=_look)
            self.box.children = (view,)
        order = comparison["status"].map(
            lambda s: 0 if s in BLOCKING else 1 if s in WARNING else 3 if s == words.OK else 2
        )
        view.show(
            comparison.assign(_order=order)
            .sort_values("_order", kind="stable")
            .drop(columns="_order")
        )
        counts = comparison["status"].value_counts()
        self.title.value = f"<b>Compared with</b> <code>{html.escape(path)}</code>: " + html.escape(
            ", ".join(f"{n} {s}" for s, n in counts.items())
        )
