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
import pandas as pd
import traitlets

from tinax import explore
from tinax import vocabulary as words
from tinax.explore import display, toolkit
from tinax.vocabulary import format_key, parse_key

from ._diff_tree import DiffTree
from ._guard import shown_in_widget
from ._nonfinite import (
    NONFINITE_BACKGROUND,
    NONFINITE_COLOR,
    is_nonfinite_change,
    nonfinite_change,
    nonfinite_counts,
)
from ._table import Column, PagedTable, RowLook
from ._text import error_html, note_html

# Subtrees shown with a bar, largest relative change first.
MAX_BARS = 8
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


def _percent(value: Any) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return ""
    if math.isnan(number):
        return ""
    return "∞" if math.isinf(number) else f"{number * 100:.3g} %"


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


# The depth of the bars: the model's layers (as ``drift_table`` finds them), or the
# first N key parts. The dropdown's values: 0 stands for the layers.
LAYERS = 0
BAR_DEPTHS = (("by layer", LAYERS), ("1 key deep", 1), ("2 keys deep", 2), ("3 keys deep", 3))


def _subtree_of(paths: dict[str, list[Any]], depth: int) -> Callable[[str, Any], Any]:
    """Maps ``(checkpointable, key path)`` to its subtree: its first ``depth`` parts,
    or with ``LAYERS`` its layer, from the structure of that checkpointable's keys."""
    if depth != LAYERS:
        return lambda _name, path: path[:depth]
    found = {name: toolkit.layer_depth(found) for name, found in paths.items()}
    return lambda name, path: toolkit.layer_of(path, *found[name])


def subtree_changes(table: pd.DataFrame, depth: int) -> pd.DataFrame:
    """The relative change of each subtree, over its changed leaves; subtrees holding
    NaN or Inf first.

    A subtree is the first ``depth`` key parts of a leaf's key, or with ``LAYERS``
    (0) its layer: ``blocks.13`` of a model whose blocks are numbered, each other
    module whole (``layer_of``). Its relative change is ``‖b − a‖ / ‖a‖`` over the
    changed floating-point leaves under it that are finite on both sides (leaves that
    are the same add nothing to ``‖b − a‖``, and those recognised from their stored
    bytes were not decoded, so their norm is not known). A changed leaf holding NaN
    or Inf on either side is counted apart: its change is not a number.

    Returns:
      ``checkpointable``, ``subtree`` (a keystr), ``rel_change`` (NaN when no
      finite leaf changed), ``leaves`` (changed leaves counted), ``nonfinite``
      (those holding NaN or Inf), ``nan`` and ``inf`` (their counts, both sides):
      subtrees with non-finite leaves first (most such leaves, then most such values
      first), then by relative change.
    """
    bad = is_nonfinite_change(table)
    nan, inf = nonfinite_counts(table)
    changed = (table["status"] == words.CHANGED).to_numpy(bool) & (
        table["norm_a"].notna().to_numpy(bool) | bad
    )
    # Layers are found from the structure of every leaf in the table, changed or not.
    paths: dict[str, list[Any]] = {}
    parsed: list[Any] = []
    for name, key in zip(table["checkpointable"], table["key"], strict=True):
        try:
            path: Any = parse_key(str(key))
        except ValueError:
            path = None
        parsed.append(path)
        if path is not None:
            paths.setdefault(str(name), []).append(path)
    rows = table[changed]
    bad, nan, inf = bad[changed], nan[changed], inf[changed]
    parsed = [p for p, keep in zip(parsed, changed, strict=True) if keep]
    subtree_of = _subtree_of(paths, depth)
    sums: dict[tuple[str, str], list[float]] = {}
    for i, (name, key, norm_a, norm_diff) in enumerate(
        zip(rows["checkpointable"], rows["key"], rows["norm_a"], rows["norm_diff"], strict=True)
    ):
        path = parsed[i]
        subtree = str(key) if path is None else format_key(subtree_of(str(name), path))
        entry = sums.setdefault((str(name), subtree), [0.0, 0.0, 0, 0, 0, 0])
        entry[2] += 1
        if bad[i]:
            entry[3] += 1
            entry[4] += int(nan[i])
            entry[5] += int(inf[i])
        elif not pd.isna(norm_a) and not pd.isna(norm_diff):
            entry[0] += float(norm_a) ** 2
            entry[1] += float(norm_diff) ** 2
    out = []
    for (name, subtree), (aa, dd, count, nonfinite, nans, infs) in sums.items():
        if aa:
            rel = math.sqrt(dd) / math.sqrt(aa)
        elif count > nonfinite:
            rel = 0.0 if dd == 0 else math.inf
        else:
            rel = math.nan
        out.append((name, subtree, rel, int(count), int(nonfinite), int(nans), int(infs)))
    frame = pd.DataFrame(
        out,
        columns=["checkpointable", "subtree", "rel_change", "leaves", "nonfinite", "nan", "inf"],
    )
    order = frame.assign(_rel=frame["rel_change"].fillna(-1.0), _values=frame["nan"] + frame["inf"])
    order = order.sort_values(["nonfinite", "_values", "_rel"], ascending=False, kind="stable")
    return order.drop(columns=["_rel", "_values"]).reset_index(drop=True)


