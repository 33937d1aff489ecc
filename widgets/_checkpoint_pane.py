"""The explorer's checkpoint pane: one checkpoint's leaves as a tree and a table,
its size by part, its soundness, what can be done with it, and its diff."""

from __future__ import annotations

import contextlib
import html
from typing import TYPE_CHECKING, Any

import ipywidgets as w
import pandas as pd

from tinax import explore
from tinax.vocabulary import COMPLETE

from ._data_check import DataCheck
from ._diff import DiffView
from ._export import ExportPanel
from ._guard import shown_in_widget
from ._soundness import verdict_html
from ._table import Column, PagedTable, format_cell
from ._text import error_html, format_bytes, note_html
from ._tree import TreeView, size_bar_html, size_breakdown

_VALUE_CHARS = 40
# A checkpoint of at least this many leaves shows their keys and kinds first and
# its shapes, dtypes, sizes and small values when they are read, in the background.
FILL_LATER_LEAVES = 2_000
# Columns of the leaf table that are empty until then.
_FILLED_LATER = ("shape", "dtype", "nbytes", "value")


def _format_value(value: Any) -> str:
    text = format_cell(value)
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 1] + "…"


def _format_key(value: Any) -> str:
    # A checkpointable that is a single leaf (an iterator, an array) has the empty key.
    return format_cell(value) or "(whole)"


LEAF_COLUMNS = (
    Column("key", "key", _format_key, key=True),
    Column("shape", "shape", descending_first=True),
    Column("dtype", "dtype"),
    Column("nbytes", "size", format_bytes, align="right", descending_first=True),
    Column("checkpointable", "checkpointable", essential=False, priority=1),
    Column("kind", "kind", essential=False, priority=2),
    Column("value", "value", _format_value, essential=False, priority=3),
)


