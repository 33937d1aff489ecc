"""Comparing the open checkpoint with another one of the run: what changed, and where most.

The diff reads forward, from the older checkpoint to the newer whichever is open,
the model before the optimizer's state; the explorer's filters narrow it, and a
row picked opens its leaf (``picked``).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as w
import numpy as np
import pandas as pd
import traitlets

from tinax import explore
from tinax import vocabulary as words
from tinax.explore import display

from ._diff_bars import BAR_DEPTHS, LAYERS, MAX_BARS, bar_rows, left_out_text, ordered_subtrees
from ._diff_both import BothSides, both_sides_text, known_both_sides
from ._diff_tree import DiffTree
from ._guard import shown_in_widget
from ._nonfinite import (
    NONFINITE_BACKGROUND,
    NONFINITE_COLOR,
    is_nonfinite_change,
    nonfinite_change,
    nonfinite_counts,
    sides_text,
)
from ._table import Column, PagedTable, RowLook
from ._task import start_thread
from ._text import error_html, note_html

# What the diff is shown as: its leaves (a table) or its subtrees (a tree).
LEAVES = "leaves"
SUBTREES = "subtrees"
_PLACEHOLDER = ("compare with…", "")


def _number(value: Any) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return ""
    return "" if math.isnan(number) else f"{number:.4g}"


def _count(value: Any) -> str:
    return "" if value is None or value is pd.NA else f"{int(value):,}"


def _key(value: Any) -> str:
    # A checkpointable that is one leaf (a PRNG key, an iterator) has the empty key.
    return "" if value is None or value is pd.NA else (str(value) or "(whole)")


DIFF_COLUMNS = (
    Column("key", "key", _key, key=True),
    Column("status", "status"),
    # The change told for what the leaf is: a float array's relative change, a
    # counter's "+150", a PRNG key's "changed"; sorted by its size.
    Column("change", "change", descending_first=True, sort_by="change_size"),
    Column("checkpointable", "checkpointable", essential=False, priority=1),
    Column("value_kind", "values", essential=False, priority=2),
    Column("max_abs_diff", "max |b−a|", _number, align="right", essential=False, priority=4),
    Column("cosine", "cosine", _number, align="right", essential=False, priority=5),
    Column("nan_b", "NaN (b)", _count, align="right", essential=False, priority=6),
    Column("inf_b", "Inf (b)", _count, align="right", essential=False, priority=6),
)


def _look(row: pd.Series) -> RowLook:
    status = str(row.get("status", ""))
    if status == words.SAME and bool(row.get("_both", False)):
        return RowLook(
            color=NONFINITE_COLOR,
            background=NONFINITE_BACKGROUND,
            tooltip="the same bytes on both sides, NaN or Inf in each",
        )
    if status == words.SAME:
        return RowLook(color="#888888")
    if status != words.CHANGED:
        return RowLook(color="#7a4f01", background="#fff4ce")
    if bool(row.get("_nonfinite", False)):
        told = row.get("nonfinite")
        return RowLook(
            color=NONFINITE_COLOR,
            background=NONFINITE_BACKGROUND,
            tooltip=str(told) if isinstance(told, str) else "NaN or Inf values",
        )
    return RowLook()


def _name(path: str) -> str:
    # A checkpoint's own name, local or gs://.
    return path.rstrip("/").rsplit("/", 1)[-1] or path


def forward(first: str, second: str) -> tuple[str, str]:
    """The two checkpoints as ``(older, newer)``: by the step in their names
    (``step_000200`` before ``step_000250``, ``step-9`` before ``step-10``)."""
    return (first, second) if _order(first) <= _order(second) else (second, first)


def _order(path: str) -> tuple[int | str, ...]:
    return display.natural_key(_name(path))


class DiffView(w.VBox):
    """A "compare with…" choice, and the diff of the open checkpoint and the one chosen.

    The diff reads from the older of the two (``a``) to the newer (``b``), whichever
    is open, so that counters move forward. Shows ``diff_table`` with the model's
    leaves before the optimizer's state, each sorted by change, and a bar of
    relative change for each subtree. Reading is region by region in bounded
    memory, with a progress bar. ``narrow`` applies the explorer's filters;
    clicking a leaf's row sets ``picked``.

    Attributes:
      base: The open checkpoint, or ``None``.
      other: The checkpoint it is compared with, or ``None``.
      older: The side ``a`` of the diff (the older of the two), or ``None``.
      newer: The side ``b``, or ``None``.
      diff: The last ``diff_table``, or an empty frame (every row, unfiltered).
      picked: ``(checkpointable, key)`` of the last leaf clicked, or ``None``.
      both: What is known of the ``same`` leaves holding NaN or Inf on both sides
        (``BothSides``); with a side diverged and neither side's data read,
        ``count_button`` reads one side to know it (``count_same``).
      compared: ``(older, newer)`` paths of the diff shown, or ``None`` (set after
        each comparison and each clear, so that others can follow it).
    """

    picked = traitlets.Any(None, allow_none=True)
    compared = traitlets.Any(None, allow_none=True)

    def __init__(self, *, page_size: int, on_error: Callable[[BaseException], None]) -> None:
        self.base: str | None = None
        self.other: str | None = None
        self.older: str | None = None
        self.newer: str | None = None
        self.diff = pd.DataFrame()
        self._filter = ("", "")
        self._choosing = False
        guard = shown_in_widget(on_error)
        self._guard = guard
        self.choice = w.Dropdown(options=[_PLACEHOLDER], value="", layout=w.Layout(width="22em"))
        self.choice.observe(guard(self._on_choice), names="value")
        self.depth = w.Dropdown(
            options=BAR_DEPTHS,
            value=LAYERS,
            tooltip="the bars' subtrees: the model's layers (blocks.13), or key parts",
            layout=w.Layout(width="12em"),
        )
        self.depth.observe(guard(lambda _: self._show_bars()), names="value")
        self.progress = w.FloatProgress(
            value=0.0, min=0.0, max=1.0, description="reading", layout=w.Layout(display="none")
        )
        self.title = w.HTML("")
        self.both = BothSides(False, np.zeros(0, np.int64), np.zeros(0, np.int64), False)
        # A diverged side whose data has not been read: which of the leaves the same on
        # both sides hold NaN is not known until one side is read.
        self.count_button = w.Button(
            description="count NaN in the same leaves",
            tooltip="read one side's data: which leaves hold NaN or Inf on both sides",
            layout=w.Layout(width="auto"),
        )
        self.count_button.on_click(guard(lambda _: self._count_in_background()))
        self.count_box = w.HBox(
            [
                w.HTML(
                    note_html(
                        "a side diverged: the leaves the same on both sides may hold NaN on both",
                        color=NONFINITE_COLOR,
                    )
                ),
                self.count_button,
            ],
            layout=w.Layout(flex_flow="row wrap", align_items="center", display="none"),
        )
        self.bars = w.VBox([])
        # What the bars leave out, named, and a button that shows every subtree.
        self.more_bars = w.HTML("")
        self.all_bars = w.ToggleButton(
            value=False,
            description="show all",
            tooltip="a bar for every subtree",
            layout=w.Layout(width="auto"),
        )
        self.all_bars.observe(guard(lambda _: self._show_bars()), names="value")
        self.more_box = w.HBox(
            [self.more_bars, self.all_bars],
            layout=w.Layout(flex_flow="row wrap", align_items="center", display="none"),
        )
        self._page_size = page_size
        self._table: PagedTable | None = None
        # The same changes by subtree, opened a level at a time, with their rollup.
        self.tree = DiffTree(page_size=page_size)
        self.tree.observe(guard(self._on_tree_pick), names="picked")
        # The leaves or the same changes by subtree: one at a time, so that the page
        # stays short.
        self.view_as = w.ToggleButtons(
            options=[("leaves", LEAVES), ("subtrees", SUBTREES)],
            value=LEAVES,
            tooltips=["every leaf, most changed first", "changes rolled up by subtree"],
            style={"button_width": "6em"},
        )
        self.view_as.observe(guard(lambda _: self._show_view()), names="value")
        self.tree.layout.display = "none"
        self.result = w.VBox(
            [
                self.title,
                self.count_box,
                self.depth,
                self.bars,
                self.more_box,
                self.view_as,
                self.tree,
            ],
            layout=w.Layout(display="none"),
        )
        super().__init__([w.HBox([self.choice, self.progress]), self.result])
        self.add_class("tinax-diff-view")

    @property
    def table(self) -> PagedTable:
        """The diff as a table; made when first needed, so that an explorer that
        compares nothing never builds it."""
        if self._table is None:
            self._table = PagedTable(DIFF_COLUMNS, page_size=self._page_size, look=_look)
            self._table.observe(self._guard(self._on_pick), names="selected")
            self.result.children = (*self.result.children, self._table)
            self._show_view()
        return self._table

    def _show_view(self) -> None:
        as_tree = self.view_as.value == SUBTREES
        self.tree.layout.display = "" if as_tree else "none"
        if self._table is not None:
            self._table.layout.display = "none" if as_tree else ""

    def narrow(self, checkpointable: str = "", text: str = "") -> None:
        """Shows only the rows of ``checkpointable`` (``""``: all) whose key holds
        ``text`` (a keystr or a dotted name, case ignored; ``""``: any)."""
        self._filter = (str(checkpointable), str(text))
        if not self.diff.empty:
            self._show_rows()

    def shown(self) -> pd.DataFrame:
        """The diff's rows the filters let through, in the order shown."""
        table = self.diff
        if table.empty:
            return table
        checkpointable, text = self._filter
        mask = pd.Series(True, index=table.index)
        if checkpointable:
            mask &= table["checkpointable"] == checkpointable
        if text.strip():
            mask &= pd.Series(
                display.key_matches(table["key"].astype(str), text), index=table.index
            )
        return table[mask]

    def _show_rows(self) -> None:
        rows = self.shown()
        bad = is_nonfinite_change(rows)
        size = pd.to_numeric(rows["rel_change"], errors="coerce")
        moved = pd.to_numeric(rows["delta"], errors="coerce").abs() if "delta" in rows else size
        # A leaf gone NaN or Inf is the largest change there is: first (diff_table
        # ranks it so) and first when the change is sorted, told by its counts
        # rather than by a percentage.
        size = size.fillna(moved).where(~bad, math.inf)
        # The same bytes on both sides, NaN or Inf in each: told, not greyed as "same".
        nan = pd.Series(self.both.nan, index=self.diff.index).reindex(rows.index)
        inf = pd.Series(self.both.inf, index=self.diff.index).reindex(rows.index)
        both = (nan + inf).to_numpy() > 0
        shown = rows.assign(change_size=size, _nonfinite=bad, _both=both)
        if bad.any() or both.any():
            change = shown["change"].astype(object)
            change[bad] = [nonfinite_change(r) for _, r in rows[bad].iterrows()]
            change[both] = [
                ", ".join(f"{w} {int(n):,}" for w, n in (("NaN", a), ("Inf", b)) if n)
                + " on both sides"
                for a, b in zip(nan[both], inf[both], strict=True)
            ]
            shown["change"] = change
            if both.any() and "nan_b" in shown:
                # The same bytes: b's counts are a's, read on one side.
                shown.loc[both, "nan_b"] = nan[both].to_numpy()
                shown.loc[both, "inf_b"] = inf[both].to_numpy()
        self.tree.show(rows.reset_index(drop=True))
        self.table.show(shown)
        self._show_bars()

    def _on_pick(self, change: Any) -> None:
        label = change["new"]
        if label is None or self._table is None:
            return
        row = self._table.frame.loc[label]
        self.picked = None
        self.picked = (str(row["checkpointable"]), str(row["key"]))

    def _on_tree_pick(self, change: Any) -> None:
        if change["new"] is not None:
            self.picked = None
            self.picked = change["new"]

    def set_base(self, base: str | None, others: Sequence[tuple[str, str]]) -> None:
        """Compares from ``base``; ``others`` are the ``(name, path)`` choices offered."""
        moved = base != self.base
        if moved:
            self.clear()
        self.base = base
        # Another checkpoint open: nothing is compared. The same one: the comparison
        # shown stays, and is not read again for new options.
        current = "" if moved else self.choice.value
        options = [_PLACEHOLDER, *[(f"compare with {n}", p) for n, p in others if p != base]]
        kept = current if any(p == current for _, p in options) else ""
        self._choosing = True
        try:
            self.choice.options = options
            self.choice.value = kept
        finally:
            self._choosing = False
        if current and not kept:
            self.clear()  # what it was compared with is gone from the run

    def clear(self) -> None:
        """Shows no comparison."""
        self.other = self.older = self.newer = None
        self.diff = pd.DataFrame()
        self.count_box.layout.display = "none"
        self.result.layout.display = "none"
        self.title.value = ""
        self.bars.children = ()
        self.compared = None

    def compare(self, other: str) -> None:
        """Compares the open checkpoint with ``other`` (a path) and shows the result,
        from the older of the two to the newer.

        Raises:
          ValueError: If no base checkpoint is set, or a checkpoint cannot be read.
        """
        if self.base is None:
            raise ValueError("no checkpoint is open to compare from")
        self.clear()
        self.progress.value = 0.0
        self.progress.layout.display = ""

        def progress(done: int, total: int) -> None:
            self.progress.value = done / total if total else 1.0

        older, newer = forward(self.base, other)
        try:
            table = explore.diff_table(older, newer, progress=progress)
        except Exception as e:
            self.result.layout.display = ""
            self.title.value = error_html(e, title="Cannot compare:")
            raise
        finally:
            self.progress.layout.display = "none"
        self.other = other
        self.older, self.newer = older, newer
        self.diff = table
        # The choice names what is compared, however the comparison was asked for.
        if any(p == other for _, p in self.choice.options) and self.choice.value != other:
            self._choosing = True
            try:
                self.choice.value = other
            finally:
                self._choosing = False
        self.both = known_both_sides(table, older, newer)
        self._show_title()
        self._show_rows()
        self.result.layout.display = ""
        self.compared = (older, newer)

    def _show_title(self) -> None:
        table, older, newer = self.diff, str(self.older), str(self.newer)
        counts = table["status"].value_counts()
        both = both_sides_text(self.both)
        self.count_box.layout.display = "" if self.both.unknown_same else "none"
        self.title.value = (
            f"<b>Changes from <code>{html.escape(_name(older))}</code> to "
            f"<code>{html.escape(_name(newer))}</code></b>: "
            + html.escape(", ".join(f"{n} {s}" for s, n in counts.items()))
            + _nonfinite_note(table)
            + (
                f' · <b class="tinax-diff-both" style="color:{NONFINITE_COLOR}">'
                f"{html.escape(both)}</b>"
                if both
                else ""
            )
            + "<br>"
            + note_html(
                f"a is {_name(older)}, b is {_name(newer)}. The model first, then the "
                "optimizer's state; in each, the leaves most changed first: floating-point "
                "arrays by relative change ‖b − a‖ / ‖a‖, then counters by how far they "
                "moved, then PRNG keys. Click a leaf to open it."
            )
        )

    def count_same(self) -> None:
        """Reads one side's data (``verify(…, data=True)``: every leaf, checked, NaN
        and Inf counted once) so that the ``same`` leaves holding NaN or Inf on both
        sides are named. Blocks; the button runs it in the background.

        Raises:
          ValueError: If nothing is compared.
        """
        if self.older is None or self.newer is None:
            raise ValueError("nothing is compared")
        older, newer = self.older, self.newer
        self.progress.value = 0.0
        self.progress.layout.display = ""

        def progress(done: int, total: int) -> None:
            self.progress.value = done / total if total else 1.0

        try:
            explore.verify(older, data=True, progress=progress)
        finally:
            self.progress.layout.display = "none"
        if (self.older, self.newer) == (older, newer):
            self.both = known_both_sides(self.diff, older, newer)
            self._show_title()
            self._show_rows()

    def _count_in_background(self) -> None:
        self.count_button.disabled = True

        def count() -> None:
            try:
                self.count_same()
            finally:
                self.count_button.disabled = False

        start_thread(self._guard(count), name="tinax-diff-count")

    def _on_choice(self, change: Any) -> None:
        if self._choosing:
            return
        if change["new"]:
            self.compare(change["new"])
        else:
            self.clear()

    def _show_bars(self) -> None:
        rows = self.shown()
        if not len(rows):
            self.bars.children = ()
            self.more_box.layout.display = "none"
            return
        subtrees = ordered_subtrees(rows, int(self.depth.value))
        limit = None if self.all_bars.value else MAX_BARS
        self.bars.children = bar_rows(subtrees, limit=limit)
        if len(subtrees) <= MAX_BARS:
            self.more_box.layout.display = "none"
            return
        self.more_box.layout.display = ""
        self.all_bars.description = "show fewer" if self.all_bars.value else "show all"
        self.more_bars.value = (
            note_html(f"{len(subtrees):,} subtrees")
            if self.all_bars.value
            else note_html(left_out_text(subtrees, MAX_BARS))
        )


def _nonfinite_note(table: pd.DataFrame) -> str:
    """The diff's title says how many changed leaves hold NaN or Inf, in their colour."""
    bad = is_nonfinite_change(table)
    if not bad.any():
        return ""
    nan, inf = nonfinite_counts(table[bad], ("b",))
    nan_a, inf_a = nonfinite_counts(table[bad], ("a",))
    count = int(bad.sum())
    counts = sides_text(int(nan.sum()), int(inf.sum()), int(nan_a.sum()), int(inf_a.sum()))
    return (
        f' · <b class="tinax-diff-nonfinite" style="color:{NONFINITE_COLOR}">'
        f"{count:,} changed lea{'f' if count == 1 else 'ves'} with NaN or Inf "
        f"({html.escape(counts)})</b>"
    )
