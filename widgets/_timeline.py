"""The run at a glance: metrics, save times and sizes, how far each layer moved, and
where NaN appeared, against step; clicks open a step, diff two, or open a layer's diff.
"""

from __future__ import annotations

import os
import pathlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import anywidget
import ipywidgets as w
import pandas as pd
import traitlets

from tinax import explore
from tinax.explore.toolkit import existing_directory

from ._guard import shown_in_widget
from ._jobs import BackgroundJob, notes_html
from ._metric_picks import MetricPicks, kept_by
from ._text import error_html, note_html
from ._timeline_data import drawn_rows, picks_text, summary_html, timeline_data

_HERE = pathlib.Path(__file__).parent
# How the heatmap groups leaves: the model's layers (``drift_table``'s ``depth=None``),
# or the first N key parts. The dropdown's values: 0 stands for the layers.
DRIFT_DEPTHS = (("layers", 0), ("1 key deep", 1), ("2 keys deep", 2), ("3 keys deep", 3))


class TimelineView(anywidget.AnyWidget):
    """The drawing (``timeline.js``): one SVG that fits its width; sends clicks back."""

    _esm = _HERE / "timeline.js"
    # The jobs' thin bars under their buttons (``BackgroundJob``): the bar itself
    # without ipywidgets' margins, which would leave it no height.
    _css = ".tinax-job-bar .progress { margin-top: 0 !important; margin-bottom: 0 !important; }"
    data = traitlets.Dict({}).tag(sync=True)
    metrics: traitlets.List[str] = traitlets.List([]).tag(sync=True)
    picked_steps: traitlets.List[int] = traitlets.List([]).tag(sync=True)


