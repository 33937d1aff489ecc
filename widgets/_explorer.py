"""Browsing a run: its checkpoints, one checkpoint's leaves, one leaf's values."""

from __future__ import annotations

import html
import os
import posixpath
import threading
import time
import weakref
from typing import Any

import ipywidgets as w
import pandas as pd
import traitlets

from tinax.explore.toolkit import LeafStatistics, existing_directory
from tinax.vocabulary import COMPLETE

from ._checkpoint_pane import CheckpointPane
from ._data_check import DataCheck
from ._diff import DiffView
from ._guard import shown_in_widget
from ._leaf_pane import LeafPane
from ._run_list import DEFAULT_POLL_SECONDS, RunList
from ._run_rows import run_heading
from ._section import Section
from ._services import Services
from ._table import PagedTable
from ._task import start_thread
from ._text import error_html, note_html
from ._timeline import RunTimeline
from ._timeline_data import drawn_rows
from ._tree import TreeView

# How often the ages shown are brought up to date (only a changed text is sent).
AGE_TICK_SECONDS = 1.0
# Rows a page of the run list and of the diff show at most, whatever ``page_size``:
# with a diff, a data check and a leaf open, the page stays within two screens.
RUN_ROWS = 8
DIFF_ROWS = 10


class CheckpointExplorer(w.VBox):
    """Browse a run: its checkpoints, one checkpoint's leaves, one leaf's statistics.

    The page is three folding sections, each a pane object of its own:

    - the run (``runs``, a ``RunList``): its checkpoints newest first, with a step
      range and "go to step". The first listing walks the run without parsing
      metadata, so that a long run shows at once; a background thread then reads
      each checkpoint's metadata and marks those that cannot be read. Checkpoints
      still being written, interrupted saves and directories that cannot be read
      are listed with their status and age and cannot be opened; an interrupted
      save can be removed, after a confirmation. Ages tick as time passes.
    - the open checkpoint (``contents``, a ``CheckpointPane``): a bar of its bytes
      by part (model, optimizer state, the rest), its verdict, "check data" and
      "export…" (each opening its panel right under the buttons), the diff against
      another checkpoint, and its leaves as a tree of subtrees with leaf counts and
      byte subtotals (``tree_view``) or as a flat table sortable by any column
      (``leaf_view``).
    - the picked leaf (``leaf_pane``, a ``LeafPane``): only that leaf's bytes are
      read; arrays of up to 64 elements show their values, larger ones their
      statistics and a histogram; "across the run" reads that one leaf from every
      complete checkpoint and plots its norm, mean and max against step.

    A checkpoint of many leaves (``FILL_LATER_LEAVES``) shows its leaves' keys and
    kinds as soon as its metadata is parsed, and says it is "reading shapes and
    sizes…" while a background thread reads them; meanwhile ``filling`` is true.

    Refresh re-lists the run; ``poll_interval`` (or the "watch" checkbox) re-lists
    it periodically from a daemon thread. ``wait`` waits for background work. No
    background thread outlives the interpreter: at exit each is stopped and joined.
    Browsing imports neither JAX nor Orbax.

    Attributes:
      checkpoint: Path of the open checkpoint, or ``None``.
      leaf: ``(checkpointable, key)`` of the picked leaf, or ``None``.
      error: The last error shown in the widget, or ``""``.
      poll_interval: Seconds between automatic refreshes; ``0`` turns polling off.
      runs, contents, leaf_pane: The three panes.
      run_section: The run's section (``contents.section`` and
        ``leaf_pane.section`` are the other two).
      message: A line for errors and notes.
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
          page_size: Rows per page in the tables (the run list shows at most
            ``RUN_ROWS`` a page, the diff ``DIFF_ROWS``).

        Raises:
          TypeError: If ``root`` is not a path.
          FileNotFoundError: If ``root`` does not exist.
          ValueError: If ``poll_interval`` is negative.
        """
        checked = existing_directory(root, what="run directory")
        self.root = str(checked)
        # The heading shows the path as given; everything else uses the checked one.
        self._shown_root = os.fspath(root)
        poll_interval = self._valid_poll_interval({"value": poll_interval})
        self._lock = threading.RLock()
        self._background: list[threading.Thread] = []
        self._stop = threading.Event()
        self._keep_place = False
        self.message = w.HTML("")
        self.services = Services(
            lock=self._lock,
            show_error=self._show_error,
            note=self._note,
            in_background=self._in_background,
        )
        self.runs = RunList(
            self.root,
            self.services,
            page_size=min(page_size, RUN_ROWS),
            poll_interval=poll_interval,
            on_listing=self._on_listing,
            on_pick=self._on_pick_checkpoint,
            on_watch=self._on_watch,
        )
        self.contents = CheckpointPane(
            self.services,
            self.runs,
            page_size=page_size,
            diff_rows=min(page_size, DIFF_ROWS),
            on_open=self._on_open,
            on_pick_leaf=self._on_pick_leaf,
            explore_elsewhere=self._explore_elsewhere,
        )
        self._page_size = page_size
        self.leaf_pane = LeafPane(self.services)
        # The run at a glance (RunTimeline), read when its section is first opened.
        self.timeline = RunTimeline(self.root, explorer=self, load=False)
        self.timeline_section = Section(
            "timeline", "<b>Run timeline</b>", [self.timeline], is_open=False
        )
        self.timeline_section.toggle.on_click(lambda _: self.timeline.load())
        # The timeline marks what is open and what it is diffed with, however opened.
        self.contents.diff_view.observe(
            shown_in_widget(self._show_error)(lambda _: self._timeline_follows()),
            names="compared",
        )
        self.heading = w.HTML(run_heading(self._shown_root, ""))
        # "average…" takes the checkpoints ticked in the list, or the timeline's two picks.
        self.runs.other_picks = self._timeline_picks
        self.run_section = Section(
            "run",
            "<b>Checkpoints</b>",
            [
                self.runs.controls,
                self.runs.view,
                self.runs.interrupted,
                self.runs.average_button,
                self.runs.average_box,
            ],
        )
        super().__init__(
            children=[
                w.HBox(
                    [self.heading, self.runs.refresh_button, self.runs.watch_box],
                    layout=w.Layout(flex_flow="row wrap", align_items="center"),
                ),
                self.message,
                self.run_section,
                self.timeline_section,
                self.contents.section,
                self.leaf_pane.section,
            ]
        )
        self.add_class("tinax-checkpoint-explorer")
        guard = shown_in_widget(self._show_error)
        self.observe(guard(self._on_poll_interval), names="poll_interval")
        self.runs.refresh(deep=False)
        self.poll_interval = poll_interval
        ages = weakref.ref(self)
        stop = self._stop
        start_thread(lambda: _tick_ages(ages, stop), name="tinax-explorer-ages", stop=stop.set)

    # -- public ---------------------------------------------------------------------

    @property
    def checkpoints(self) -> pd.DataFrame:
        """The run's ``list_checkpoints`` table, indexed by path."""
        return self.runs.checkpoints

    @property
    def summary(self) -> str:
        """The run's checkpoints counted in words, with its policy."""
        return self.runs.summary

    @property
    def leaves(self) -> pd.DataFrame:
        """The open checkpoint's ``checkpoint_table`` (all rows, unfiltered); while
        ``filling``, the same rows with keys and kinds only."""
        return self.contents.leaves

    @property
    def filling(self) -> bool:
        """Whether the open checkpoint's shapes and sizes are being read."""
        return self.contents.filling

    @property
    def statistics(self) -> LeafStatistics | None:
        """The picked leaf's statistics, or ``None``."""
        return self.leaf_pane.statistics

    @property
    def leaf_value(self) -> Any:
        """The picked leaf's value as read, or ``None``."""
        return self.leaf_pane.value

    @property
    def history(self) -> pd.DataFrame:
        """The picked leaf's norm, mean and max at every complete checkpoint, once
        "across the run" has read them; else empty."""
        return self.leaf_pane.history

    @property
    def checkpoint_view(self) -> PagedTable:
        """The table of the run's checkpoints."""
        return self.runs.view

    @property
    def leaf_view(self) -> PagedTable:
        """The open checkpoint's leaves as a flat table."""
        return self.contents.leaf_view

    @property
    def tree_view(self) -> TreeView:
        """The open checkpoint's leaves as a tree."""
        return self.contents.tree_view

    @property
    def diff_view(self) -> DiffView:
        """The diff of the open checkpoint against another."""
        return self.contents.diff_view

    @property
    def data_check(self) -> DataCheck:
        """The open checkpoint's "check data" action."""
        return self.contents.data_check

    def refresh(self, *, deep: bool = True) -> None:
        """Re-lists the run's checkpoints, keeping the open checkpoint if it is still
        there (see ``RunList.refresh``)."""
        self.runs.refresh(deep=deep)

    def go_to_step(self, step: int) -> None:
        """Opens the complete checkpoint of ``step``, or the nearest one.

        Raises:
          TypeError: If ``step`` is not an int.
          ValueError: If the run has no complete checkpoint with a step.
        """
        self.runs.go_to_step(step)

    def open_checkpoint(self, name_or_path: str | os.PathLike[str]) -> None:
        """Opens a listed checkpoint, as if its row had been clicked.

        Raises:
          ValueError: If no listed checkpoint has that name or path.
        """
        self.runs.open_checkpoint(name_or_path)

    def show_checkpoint(self, name_or_path: str | os.PathLike[str]) -> None:
        """Opens a listed checkpoint and leaves the page where it is: the list of
        checkpoints neither folds nor turns its page (the timeline's clicks, so that
        what is under the pointer stays there).

        Raises:
          ValueError: If no listed checkpoint has that name or path.
        """
        self._keep_place = True
        try:
            self.runs.open_checkpoint(name_or_path, turn_page=False)
        finally:
            self._keep_place = False

    def open_leaf(self, checkpointable: str, key: str) -> None:
        """Picks a leaf of the open checkpoint, as if its row had been clicked.

        Raises:
          ValueError: If no checkpoint is open or it has no such leaf.
        """
        label = self.contents.find_leaf(checkpointable, key)
        view = self.contents.leaf_view
        if view.selected == label and self.leaf != (checkpointable, key):
            view.selected = None
        view.selected = label

    def show_history(self) -> None:
        """Reads the picked leaf from every complete checkpoint of the run, in the
        background, and plots its norm, mean and max against step (``wait`` waits).

        Raises:
          ValueError: If no leaf is picked.
        """
        self.leaf_pane.show_history_of(self.runs.checkpoints)

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

    def close(self) -> None:
        """Stops polling and background work and closes the widget."""
        # Also called from __del__, possibly on an instance whose __init__ failed.
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
        for pane in ("runs", "leaf_pane"):
            part = getattr(self, pane, None)
            if part is not None:
                part.stop()
        contents = getattr(self, "contents", None)
        if contents is not None:
            contents.data_check.cancel()
        super().close()

    # -- wiring between the panes ---------------------------------------------------

    def _on_listing(self, table: pd.DataFrame, changed: bool) -> None:
        self.heading.value = run_heading(self._shown_root, self.runs.summary)
        if changed:
            self.contents.set_comparable()
            if self.timeline.loaded:
                # New checkpoints, or a health found: the timeline reads the run again.
                self._in_background(self.timeline.refresh, "tinax-explorer-timeline")
        if self.checkpoint is not None:
            still = table[table["path"].astype(str) == self.checkpoint]
            if still.empty or str(still.iloc[0]["status"]) != COMPLETE:
                self.contents.close()
                self._note("the open checkpoint is gone from the run", "#8a6d00")

    def _on_pick_checkpoint(self, path: str, name: str) -> None:
        self.error = ""
        self.contents.open(path, name)
        # The list folds to one line naming what is open: the checkpoint, its diff
        # and a leaf then fit two screens. Its heading unfolds it. A step opened from
        # the timeline (below the list) leaves it as it is.
        if not self._keep_place:
            self.run_section.set_open(False)

    def _on_open(self, path: str | None) -> None:
        self.leaf_pane.clear()
        self.leaf = None
        self.checkpoint = path
        self._timeline_follows()
        if path is None:
            self.runs.unpick()
            self.run_section.set_open(True)
            self.run_section.set_title("<b>Checkpoints</b>")
        else:
            name = os.path.basename(path.rstrip("/"))
            self.run_section.set_title(
                f"<b>Checkpoints</b> · <code>{html.escape(name)}</code> open"
            )

    def _on_pick_leaf(self, checkpointable: str, key: str) -> None:
        checkpoint = self.contents.checkpoint
        if checkpoint is None:
            return
        leaves = self.contents.leaves
        row = leaves[(leaves["checkpointable"] == checkpointable) & (leaves["key"] == key)].iloc[0]
        self.leaf = None
        self.contents.reveal_in_tree(checkpointable, key)
        try:
            self.leaf_pane.show(
                checkpoint, row, filling=self.contents.filling, listing=self.runs.checkpoints
            )
        finally:
            self.leaf = self.leaf_pane.leaf

    def _on_watch(self, on: bool) -> None:
        if on and self.poll_interval <= 0:
            self.poll_interval = DEFAULT_POLL_SECONDS
        elif not on:
            self.poll_interval = 0.0

    def _on_poll_interval(self, change: Any) -> None:
        self.runs.set_poll_interval(float(change["new"]))

    def _step_of(self, path: str) -> int | None:
        """The step of ``path`` on the timeline: ``None`` for a checkpoint it does not
        draw (no step, or a copy beside the step drawn)."""
        table = self.runs.checkpoints
        if table.empty or path not in table.index:
            return None
        drawn = drawn_rows(table)
        return int(drawn.at[path, "step"]) if path in drawn.index else None

    def _timeline_follows(self) -> None:
        """Marks on the timeline the step open, or the two steps diffed."""
        path = self.checkpoint
        if path != self.contents.checkpoint:
            return  # a checkpoint is being opened: followed once it is
        if path is None:
            self.timeline.follow([])
            return
        compared = self.contents.diff_view.compared
        paths = list(compared) if compared is not None else [path]
        steps = [self._step_of(p) for p in paths]
        if any(s is None for s in steps):
            self.timeline.follow([], name=os.path.basename(path.rstrip("/")))
            return
        self.timeline.follow([s for s in steps if s is not None])

    def _explore_elsewhere(self, path: str) -> CheckpointExplorer:
        """An explorer of the directory holding ``path`` (a checkpoint outside this
        run: a derived checkpoint's source), with ``path`` open."""
        where = path.rstrip("/")
        explorer = CheckpointExplorer(posixpath.dirname(where), page_size=self._page_size)
        # By its path where it is listed so (a run of two tiers lists one copy of a step).
        listed = where in explorer.checkpoints.index
        explorer.open_checkpoint(where if listed else posixpath.basename(where))
        return explorer

    def _timeline_picks(self) -> list[str]:
        """The paths of the steps picked in the run timeline (the checkpoints it draws,
        not a copy derived from one of those steps)."""
        table = self.runs.checkpoints
        if table.empty:
            return []
        done = drawn_rows(table)
        by_step = {int(s): str(p) for s, p in zip(done["step"], done["path"], strict=True)}
        return [by_step[s] for s in self.timeline.picked_steps if s in by_step]

    # -- services -------------------------------------------------------------------

    def _in_background(self, work: Any, name: str) -> None:
        guarded = shown_in_widget(self._show_error)(work)
        with self._lock:
            self._background.append(start_thread(guarded, name=name, stop=self._stop_work))

    def _stop_work(self) -> None:
        self.leaf_pane.stop()
        self.contents.data_check.cancel()

    def _show_error(self, error: BaseException) -> None:
        self.error = f"{type(error).__name__}: {error}"
        self.message.value = error_html(error)

    def _note(self, text: str, color: str) -> None:
        self.message.value = note_html(text, color=color or "#555") if text else ""

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


def _tick_ages(explorer: weakref.ref[CheckpointExplorer], stop: threading.Event) -> None:
    """Keeps an explorer's ages up to date until it is closed or collected (the thread
    holds it only while it ticks, so that a dropped explorer is not kept alive)."""
    while not stop.wait(AGE_TICK_SECONDS):
        shown = explorer()
        if shown is None:
            return
        shown_in_widget(shown._show_error)(shown.runs.tick_ages)()
        del shown
