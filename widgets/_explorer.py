"""Browsing a run: its checkpoints, one checkpoint's leaves, one leaf's values."""

from __future__ import annotations

import contextlib
import html
import math
import os
import threading
import time
from typing import Any

import ipywidgets as w
import numpy as np
import pandas as pd
import traitlets

from tinax import explore
from tinax.explore import LeafStatistics, is_numeric, leaf_statistics
from tinax.vocabulary import ARRAY_KINDS, COMPLETE, IN_PROGRESS, INTERRUPTED, SCALAR, STRING

from ._data_check import DataCheck
from ._diff import DiffView
from ._guard import shown_in_widget
from ._histogram import histogram_png
from ._history import HISTORY_COLUMNS, history_png, leaf_history
from ._interrupted import InterruptedSaves
from ._soundness import verdict_html
from ._table import Column, PagedTable, RowLook, format_cell
from ._text import error_html, format_age, format_bytes, note_html
from ._tree import TreeView, size_bar_html, size_breakdown

DEFAULT_POLL_SECONDS = 2.0
_VALUE_CHARS = 40
# Arrays this small show their values (a PRNG key's data, a bias, a step count).
SMALL_ARRAY = 64
# A checkpoint of at least this many leaves shows their keys and kinds first and
# its shapes, dtypes, sizes and small values when they are read, in the background.
FILL_LATER_LEAVES = 2_000
# Columns of the leaf table that are empty until then.
_FILLED_LATER = ("shape", "dtype", "nbytes", "value")


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


def _format_value(value: Any) -> str:
    text = format_cell(value)
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 1] + "…"


def _format_number(value: float | int | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.6g}"


def _image_layout(**extra: str) -> w.Layout:
    # Never stretched by its row (a flex row stretches its items to the tallest one),
    # and scaled down whole, keeping its aspect ratio, when the notebook is narrow.
    return w.Layout(
        align_self="flex-start",
        flex="0 1 auto",
        max_width="100%",
        height="auto",
        object_fit="contain",
        **extra,
    )


def _checkpoint_look(row: pd.Series) -> RowLook:
    status = str(row.get("status", ""))
    if status == COMPLETE:
        return RowLook()
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


CHECKPOINT_COLUMNS = (
    Column("name", "checkpoint", key=True),
    Column("step", "step", align="right", descending_first=True),
    Column("status", "status"),
    Column("nbytes", "size on disk", format_bytes, align="right", descending_first=True),
    Column("age", "age", format_age, align="right", essential=False, priority=1),
    Column("committed", "committed (UTC)", _format_time, essential=False, priority=3),
    Column("checkpointables", "checkpointables", _format_names, essential=False, priority=2),
)


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


def _itemsize(dtype: Any) -> float:
    try:
        return np.dtype(str(dtype)).itemsize
    except TypeError:
        return math.nan  # a dtype NumPy does not know: its size is not shown


def statistics_html(stats: LeafStatistics) -> str:
    """The statistics of one leaf as a small two-column HTML table."""
    rows = [
        ("shape", format_cell(stats.shape)),
        ("dtype", stats.dtype),
        ("elements", f"{stats.size:,}"),
        ("size", format_bytes(stats.size * _itemsize(stats.dtype))),
        ("min", _format_number(stats.minimum)),
        ("max", _format_number(stats.maximum)),
        ("mean", _format_number(stats.mean)),
        ("std", _format_number(stats.std)),
        ("NaN", f"{stats.nan_count:,}"),
        ("Inf", f"{stats.inf_count:,}"),
    ]
    cells = "".join(
        f'<tr><th style="text-align:left;padding-right:1em">{html.escape(k)}</th>'
        f'<td style="font-family:monospace" data-stat="{html.escape(k)}">{html.escape(v)}</td></tr>'
        for k, v in rows
    )
    return f'<table class="tinax-leaf-stats">{cells}</table>'


def values_html(value: Any) -> str:
    """A small array's values, as NumPy prints them."""
    array = np.asarray(value)
    try:
        text = np.array2string(array, max_line_width=96, threshold=SMALL_ARRAY, separator=", ")
    except (TypeError, ValueError):
        text = repr(array.tolist())
    return f'<pre class="tinax-leaf-values" style="margin:0 0 4px 0">{html.escape(text)}</pre>'


