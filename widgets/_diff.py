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
from tinax.explore import display
from tinax.vocabulary import format_key, parse_key

from ._diff_tree import DiffTree
from ._guard import shown_in_widget
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
    nan, inf = row.get("nan_b"), row.get("inf_b")
    if (nan is not None and nan is not pd.NA and nan) or (
        inf is not None and inf is not pd.NA and inf
    ):
        return RowLook(color="#b00020", background="#fde7e9", tooltip="NaN or Inf values")
    return RowLook()


def subtree_changes(table: pd.DataFrame, depth: int) -> pd.DataFrame:
    """The relative change of each subtree ``depth`` keys deep, over its changed leaves.

    A subtree's relative change is ``‖b − a‖ / ‖a‖`` over the changed numeric
    leaves under it (leaves that are the same add nothing to ``‖b − a‖``, and
    those recognised from their stored bytes were not decoded, so their norm is
    not known). Returns ``checkpointable``, ``subtree``, ``rel_change`` and
    ``leaves`` (changed leaves counted), largest change first.
    """
    changed = table[(table["status"] == words.CHANGED) & table["norm_a"].notna()]
    sums: dict[tuple[str, str], list[float]] = {}
    for name, key, norm_a, norm_diff in zip(
        changed["checkpointable"],
        changed["key"],
        changed["norm_a"],
        changed["norm_diff"],
        strict=True,
    ):
        try:
            subtree = format_key(parse_key(str(key))[:depth])
        except ValueError:
            subtree = str(key)
        entry = sums.setdefault((str(name), subtree), [0.0, 0.0, 0])
        entry[0] += float(norm_a) ** 2
        entry[1] += float(norm_diff) ** 2
        entry[2] += 1
    rows = []
    for (name, subtree), (aa, dd, count) in sums.items():
        rel = math.sqrt(dd) / math.sqrt(aa) if aa else (0.0 if dd == 0 else math.inf)
        rows.append((name, subtree, rel, int(count)))
    frame = pd.DataFrame(rows, columns=["checkpointable", "subtree", "rel_change", "leaves"])
    return frame.sort_values("rel_change", ascending=False, kind="stable").reset_index(drop=True)


# Bars at a depth where the model has at least this many subtrees tell which part moved.
_TELLING = 4


def telling_depth(table: pd.DataFrame) -> int:
    """The shallowest depth (1 to 3) at which the model's changed floating-point leaves
    fall in at least a few subtrees: ``blocks`` alone says little, ``blocks.7`` says
    which layer moved. 1 if no depth does."""
    changed = table[(table["status"] == words.CHANGED) & table["norm_a"].notna()]
    model = [
        display.state_part(c, k) == display.MODEL
        for c, k in zip(changed["checkpointable"], changed["key"], strict=True)
    ]
    paths = []
    for name, key in zip(changed["checkpointable"][model], changed["key"][model], strict=True):
        try:
            paths.append((str(name), parse_key(str(key))))
        except ValueError:
            continue
    for depth in (1, 2, 3):
        if len({(name, path[:depth]) for name, path in paths}) >= _TELLING:
            return depth
    return 1


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
        guard = shown_in_widget(on_error)
        self._guard = guard
        self.choice = w.Dropdown(options=[_PLACEHOLDER], value="", layout=w.Layout(width="22em"))
        self.choice.observe(guard(self._on_choice), names="value")
        self.depth = w.Dropdown(
            options=[("subtrees 1 key deep", 1), ("2 keys deep", 2), ("3 keys deep", 3)],
            value=1,
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
        size = pd.to_numeric(rows["rel_change"], errors="coerce")
        moved = pd.to_numeric(rows["delta"], errors="coerce").abs() if "delta" in rows else size
        self.tree.show(rows.reset_index(drop=True))
        self.table.show(rows.assign(change_size=size.fillna(moved)))
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
        if base != self.base:
            self.clear()
        self.base = base
        current = self.choice.value
        options = [_PLACEHOLDER, *[(f"compare with {n}", p) for n, p in others if p != base]]
        self.choice.options = options
        self.choice.value = current if any(p == current for _, p in options) else ""

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
        with self.depth.hold_trait_notifications():
            self.depth.value = telling_depth(table)
        counts = table["status"].value_counts()
        self.title.value = (
            f"<b>Changes from <code>{html.escape(_name(older))}</code> to "
            f"<code>{html.escape(_name(newer))}</code></b>: "
            + html.escape(", ".join(f"{n} {s}" for s, n in counts.items()))
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
        # The model's subtrees before the optimizer's, as in the table.
        optimizer = [
            display.state_part(c, k)
            for c, k in zip(subtrees["checkpointable"], subtrees["subtree"], strict=True)
        ]
        subtrees = (
            subtrees.assign(_part=optimizer)
            .sort_values("_part", kind="stable")
            .drop(columns="_part")
            .head(MAX_BARS)
        )
        finite = [r for r in subtrees["rel_change"] if math.isfinite(r)]
        top = max(finite, default=0.0) or 1.0
        rows = []
        for name, subtree, rel, leaves in subtrees.itertuples(index=False):
            exact = f"{name} {subtree}".strip()
            label = f"{name} {_readable(subtree)}" if subtree else name
            bar = w.FloatProgress(
                value=min(1.0, rel / top) if math.isfinite(rel) else 1.0,
                min=0.0,
                max=1.0,
                layout=w.Layout(width="16em"),
            )
            rows.append(
                w.HBox(
                    [
                        w.Label(label, layout=w.Layout(width="20em"), tooltip=exact),
                        bar,
                        w.Label(
                            f"{_percent(rel)} ({leaves:,} changed)",
                            layout=w.Layout(flex="0 0 auto"),
                        ),
                    ],
                    # On a narrow screen the numbers go under the bar, never cut.
                    layout=w.Layout(flex_flow="row wrap"),
                )
            )
        if rows:
            rows.insert(
                0,
                w.HTML(note_html("relative change ‖b − a‖ / ‖a‖ of the floating-point leaves")),
            )
        else:
            rows = [w.HTML(note_html("no floating-point leaf changed"))]
        self.bars.children = tuple(rows)
