"""RestoreTargetBuilder: choose restore targets, see them against a checkpoint, load them.

It composes the three parts that do the work: ``TargetChoice`` (what to restore),
``judge`` and ``ComparisonView`` (whether it fits the checkpoint), and ``Load``
(the load with its progress bar).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import PurePath
from typing import Any

import ipywidgets as w
import jax
import pandas as pd
import traitlets

from tinax import explore
from tinax.checkpointing import abstract_restore_target, validate_checkpointable_name

from ._choice import LEFT_OUT, TargetChoice, keep_live
from ._comparison import ComparisonView, judge
from ._guard import shown_in_widget
from ._loading import Load
from ._progress import FAILED, RUNNING
from ._table import Column, PagedTable, format_cell
from ._text import error_html, format_bytes, format_seconds, note_html

STATE_COLUMNS = (
    Column("key", "key", lambda key: format_cell(key) or "(whole)", key=True),
    Column("shape", "shape"),
    Column("dtype", "dtype"),
    Column("nbytes", "size", format_bytes, align="right", descending_first=True),
    Column("checkpointable", "checkpointable", essential=False, priority=1),
    Column("kind", "kind", essential=False, priority=2),
)


def _check_state(state: object) -> Mapping[str, Any]:
    if not isinstance(state, Mapping):
        raise TypeError(
            f"state must be a mapping of checkpointable name to pytree, got {type(state).__name__}"
        )
    if not state:
        raise ValueError("state must not be empty")
    for name in state:
        validate_checkpointable_name(name)
    return state


class RestoreTargetBuilder(w.VBox):
    """Abstract restore targets from live state, checked against a checkpoint, and a Load button.

    Every checkpointable and each of its top-level subtrees has a checkbox;
    unticking leaves it out of ``target`` (unticking a checkpointable unticks its
    subtrees). In ``target`` a left-out subtree keeps its structure with Orbax's
    placeholder ``...`` at every leaf, so Orbax reads none of its bytes. In
    ``result`` it holds the live values passed in ``state`` (the same objects, not
    copies): each restored checkpointable has the structure of its live state and
    no placeholder, ready to replace it whole. A checkpointable that is unticked
    altogether is absent from ``result``.

    With a checkpoint ``path`` the widget shows ``compare_table``: by default only
    the leaves that differ (refusals, casts, leaves missing on one side), with a
    toggle to show every leaf (stored leaves of what is unticked show as ``left
    out``). After a load a one-line summary says what was restored; Load
    stays disabled, with the reason shown, while a chosen target cannot be
    restored from it. A dtype difference only warns: Orbax casts on restore.
    Load runs in a background thread when JAX runs in one process; with several
    processes Orbax needs every process on its main thread, so the load runs in
    the click.

    Attributes:
      path: The checkpoint compared and loaded from, or ``None``. Setting it (or
        linking it to ``CheckpointExplorer.checkpoint``) re-runs the comparison.
      reason: Why Load is disabled, or ``""``.
      status: ``""``, ``"loading"``, ``"loaded"`` or ``"failed"``.
      error: The last error shown in the widget, or ``""``.
      result: The restored values (name → value) after a load, else ``None``.
      summary: The one-line summary of the last load, or ``""``.
      progress: The ``AsyncProgress`` of the last load, or ``None``.
      comparison: The last comparison with the checkpoint, or ``None``.
    """

    path = traitlets.Unicode(None, allow_none=True)
    reason = traitlets.Unicode("")
    status = traitlets.Unicode("")
    error = traitlets.Unicode("")
    summary = traitlets.Unicode("")

    def __init__(
        self,
        state: Mapping[str, Any],
        path: str | Any | None = None,
        *,
        page_size: int = 20,
        load_in_thread: bool | None = None,
    ) -> None:
        """Builds targets for every checkpointable of ``state``.

        Args:
          state: Mapping of checkpointable name to live pytree (concrete arrays or
            abstract targets).
          path: A checkpoint to compare with and load from.
          page_size: Rows per page in the tables.
          load_in_thread: Load in a background thread (``True``) or in the click,
            one checkpointable at a time (``False``). ``None`` chooses the thread
            exactly when JAX runs in a single process.

        Raises:
          TypeError: If ``state`` is not a mapping, a name is not a string or
            ``path`` is not a path.
          ValueError: If ``state`` is empty or a name is invalid.
          FileNotFoundError: If ``path`` does not exist.
        """
        state = _check_state(state)
        if load_in_thread is not None and not isinstance(load_in_thread, bool):
            raise TypeError("load_in_thread must be a bool or None")
        self._load_in_thread = load_in_thread
        self._live = dict(state)
        self._load_started = 0.0
        # What the running load was asked for: its leaves, checkpointables, left-out
        # subtrees and how many placeholders stand for them.
        self._loading: tuple[pd.DataFrame, dict[str, Any], dict[str, set[Any]], int] = (
            pd.DataFrame(),
            {},
            {},
            0,
        )
        self._callbacks: list[Callable[[dict[str, Any]], None]] = []
        self._lock = threading.RLock()
        self.result: dict[str, Any] | None = None
        self.progress: Any = None
        self.comparison: pd.DataFrame | None = None
        self._table = pd.DataFrame()
        guard = shown_in_widget(self._show_error)

        self.choice = TargetChoice(
            {name: abstract_restore_target(tree) for name, tree in state.items()},
            guard(lambda _change: self._rebuild()),
        )
        self.checkboxes = self.choice.checkboxes
        self.subtree_checkboxes = self.choice.subtree_checkboxes
        self.message = w.HTML("")
        self.state_view = PagedTable(
            STATE_COLUMNS, page_size=page_size, empty_text="nothing chosen"
        )
        self.comparison_view = ComparisonView(page_size=page_size)
        self.compare_box = self.comparison_view.box
        self.load_button = w.Button(
            description="Load",
            icon="download",
            button_style="primary",
            layout=w.Layout(flex="0 0 auto"),
        )
        self.load_button.on_click(guard(self._on_load))
        self.reason_html = w.HTML("")
        self.lossy_box = w.Checkbox(
            value=False,
            description="allow lossy casts",
            indent=False,
            tooltip="restore into dtypes that cannot hold every stored value "
            "(float32 into bfloat16, a float into an integer)",
            layout=w.Layout(width="auto"),
        )
        self.lossy_box.observe(guard(lambda _change: self._rebuild()), names="value")
        self.progress_box = w.VBox([])
        self.summary_html = w.HTML("")
        self.compare_section = w.VBox(
            [
                self.comparison_view,
                w.HBox(
                    [self.load_button, self.lossy_box, self.reason_html],
                    layout=w.Layout(flex_flow="row wrap", align_items="center"),
                ),
                self.progress_box,
                self.summary_html,
            ],
            layout=w.Layout(display="none"),
        )
        super().__init__(
            children=[
                w.HTML("<b>Restore targets</b> (untick what to leave out)"),
                self.choice,
                self.state_view,
                self.message,
                self.compare_section,
            ]
        )
        self.add_class("tinax-restore-target-builder")
        self.observe(guard(self._on_path), names="path")
        self._rebuild()
        if path is not None:
            self.path = self._check_path(path)  # checked here too, to raise from the constructor

    # -- public ---------------------------------------------------------------------

    def tick(self, checkpointable: str, key: str = "", value: bool = True) -> None:
        """Restores (``True``) or leaves out (``False``) the subtree ``key`` of
        ``checkpointable``, at any depth (``""``: the whole checkpointable), as
        clicking its box in the tree does.

        Raises:
          ValueError: If there is no such subtree.
        """
        self.choice.tick(checkpointable, key, value)

    def ticked(self, checkpointable: str, key: str = "") -> bool | None:
        """Whether the subtree is restored: ``True``, ``False`` or ``None`` (in part)."""
        return self.choice.ticked(checkpointable, key)

    @property
    def target(self) -> dict[str, Any]:
        """Name → abstract restore target for the ticked checkpointables, ready for loading."""
        return self.choice.target

    @property
    def table(self) -> pd.DataFrame:
        """``state_table`` rows of the leaves that ``target`` restores."""
        return self._table.copy()

    def on_loaded(self, callback: Callable[[dict[str, Any]], None]) -> None:
        """Calls ``callback(result)`` after each successful load.

        With a single JAX process the load finishes in a background thread and the
        callback runs there. An exception from the callback is shown in the widget.
        """
        if not callable(callback):
            raise TypeError("callback must be callable")
        self._callbacks.append(callback)

    # -- choice and comparison --------------------------------------------------------

    def _show_error(self, error: BaseException) -> None:
        self.error = f"{type(error).__name__}: {error}"
        self.message.value = error_html(error)

    @staticmethod
    def _check_path(path: object) -> str:
        # Orbax reads only absolute paths; a notebook's paths are often relative.
        where = explore.resolve_path(path)
        if not explore.path_exists(where):
            raise FileNotFoundError(f"checkpoint {where!r} does not exist")
        return where

    @traitlets.validate("path")
    def _valid_path(self, proposal: Any) -> str | None:
        value = proposal["value"]
        return None if value is None else self._check_path(value)

    def _on_path(self, _change: Any) -> None:
        self.result = None
        self.status = ""
        self.summary = ""
        self.summary_html.value = ""
        self.progress_box.children = ()
        self._rebuild()

    def _rebuild(self) -> None:
        with self._lock:
            self.error = ""
            self.message.value = ""
            self._table = self.choice.table()
            self.state_view.show(self._table)
            self._check_against_checkpoint()

    def _check_against_checkpoint(self) -> None:
        self.comparison = None
        if self.path is None:
            self.compare_section.layout.display = "none"
            self.reason = "no checkpoint to load from"
            return
        self.compare_section.layout.display = ""
        self.comparison_view.clear(self.path)
        chosen = self.choice.chosen()
        if not chosen:
            self._block("nothing is chosen to load")
            return
        try:
            verdict = judge(
                self.path,
                chosen,
                {n: self.choice.left_out(n) for n in chosen},
                allow_lossy=self.lossy_box.value,
            )
        except Exception as e:
            self._block(f"cannot compare: {type(e).__name__}: {e}")
            raise
        self.comparison = verdict.comparison
        self.comparison_view.show(self.path, verdict.comparison)
        if verdict.reason:
            self._block(verdict.reason)
            return
        self.reason = ""
        self.load_button.disabled = self.status == "loading"
        self.reason_html.value = (
            note_html(
                f"{verdict.casts} lea{'f' if verdict.casts == 1 else 'ves'} will be cast "
                "to the target dtype",
                color="#7a4f01",
            )
            if verdict.casts
            else note_html("every chosen leaf matches the checkpoint", color="#1b5e20")
        )

    def _block(self, reason: str) -> None:
        self.reason = reason
        self.load_button.disabled = True
        self.reason_html.value = error_html(reason, title="Cannot load:")

    # -- loading --------------------------------------------------------------------

    def _on_load(self, _button: Any = None) -> None:
        if self.status == "loading" or self.path is None:
            return
        self._rebuild()
        if self.reason:
            return
        target = self.target
        load = Load(
            self.path,
            target,
            total_bytes=int(pd.to_numeric(self._table["nbytes"], errors="coerce").fillna(0).sum()),
            description=f"loading {PurePath(self.path).name}",
            finish=self._loaded,
            allow_lossy=self.lossy_box.value,
        )
        self.progress = load.progress
        self.progress_box.children = (load.progress,)
        self.status = "loading"
        self.result = None
        self.summary = ""
        self.summary_html.value = ""
        placeholders = sum(leaf is LEFT_OUT for leaf in jax.tree_util.tree_leaves(target))
        self._loading = (self._table.copy(), self.choice.chosen(), self._left_out(), placeholders)
        self._load_started = time.monotonic()
        self.load_button.disabled = True
        load.progress.observe(
            shown_in_widget(self._show_error)(self._on_progress_status), names="status"
        )
        in_thread = (
            jax.process_count() == 1 if self._load_in_thread is None else self._load_in_thread
        )
        failure = load.start(in_thread=in_thread)
        if failure is not None:
            # Loaded in this click: report the failure now, not when the bar notices.
            self.status = "failed"
            self.error = f"{type(failure).__name__}: {failure}"
            self.load_button.disabled = bool(self.reason)

    def _left_out(self) -> dict[str, set[Any]]:
        return {name: self.choice.left_out(name) for name in self.choice.chosen()}

    def _loaded(self, result: dict[str, Any]) -> None:
        seconds = time.monotonic() - self._load_started
        table, chosen, left_out, kept = self._loading
        result = {
            name: keep_live(value, self._live[name], left_out.get(name, set()))
            for name, value in result.items()
        }
        nbytes = int(pd.to_numeric(table["nbytes"], errors="coerce").fillna(0).sum())
        parts = [
            f"loaded {len(table):,} lea{'f' if len(table) == 1 else 'ves'} "
            f"({format_bytes(nbytes)}) in {format_seconds(seconds)}"
        ]
        if kept:
            parts.append(f"{kept:,} left-out lea{'f' if kept == 1 else 'ves'} kept as passed in")
        unticked = [name for name in self._live if name not in chosen]
        if unticked:
            parts.append("not loaded: " + ", ".join(unticked))
        self.summary = "; ".join(parts)
        self.summary_html.value = note_html(self.summary, color="#1b5e20")
        self.result = result
        self.status = "loaded"
        for callback in list(self._callbacks):
            shown_in_widget(self._show_error)(callback)(result)

    def _on_progress_status(self, change: Any) -> None:
        if change["new"] == RUNNING:
            return
        if change["new"] == FAILED:
            self.status = "failed"
            self.error = self.progress.error if self.progress is not None else ""
        self.load_button.disabled = bool(self.reason)
