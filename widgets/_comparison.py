"""Showing a checkpoint against the chosen restore targets, and whether they can be loaded."""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Collection, Mapping
from typing import Any

import ipywidgets as w
import pandas as pd

from tinax import explore
from tinax import vocabulary as words
from tinax.explore import display
from tinax.vocabulary import KeyPath

from ._choice import inside
from ._table import Column, PagedTable, RowLook

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


def blocks(status: str, lossy: Any, *, allow_lossy: bool) -> bool:
    """Whether a leaf with this comparison keeps the load from going ahead."""
    if status in words.REFUSED_STATUSES:
        return True
    is_lossy = lossy is not None and not pd.isna(lossy) and bool(lossy)
    return status == words.DTYPE_CAST and is_lossy and not allow_lossy


def _rank(row: pd.Series) -> int:
    """Where a row sorts: refusals first, then casts, the rest, and matches last."""
    status = str(row.get("status", ""))
    if blocks(status, row.get("lossy"), allow_lossy=False):
        return 0
    return 1 if status == words.DTYPE_CAST else 3 if status == words.OK else 2


def _look(row: pd.Series) -> RowLook:
    rank = _rank(row)
    if rank == 0:
        return RowLook(color="#b00020", background="#fde7e9")
    if rank == 1:
        return RowLook(color="#7a4f01", background="#fff4ce")
    if str(row.get("status", "")) == words.LEFT_OUT:
        return RowLook(color="#888888")
    return RowLook()


def _problem(row: pd.Series) -> str:
    # Keys read as everywhere else: dotted (model dense.w), not as a keystr.
    key = str(row["key"])
    try:
        shown = display.readable_key(key) if key else ""
    except ValueError:
        shown = key
    where = f"{row['checkpointable']} {shown}".strip()
    if row["status"] == words.DTYPE_CAST:
        return f"{where}: lossy cast from {row['dtype_checkpoint']} to {row['dtype_target']}"
    return f"{where}: {row['status']}"


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
    path: str,
    chosen: Mapping[str, Any],
    left_out: Mapping[str, Collection[KeyPath]],
    *,
    allow_lossy: bool,
) -> Verdict:
    """Compares the checkpoint at ``path`` with the ``chosen`` targets.

    Args:
      path: The checkpoint.
      chosen: Name → abstract target, for the ticked checkpointables.
      left_out: Name → key paths of the unticked subtrees.
      allow_lossy: Whether casts that lose values are allowed.

    Raises:
      ValueError, OSError: If the checkpoint cannot be read.
    """
    comparison = explore.compare_table(path, dict(chosen)).reset_index(drop=True)
    ticked = comparison["checkpointable"].isin(list(chosen))
    comparison.loc[~ticked, "status"] = words.LEFT_OUT
    for name, subtrees in left_out.items():
        rows = ticked & (comparison["checkpointable"] == name)
        comparison.loc[rows & inside(comparison["key"], subtrees), "status"] = words.LEFT_OUT
    blocked = [
        blocks(str(s), lossy, allow_lossy=allow_lossy)
        for s, lossy in zip(comparison["status"], comparison["lossy"], strict=True)
    ]
    blocking = comparison[pd.Series(blocked, index=comparison.index, dtype=bool)]
    reason = ""
    if len(blocking):
        problems = [_problem(r) for _, r in blocking.head(_SHOWN_PROBLEMS).iterrows()]
        more = len(blocking) - len(problems)
        reason = (
            f"{_leaves(len(blocking))} cannot be restored: "
            + "; ".join(problems)
            + (f"; and {more} more" if more else "")
        )
    casts = int((comparison["status"] == words.DTYPE_CAST).sum()) - int(
        (blocking["status"] == words.DTYPE_CAST).sum()
    )
    return Verdict(comparison=comparison, reason=reason, casts=casts)


# The columns beside key and status, in the order a reader looks for them.
_SIDE_COLUMNS = ("shape", "dtype", "lossy", "kind")


def is_difference(status: object) -> bool:
    """Whether a comparison row is worth a look: anything but a match or a left-out leaf."""
    return str(status) not in (words.OK, words.LEFT_OUT)


class ComparisonView(w.VBox):
    """The comparison as a paged table, differences first and highlighted.

    By default only the differences are listed (every leaf that does not simply
    match and is not left out); ``show_all`` lists every leaf.

    Attributes:
      show_all: The toggle that lists every leaf rather than only the differences.
      comparison: The whole comparison last shown, or ``None``.
    """

    def __init__(self, *, page_size: int) -> None:
        self._page_size = page_size
        self._path = ""
        self.comparison: pd.DataFrame | None = None
        self.title = w.HTML("")
        self.show_all = w.Checkbox(
            value=False,
            description="show every leaf, not only the differences",
            indent=False,
            layout=w.Layout(width="auto", display="none"),
        )
        self.show_all.observe(lambda _change: self._show_rows(), names="value")
        self.box = w.VBox([])
        super().__init__([self.title, self.show_all, self.box])

    def clear(self, path: str | None) -> None:
        """Shows no table, only which checkpoint is compared."""
        self.comparison = None
        self.box.children = ()
        self.show_all.layout.display = "none"
        self.title.value = (
            "" if path is None else f"<b>Compared with</b> <code>{html.escape(path)}</code>"
        )

    def show(self, path: str, comparison: pd.DataFrame) -> None:
        """Shows ``comparison``, with its status counts in the title."""
        self._path = path
        self.comparison = comparison
        self.show_all.layout.display = ""
        counts = comparison["status"].value_counts()
        self.title.value = f"<b>Compared with</b> <code>{html.escape(path)}</code>: " + html.escape(
            ", ".join(f"{n} {s}" for s, n in counts.items())
        )
        self._show_rows()

    def _show_rows(self) -> None:
        comparison = self.comparison
        if comparison is None:
            return
        fields = ["checkpointable", "key", "status"]
        extra = [
            c
            for part in _SIDE_COLUMNS
            for c in comparison.columns
            if c not in fields and c.startswith(part)
        ]
        columns = [
            Column("key", "key", key=True),
            Column("status", "status"),
            Column("checkpointable", "checkpointable", essential=False, priority=1),
            *[Column(c, _side_title(c), essential=False) for c in extra],
        ]
        view = self.box.children[0] if self.box.children else None
        if not isinstance(view, PagedTable) or [c.field for c in view.columns] != [
            c.field for c in columns
        ]:
            view = PagedTable(
                columns,
                page_size=self._page_size,
                look=_look,
                empty_text="no differences: every chosen leaf matches the checkpoint",
            )
            self.box.children = (view,)
        rows = comparison
        if not self.show_all.value and len(comparison):
            rows = comparison[comparison["status"].map(is_difference).astype(bool)]
        order = rows.apply(_rank, axis=1) if len(rows) else rows["status"]
        view.show(
            rows.assign(_order=order).sort_values("_order", kind="stable").drop(columns="_order")
        )
