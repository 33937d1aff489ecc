"""Comparing the open checkpoint with another one of the run: what changed, and where most."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as w
import pandas as pd

from tinax import explore
from tinax import vocabulary as words
from tinax.vocabulary import format_key, parse_key

from ._diff_tree import DiffTree
from ._guard import shown_in_widget
from ._table import Column, PagedTable, RowLook
from ._text import error_html, note_html

# Subtrees shown with a bar, largest relative change first.
MAX_BARS = 12
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
    # counter's "+150", a PRNG key's "changed".
    Column("change", "change"),
    Column("checkpointable", "checkpointable", essential=False, priority=1),
    Column("value_kind", "values", essential=False, priority=2),
    Column(
        "rel_change",
        "rel. change",
        _percent,
        align="right",
        descending_first=True,
        essential=False,
        priority=3,
    ),
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


def _name(path: str) -> str:
    # A checkpoint's own name, local or gs://.
    return path.rstrip("/").rsplit("/", 1)[-1] or path


class DiffView(w.VBox):
    """A "compare with…" choice, and the diff of the open checkpoint against the one chosen.

    Shows ``diff_table`` sorted by relative change, and a bar of relative change
    for each subtree. Reading is region by region in bounded memory, with a
    progress bar.

    Attributes:
      base: The checkpoint compared from, or ``None``.
      other: The checkpoint compared to, or ``None``.
      diff: The last ``diff_table``, or an empty frame.
    """

    def __init__(self, *, page_size: int, on_error: Callable[[BaseException], None]) -> None:
        self.base: str | None = None
        self.other: str | None = None
        self.diff = pd.DataFrame()
        guard = shown_in_widget(on_error)
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
        self.result = w.VBox(
            [self.title, self.depth, self.bars, self.tree], layout=w.Layout(display="none")
        )
        super().__init__([w.HBox([self.choice, self.progress]), self.result])
        self.add_class("tinax-diff-view")

    @property
    def table(self) -> PagedTable:
        """The diff as a table; made when first needed, so that an explorer that
        compares nothing never builds it."""
        if self._table is None:
            self._table = PagedTable(DIFF_COLUMNS, page_size=self._page_size, look=_look)
            self.result.children = (*self.result.children, self._table)
        return self._table

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
        self.other = None
        self.diff = pd.DataFrame()
        self.result.layout.display = "none"
        self.title.value = ""
        self.bars.children = ()

    def compare(self, other: str) -> None:
        """Compares the base checkpoint with ``other`` (a path) and shows the result.

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

        try:
            table = explore.diff_table(self.base, other, progress=progress)
        except Exception as e:
            self.result.layout.display = ""
            self.title.value = error_html(e, title="Cannot compare:")
            raise
        finally:
            self.progress.layout.display = "none"
        self.other = other
        self.diff = table
        counts = table["status"].value_counts()
        self.title.value = (
            f"<b>Changes</b> from <code>{html.escape(_name(self.base))}</code> to "
            f"<code>{html.escape(_name(other))}</code>: "
            + html.escape(", ".join(f"{n} {s}" for s, n in counts.items()))
            + "<br>"
            + note_html(
                "leaves most changed first: floating-point arrays by relative change "
                "‖b − a‖ / ‖a‖, then counters by how far they moved, then PRNG keys"
            )
        )
        self._show_bars()
        self.tree.show(table)
        self.table.show(table)
        self.result.layout.display = ""

    def _on_choice(self, change: Any) -> None:
        if change["new"]:
            self.compare(change["new"])
        else:
            self.clear()

    def _show_bars(self) -> None:
        if self.diff.empty:
            self.bars.children = ()
            return
        subtrees = subtree_changes(self.diff, int(self.depth.value)).head(MAX_BARS)
        finite = [r for r in subtrees["rel_change"] if math.isfinite(r)]
        top = max(finite, default=0.0) or 1.0
        rows = []
        for name, subtree, rel, leaves in subtrees.itertuples(index=False):
            label = f"{name} {subtree}".strip()
            bar = w.FloatProgress(
                value=min(1.0, rel / top) if math.isfinite(rel) else 1.0,
                min=0.0,
                max=1.0,
                layout=w.Layout(width="16em"),
            )
            rows.append(
                w.HBox(
                    [
                        w.Label(label, layout=w.Layout(width="20em"), tooltip=label),
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