class RunTimeline(w.VBox):
    """A run at a glance, from its checkpoints alone.

    Shows, against step: the metrics of the run picked in ``metric_picks``
    (``run_table``: the numeric scalars of the auxiliary state, or Orbax's recorded
    metrics; at first the one the run keeps its best checkpoints by), overlaid on
    one panel, each on its own scale (the first's on the left axis, the second's on
    the right, a log scale where its values lie over two decades apart), how long
    each save blocked the
    caller and took in all, each checkpoint's size, a heatmap of ``rel_update`` by
    layer between consecutive checkpoints (``drift_table``: the layer that moved
    most is one glance), the checkpoints holding NaN or Inf (red lines) and the
    step to roll back to (green; ``scan_run``). The metadata is read at once, and a
    metric that is NaN or infinite is marked then, before any array is read. The
    heatmap and the scan read array data, in the background, when asked for
    ("layer drift", "scan for NaN/Inf", or ``drift``/``scan`` true), each with its
    own progress bar: the two run side by side, and "cancel" stops both. The
    heatmap groups leaves by the model's layers or by the first 1 to 3 key parts
    (``depth_choice``); a layer that held NaN or Inf, and one that could not be
    read, has a colour of its own, apart from the scale of the values.

    A click on a step opens it in the explorer (``explorer``, when given); the
    next click on another step diffs the two (the one open stays open), and the
    click after that opens one step again. The timeline follows the explorer
    (``follow``): a checkpoint opened from its list or by "go to step", and a diff
    chosen there, are marked as picked, so that the next click diffs against
    what is open. A shift-click, or any click while "2nd click diffs" is unticked,
    only opens its step. Opening a step keeps the page where it is: the explorer's
    list of checkpoints neither folds nor turns its page, and what opens comes
    below the timeline. Clicking a heatmap cell opens the diff of its two
    checkpoints narrowed to that layer. Without an explorer the picks are only
    recorded (``picked_steps``, ``picked_cell``) and ``on_pick`` is called.

    Attributes:
      table: The ``run_table``.
      drift: The ``drift_table`` (empty until computed).
      scan: The ``scan_run`` table (empty until computed).
      picked_steps: The steps picked, at most two, older first.
      picked_cell: ``(subtree key, step)`` of the last heatmap cell clicked.
      metric_picks: The metrics drawn (``metric_picks.picked``, settable), a toggle
        button each.
      error: The last error shown in the widget, or ``""``.
      view: The drawing (an anywidget).
      drift_job, scan_job: The two background reads (``BackgroundJob``).
      depth_choice: How the heatmap groups leaves.
      diff_box: Whether a second click diffs (ticked) or opens its step alone.
    """

    error = traitlets.Unicode("")
    picked_steps: traitlets.List[int] = traitlets.List([])
    picked_cell = traitlets.Any(None, allow_none=True)

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        explorer: Any = None,
        drift: bool = False,
        scan: bool = False,
        on_pick: Callable[[str, Any], None] | None = None,
        load: bool = True,
    ) -> None:
        """Reads the run's metadata (``run_table``) and draws what it says.

        Args:
          root: A run directory (local or ``gs://``).
          explorer: A ``CheckpointExplorer`` of the same run, which clicks drive.
          drift: Compute the heatmap at once (in the background).
          scan: Scan for NaN/Inf at once (in the background).
          on_pick: Called as ``on_pick("step", step)`` or ``on_pick("cell", (key,
            step))`` after each click.
          load: Read the run now; ``False`` waits for ``load`` (the explorer's
            folded timeline reads the run when it is first opened).

        Raises:
          TypeError: If ``root`` is not a path.
          FileNotFoundError: If ``root`` does not exist.
        """
        self.root = str(existing_directory(root, what="run directory"))
        self._explorer = explorer
        self._on_pick = on_pick
        self._lock = threading.RLock()
        self._depth_changed = threading.Event()
        self.table = pd.DataFrame()
        self.drift = pd.DataFrame()
        self.scan = pd.DataFrame()
        self._layers: list[str] = []
        self._error_text = ""
        self._setting_depth = False
        # The name of a checkpoint open in the explorer without a step on this timeline.
        self._off_timeline: str | None = None
        self.view = TimelineView()
        self.view.layout = w.Layout(width="100%")
        self.message = w.HTML("")
        guard = shown_in_widget(self._show_error)
        self.metric_picks = MetricPicks()
        self.depth_choice = w.Dropdown(
            description="drift by",
            options=DRIFT_DEPTHS,
            value=0,
            tooltip="group the heatmap's rows by the model's layers, or by key parts",
            layout=w.Layout(width="auto", max_width="220px"),
        )
        self.drift_button = w.Button(
            description="layer drift",
            tooltip="read every consecutive pair; rel_update by layer",
            layout=w.Layout(width="auto"),
        )
        self.scan_button = w.Button(
            description="scan for NaN/Inf",
            tooltip="read every checkpoint; first NaN, roll back",
            layout=w.Layout(width="auto"),
        )
        self.refresh_button = w.Button(
            description="refresh", tooltip="read the run again", layout=w.Layout(width="auto")
        )
        self.cancel_button = w.Button(
            description="cancel", disabled=True, tooltip="stop the reads in progress"
        )
        self.cancel_button.layout = w.Layout(width="auto")
        self.diff_box = w.Checkbox(
            value=True,
            description="2nd click diffs",
            indent=False,
            tooltip="a click on a second step diffs it with the one open; "
            "untick to open each step clicked (a shift-click always only opens)",
            layout=w.Layout(width="auto"),
        )
        self.drift_job = BackgroundJob(
            "layer drift",
            button=self.drift_button,
            on_note=self._on_jobs,
            on_error=self._show_error,
        )
        self.scan_job = BackgroundJob(
            "scan", button=self.scan_button, on_note=self._on_jobs, on_error=self._show_error
        )
        self.summary = w.HTML("")
        self.picks = w.HTML("")
        self.metric_picks.observe(guard(self._on_metrics), names="picked")
        self.depth_choice.observe(guard(self._on_depth), names="value")
        self.drift_button.on_click(guard(lambda _: self.compute_drift(depth=self._depth())))
        self.scan_button.on_click(guard(lambda _: self.compute_scan()))
        self.refresh_button.on_click(guard(lambda _: self.refresh()))
        self.cancel_button.on_click(guard(lambda _: self.cancel()))
        self.view.on_msg(guard(self._on_click))
        # What changes as work goes on (notes, the summary, the picks) sits below the
        # drawing, and the bars keep their room while hidden: the drawing never
        # moves under the pointer.
        super().__init__(
            children=[
                w.HBox(
                    [
                        self.depth_choice,
                        self.drift_job.box,
                        self.scan_job.box,
                        self.cancel_button,
                        self.refresh_button,
                        self.diff_box,
                    ],
                    layout=w.Layout(flex_flow="row wrap", align_items="center"),
                ),
                self.metric_picks,
                self.view,
                self.picks,
                self.summary,
                self.message,
            ]
        )
        self.add_class("tinax-run-timeline")
        self.loaded = False
        if load or drift or scan:
            self.refresh()
        if drift:
            self.compute_drift()
        if scan:
            self.compute_scan()

    # -- public ---------------------------------------------------------------------

    def load(self) -> None:
        """Reads the run, unless it has been read already."""
        if not self.loaded:
            self.refresh()

    def refresh(self) -> None:
        """Reads the run's metadata again (``run_table``) and redraws; what drift and
        scan found stays, for the checkpoints still there."""
        table = explore.run_table(self.root)
        with self._lock:
            self.loaded = True
            self.table = table
            self.metric_picks.offer(list(table.attrs.get("metrics", [])), kept_by(self.root))
        self._redraw()

    def compute_drift(self, *, depth: int | None = None) -> None:
        """Computes ``drift_table`` in the background and draws its heatmap.

        Args:
          depth: Key parts a heatmap row groups (``None``: the model's layers).

        Raises:
          TypeError: If ``depth`` is not an int or ``None``.
          ValueError: If ``depth`` is not one the widget offers (1 to 3).
        """
        value = 0 if depth is None else depth
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"depth must be an int or None, got {type(depth).__name__}")
        if value not in {v for _, v in DRIFT_DEPTHS}:
            raise ValueError(f"depth must be None or 1 to 3, got {depth}")
        self._clear_error()
        self._setting_depth = True
        try:
            self.depth_choice.value = value
        finally:
            self._setting_depth = False
        if not self.drift_job.start(self._drift):
            # A change of depth while it runs: the read in progress moves on to it.
            self._depth_changed.set()

    def compute_scan(self) -> None:
        """Scans every checkpoint for NaN/Inf in the background (``scan_run``)."""
        self._clear_error()
        self.scan_job.start(self._scan)

    def cancel(self) -> None:
        """Stops the drift and the scan in progress (each at its next checkpoint)."""
        self.drift_job.cancel()
        self.scan_job.cancel()

    def pick_step(self, step: int, *, open_only: bool = False) -> None:
        """As a click on ``step``: opens it in the explorer; with one other step open
        (and ``diff_box`` ticked), diffs the two instead.

        Args:
          step: A step with a complete checkpoint.
          open_only: Open the step alone whatever is picked (a shift-click).

        Raises:
          ValueError: If the run has no complete checkpoint of ``step``.
        """
        step = int(step)
        self._clear_error()
        held = self.picked_steps
        if not open_only and self.diff_box.value and len(held) == 1 and held[0] != step:
            self.diff_steps(held[0], step)
        else:
            self.open_step(step)

    def open_step(self, step: int) -> None:
        """Opens ``step`` alone in the explorer, and makes it the one picked.

        Raises:
          ValueError: If the run has no complete checkpoint of ``step``.
        """
        path = self._path_of(step)
        if self._explorer is not None:
            self._explorer.show_checkpoint(path)
        self._set_picks([int(step)], cell=None)
        self._show_picks()
        if self._on_pick is not None:
            self._on_pick("step", int(step))

    def diff_steps(self, first: int, second: int) -> None:
        """Diffs two steps in the explorer: ``first`` stays open (opened if it is not
        the one open) and is compared with ``second``; the diff reads from the older
        to the newer either way.

        Raises:
          ValueError: If the run has no complete checkpoint of either step.
        """
        first, second = int(first), int(second)
        paths = self._path_of(first), self._path_of(second)
        explorer = self._explorer
        if explorer is not None:
            if explorer.checkpoint != paths[0]:
                explorer.show_checkpoint(paths[0])
            explorer.contents.diff_view.compare(paths[1])
        self._set_picks(sorted((first, second)), cell=None)
        self._show_picks()
        if self._on_pick is not None:
            self._on_pick("step", second)

    def pick_cell(self, key: str, step: int) -> None:
        """As a click on a heatmap cell: the diff of ``step``'s checkpoint and the one
        before it, narrowed to the subtree ``key`` (a ``drift_table`` key).

        Raises:
          ValueError: If there is no such cell.
        """
        rows = self.drift
        hit = rows[(rows["key"] == key) & (rows["step"] == step)] if len(rows) else rows
        if hit.empty:
            raise ValueError(f"the heatmap has no cell for {key} at step {step}")
        row = hit.iloc[0]
        previous = int(row["previous_step"])
        explorer = self._explorer
        if explorer is not None:
            explorer.show_checkpoint(self._path_of(previous))
            pane = explorer.contents
            pane.key_filter.value = str(row["subtree"])
            pane.diff_view.compare(self._path_of(step))
        self._set_picks([previous, int(step)], cell=(key, int(step)))
        self._show_picks()
        if self._on_pick is not None:
            self._on_pick("cell", (key, int(step)))

    def follow(self, steps: Sequence[int], *, name: str | None = None) -> None:
        """Marks what the explorer shows, however it was opened (its list, "go to
        step", its diff's "compare with…"): the step open, or the two steps diffed;
        the next click on a step diffs against the one open. Nothing is opened.

        Args:
          steps: The step open, or the two steps of the diff; empty when what is
            open has no step on this timeline (or nothing is).
          name: The name of what is open, said when it has no step here.
        """
        picked = sorted({int(s) for s in steps})
        if picked == self.picked_steps and self._off_timeline == (name if not picked else None):
            return
        cell = self.picked_cell
        keep = cell is not None and len(picked) == 2 and picked[1] == cell[1]
        self._off_timeline = name if not picked else None
        self._set_picks(picked, cell=cell if keep else None)
        self._show_picks()

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for background work; returns whether it has all finished."""
        done = self.drift_job.wait(timeout)
        return self.scan_job.wait(timeout) and done

    def close(self) -> None:
        """Cancels the work in the background and closes the widget."""
        for job in ("drift_job", "scan_job"):  # absent when __init__ failed early
            found = getattr(self, job, None)
            if found is not None:
                found.cancel()
        super().close()

    # -- background work ------------------------------------------------------------

    def _depth(self) -> int | None:
        return int(self.depth_choice.value) or None

    def _drift(self, progress: Callable[[int, int], None], cancel: threading.Event) -> str:
        changed = self._depth_changed
        while True:
            changed.clear()
            table = explore.drift_table(
                self.root,
                depth=self._depth(),
                progress=progress,
                cancel=lambda: cancel.is_set() or changed.is_set(),
            )
            # Pairs already read are kept by drift_table: a new depth reads none again.
            if changed.is_set() and not cancel.is_set():
                continue
            with self._lock:
                self.drift = table
            self._redraw()
            if not changed.is_set() or cancel.is_set():
                break
        done = "cancelled: " if table.attrs.get("cancelled") else ""
        return f"{done}layer drift of {table.attrs.get('pairs', 0)} pairs"

    def _scan(self, progress: Callable[[int, int], None], cancel: threading.Event) -> str:
        # What it counts in each checkpoint the library remembers: the explorer's
        # verdicts and its export's warning read it from there.
        table = explore.scan_run(self.root, progress=progress, cancel=cancel)
        with self._lock:
            self.scan = table
        self._redraw()
        if self._explorer is not None:
            # The open checkpoint's verdict (and each opened later) says what it found.
            self._explorer.contents.show_scan()
        first, rollback = table.attrs["first_nonfinite_step"], table.attrs["rollback_step"]
        if first is None:
            text = "no NaN or Inf in any checkpoint read"
        else:
            text = f"NaN/Inf from step {first} on; roll back to step {rollback}"
        return ("cancelled: " if table.attrs.get("cancelled") else "") + text

    def _on_jobs(self) -> None:
        self.cancel_button.disabled = not (self.drift_job.running or self.scan_job.running)
        self._show_message()

    # -- drawing --------------------------------------------------------------------

    def _redraw(self) -> None:
        with self._lock:
            data, self._layers = timeline_data(self.table, self.drift, self.scan)
        self.view.metrics = list(self.metric_picks.picked)
        self.view.data = data
        self.summary.value = summary_html(self.table, self.drift, self.scan)

    def _show_picks(self) -> None:
        layer = None
        if self.picked_cell is not None:
            label = self.drift[self.drift["key"] == self.picked_cell[0]]["subtree"]
            layer = str(label.iloc[0]) if len(label) else self.picked_cell[0]
        text = picks_text(
            self.picked_steps, layer=layer, off=self._off_timeline, diffs=self.diff_box.value
        )
        self.picks.value = note_html(text) if text else ""

    def _set_picks(self, steps: list[int], *, cell: tuple[str, int] | None) -> None:
        if steps:
            self._off_timeline = None
        self.picked_cell = cell
        self.picked_steps = steps
        self.view.picked_steps = steps

    def _show_message(self) -> None:
        error = error_html(self._error_text) if self._error_text else ""
        self.message.value = error + notes_html([self.drift_job, self.scan_job])

    # -- events ---------------------------------------------------------------------

    def _on_metrics(self, change: Any) -> None:
        self.view.metrics = list(change["new"])

    def _on_depth(self, change: Any) -> None:
        if self._setting_depth:
            return
        if len(self.drift) or self.drift_job.running:
            self.compute_drift(depth=int(change["new"]) or None)

    def _on_click(self, _widget: Any, content: Any, _buffers: Sequence[Any]) -> None:
        if not isinstance(content, dict):
            return
        if content.get("kind") == "step":
            self.pick_step(int(content["step"]), open_only=bool(content.get("open_only")))
        elif content.get("kind") == "cell":
            column, layer = int(content["column"]), int(content["layer"])
            steps = self.view.data.get("heat_steps", [])
            self.pick_cell(self._layers[layer], int(steps[column]))

    def _path_of(self, step: int) -> str:
        rows = drawn_rows(self.table) if len(self.table) else self.table
        hit = rows[rows["step"] == step] if len(rows) else rows
        if hit.empty:
            raise ValueError(f"the run has no complete checkpoint of step {step}")
        return str(hit.iloc[0]["path"])

    def _clear_error(self) -> None:
        if self._error_text:
            self._error_text = ""
            self._show_message()

    def _show_error(self, error: BaseException) -> None:
        self.error = f"{type(error).__name__}: {error}"
        self._error_text = self.error
        self._show_message()
