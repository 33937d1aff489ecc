"""The run at a glance: metrics, save times and sizes, how far each layer moved, and
where NaN appeared, against step; clicks open a step, diff two, or open a layer's diff.
"""

from __future__ import annotations

import math
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
from tinax.explore.display import display_keys, human_bytes
from tinax.explore.toolkit import existing_directory
from tinax.vocabulary import COMPLETE, DIVERGED, NONFINITE

from ._guard import shown_in_widget
from ._task import start_thread
from ._text import error_html, note_html

_HERE = pathlib.Path(__file__).parent
# The metric shown first when the run has it.
PREFERRED_METRICS = ("loss", "train_loss", "eval_loss", "accuracy")
# Labels of the heatmap's rows: as wide as this in characters at most.
LABEL_CHARS = 28


def _floats(values: Any) -> list[float | None]:
    """JSON numbers: NaN and infinities as ``None`` (the view draws them as gaps)."""
    out: list[float | None] = []
    for v in values:
        try:
            number = float(v)
        except (TypeError, ValueError):
            out.append(None)
            continue
        out.append(number if math.isfinite(number) else None)
    return out


class TimelineView(anywidget.AnyWidget):
    """The drawing (``timeline.js``): one SVG that fits its width; sends clicks back."""

    _esm = _HERE / "timeline.js"
    data = traitlets.Dict({}).tag(sync=True)
    metric = traitlets.Unicode("").tag(sync=True)
    picked_steps: traitlets.List[int] = traitlets.List([]).tag(sync=True)


