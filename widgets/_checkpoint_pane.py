"""The explorer's checkpoint pane: one checkpoint's leaves as a tree or a table,
its size by part, its soundness, what can be done with it, and its diff.

(Over 500 lines: the leaves filled in the background, the verdict line that the
metadata check, a data check and the run's scan each add to, and the actions that
read both, answer one another's events under the explorer's one lock; the parts that
stand alone live beside it: ``_leaf_columns``, ``_soundness``, ``_export``,
``_surgery``.)"""

from __future__ import annotations

import contextlib
import html
from collections.abc import Callable
from typing import Any

import ipywidgets as w
import pandas as pd

from tinax.explore.display import key_matches
from tinax.explore.toolkit import StagedLeaves, collector_paused, open_leaves
from tinax.vocabulary import COMPLETE

from ._data_check import DataCheck
from ._diff import DiffView
from ._export import ExportPanel
from ._guard import shown_in_widget
from ._leaf_columns import LEAF_COLUMNS
from ._lineage_view import LineageView, same_place
from ._run_list import RunList
from ._section import Section
from ._services import Services
from ._soundness import verdict_html, verdict_span
from ._surgery import DerivePanel
from ._table import PagedTable
from ._text import error_html, format_bytes, note_html
from ._tree import TreeView, size_bar_html, size_breakdown

# A checkpoint of at least this many leaves shows their keys and kinds first and
# its shapes, dtypes, sizes and small values when they are read, in the background.
FILL_LATER_LEAVES = 2_000
# Columns of the leaf table that are empty until then.
_FILLED_LATER = ("shape", "dtype", "nbytes", "value")


TREE, TABLE = "tree", "table"