class CheckpointExplorer(w.VBox):
    """Browse a run: its checkpoints, one checkpoint's leaves, one leaf's statistics.

    Checkpoints are listed newest first; a step range narrows the list and "go to
    step" opens the checkpoint of a step. The first listing walks the run without
    parsing metadata, so that a long run shows at once; a background thread then
    reads each checkpoint's metadata and marks those that cannot be read.
    Checkpoints still being written, interrupted saves and directories that
    cannot be read are listed with their status and age and cannot be opened; an
    interrupted save can be removed, after a confirmation.

    An open checkpoint shows a bar of its bytes by part (model, optimizer state,
    the rest), and its leaves both as a tree of subtrees with leaf counts and byte
    subtotals (``tree_view``) and as a flat table sortable by any column, with a
    page jump (``leaf_view``). Picking a leaf reads only that leaf's bytes: arrays
    of up to 64 elements show their values, larger ones their statistics and a
    histogram (on a log scale if asked); "across the run" reads that one leaf from
    every complete checkpoint and plots its norm, mean and max against step.
    Refresh re-lists the run; ``poll_interval`` (or the "watch" checkbox) re-lists
    it periodically from a daemon thread. ``wait`` waits for background work.

    A checkpoint of many leaves (``FILL_LATER_LEAVES``) shows its leaves' keys and
    kinds as soon as its metadata is parsed, and says it is "reading shapes and
    sizes…" while a background thread reads them from the array store; then the
    tables, the tree's subtotals and the size bar are filled in place. Meanwhile
    ``filling`` is true, sizes read "…", and a sort by a column not read yet
    waits for it.

    Attributes:
      checkpoint: Path of the open checkpoint, or ``None``.
      leaf: ``(checkpointable, key)`` of the picked leaf, or ``None``.
      error: The last error shown in the widget, or ``""``.
      poll_interval: Seconds between automatic refreshes; ``0`` turns polling off.
      checkpoints: The run's ``list_checkpoints`` table.
      leaves: The open checkpoint's ``checkpoint_table`` (all rows, unfiltered);
        while ``filling``, the same rows with keys and kinds only.
      filling: Whether the open checkpoint's shapes and sizes are being read
        (``wait`` waits for them).
      statistics: The picked leaf's ``LeafStatistics``, or ``None``.
      leaf_value: The picked leaf's value as read, or ``None``.
      history: The picked leaf's norm, mean and max at every complete checkpoint
        (``leaf_history``), once "across the run" has read them; else empty.
    """

    checkpoint = traitlets.Unicode(None, allow_none=True)
    leaf = traitlets.Any(None, allow_none=True)
    error = traitlets.Unicode("")
    # Any, so that the validator (not the trait type) says what is wrong with a value.
    poll_interval = traitlets.Any(0.0)

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        poll_interval: float = 0.0,
        page_size: int = 20,
    ) -> None:
        """Lists the checkpoints under ``root``.

        Args:
          root: A run directory, or one checkpoint.
          poll_interval: Seconds between automatic refreshes; ``0`` for none.
          page_size: Rows per page in the tables.

        Raises:
          TypeError: If ``root`` is not a path.
          FileNotFoundError: If ``root`` does not exist.
          ValueError: If ``poll_interval`` is negative.
        """
        self._root = explore.existing_directory(root, what="run directory")
        # The header shows the path as given; everything else uses the checked one.
        self.root = str(self._root)
        poll_interval = self._valid_poll_interval({"value": poll_interval})
        self._lock = threading.RLock()
        self._stop_polling = threading.Event()
        self._poller: threading.Thread | None = None
        self._background: list[threading.Thread] = []
        # Listings finish out of order (a background check, a refresh): the last
        # one started is the one shown.
        self._listings_started = 0
        self._listing_shown = 0
        self.checkpoints = pd.DataFrame()
        self.leaves = pd.DataFrame()
        self.filling = False
        # Counts opens, so that a late fill of a checkpoint closed since is dropped.
        self._opens = 0
        self.statistics: LeafStatistics | None = None
        self.leaf_value: Any = None
        self.history = pd.DataFrame(columns=list(HISTORY_COLUMNS))
        self._history_stop = threading.Event()

        guard = shown_in_widget(self._show_error)
        self.refresh_button = w.Button(description="Refresh", icon="refresh")
        self.refresh_button.on_click(guard(lambda _: self.refresh()))
        self.watch_box = w.Checkbox(
            value=poll_interval > 0, description="watch for new checkpoints", indent=False
        )
        self.watch_box.observe(guard(self._on_watch), names="value")
        self.summary = w.Label("")
        self.message = w.HTML("")
        self.interrupted = InterruptedSaves(on_removed=self.refresh)

        self.checkpoint_view = PagedTable(
            CHECKPOINT_COLUMNS,
            page_size=page_size,
            look=_checkpoint_look,
            empty_text="no checkpoints yet",
            sort_field="step",
            ascending=False,
        )
        self.checkpoint_view.observe(guard(self._on_pick_checkpoint), names="selected")
        self.step_range = w.IntRangeSlider(
            value=(0, 0),
            min=0,
            max=0,
            description="steps",
            continuous_update=False,
            layout=w.Layout(width="32em", display="none"),
        )
        self.step_range.observe(guard(self._on_step_range), names="value")
        self.step_box = w.IntText(value=0, description="go to step", layout=w.Layout(width="14em"))
        self._offered_step = 0
        self.go_button = w.Button(description="Go", tooltip="open the checkpoint of this step")
        self.go_button.layout = w.Layout(width="5em")
        self.go_button.on_click(guard(lambda _: self.go_to_step(int(self.step_box.value))))
        self.run_controls = w.HBox([self.step_range, self.step_box, self.go_button])

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
        # What can be done with the open checkpoint, one button each. Another action
        # (an export, say) adds its button here and its panel below ``data_check``.
        self.actions = w.HBox(
            [self.data_check.button], layout=w.Layout(flex_flow="row wrap", align_items="center")
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
                self.diff_view,
                w.HBox(
                    [self.checkpointable_filter, self.key_filter],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                self.leaf_tables,
            ],
            layout=w.Layout(display="none"),
        )

        self.leaf_heading = w.HTML("")
        self.values = w.HTML("")
        self.stats_html = w.HTML("")
        self.histogram = w.Image(format="png", layout=_image_layout(display="none"))
        self.histogram.add_class("tinax-histogram")
        self.log_box = w.Checkbox(
            value=False, description="log scale", indent=False, layout=w.Layout(display="none")
        )
        self.log_box.observe(guard(lambda _: self._draw_histogram()), names="value")
        self.history_button = w.Button(
            description="across the run",
            icon="line-chart",
            tooltip="this leaf's norm, mean and max at every complete checkpoint",
        )
        self.history_button.on_click(guard(lambda _: self.show_history()))
        self.history_status = w.Label("")
        self.history_image = w.Image(format="png", layout=_image_layout())
        # Holds the image only while there is a history to show: an empty image is
        # still an element of the page.
        self.history_box = w.Box([])
        self.leaf_panel = w.VBox(
            [
                self.leaf_heading,
                self.values,
                w.HBox(
                    [self.stats_html, w.VBox([self.histogram, self.log_box])],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                w.HBox([self.history_button, self.history_status]),
                self.history_box,
            ],
            layout=w.Layout(display="none"),
        )

        super().__init__(
            children=[
                w.HTML(f"<b>Run</b> <code>{html.escape(os.fspath(root))}</code>"),
                w.HBox(
                    [self.refresh_button, self.watch_box, self.summary],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                self.message,
                self.run_controls,
                self.checkpoint_view,
                self.interrupted,
                self.leaf_section,
                self.leaf_panel,
            ]
        )
        self.add_class("tinax-checkpoint-explorer")
        self.observe(guard(self._on_poll_interval), names="poll_interval")
        self.refresh(deep=False)
        self._build_leaf_tables()
        self.poll_interval = poll_interval

    # -- public ---------------------------------------------------------------------

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

    def refresh(self, *, deep: bool = True) -> None:
        """Re-lists the run's checkpoints, keeping the open checkpoint if it is still there.

        Args:
          deep: Whether checkpoints not read before are read (metadata only) to
            tell whether they can be opened. ``False`` lists at the speed of a
            walk of the run and leaves that check to a background thread.
        """
        with self._lock:
            self._listings_started += 1
            number = self._listings_started
        table = explore.list_checkpoints(self.root, deep=deep)
        with self._lock:
            if number < self._listing_shown:
                return  # A listing started later is already shown.
            self._listing_shown = number
            self._show_listing(table)
        if table.attrs.get("unchecked"):
            self._in_background(self._check_listing, "tinax-explorer-check")

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for the work started in the background (the run's check, a leaf's
        history across the run); returns whether it has all finished."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                running = [t for t in self._background if t.is_alive()]
                self._background = running
            if not running:
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            running[0].join(left)

    def go_to_step(self, step: int) -> None:
        """Opens the complete checkpoint of ``step``, or the nearest one, and shows its row.

        Raises:
          TypeError: If ``step`` is not an int.
          ValueError: If the run has no complete checkpoint with a step.
        """
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"a step is an int, got {type(step).__name__}")
        table = self.checkpoints
        done = table[(table["status"] == COMPLETE) & table["step"].notna()] if len(table) else table
        if done.empty:
            raise ValueError(f"no complete checkpoint with a step in {str(self.root)!r}")
        steps = done["step"].astype("int64")
        distance = (steps - step).abs()
        # The nearest step; of two as near, the earlier.
        label = distance.sort_values(kind="stable").index[0]
        found = int(steps.loc[label])
        self.open_checkpoint(label)
        if found != step:
            self.message.value = note_html(
                f"no complete checkpoint at step {step:,}; opened step {found:,}, the nearest"
            )

    def open_checkpoint(self, name_or_path: str | os.PathLike[str]) -> None:
        """Opens a listed checkpoint, as if its row had been clicked.

        Raises:
          ValueError: If no listed checkpoint has that name or path.
        """
        wanted = os.fspath(name_or_path)
        table = self.checkpoints
        rows = table[(table["name"].astype(str) == wanted) | (table.index == wanted)]
        if rows.empty:
            raise ValueError(f"no checkpoint {wanted!r} in {str(self.root)!r}")
        label = rows.index[0]
        if label not in self.checkpoint_view.frame.index:
            self.step_range.value = (self.step_range.min, self.step_range.max)
        self.checkpoint_view.show_row(label)
        self.checkpoint_view.selected = label

    def open_leaf(self, checkpointable: str, key: str) -> None:
        """Picks a leaf of the open checkpoint, as if its row had been clicked.

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
        self.leaf_view.selected = label

    def show_history(self) -> None:
        """Reads the picked leaf from every complete checkpoint of the run, in the
        background, and plots its norm, mean and max against step (``wait`` waits).

        Raises:
          ValueError: If no leaf is picked.
        """
        with self._lock:
            if self.leaf is None or self.checkpoint is None:
                raise ValueError("pick a leaf first")
            checkpointable, key = self.leaf
            self._history_stop.set()
            stop = self._history_stop = threading.Event()
            listing = self.checkpoints
            self.history_status.value = "reading…"
            self.history_box.children = ()

        def progress(done: int, total: int) -> None:
            if not stop.is_set():
                self.history_status.value = f"read {done:,} of {total:,} checkpoints…"

        def work() -> None:
            try:
                table = leaf_history(listing, checkpointable, key, progress=progress, stop=stop)
                png = history_png(table, title=f"{checkpointable} {key}")
            except Exception as e:
                if not stop.is_set():
                    self.history_status.value = f"⚠ {type(e).__name__}: {e}"
                raise
            with self._lock:
                if stop.is_set():
                    return  # Another leaf was picked meanwhile.
                self.history = table
                failed = int((table["error"] != "").sum())
                parts = [f"{len(table) - failed:,} checkpoints read"]
                if failed:
                    parts.append(f"{failed:,} without this leaf or unreadable")
                self.history_status.value = " · ".join(parts)
                if png:
                    self.history_image.value = png
                    self.history_box.children = (self.history_image,)

        self._in_background(work, "tinax-explorer-history")

    def close(self) -> None:
        """Stops polling and closes the widget."""
        # Also called from __del__, possibly on an instance whose __init__ failed.
        data_check = getattr(self, "data_check", None)
        if data_check is not None:
            data_check.cancel()
        for name in ("_stop_polling", "_history_stop"):
            stop = getattr(self, name, None)
            if stop is not None:
                stop.set()
        super().close()

    # -- checkpoints ----------------------------------------------------------------

    def _in_background(self, work: Any, name: str) -> None:
        guarded = shown_in_widget(self._show_error)(work)
        thread = threading.Thread(target=guarded, name=name, daemon=True)
        with self._lock:
            self._background.append(thread)
        thread.start()

    def _check_listing(self) -> None:
        # Deep, so it remembers each verdict: later listings are quick and exact.
        self.refresh(deep=True)

    def _show_listing(self, table: pd.DataFrame) -> None:
        table = table.set_index(table["path"].astype(str), drop=False)
        table.index.name = None
        changed = not self._same_listing(self.checkpoints, table)
        self.checkpoints = table
        counts = table["status"].value_counts() if len(table) else pd.Series(dtype=int)
        parts = [f"{len(table)} checkpoint{'s' if len(table) != 1 else ''}"]
        parts += [f"{n} {status}" for status, n in counts.items() if status != COMPLETE]
        unchecked = len(table.attrs.get("unchecked", ()))
        if unchecked:
            parts.append(f"checking {unchecked:,} that have not been read yet…")
        self.summary.value = " · ".join(parts)
        if changed:
            self._update_step_range(table)
            self.checkpoint_view.show(self._in_step_range(table), keep_page=True)
            self.diff_view.set_base(self.checkpoint, self._comparable())
        self.interrupted.update(table)
        if self.checkpoint is not None:
            still = table[table["path"].astype(str) == self.checkpoint]
            if still.empty or str(still.iloc[0]["status"]) != COMPLETE:
                self._close_checkpoint()
                self.message.value = note_html(
                    "the open checkpoint is gone from the run", color="#8a6d00"
                )

    def _update_step_range(self, table: pd.DataFrame) -> None:
        steps = table["step"].dropna() if len(table) else pd.Series(dtype="Int64")
        if steps.empty:
            self.step_range.layout.display = "none"
            return
        low, high = int(steps.min()), int(steps.max())
        # "go to step" offers the newest step until the reader types another.
        if self.step_box.value in (0, self._offered_step):
            self.step_box.value = high
        self._offered_step = high
        slider = self.step_range
        was_all = slider.layout.display == "none" or slider.value == (slider.min, slider.max)
        old_low, old_high = slider.value
        with self.hold_trait_notifications(), slider.hold_trait_notifications():
            # Widened first, so that neither bound is clamped against the other.
            slider.min, slider.max = min(slider.min, low), max(slider.max, high)
            value = (low, high) if was_all else (max(low, old_low), min(high, old_high))
            slider.value = value if value[0] <= value[1] else (low, high)
            slider.min, slider.max = low, high
        slider.layout.display = ""

    def _in_step_range(self, table: pd.DataFrame) -> pd.DataFrame:
        slider = self.step_range
        if slider.layout.display == "none" or slider.value == (slider.min, slider.max):
            return table
        low, high = slider.value
        steps = table["step"]
        return table[steps.notna() & (steps >= low) & (steps <= high)].copy()

    def _on_step_range(self, _change: Any) -> None:
        with self._lock:
            if not self.checkpoints.empty:
                self.checkpoint_view.show(self._in_step_range(self.checkpoints))

    def _comparable(self) -> list[tuple[str, str]]:
        table = self.checkpoints
        if table.empty:
            return []
        done = table[table["status"] == COMPLETE]
        return [(str(n), str(p)) for n, p in zip(done["name"], done["path"], strict=True)]

    @staticmethod
    def _same_listing(old: pd.DataFrame, new: pd.DataFrame) -> bool:
        fields = ["path", "status", "nbytes", "committed"]
        if list(old.index) != list(new.index) or not {*fields, "age"} <= set(old.columns):
            return False
        # Ages change all the time; the table is redrawn when their shown text does.
        if list(old["age"].map(format_age)) != list(new["age"].map(format_age)):
            return False
        return bool(old[fields].astype(str).equals(new[fields].astype(str)))

    def _show_error(self, error: BaseException) -> None:
        self.error = f"{type(error).__name__}: {error}"
        self.message.value = error_html(error)

    def _on_pick_checkpoint(self, change: Any) -> None:
        label = change["new"]
        with self._lock:
            if label is None:
                return
            row = self.checkpoints.loc[label]
            if str(row["status"]) != COMPLETE:
                # Buttons of such rows are disabled; this guards programmatic picks.
                self.checkpoint_view.selected = None
                self.message.value = note_html(
                    f"{row['name']} is {row['status']}; it is not opened", color="#8a6d00"
                )
                return
            self._open(str(row["path"]), str(row["name"]))

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
        self.diff_view.set_base(path, self._comparable())
        self.leaf_section.layout.display = ""

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
        self.diff_view.set_base(None, [])
        self._clear_leaf()
        if self.checkpoint_view.selected is not None:
            label = self.checkpoint_view.selected
            if label not in self.checkpoints.index or (
                str(self.checkpoints.loc[label]["status"]) != COMPLETE
            ):
                self.checkpoint_view.selected = None

    # -- leaves ---------------------------------------------------------------------

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

    def _clear_leaf(self) -> None:
        self.leaf = None
        self.statistics = None
        self.leaf_value = None
        self.leaf_panel.layout.display = "none"
        self.histogram.layout.display = "none"
        self.log_box.layout.display = "none"
        self.stats_html.value = ""
        self.values.value = ""
        self._history_stop.set()
        self.history = pd.DataFrame(columns=list(HISTORY_COLUMNS))
        self.history_status.value = ""
        self.history_box.children = ()

    def _draw_histogram(self) -> None:
        stats = self.statistics
        key = "" if self.leaf is None else self.leaf[1]
        png = b""
        if stats is not None:
            png = histogram_png(stats, title=key, log=self.log_box.value)
        if png:
            self.histogram.value = png
        self.histogram.layout.display = "" if png else "none"
        self.log_box.layout.display = "" if png else "none"

    def _on_pick_leaf(self, change: Any) -> None:
        label = change["new"]
        with self._lock:
            self._clear_leaf()
            if label is None or self.checkpoint is None:
                return
            row = self.leaves.loc[label]
            checkpointable, key = str(row["checkpointable"]), str(row["key"])
            self.leaf_heading.value = (
                f"<b>{html.escape(checkpointable)}</b> <code>{html.escape(key)}</code>"
            )
            self.leaf_panel.layout.display = ""
            # Wherever it was picked, the tree shows where the leaf sits.
            self.tree_view.expand(checkpointable, key)
            if str(row["kind"]) not in ARRAY_KINDS:
                self.leaf_value = row.get("value")
                if self.filling and str(row["kind"]) in (SCALAR, STRING):
                    # Not in the table yet: its few stored bytes are read now.
                    self.leaf_value = explore.read_leaf(self.checkpoint, checkpointable, key)
                self.stats_html.value = (
                    f"<pre>{html.escape(format_cell(self.leaf_value))}</pre>"
                    f"{note_html(str(row['kind']) + ' leaf: stored value shown, nothing read')}"
                )
                self.leaf = (checkpointable, key)
                return
            self.stats_html.value = note_html("reading…")
            try:
                value = explore.read_leaf(self.checkpoint, checkpointable, key)
            except Exception as e:
                self.stats_html.value = error_html(e, title="Cannot read this leaf:")
                raise
            self.leaf_value = value
            small = is_numeric(value) and int(np.size(value)) <= SMALL_ARRAY
            if small:
                self.values.value = values_html(value)
            if is_numeric(value) and not (small and np.asarray(value).dtype.kind in "biu"):
                stats = leaf_statistics(value)
                self.statistics = stats
                self.stats_html.value = statistics_html(stats)
                self.leaf = (checkpointable, key)
                self._draw_histogram()
            elif small:
                # Integers this few are identities (a PRNG key, a step count), not a
                # distribution: their values are what there is to see.
                array = np.asarray(value)
                self.stats_html.value = note_html(
                    f"{format_cell(tuple(array.shape))} {array.dtype}: values shown"
                )
            else:
                self.stats_html.value = f"<pre>{html.escape(_format_value(repr(value)))}</pre>"
            self.leaf = (checkpointable, key)

    # -- polling --------------------------------------------------------------------

    def _on_watch(self, change: Any) -> None:
        if change["new"] and self.poll_interval <= 0:
            self.poll_interval = DEFAULT_POLL_SECONDS
        elif not change["new"]:
            self.poll_interval = 0.0

    @traitlets.validate("poll_interval")
    def _valid_poll_interval(self, proposal: Any) -> float:
        value = proposal["value"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(
                f"poll_interval must be a number of seconds, got {type(value).__name__}"
            )
        if not value >= 0:
            raise ValueError(f"poll_interval must be non-negative, got {value}")
        return float(value)

    def _on_poll_interval(self, change: Any) -> None:
        interval = float(change["new"])
        self.watch_box.value = interval > 0
        self._stop_polling.set()
        self._stop_polling = threading.Event()
        if interval > 0:
            stop = self._stop_polling
            self._poller = threading.Thread(
                target=self._poll, args=(interval, stop), name="tinax-explorer-poll", daemon=True
            )
            self._poller.start()

    def _poll(self, interval: float, stop: threading.Event) -> None:
        guarded_refresh = shown_in_widget(self._show_error)(self.refresh)
        while not stop.wait(interval):
            guarded_refresh()
