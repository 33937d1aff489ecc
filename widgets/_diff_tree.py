"""The diff of two checkpoints as a tree: each subtree's changed leaves and its relative
change rolled up from its floating-point leaves, opened a level at a time."""

from __future__ import annotations

import math
from typing import Any

import ipywidgets as w
import numpy as np
import pandas as pd
import traitlets

from tinax.vocabulary import CHANGED, SAME

from ._guard import shown_in_widget
from ._nonfinite import NONFINITE_BACKGROUND, NONFINITE_COLOR, is_nonfinite_change
from ._table import Column, RowLook
from ._tree import LeafTree, Node, NodeId, open_mark, shown_nodes, toggled, tree_table


def _percent(value: Any) -> str:
    if isinstance(value, str):  # what a subtree holding NaN or Inf shows instead
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return "∞ %" if math.isinf(value) else f"{value * 100:.3g} %"


def _count(value: Any) -> str:
    return "" if value is None else f"{int(value):,}"


_COLUMNS = (
    Column("label", "subtree", key=True, exact="exact"),
    Column("moved", "leaves changed", _count, align="right"),
    Column("leaves", "leaves", _count, align="right", essential=False),
    Column("rel_change", "rel. change", _percent, align="right"),
)


def _look(row: pd.Series) -> RowLook:
    if row["nonfinite"]:
        return RowLook(
            depth=int(row["depth"]),
            mark=str(row["mark"]),
            color=NONFINITE_COLOR,
            background=NONFINITE_BACKGROUND,
            tooltip="NaN or Inf values",
        )
    color = "#888888" if row["moved"] == 0 else None
    return RowLook(depth=int(row["depth"]), mark=str(row["mark"]), color=color)


class DiffTree(w.VBox):
    """A ``diff_table`` as a tree of subtrees: how many leaves changed under each, and
    its relative change ‖b − a‖ / ‖a‖ over its changed floating-point leaves (leaves
    that are the same add nothing to ‖b − a‖). Click a subtree to open or close it,
    a leaf to pick it. One list that scrolls within itself past ``page_size`` rows.

    Attributes:
      nodes: The nodes shown, in order.
      picked: ``(checkpointable, key)`` of the last leaf clicked, or ``None``.
    """

    picked = traitlets.Any(None, allow_none=True)

    def __init__(self, *, page_size: int = 20) -> None:
        self.nodes: list[Node] = []
        self._open: set[NodeId] = set()
        self._tree = LeafTree(pd.DataFrame(columns=["checkpointable", "key", "nbytes"]))
        self._aa = self._dd = np.zeros(0)
        self._changed = np.zeros(0, bool)
        self._nonfinite = np.zeros(0, bool)
        self._keys = pd.DataFrame(columns=["checkpointable", "key"])
        self.table = tree_table(_COLUMNS, _look, page_size)
        guard = shown_in_widget(self.table._show_error)
        self.table.observe(guard(self._on_pick), names="selected")
        super().__init__([self.table])
        self.add_class("tinax-diff-tree")

    def show(self, diff: pd.DataFrame) -> None:
        """Shows the tree of ``diff``, its checkpointables open one level."""
        frame = pd.DataFrame(
            {
                "checkpointable": diff["checkpointable"].astype(str),
                "key": diff["key"].astype(str),
                "nbytes": 0,
            }
        ).reset_index(drop=True)
        self._tree = LeafTree(frame)
        self._keys = frame[["checkpointable", "key"]]
        status = diff["status"].astype(str).to_numpy()
        self._changed = status != SAME
        # Leaves holding NaN or Inf are counted apart: their ‖b − a‖ is no number.
        self._nonfinite = is_nonfinite_change(diff)
        floating = (status == CHANGED) & diff["norm_a"].notna().to_numpy() & ~self._nonfinite
        norm_a = pd.to_numeric(diff["norm_a"], errors="coerce").fillna(0).to_numpy(float)
        norm_d = pd.to_numeric(diff["norm_diff"], errors="coerce").fillna(0).to_numpy(float)
        self._aa = np.where(floating, norm_a**2, 0.0)
        self._dd = np.where(floating, norm_d**2, 0.0)
        self._open = {r.id for r in self._tree.roots if r.leaf is None}
        self._redraw(keep_page=False)

    def toggle(self, checkpointable: str, key: str = "") -> None:
        """Opens a closed subtree, closes an open one."""
        node = self._tree.find(checkpointable, key)
        if node.leaf is not None:
            raise ValueError(f"{checkpointable!r} {key} is a leaf, not a subtree")
        self._open = toggled(self._open, node)
        self._redraw(keep_page=True)

    def rollup(self, checkpointable: str, key: str = "") -> tuple[int, float]:
        """``(changed leaves, relative change)`` of a subtree (NaN: no float changed
        with finite values on both sides)."""
        return self._rollup(self._tree.find(checkpointable, key))[:2]

    def nonfinite(self, checkpointable: str, key: str = "") -> int:
        """How many changed leaves of a subtree hold NaN or Inf."""
        return self._rollup(self._tree.find(checkpointable, key))[2]

    def _rollup(self, node: Node) -> tuple[int, float, int]:
        rows = node.rows
        changed = int(self._changed[rows].sum())
        nonfinite = int(self._nonfinite[rows].sum())
        aa, dd = float(self._aa[rows].sum()), float(self._dd[rows].sum())
        if aa > 0.0:
            return changed, math.sqrt(dd / aa), nonfinite
        return changed, math.nan if dd == 0.0 else math.inf, nonfinite

    def _on_pick(self, change: Any) -> None:
        index = change["new"]
        if index is None:
            return
        self.table.selected = None
        node = self.nodes[index]
        if node.leaf is None:
            self.toggle(node.checkpointable, node.key)
        else:
            row = self._keys.loc[node.leaf]
            self.picked = None
            self.picked = (str(row["checkpointable"]), str(row["key"]))

    def _redraw(self, *, keep_page: bool) -> None:
        out = shown_nodes(self._tree.roots, self._tree.children, self._open)
        self.nodes = [n for n, _ in out]
        rollups = [self._rollup(n) for n in self.nodes]
        frame = pd.DataFrame(
            {
                "label": [n.label for n in self.nodes],
                "exact": [
                    str(self._keys.loc[n.leaf, "key"]) if n.leaf is not None else n.key
                    for n in self.nodes
                ],
                "depth": [d for _, d in out],
                "mark": [open_mark(n, self._open) for n in self.nodes],
                "moved": [c for c, _, _ in rollups],
                "leaves": [n.leaves for n in self.nodes],
                # A subtree holding NaN or Inf says so: its change is not a number.
                "rel_change": pd.Series(
                    [f"NaN/Inf in {n:,}" if n else r for _, r, n in rollups], dtype=object
                ),
                "nonfinite": [n for _, _, n in rollups],
            }
        )
        self.table.show(frame, keep_page=keep_page)