class CheckpointPane:
    """One checkpoint: the explorer's second pane.

    Its heading names the checkpoint, counts its leaves and bytes; below it a bar
    of its bytes by part, the verdict of ``verify`` and the actions ("check data",
    "export…"), each action's panel right under the actions, the diff against
    another checkpoint, and the leaves: as a tree with byte subtotals or as a flat
    table sortable by any column, narrowed by the "show" and "key" filters.
    Picking a leaf calls ``on_pick_leaf``.

    Attributes:
      section: The pane, folding away under its heading.
      checkpoint: Path of the open checkpoint, or ``None``.
      leaves: Its ``checkpoint_table`` (all rows); while ``filling``, keys and kinds only.
      filling: Whether its shapes and sizes are being read in the background.
      data_check, diff_view, export_button, derive_button, export_box: The actions and
        their panels ("export…" and "derive…" open theirs in ``export_box``).
      lineage: What a derived or averaged checkpoint was made from, in a line
        (``LineageView``): each source a link that opens it.
      data_section, diff_section: The sections of the data check and of the diff.
      checkpointable_filter, key_filter: The filters of the leaves (and of the diff).
      leaves_as: Shows the leaves as a ``"tree"`` or as a ``"table"``.
    """

    def __init__(
        self,
        services: Services,
        runs: RunList,
        *,
        page_size: int,
        diff_rows: int,
        on_open: Callable[[str | None], None],
        on_pick_leaf: Callable[[str, str], None],
        explore_elsewhere: Callable[[str], w.Widget],
    ) -> None:
        """Makes the pane's widgets (hidden until a checkpoint is opened).

        Args:
          services: The explorer's shared services.
          runs: The run list, for the sizes on disk and the checkpoints to compare with.
          page_size: Rows per page of the tables.
          diff_rows: Rows per page of the diff.
          on_open: Called, under the lock, with the checkpoint opened (``None``: closed).
          on_pick_leaf: Called, under the lock, with a leaf picked in the tree or table.
          explore_elsewhere: An explorer of the directory of a checkpoint outside the
            run, that checkpoint open (a derived checkpoint's source, followed).
        """
        self._services = services
        self._runs = runs
        self._on_open = on_open
        self._on_pick_leaf = on_pick_leaf
        self._page_size = page_size
        self.checkpoint: str | None = None
        self.leaves = pd.DataFrame()
        self.filling = False
        # Counts opens, so that a late fill of a checkpoint closed since is dropped.
        self._opens = 0
        self._name = ""
        self._from_diff = False
        guard = shown_in_widget(services.show_error)
        self.checkpointable_filter = w.Dropdown(
            options=[("all checkpointables", "")],
            value="",
            description="show",
            layout=w.Layout(width="auto", max_width="100%"),
        )
        self.key_filter = w.Text(
            value="",
            placeholder="key contains…",
            description="key",
            continuous_update=True,
            layout=w.Layout(width="auto", max_width="100%"),
        )
        for control in (self.checkpointable_filter, self.key_filter):
            control.observe(guard(self._on_filter), names="value")
        self.leaves_as = w.ToggleButtons(
            options=[("tree", TREE), ("table", TABLE)],
            value=TREE,
            tooltips=["subtrees with their sizes", "every leaf, sortable by any column"],
            style={"button_width": "5em"},
        )
        self.leaves_as.observe(guard(lambda _: self._show_view()), names="value")
        self._leaf_view: PagedTable | None = None
        self._tree_view: TreeView | None = None
        # The tree or the flat table, as wide as the output; built with the
        # explorer, so that opening a checkpoint only fills them.
        self.leaf_tables = w.VBox([])
        self.size_bar = w.HTML("")
        self.verdict = w.HTML("")
        self.data_check = DataCheck(
            page_size=diff_rows, on_start=self._on_data_check, on_done=self._on_data_checked
        )
        # verify's verdict: of metadata and what this process read of the data before
        # (a scan, a load), or of the data check.
        self._verdict_text = ""
        self.export_button = w.Button(
            description="export…", icon="download", tooltip="write its arrays as safetensors"
        )
        self.export_button.on_click(guard(self._on_export))
        self.derive_button = w.Button(
            description="derive…",
            icon="copy",
            tooltip="a new checkpoint from this one: params only, cast, some keys",
        )
        self.derive_button.on_click(guard(self._on_derive))
        self.lineage = LineageView(
            open_listed=self._open_listed,
            explore_elsewhere=explore_elsewhere,
            on_error=services.show_error,
        )
        # Each action's panel opens right under the row of buttons.
        self.export_box = w.VBox([])
        # The buttons first and the verdict after them, in a box of its own width: a
        # verdict that grows or shortens (checking…, the data check's, the scan's)
        # wraps inside that box, and never moves a button under the pointer.
        self.verdict.layout = w.Layout(flex="1 1 22em", min_width="0")
        self.actions = w.HBox(
            [self.data_check.button, self.export_button, self.derive_button, self.verdict],
            layout=w.Layout(flex_flow="row wrap", align_items="flex-start"),
        )
        self.data_section = Section("data check", "<b>Data check</b>", [self.data_check])
        self.data_section.show(False)
        self.diff_view = DiffView(page_size=diff_rows, on_error=services.show_error)
        self.diff_view.observe(guard(self._on_diff_pick), names="picked")
        self.diff_section = Section("diff", "<b>Compare</b>", [self.diff_view])
        self.section = Section(
            "checkpoint",
            "",
            [
                self.lineage,
                self.size_bar,
                self.actions,
                self.export_box,
                self.data_section,
                self.diff_section,
                w.HBox(
                    [self.leaves_as, self.checkpointable_filter, self.key_filter],
                    layout=w.Layout(flex_flow="row wrap", align_items="center"),
                ),
                self.leaf_tables,
            ],
        )
        self.section.show(False)
        self._build_leaf_tables()

    # -- public ---------------------------------------------------------------------

    @property
    def leaf_view(self) -> PagedTable:
        """The open checkpoint's leaves as a flat table."""
        assert self._leaf_view is not None
        return self._leaf_view

    @property
    def tree_view(self) -> TreeView:
        """The open checkpoint's leaves as a tree."""
        assert self._tree_view is not None
        return self._tree_view

    def open(self, path: str, name: str) -> None:
        """Opens a checkpoint: its leaves at once, its verdict from the background."""
        self._clear()
        self._services.note("", "")
        with contextlib.ExitStack() as pause:
            # The cycle collector waits while the metadata is parsed and the tables
            # built: the millions of objects of a large checkpoint's metadata would set
            # it off again and again. A checkpoint filled in the background hands the
            # pause to the thread that fills it, so that the collection put off runs
            # there, not while the keys are being shown.
            pause.enter_context(collector_paused())
            # Opened by the run's deep listing already (kept while unchanged): its
            # metadata is not parsed again.
            checkpoint = open_leaves(self._runs.opened(path) or path)
            keys = checkpoint.keys()
            if len(keys) >= FILL_LATER_LEAVES:
                self._show_leaves(path, name, keys, filling=True, opened=checkpoint.checkpoint)
                self._fill_in_background(checkpoint, path, name, pause.pop_all())
                return
            self._show_leaves(path, name, checkpoint.table(), opened=checkpoint.checkpoint)
        # verify reads every metadata file again and walks the array stores: the
        # leaves are shown first, its verdict when it comes. Started last, because a
        # thread parsing metadata slows every widget update made beside it.
        opened = checkpoint.checkpoint
        self._services.in_background(
            lambda: self._show_verdict(path, opened), "tinax-explorer-verdict"
        )

    def close(self) -> None:
        """Shows no checkpoint."""
        self._clear()
        self._on_open(None)

    def _clear(self) -> None:
        self.checkpoint = None
        self.leaves = pd.DataFrame()
        self.filling = False
        self._opens += 1
        self._name = ""
        self.leaf_view.selected = None
        self.leaf_view.show(pd.DataFrame(columns=[c.field for c in LEAF_COLUMNS]))
        self.tree_view.show(pd.DataFrame(columns=["checkpointable", "key", "nbytes"]))
        self.size_bar.value = ""
        self.section.show(False)
        self.verdict.value = ""
        self.lineage.show(None)
        self.data_check.set_path(None)
        self.data_section.show(False)
        self.export_box.children = ()
        self.diff_view.set_base(None, [])

    def set_comparable(self) -> None:
        """Offers the run's complete checkpoints, as listed now, to compare with."""
        self.diff_view.set_base(self.checkpoint, self._runs.comparable())

    def reveal_in_tree(self, checkpointable: str, key: str) -> None:
        """Opens the tree down to a leaf picked in the flat table, so that the tree
        shows where it sits; a leaf opened from the diff leaves the tree as it is
        (the diff already says where it sits, and the page stays short)."""
        if self._from_diff:
            return
        self.tree_view.expand(checkpointable, key)

    def find_leaf(self, checkpointable: str, key: str) -> Any:
        """The leaf table's label of a leaf of the open checkpoint, shown in the table.

        Raises:
          ValueError: If no checkpoint is open or it has no such leaf.
        """
        if self.checkpoint is None:
            raise ValueError("no checkpoint is open")
        leaves = self.leaves
        rows = leaves[(leaves["checkpointable"] == checkpointable) & (leaves["key"] == key)]
        if rows.empty:
            raise ValueError(f"the open checkpoint has no leaf {checkpointable!r} {key}")
        label = rows.index[0]
        if label not in self.leaf_view.frame.index:
            self.checkpointable_filter.value = ""
            self.key_filter.value = ""
        self.leaf_view.show_row(label)
        return label

    # -- opening --------------------------------------------------------------------

    def _build_leaf_tables(self) -> None:
        guard = shown_in_widget(self._services.show_error)
        leaf_view = PagedTable(
            LEAF_COLUMNS, page_size=self._page_size, empty_text="no matching leaves"
        )
        leaf_view.observe(guard(self._on_table_pick), names="selected")
        leaf_view.add_class("tinax-leaf-table")
        tree_view = TreeView(page_size=self._page_size, on_error=self._services.show_error)
        tree_view.observe(guard(self._on_tree_pick), names="picked")
        self._leaf_view, self._tree_view = leaf_view, tree_view
        self._show_view()

    def _show_view(self) -> None:
        shown = self.tree_view if self.leaves_as.value == TREE else self.leaf_view
        self.leaf_tables.children = (shown,)

    def _fill_in_background(
        self,
        checkpoint: StagedLeaves,
        path: str,
        name: str,
        pause: contextlib.ExitStack,
    ) -> None:
        opened = self._opens
        lock = self._services.lock

        def fill() -> None:
            failed = None
            try:
                with pause:
                    table = checkpoint.table()
            except Exception as e:
                failed = e
                with lock:
                    if self._opens == opened:
                        self.filling = False
                        self.size_bar.value = error_html(e, title="Cannot read shapes and sizes:")
            else:
                with lock:
                    if self._opens == opened:
                        self._fill(name, table)
            # The verdict after the fill: both parse metadata, and side by side each
            # would slow the other.
            self._show_verdict(path, checkpoint.checkpoint)
            if failed is not None:
                raise failed

        try:
            self._services.in_background(fill, "tinax-explorer-fill")
        except BaseException:
            pause.close()
            raise

    def _show_leaves(
        self,
        path: str,
        name: str,
        leaves: pd.DataFrame,
        *,
        filling: bool = False,
        opened: Any = None,
    ) -> None:
        """Shows the leaves of the checkpoint at ``path`` (``opened``: as opened for them,
        read through by what else is shown of it; else it is opened afresh)."""
        self.leaves = leaves
        self.checkpoint = path
        self.filling = filling
        self._name = name
        # unique(): in order of first appearance, without a Python loop over the rows.
        names = [str(n) for n in leaves["checkpointable"].unique()]
        self.checkpointable_filter.options = [("all checkpointables", ""), *[(n, n) for n in names]]
        self.checkpointable_filter.value = ""
        self.key_filter.value = ""
        self._show_title()
        self.leaf_view.hold(_FILLED_LATER if filling else ())
        self.leaf_view.show(leaves)
        self.tree_view.show(leaves, sized=not filling)
        self.size_bar.value = (
            note_html("reading shapes and sizes…")
            if filling
            else size_bar_html(size_breakdown(self.tree_view.tree))
        )
        self._verdict_text = ""
        self.verdict.value = note_html("checking the checkpoint…")
        self.lineage.show(path, opened)
        self.data_check.set_path(path)
        self.export_box.children = ()
        self.set_comparable()
        self.section.show(True)
        self._on_open(path)

    def _show_title(self) -> None:
        leaves, name = self.leaves, self._name
        count = leaves["checkpointable"].nunique()
        if self.filling:
            size = "reading shapes and sizes…"
        else:
            size = format_bytes(
                int(pd.to_numeric(leaves["nbytes"], errors="coerce").fillna(0).sum())
            )
            # The listing counts every file on disk; the leaves, the values they hold.
            on_disk = self._runs.bytes_on_disk(name)
            if on_disk is not None:
                size += f" in arrays and state ({format_bytes(on_disk)} on disk with metadata)"
        self.section.set_title(
            f'<span class="tinax-checkpoint-title"><b>{html.escape(name)}</b>: '
            f"{len(leaves):,} leaves in {count} "
            f"checkpointable{'s' if count != 1 else ''}, {html.escape(size)}</span>"
        )

    def _fill(self, name: str, table: pd.DataFrame) -> None:
        """Puts the full leaf table in place of the keys shown while it was read."""
        same = table["checkpointable"].equals(self.leaves["checkpointable"]) and table[
            "key"
        ].equals(self.leaves["key"])
        if not same:
            # The checkpoint changed on disk since its keys were read: shown afresh.
            self.leaf_view.selected = None
            self._show_leaves(str(self.checkpoint), name, table)
            return
        self.leaves = table
        self.filling = False
        self._show_title()
        self._apply_filter(keep_page=True)
        self.leaf_view.hold(())
        self.tree_view.fill(table)
        self.size_bar.value = size_bar_html(size_breakdown(self.tree_view.tree))

    def _show_verdict(self, path: str, opened: Any = None) -> None:
        text = verdict_html(path if opened is None else opened)
        with self._services.lock:
            if self.checkpoint == path:
                self._verdict_text = text
                self._render_verdict()

    def show_scan(self) -> None:
        """Says what the run's scan found: the open checkpoint's verdict is read again
        (the library remembers what the scan counted), and each one opened later's is."""
        path = self.checkpoint
        if path is not None:
            self._services.in_background(lambda: self._show_verdict(path), "tinax-explorer-verdict")
        self._services.in_background(self._runs.refresh, "tinax-explorer-relist")

    def _render_verdict(self) -> None:
        self.verdict.value = self._verdict_text

    def _on_data_checked(self, path: str, result: Any) -> None:
        # The data read says more than the metadata: the verdict line follows it.
        with self._services.lock:
            if path == self.checkpoint:
                self._verdict_text = verdict_span(result, css_class="tinax-verdict")
                self._render_verdict()
        # The list (and the timeline, read again) say the health the check found.
        self._services.in_background(self._runs.refresh, "tinax-explorer-relist")

    # -- actions --------------------------------------------------------------------

    def _toggle_panel(self, kind: type, make: Callable[[str], w.Widget]) -> None:
        """Opens a panel of ``kind`` for the open checkpoint under the actions (made by
        ``make``), or closes the one that is open."""
        if self.export_box.children and isinstance(self.export_box.children[0], kind):
            self.export_box.children = ()
        elif self.checkpoint is not None:
            self.export_box.children = (make(self.checkpoint),)

    def _on_export(self, _button: Any = None) -> None:
        # The panel asks the library what is known of the checkpoint's NaN and Inf.
        self._toggle_panel(ExportPanel, ExportPanel)

    def _on_derive(self, _button: Any = None) -> None:
        self._toggle_panel(DerivePanel, lambda path: DerivePanel(path, on_done=self._open_new))

    def _open_listed(self, path: str) -> bool:
        """Opens the complete checkpoint of the run at ``path``; whether there is one."""
        table = self._runs.checkpoints
        if table.empty:
            return False
        done = table[table["status"] == COMPLETE]
        found = [p for p in done.index if same_place(str(p), path)]
        if not found:
            return False
        self._runs.open_checkpoint(found[0])
        return True

    def _open_new(self, path: str) -> None:
        """Opens a checkpoint just written from this one (see ``RunList.open_written``)."""
        self._runs.open_written(path)

    def _on_data_check(self) -> None:
        self.data_section.show(True)
        self.data_section.set_open(True)

    # -- filters and picks ----------------------------------------------------------

    def _on_filter(self, _change: Any) -> None:
        with self._services.lock:
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
            # Found typed dotted (blocks.7, as keys are shown) or as a keystr.
            mask &= pd.Series(key_matches(leaves["key"].astype(str), text), index=leaves.index)
        self.leaf_view.show(leaves[mask], keep_page=keep_page)
        if not keep_page:
            # The tree narrows with the table (its subtotals are of what is shown),
            # opened down to the leaves found when they are few.
            self.tree_view.narrow(None if bool(mask.all()) else leaves.index[mask])
        self.diff_view.narrow(self.checkpointable_filter.value, text)

    def _on_table_pick(self, change: Any) -> None:
        label = change["new"]
        with self._services.lock:
            if label is None or self.checkpoint is None:
                return
            row = self.leaves.loc[label]
            self._on_pick_leaf(str(row["checkpointable"]), str(row["key"]))

    def _on_diff_pick(self, change: Any) -> None:
        if change["new"] is not None:
            # A row of the diff opens its leaf, as a click in the table does.
            self._from_diff = True
            try:
                self.leaf_view.selected = self.find_leaf(*change["new"])
            finally:
                self._from_diff = False

    def _on_tree_pick(self, change: Any) -> None:
        label = change["new"]
        if label is None:
            return
        with self._services.lock:
            row = self.leaves.loc[label]
            checkpointable, key = str(row["checkpointable"]), str(row["key"])
        # Through the table's pick, as a click there: one way to open a leaf.
        self.leaf_view.selected = self.find_leaf(checkpointable, key)