class RunTimeline(w.VBox):
    """A run at a glance, from its checkpoints alone.

    Shows, against step: a metric of the run (``run_table``: the numeric scalars of
    the auxiliary state, or Orbax's recorded metrics), how long each save blocked the
    caller and took in all, each checkpoint's size, a heatmap of ``rel_update`` by
    layer between consecutive checkpoints (``drift_table``: the layer that moved
    most is one glance), the checkpoints holding NaN or Inf (red lines) and the
    step to roll back to (green; ``scan_run``). The metadata is read at once; the
    heatmap and the scan read array data, in the background, when asked for
    ("layer drift", "scan for NaN/Inf", or ``drift``/``scan`` true), with progress
    and a cancel button.

    Clicking a step opens it in the explorer (``explorer``, when given) and picks
    it; the second pick diffs the two. Clicking a heatmap cell opens the diff of
    its two checkpoints narrowed to that layer. Without an explorer the picks are
    only recorded (``picked_steps``, ``picked_cell``) and ``on_pick`` is called.

    Attributes:
      table: The ``run_table``.
      drift: The ``drift_table`` (empty until computed).
      scan: The ``scan_run`` table (empty until computed).
      picked_steps: The steps picked, at most two, newest last.
      picked_cell: ``(subtree key, step)`` of the last heatmap cell clicked.
      error: The last error shown in the widget, or ``""``.
      view: The drawing (an anywidget).
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
        self._cancel = threading.Event()
        self._threads: list[threading.Thread] = []
        self.table = pd.DataFrame()
        self.drift = pd.DataFrame()
        self.scan = pd.DataFrame()
        self._layers: list[str] = []
        self.view = TimelineView()
        self.view.layout = w.Layout(width="100%")
        self.message = w.HTML("")
        self.metric_choice = w.Dropdown(
            description="metric", options=[], layout=w.Layout(width="auto", max_width="260px")
        )
        self.drift_button = w.Button(
            description="layer drift", tooltip="read every consecutive pair; rel_update by layer"
        )
        self.scan_button = w.Button(
            description="scan for NaN/Inf", tooltip="read every checkpoint; first NaN, roll back"
        )
        self.refresh_button = w.Button(description="refresh", tooltip="read the run again")
        self.cancel_button = w.Button(description="cancel", disabled=True)
        for button in (self.drift_button, self.scan_button, self.refresh_button):
            button.layout = w.Layout(width="auto")
        self.cancel_button.layout = w.Layout(width="auto")
        self.progress = w.FloatProgress(
            value=0.0, min=0.0, max=1.0, layout=w.Layout(width="160px", visibility="hidden")
        )
        self.summary = w.HTML("")
        self.picks = w.HTML("")
        guard = shown_in_widget(self._show_error)
        self.metric_choice.observe(guard(self._on_metric), names="value")
        self.drift_button.on_click(guard(lambda _: self.compute_drift()))
        self.scan_button.on_click(guard(lambda _: self.compute_scan()))
        self.refresh_button.on_click(guard(lambda _: self.refresh()))
        self.cancel_button.on_click(guard(lambda _: self._cancel.set()))
        self.view.on_msg(guard(self._on_click))
        super().__init__(
            children=[
                w.HBox(
                    [
                        self.metric_choice,
                        self.drift_button,
                        self.scan_button,
                        self.refresh_button,
                        self.cancel_button,
                        self.progress,
                    ],
                    layout=w.Layout(flex_flow="row wrap", align_items="center"),
                ),
                self.summary,
                self.message,
                self.view,
                self.picks,
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
            metrics = list(table.attrs.get("metrics", []))
            chosen = self.metric_choice.value
            if chosen not in metrics:
                chosen = next((m for m in PREFERRED_METRICS if m in metrics), None)
                chosen = chosen or (metrics[0] if metrics else None)
            self.metric_choice.options = metrics
            self.metric_choice.value = chosen
            self.metric_choice.layout.display = "" if metrics else "none"
        self._redraw()

    def compute_drift(self, *, depth: int | None = None) -> None:
        """Computes ``drift_table`` in the background and draws its heatmap."""
        self._start("drift", lambda progress: self._drift(depth, progress))

    def compute_scan(self) -> None:
        """Scans every checkpoint for NaN/Inf in the background (``scan_run``)."""
        self._start("scan", self._scan)

    def pick_step(self, step: int) -> None:
        """As a click on ``step``: opens it in the explorer; a second pick diffs the two.

        Raises:
          ValueError: If the run has no complete checkpoint of ``step``.
        """
        path = self._path_of(step)
        picked = [*[s for s in self.picked_steps if s != step][-1:], int(step)]
        self.picked_steps = picked
        self.view.picked_steps = picked
        explorer = self._explorer
        if explorer is not None:
            if len(picked) == 2:
                first, second = (self._path_of(s) for s in sorted(picked))
                explorer.open_checkpoint(first)
                explorer.contents.diff_view.compare(second)
            else:
                explorer.open_checkpoint(path)
        self._show_picks()
        if self._on_pick is not None:
            self._on_pick("step", int(step))

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
        self.picked_cell = (key, int(step))
        self.picked_steps = [previous, int(step)]
        self.view.picked_steps = self.picked_steps
        explorer = self._explorer
        if explorer is not None:
            explorer.open_checkpoint(self._path_of(previous))
            pane = explorer.contents
            pane.key_filter.value = str(row["subtree"])
            pane.diff_view.compare(self._path_of(step))
        self._show_picks()
        if self._on_pick is not None:
            self._on_pick("cell", (key, int(step)))

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for background work; returns whether it has all finished."""
        for thread in list(self._threads):
            thread.join(timeout)
        return not any(t.is_alive() for t in self._threads)

    def close(self) -> None:
        """Cancels the work in the background and closes the widget."""
        cancel = getattr(self, "_cancel", None)  # absent when __init__ failed early
        if cancel is not None:
            cancel.set()
        super().close()

    # -- background work ------------------------------------------------------------

    def _start(self, what: str, work: Callable[[Callable[[int, int], None]], None]) -> None:
        if any(t.is_alive() for t in self._threads):
            self._note(f"busy: wait for the {what} in progress, or cancel it", "#b35900")
            return
        self._cancel.clear()
        self.cancel_button.disabled = False
        self.drift_button.disabled = self.scan_button.disabled = True
        self.progress.value = 0.0
        self.progress.layout.visibility = "visible"

        def progress(done: int, total: int) -> None:
            self.progress.value = done / total if total else 1.0

        def run() -> None:
            try:
                work(progress)
            except Exception as e:  # shown in the widget, never a traceback
                self._show_error(e)
            finally:
                self.cancel_button.disabled = True
                self.drift_button.disabled = self.scan_button.disabled = False
                self.progress.layout.visibility = "hidden"

        self._threads = [start_thread(run, name=f"tinax-timeline-{what}", stop=self._cancel.set)]

    def _drift(self, depth: int | None, progress: Callable[[int, int], None]) -> None:
        self._note("reading every consecutive pair of checkpoints…", "#555")
        table = explore.drift_table(self.root, depth=depth, progress=progress, cancel=self._cancel)
        with self._lock:
            self.drift = table
        done = "cancelled: " if table.attrs.get("cancelled") else ""
        self._note(f"{done}layer drift of {table.attrs.get('pairs', 0)} pairs", "#555")
        self._redraw()

    def _scan(self, progress: Callable[[int, int], None]) -> None:
        self._note("reading every checkpoint…", "#555")
        table = explore.scan_run(self.root, progress=progress, cancel=self._cancel)
        with self._lock:
            self.scan = table
        first, rollback = table.attrs["first_nonfinite_step"], table.attrs["rollback_step"]
        if first is None:
            text = "no NaN or Inf in any checkpoint read"
        else:
            text = f"NaN/Inf from step {first} on; roll back to step {rollback}"
        done = "cancelled: " if table.attrs.get("cancelled") else ""
        self._note(done + text, "#555")
        self._redraw()

    # -- drawing --------------------------------------------------------------------

    def _data(self) -> dict[str, Any]:
        table = self.table
        if table.empty:
            return {"steps": [], "empty": "No checkpoint in this run yet."}
        rows = table[(table["status"] == COMPLETE) & table["step"].notna()]
        steps = [int(s) for s in rows["step"]]
        data: dict[str, Any] = {
            "steps": steps,
            "metrics": {m: _floats(rows[m]) for m in table.attrs.get("metrics", [])},
            "save_blocked_s": _floats(rows["save_blocked_s"]),
            "save_total_s": _floats(rows["save_total_s"]),
            "nbytes": _floats(rows["nbytes"]),
        }
        drift = self.drift
        if len(drift):
            keys = list(dict.fromkeys(drift["key"]))
            subtrees = dict(zip(drift["key"], drift["subtree"], strict=True))
            pairs = sorted(set(zip(drift["step"], drift["previous_step"], strict=True)))
            column = {step: i for i, (step, _) in enumerate(pairs)}
            row = {key: i for i, key in enumerate(keys)}
            heat: list[list[float | None]] = [[None] * len(pairs) for _ in keys]
            for key, step, value in zip(
                drift["key"], drift["step"], drift["rel_update"], strict=True
            ):
                heat[row[key]][column[int(step)]] = _floats([value])[0]
            self._layers = keys
            data.update(
                layers=display_keys(keys, width=LABEL_CHARS)
                if len(keys) > 1
                else [subtrees[k] for k in keys],
                layer_keys=[subtrees[k] for k in keys],
                heat=heat,
                heat_steps=[int(s) for s, _ in pairs],
                heat_previous=[int(p) for _, p in pairs],
            )
        scan = self.scan
        if len(scan):
            bad = scan[scan["verdict"].isin([DIVERGED, NONFINITE])]
            data["nonfinite_steps"] = [int(s) for s in bad["step"] if not pd.isna(s)]
            data["rollback_step"] = scan.attrs.get("rollback_step")
        return data

    def _redraw(self) -> None:
        with self._lock:
            data = self._data()
        self.view.metric = self.metric_choice.value or ""
        self.view.data = data
        self.summary.value = self._summary_html()

    def _summary_html(self) -> str:
        table = self.table
        if table.empty:
            return ""
        complete = int((table["status"] == COMPLETE).sum())
        parts = [f"{len(table)} checkpoints, {complete} complete"]
        total = table["nbytes"].dropna()
        if len(total):
            parts.append(human_bytes(int(total.sum())) + " on disk")
        saves = table["save_total_s"].dropna()
        if len(saves):
            parts.append(f"saves {saves.median():.2g} s (median)")
        if len(self.drift):
            finite = self.drift[self.drift["rel_update"] > 0]
            if len(finite):
                top = finite.loc[finite["rel_update"].idxmax()]
                parts.append(
                    f"moved most: <b>{top['subtree']}</b> at step {int(top['step'])} "
                    f"(rel_update {top['rel_update']:.3g})"
                )
        if len(self.scan):
            first = self.scan.attrs.get("first_nonfinite_step")
            if first is not None:
                parts.append(
                    f"<span style='color:#d62728'>NaN/Inf from step {first}</span>; roll back "
                    f"to <b>{self.scan.attrs.get('rollback_step')}</b>"
                )
        return "<div style='line-height:1.4'>" + " · ".join(parts) + "</div>"

    def _show_picks(self) -> None:
        steps = self.picked_steps
        text = ""
        if len(steps) == 1:
            text = f"picked step {steps[0]}; pick another to diff the two"
        elif len(steps) == 2:
            text = f"diff of steps {steps[0]} → {steps[1]}"
            if self.picked_cell is not None:
                label = self.drift[self.drift["key"] == self.picked_cell[0]]["subtree"]
                text += f", layer {label.iloc[0] if len(label) else self.picked_cell[0]}"
        self.picks.value = note_html(text) if text else ""

    # -- events ---------------------------------------------------------------------

    def _on_metric(self, change: Any) -> None:
        self.view.metric = change["new"] or ""

    def _on_click(self, _widget: Any, content: Any, _buffers: Sequence[Any]) -> None:
        if not isinstance(content, dict):
            return
        if content.get("kind") == "step":
            self.picked_cell = None
            self.pick_step(int(content["step"]))
        elif content.get("kind") == "cell":
            column, layer = int(content["column"]), int(content["layer"])
            steps = sorted(set(int(s) for s in self.drift["step"]))
            self.pick_cell(self._layers[layer], steps[column])

    def _path_of(self, step: int) -> str:
        table = self.table
        hit = table[(table["step"] == step) & (table["status"] == COMPLETE)]
        if hit.empty:
            raise ValueError(f"the run has no complete checkpoint of step {step}")
        return str(hit.iloc[0]["path"])

    def _show_error(self, error: BaseException) -> None:
        self.error = f"{type(error).__name__}: {error}"
        self.message.value = error_html(self.error)

    def _note(self, text: str, color: str) -> None:
        self.message.value = note_html(text, color=color) if text else ""