def _name(path: str) -> str:
    # A checkpoint's own name, local or gs://.
    return path.rstrip("/").rsplit("/", 1)[-1] or path


def _readable(key: str) -> str:
    try:
        return display.readable_key(key)
    except ValueError:
        return key


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
    """

    picked = traitlets.Any(None, allow_none=True)

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
        self.bars = w.VBox([])
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
            [self.title, self.depth, self.bars, self.view_as, self.tree],
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
        shown = rows.assign(change_size=size, _nonfinite=bad)
        if bad.any():
            change = shown["change"].astype(object)
            change[bad] = [nonfinite_change(r) for _, r in rows[bad].iterrows()]
            shown["change"] = change
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
        self.result.layout.display = "none"
        self.title.value = ""
        self.bars.children = ()

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
        counts = table["status"].value_counts()
        self.title.value = (
            f"<b>Changes from <code>{html.escape(_name(older))}</code> to "
            f"<code>{html.escape(_name(newer))}</code></b>: "
            + html.escape(", ".join(f"{n} {s}" for s, n in counts.items()))
            + _nonfinite_note(table)
            + "<br>"
            + note_html(
                f"a is {_name(older)}, b is {_name(newer)}. The model first, then the "
                "optimizer's state; in each, the leaves most changed first: floating-point "
                "arrays by relative change ‖b − a‖ / ‖a‖, then counters by how far they "
                "moved, then PRNG keys. Click a leaf to open it."
            )
        )
        self._show_rows()
        self.result.layout.display = ""

    def _on_choice(self, change: Any) -> None:
        if self._choosing:
            return
        if change["new"]:
            self.compare(change["new"])
        else:
            self.clear()

    def _show_bars(self) -> None:
        rows = self.shown()
        if rows.empty:
            self.bars.children = ()
            return
        subtrees = subtree_changes(rows, int(self.depth.value))
        # Subtrees holding NaN or Inf first; then the model's before the optimizer's,
        # as in the table.
        part = [
            display.state_part(c, k)
            for c, k in zip(subtrees["checkpointable"], subtrees["subtree"], strict=True)
        ]
        subtrees = (
            subtrees.assign(_part=part, _finite=subtrees["nonfinite"] == 0)
            .sort_values(["_finite", "_part"], kind="stable")
            .drop(columns=["_part", "_finite"])
            .head(MAX_BARS)
        )
        finite = [
            r
            for r, n in zip(subtrees["rel_change"], subtrees["nonfinite"], strict=True)
            if not n and math.isfinite(r)
        ]
        top = max(finite, default=0.0) or 1.0
        shown = []
        for row in subtrees.itertuples(index=False):
            shown.append(_bar(row, top))
        if shown:
            shown.insert(
                0,
                w.HTML(
                    note_html(
                        "relative change ‖b − a‖ / ‖a‖ of the floating-point leaves"
                        + ("; NaN/Inf in purple" if int(subtrees["nonfinite"].sum()) else "")
                    )
                ),
            )
        else:
            shown = [w.HTML(note_html("no floating-point leaf changed"))]
        self.bars.children = tuple(shown)


def _nonfinite_note(table: pd.DataFrame) -> str:
    """The diff's title says how many changed leaves hold NaN or Inf, in their colour."""
    bad = is_nonfinite_change(table)
    if not bad.any():
        return ""
    nan, inf = nonfinite_counts(table[bad])
    count = int(bad.sum())
    return (
        f' · <b class="tinax-diff-nonfinite" style="color:{NONFINITE_COLOR}">'
        f"{count:,} lea{'f' if count == 1 else 'ves'} with NaN or Inf "
        f"({int(nan.sum()):,} NaN, {int(inf.sum()):,} Inf)</b>"
    )


def _bar(row: Any, top: float) -> w.HBox:
    """One subtree's bar: its relative change against the largest, or, holding NaN or
    Inf, a full bar in their colour and their counts: never a percentage."""
    name, subtree, rel, leaves = row.checkpointable, row.subtree, row.rel_change, row.leaves
    exact = f"{name} {subtree}".strip()
    label = f"{name} {_readable(subtree)}" if subtree else name
    if row.nonfinite:
        value, color = 1.0, NONFINITE_COLOR
        counts = [f"{n:,} {word}" for n, word in ((row.nan, "NaN"), (row.inf, "Inf")) if n]
        text = f"NaN/Inf in {row.nonfinite:,} of {leaves:,} changed ({', '.join(counts)})"
    else:
        value = min(1.0, rel / top) if math.isfinite(rel) else 1.0
        color = None
        text = f"{_percent(rel)} ({leaves:,} changed)"
    bar = w.FloatProgress(value=value, min=0.0, max=1.0, layout=w.Layout(width="16em"))
    if color is not None:
        bar.style.bar_color = color
        bar.add_class("tinax-bar-nonfinite")
    words_label = w.Label(text, layout=w.Layout(flex="0 0 auto"))
    if color is not None:
        words_label.style.text_color = color
    return w.HBox(
        [w.Label(label, layout=w.Layout(width="20em"), tooltip=exact), bar, words_label],
        # On a narrow screen the numbers go under the bar, never cut.
        layout=w.Layout(flex_flow="row wrap"),
    )
