"""Browsing a run: its checkpoints, one checkpoint's leaves, one leaf's values."""

from __future__ import annotations

import html
import os
import threading
import time
from typing import Any

import ipywidgets as w
import pandas as pd
import traitlets

from tinax import explore
from tinax.explore import LeafStatistics

from ._checkpoint_pane import CheckpointPane
from ._guard import shown_in_widget
from ._history import HISTORY_COLUMNS
from ._leaf_pane import LeafPane
from ._run_list import RunList
from ._task import start_thread
from ._text import error_html


class CheckpointExplorer(RunList, CheckpointPane, LeafPane, w.VBox):
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
        self._build_run_list(poll_interval, page_size)
        self._build_checkpoint_pane(page_size)
        self._build_leaf_pane()
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
        with self._lock:
            self._background.append(start_thread(guarded, name=name, stop=self._history_stop.set))

    def _show_error(self, error: BaseException) -> None:
        self.error = f"{type(error).__name__}: {error}"
        self.message.value = error_html(error)

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
