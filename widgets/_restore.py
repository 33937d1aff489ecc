"""RestoreTargetBuilder: choose restore targets, see them against a checkpoint, load them.

It composes the parts that do the work: ``TargetChoice`` (what to restore), the
presets (``_presets``: common choices in one click), ``judge`` and ``ComparisonView``
(whether it fits the checkpoint), ``PlanView`` (what the load will read and hold, and
whether it fits in memory), and ``Load`` (the load with its progress bar).

The builder is the one widget that needs JAX and Orbax, and only once it is made
from live state (which JAX made): they are imported then, not with ``tinax.widgets``.

(Over 500 lines: one widget's flow from choice to comparison, load and apply, whose
steps share the state of the load in flight; the parts that stand alone live apart.)
"""

from __future__ import annotations

import contextlib
import html
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

import ipywidgets as w
import pandas as pd
import traitlets

from tinax import explore
from tinax.explore import toolkit

from . import _presets
from ._guard import shown_in_widget
from ._load_guard import LoadGuard
from ._nonfinite import NONFINITE_COLOR
from ._plan_view import PlanView
from ._progress import FAILED, RUNNING
from ._section import Section
from ._table import Column, PagedTable, format_cell
from ._text import error_html, format_bytes, format_seconds, note_html

if TYPE_CHECKING:
    from ._choice import TargetChoice
    from ._comparison import ComparisonView

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
    from tinax.checkpointing import validate_checkpointable_name

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

    Presets tick the common choices in one click (``apply_preset``): ``model
    only``, ``params only`` (the model's ``nnx.Param`` leaves), ``without
    normalisation statistics`` (the model without BatchNorm's running mean and
    var) and ``everything``. After a load the summary says where the values are
    and how to put them into the notebook's objects (``nnx.update(model,
    builder.result["model"])``); for flax NNX state, *Apply* (``apply()``) does it:
    the state passed in shares its variables with the model it came from
    (``nnx.state(model)``), so the model itself takes the restored values.

    With a checkpoint ``path`` the widget shows ``compare_table``: by default only
    the leaves that differ (refusals, casts, leaves missing on one side), with a
    toggle to show every leaf (stored leaves of what is unticked show as ``left
    out``); then the restore plan (``tinax.explore.restore_plan``): what the load
    will read, its peak host memory and each device's memory against what is
    available, and the warnings, with its rows per process and device folded under
    them. A load that would not fit is not offered: Load is disabled, the reason
    said, as the load itself would refuse it. After a load a one-line summary says what was restored; Load
    stays disabled, with the reason shown, while a chosen target cannot be
    restored from it. The checkpoint's verdict (``verify``: integrity and health)
    shows above Load; Load of a checkpoint that diverged asks first (``load_guard``:
    "Load anyway" or "Cancel"). A dtype difference only warns: Orbax casts on restore.
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
      plan: The restore plan of the chosen targets (``restore_plan``'s table), or
        ``None`` when there is none (no checkpoint, nothing chosen, a refusal).
      preset: The preset the ticks follow, or ``""`` once they are changed by hand.
      applied: Names of the checkpointables the last ``apply()`` put into live state.
    """

    path = traitlets.Unicode(None, allow_none=True)
    reason = traitlets.Unicode("")
    status = traitlets.Unicode("")
    error = traitlets.Unicode("")
    summary = traitlets.Unicode("")
    preset = traitlets.Unicode("")

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
          load_in_thread: Load in a background thread (``True``) or in the click
            (``False``). ``None`` chooses the thread exactly when JAX runs in a
            single process.

        Raises:
          TypeError: If ``state`` is not a mapping, a name is not a string or
            ``path`` is not a path.
          ValueError: If ``state`` is empty or a name is invalid.
          FileNotFoundError: If ``path`` does not exist.
        """
        state = _check_state(state)
        if load_in_thread is not None and not isinstance(load_in_thread, bool):
            raise TypeError("load_in_thread must be a bool or None")
        from tinax.checkpointing import abstract_restore_target

        from ._choice import TargetChoice
        from ._comparison import ComparisonView

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
        self.plan: pd.DataFrame | None = None
        self.applied: list[str] = []
        self._table = pd.DataFrame()
        self._applying_preset = False
        guard = shown_in_widget(self._show_error)

        self.choice: TargetChoice = TargetChoice(
            {name: abstract_restore_target(tree) for name, tree in state.items()},
            guard(self._on_choice),
        )
        self.presets_box = _presets.PresetButtons(self._live, guard(self.apply_preset))
        self.preset_buttons = self.presets_box.buttons
        self.checkboxes = self.choice.checkboxes
        self.subtree_checkboxes = self.choice.subtree_checkboxes
        self.message = w.HTML("")
        self.state_view = PagedTable(
            STATE_COLUMNS, page_size=page_size, empty_text="nothing chosen"
        )
        # The leaves restored, as a table: folded at first, the tree says the same.
        self.leaves_section = Section("leaves", "", [self.state_view], is_open=False)
        self.comparison_view: ComparisonView = ComparisonView(page_size=page_size)
        self.compare_box = self.comparison_view.box
        self.plan_view = PlanView(page_size=page_size)
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
        self.apply_button = w.Button(
            description="Apply",
            icon="check",
            tooltip="put the restored values into the live state passed in (nnx.update), "
            "and so into the model or optimizer it came from",
            layout=w.Layout(flex="0 0 auto", display="none"),
        )
        self.apply_button.on_click(guard(lambda _button: self.apply()))
        # The checkpoint's verdict, and the question before a diverged one is loaded.
        self.load_guard = LoadGuard(self._show_error)
        self._confirmed = False
        self.compare_section = w.VBox(
            [
                self.comparison_view,
                self.plan_view,
                self.load_guard.verdict,
                w.HBox(
                    [self.load_button, self.lossy_box, self.reason_html],
                    layout=w.Layout(flex_flow="row wrap", align_items="center"),
                ),
                self.load_guard.question,
                self.progress_box,
                w.HBox(
                    [self.summary_html, self.apply_button],
                    layout=w.Layout(flex_flow="row wrap", align_items="center"),
                ),
            ],
            layout=w.Layout(display="none"),
        )
        super().__init__(
            children=[
                w.HTML("<b>Restore targets</b> (untick what to leave out, or pick a preset)"),
                self.presets_box,
                self.choice,
                self.leaves_section,
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

    def apply_preset(self, preset: str) -> None:
        """Ticks what ``preset`` restores and unticks the rest, as its button does.

        Args:
          preset: One of ``"model only"``, ``"params only"``, ``"without
            normalisation statistics"`` and ``"everything"``.

        Raises:
          ValueError: If there is no such preset, or it needs a checkpointable named
            ``model`` and there is none (nor only one checkpointable).
        """
        plan = _presets.plan(preset, self._live)
        with self._preset_ticks():
            for name in self._live:
                chosen = name in plan.checkpointables
                self.choice.tick(name, "", chosen)
                if chosen and self.choice.ticked(name) is not True:
                    # Ticking a checkpointable gives back its old ticks; a preset wants all.
                    self.choice.tick(name, "", True)
            for name, keys in plan.left_out.items():
                for key in keys:
                    self.choice.tick(name, key, False)
        self.preset = preset
        self.presets_box.show(preset)
        self._rebuild()

    def apply(self) -> list[str]:
        """Puts the last load's values into the live state passed in, with ``nnx.update``.

        Only flax NNX state can take values in place: ``nnx.state(model)`` shares its
        variables with ``model``, so the model itself then holds the restored values
        (left-out leaves keep theirs). Other checkpointables (a PRNG key, a dict of
        arrays) are immutable values; take them from ``result``.

        Returns:
          The names of the checkpointables applied.

        Raises:
          RuntimeError: If nothing has been loaded yet.
        """
        if self.result is None:
            raise RuntimeError("nothing loaded yet: click Load first")
        applied = _presets.apply_to_live(self._live, self.result)
        self.applied = applied
        if applied:
            note = (
                f"applied {', '.join(applied)}: the live "
                f"{'state holds' if len(applied) == 1 else 'states hold'} the restored values"
            )
        else:
            note = "nothing to apply in place: take the values from builder.result"
        self.summary_html.value = self._summary_html(extra=note)
        return applied

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
        where = toolkit.resolve_path(path)
        if not toolkit.path_exists(where):
            raise FileNotFoundError(f"checkpoint {where!r} does not exist")
        return where

    @traitlets.validate("path")
    def _valid_path(self, proposal: Any) -> str | None:
        value = proposal["value"]
        return None if value is None else self._check_path(value)

    def _on_path(self, _change: Any) -> None:
        self.load_guard.check(self.path)
        self.result = None
        self.status = ""
        self.summary = ""
        self.summary_html.value = ""
        self.progress_box.children = ()
        self._rebuild()

    @contextlib.contextmanager
    def _preset_ticks(self) -> Iterator[None]:
        # A preset ticks many boxes; the comparison runs once, after the last.
        self._applying_preset = True
        try:
            yield
        finally:
            self._applying_preset = False

    def _on_choice(self, _change: Any) -> None:
        if self._applying_preset:
            return
        self.preset = ""
        self.presets_box.show("")
        self._rebuild()

    def _rebuild(self) -> None:
        with self._lock:
            self.error = ""
            self.message.value = ""
            self._table = self.choice.table()
            self.state_view.show(self._table)
            nbytes = int(pd.to_numeric(self._table["nbytes"], errors="coerce").fillna(0).sum())
            count = len(self._table)
            self.leaves_section.set_title(
                f"<b>{count:,} lea{'f' if count == 1 else 'ves'} to restore</b> "
                f"({format_bytes(nbytes)}) as a table"
            )
            self._check_against_checkpoint()

    def _check_against_checkpoint(self) -> None:
        self.comparison = None
        self.plan = None
        self.plan_view.clear()
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
        from ._comparison import judge

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
        if not self._planned():
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

    def _planned(self) -> bool:
        """Shows the restore plan of the chosen targets; ``False`` (Load disabled, the
        reason said) when the load would be refused: it does not fit in memory."""
        from tinax.checkpointing import allow_lossy_casts

        assert self.path is not None
        try:
            with allow_lossy_casts(self.lossy_box.value):
                self.plan = explore.restore_plan(self.path, self.target)
        except Exception as e:
            self._block(f"cannot plan the restore: {type(e).__name__}: {e}")
            raise
        self.plan_view.show(self.plan)
        if self.plan.attrs["fits"]:
            return True
        self._block("it does not fit in memory: " + "; and ".join(self.plan.attrs["problems"]))
        return False

    def _block(self, reason: str) -> None:
        self.reason = reason
        self.load_button.disabled = True
        self.reason_html.value = error_html(reason, title="Cannot load:")

    # -- loading --------------------------------------------------------------------

    def _on_load(self, _button: Any = None) -> None:
        if self.status == "loading" or self.path is None:
            return
        if self.load_guard.diverged and not self._confirmed:
            self.load_guard.ask(self.path, self._load_confirmed)
            return
        import jax

        from ._choice import LEFT_OUT
        from ._loading import Load

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
        self.apply_button.layout.display = "none"
        self.applied = []
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

    def _load_confirmed(self) -> None:
        """Loads a diverged checkpoint, its "Load anyway" clicked."""
        self._confirmed = True
        try:
            self._on_load()
        finally:
            self._confirmed = False

    def _left_out(self) -> dict[str, set[Any]]:
        return {name: self.choice.left_out(name) for name in self.choice.chosen()}

    def _loaded(self, result: dict[str, Any]) -> None:
        from ._choice import keep_live

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
        # What the load counted as it read: the verdict (and this summary) say it.
        self.load_guard.check(self.path)
        if self.load_guard.diverged:
            parts.append(f"diverged: {self.load_guard.health.reason}")
        self.summary = "; ".join(parts)
        self.result = result
        self.summary_html.value = self._summary_html()
        self.apply_button.layout.display = (
            "" if any(_presets.is_nnx_state(self._live[name]) for name in result) else "none"
        )
        self.status = "loaded"
        for callback in list(self._callbacks):
            shown_in_widget(self._show_error)(callback)(result)

    def _summary_html(self, extra: str = "") -> str:
        """The summary of the last load, where its values are and how to apply them."""
        names = list(self.result or {})
        where = (
            "The values are in builder.result (this widget's .result): "
            + html.escape(_presets.apply_hint(self._live, names))
            if names
            else ""
        )
        # Read as a paragraph, not spaced out as a row of controls.
        return (
            '<div style="line-height:1.4">'
            + note_html(
                self.summary, color=NONFINITE_COLOR if self.load_guard.diverged else "#1b5e20"
            )
            + (f"<br><code style='font-size:90%'>{where}</code>" if where else "")
            + (f"<br>{note_html(extra, color='#1b5e20')}" if extra else "")
            + "</div>"
        )

    def _on_progress_status(self, change: Any) -> None:
        if change["new"] == RUNNING:
            return
        if change["new"] == FAILED:
            self.status = "failed"
            self.error = self.progress.error if self.progress is not None else ""
        self.load_button.disabled = bool(self.reason)