class CheckpointPane:
    """The checkpoint pane of ``CheckpointExplorer``: opening a checkpoint and showing its leaves."""

    if TYPE_CHECKING:
        # The explorer's state and the other panes' widgets, shared through ``self``.
        checkpoint: str | None
        _opens: int

        def __getattr__(self, name: str) -> Any: ...

    def _build_checkpoint_pane(self, page_size: int) -> None:
        """Makes the checkpoint pane's widgets."""
        guard = shown_in_widget(self._show_error)
        self.leaf_title = w.HTML("")
        self.checkpointable_filter = w.Dropdown(
            options=[("all checkpointables", "")], value="", description="show"
        )
        self.key_filter = w.Text(
            value="", placeholder="key contains…", description="key", continuous_update=True
        )
        for control in (self.checkpointable_filter, self.key_filter):
            control.observe(guard(self._on_filter), names="value")
        self._page_size = page_size
        self._leaf_view: PagedTable | None = None
        self._tree_view: TreeView | None = None
        # The tree above the flat table, each as wide as the output; built with the
        # explorer (below), so that opening a checkpoint only fills them.
        self.leaf_tables = w.VBox([])
        self.size_bar = w.HTML("")
        self.verdict = w.HTML("")
        self.data_check = DataCheck(page_size=page_size)
        # What can be done with the open checkpoint, one button each, each action's
        # panel below the verdict.
        self.export_button = w.Button(
            description="export…", icon="download", tooltip="write its arrays as safetensors"
        )
        self.export_button.on_click(shown_in_widget(self._show_error)(self._on_export))
        self.export_box = w.VBox([])
        self.actions = w.HBox(
            [self.data_check.button, self.export_button],
            layout=w.Layout(flex_flow="row wrap", align_items="center"),
        )
        self.diff_view = DiffView(page_size=page_size, on_error=self._show_error)
        self.leaf_section = w.VBox(
            [
                self.leaf_title,
                self.size_bar,
                w.HBox(
                    [self.verdict, self.actions],
                    layout=w.Layout(flex_flow="row wrap", align_items="center"),
                ),
                self.data_check,
                self.export_box,
                self.diff_view,
                w.HBox(
                    [self.checkpointable_filter, self.key_filter],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                self.leaf_tables,
            ],
            layout=w.Layout(display="none"),
        )

    @property
    def leaf_view(self) -> PagedTable:
        """The open checkpoint's leaves as a flat table."""
        if self._leaf_view is None:
            self._build_leaf_tables()
        assert self._leaf_view is not None
        return self._leaf_view

    @property
    def tree_view(self) -> TreeView:
        """The open checkpoint's leaves as a tree."""
        if self._tree_view is None:
            self._build_leaf_tables()
        assert self._tree_view is not None
        return self._tree_view

    def _build_leaf_tables(self) -> None:
        guard = shown_in_widget(self._show_error)
        leaf_view = PagedTable(
            LEAF_COLUMNS, page_size=self._page_size, empty_text="no matching leaves"
        )
        leaf_view.observe(guard(self._on_pick_leaf), names="selected")
        tree_view = TreeView(page_size=self._page_size, on_error=self._show_error)
        tree_view.observe(guard(self._on_tree_pick), names="picked")
        self._leaf_view, self._tree_view = leaf_view, tree_view
        self.leaf_tables.children = (tree_view, leaf_view)

    def _open(self, path: str, name: str) -> None:
        self._close_checkpoint()
        self.error = ""
        self.message.value = ""
        with contextlib.ExitStack() as pause:
            # The cycle collector waits while the metadata is parsed and the tables
            # built: the millions of objects of a large checkpoint's metadata would set
            # it off again and again. A checkpoint filled in the background hands the
            # pause to the thread that fills it, so that the collection put off runs
            # there, not while the keys are being shown.
            pause.enter_context(explore.collector_paused())
            checkpoint = explore.open_leaves(path)
            keys = checkpoint.keys()
            if len(keys) >= FILL_LATER_LEAVES:
                self._show_leaves(path, name, keys, filling=True)
                self._fill_in_background(checkpoint, path, name, pause.pop_all())
                return
            self._show_leaves(path, name, checkpoint.table())
        # verify reads every metadata file again and walks the array stores: the
        # leaves are shown first, its verdict when it comes. Started last, because a
        # thread parsing metadata slows every widget update made beside it.
        self._in_background(lambda: self._show_verdict(path), "tinax-explorer-verdict")

    def _fill_in_background(
        self,
        checkpoint: explore.StagedLeaves,
        path: str,
        name: str,
        pause: contextlib.ExitStack,
    ) -> None:
        opened = self._opens

        def fill() -> None:
            failed = None
            try:
                with pause:
                    table = checkpoint.table()
            except Exception as e:
                failed = e
                with self._lock:
                    if self._opens == opened:
                        self.filling = False
                        self.size_bar.value = error_html(e, title="Cannot read shapes and sizes:")
            else:
                with self._lock:
                    if self._opens == opened:
                        self._fill(name, table)
            # The verdict after the fill: both parse metadata, and side by side each
            # would slow the other.
            self._show_verdict(path)
            if failed is not None:
                raise failed

        try:
            self._in_background(fill, "tinax-explorer-fill")
        except BaseException:
            pause.close()
            raise

    def _show_leaves(
        self, path: str, name: str, leaves: pd.DataFrame, *, filling: bool = False
    ) -> None:
        self.leaves = leaves
        self.checkpoint = path
        self.filling = filling
        # unique(): in order of first appearance, without a Python loop over the rows.
        names = [str(n) for n in leaves["checkpointable"].unique()]
        self.checkpointable_filter.options = [("all checkpointables", ""), *[(n, n) for n in names]]
        self.checkpointable_filter.value = ""
        self.key_filter.value = ""
        self._show_title(name)
        self.leaf_view.hold(_FILLED_LATER if filling else ())
        self.leaf_view.show(leaves)
        self.tree_view.show(leaves, sized=not filling)
        self.size_bar.value = (
            note_html("reading shapes and sizes…")
            if filling
            else size_bar_html(size_breakdown(self.tree_view.tree))
        )
        self.verdict.value = note_html("checking the checkpoint…")
        self.data_check.set_path(path)
        self.export_box.children = ()
        self.diff_view.set_base(path, self._comparable())
        self.leaf_section.layout.display = ""

    def _on_export(self, _button: Any = None) -> None:
        """Opens the export panel of the open checkpoint below the actions, or closes it."""
        if self.export_box.children:
            self.export_box.children = ()
        elif self.checkpoint is not None:
            self.export_box.children = (ExportPanel(self.checkpoint),)

    def _show_title(self, name: str) -> None:
        leaves = self.leaves
        count = leaves["checkpointable"].nunique()
        if self.filling:
            size = "reading shapes and sizes…"
        else:
            size = format_bytes(
                int(pd.to_numeric(leaves["nbytes"], errors="coerce").fillna(0).sum())
            )
            # The listing counts every file on disk; the leaves, the values they hold.
            rows = self.checkpoints[self.checkpoints["name"].astype(str) == name]
            if len(rows) and pd.notna(rows["nbytes"].iloc[0]):
                on_disk = format_bytes(rows["nbytes"].iloc[0])
                size += f" in arrays and state ({on_disk} on disk with metadata)"
        self.leaf_title.value = (
            f"<b>{html.escape(name)}</b>: {len(leaves):,} leaves in {count} "
            f"checkpointable{'s' if count != 1 else ''}, {html.escape(size)}"
        )

    def _fill(self, name: str, table: pd.DataFrame) -> None:
        """Puts the full leaf table in place of the keys shown while it was read."""
        same = table["checkpointable"].equals(self.leaves["checkpointable"]) and table[
            "key"
        ].equals(self.leaves["key"])
        if not same:
            # The checkpoint changed on disk since its keys were read: shown afresh.
            self._clear_leaf()
            self.leaf_view.selected = None
            self._show_leaves(str(self.checkpoint), name, table)
            return
        self.leaves = table
        self.filling = False
        self._show_title(name)
        self._apply_filter(keep_page=True)
        self.leaf_view.hold(())
        self.tree_view.fill(table)
        self.size_bar.value = size_bar_html(size_breakdown(self.tree_view.tree))

    def _show_verdict(self, path: str) -> None:
        text = verdict_html(path)
        with self._lock:
            if self.checkpoint == path:
                self.verdict.value = text

    def _close_checkpoint(self) -> None:
        self.checkpoint = None
        self.leaves = pd.DataFrame()
        self.filling = False
        self._opens += 1
        if self._leaf_view is not None and self._tree_view is not None:
            self._leaf_view.selected = None
            self._leaf_view.show(pd.DataFrame(columns=[c.field for c in LEAF_COLUMNS]))
            self._tree_view.show(pd.DataFrame(columns=["checkpointable", "key", "nbytes"]))
        self.size_bar.value = ""
        self.leaf_section.layout.display = "none"
        self.verdict.value = ""
        self.data_check.set_path(None)
        self.export_box.children = ()
        self.diff_view.set_base(None, [])
        self._clear_leaf()
        if self.checkpoint_view.selected is not None:
            label = self.checkpoint_view.selected
            if label not in self.checkpoints.index or (
                str(self.checkpoints.loc[label]["status"]) != COMPLETE
            ):
                self.checkpoint_view.selected = None

    def _on_filter(self, _change: Any) -> None:
        with self._lock:
            self._apply_filter(keep_page=False)

    def _apply_filter(self, *, keep_page: bool) -> None:
        leaves = self.leaves
        if leaves.empty:
            return
        mask = pd.Series(True, index=leaves.index)
        if self.checkpointable_filter.value:
            mask &= leaves["checkpointable"] == self.checkpointable_filter.value
        text = self.key_filter.value.strip()
        if text:
            mask &= leaves["key"].astype(str).str.contains(text, case=False, regex=False)
        self.leaf_view.show(leaves[mask], keep_page=keep_page)

    def _on_tree_pick(self, change: Any) -> None:
        label = change["new"]
        if label is None:
            return
        with self._lock:
            row = self.leaves.loc[label]
            self.open_leaf(str(row["checkpointable"]), str(row["key"]))
