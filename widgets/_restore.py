"""Choosing restore targets from live state, checking them against a checkpoint, loading."""

from __future__ import annotations

import html
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ipywidgets as w
import jax
import pandas as pd
import traitlets

from tinax import explore
from tinax.checkpointing import (
    abstract_restore_target,
    load_checkpointables,
    validate_checkpointable_name,
)
from widgets._disk import load_meter
from widgets._format import error_html, format_bytes, note_html
from widgets._guard import shown_in_widget
from widgets._progress import RUNNING, AsyncProgress
from widgets._table import Column, PagedTable, RowLook, format_cell
from widgets._task import Task

# Orbax skips a leaf whose restore target is this placeholder.
LEFT_OUT = ...
LEFT_OUT_STATUS = "left out"
# Statuses that make Orbax refuse the load (a dtype difference is cast on restore).
BLOCKING = frozenset({"shape differs", "kind differs", "missing from checkpoint", "not in target"})
_WARNING = frozenset({"dtype differs"})
_SHOWN_PROBLEMS = 3

STATE_COLUMNS = (
    Column("checkpointable", "checkpointable", "9em"),
    Column("key", "key", None, lambda key: format_cell(key) or "(whole)"),
    Column("kind", "kind", "7em"),
    Column("shape", "shape", "8em"),
    Column("dtype", "dtype", "6em"),
    Column("nbytes", "size", "6em", format_bytes),
)


def top_level_subtrees(tree: Any) -> list[str]:
    """``keystr`` of each direct child of ``tree`` (empty when ``tree`` is a leaf)."""
    children = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda node: node is not tree)[0]
    return [jax.tree_util.keystr(path) for path, _ in children if path]


def in_subtree(key: str, subtree: str) -> bool:
    """Whether the leaf ``key`` lies in the subtree whose key path is ``subtree``."""
    return key == subtree or (key.startswith(subtree) and key[len(subtree)] in "[.")


def _leave_out(target: Any, subtrees: set[str]) -> Any:
    if not subtrees:
        return target

    def place(path: Any, leaf: Any) -> Any:
        key = jax.tree_util.keystr(path)
        return LEFT_OUT if any(in_subtree(key, s) for s in subtrees) else leaf

    return jax.tree_util.tree_map_with_path(place, target)


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


def _side_title(column: str) -> str:
    """``shape_checkpoint`` → ``stored shape``; ``dtype_target`` → ``target dtype``."""
    base, _, side = column.rpartition("_")
    if side == "checkpoint":
        return f"stored {base}"
    if side == "target":
        return f"target {base}"
    return column.replace("_", " ")


def _leaves(n: int) -> str:
    return f"{n} leaf" if n == 1 else f"{n} leaves"


def _compare_look(row: pd.Series) -> RowLook:
    status = str(row.get("status", ""))
    if status in BLOCKING:
        return RowLook(color="#b00020", background="#fde7e9")
    if status in _WARNING:
        return RowLook(color="#7a4f01", background="#fff4ce")
    if status == LEFT_OUT_STATUS:
        return RowLook(color="#888888")
    return RowLook()


class RestoreTargetBuilder(w.VBox):
    """Abstract restore targets from live state, checked against a checkpoint, and a Load button.

    Every checkpointable and each of its top-level subtrees has a checkbox;
    unticking leaves it out of ``target``. A left-out subtree keeps its structure
    with Orbax's placeholder ``...`` at every leaf, so Orbax reads none of its
    bytes, and the restored value holds ``...`` there too.

    With a checkpoint ``path`` the widget shows ``compare_table`` with differences
    highlighted (stored leaves of what is unticked show as ``left out``); Load
    stays disabled, with the reason shown, while a chosen target cannot be
    restored from it. A dtype difference only warns: Orbax casts on restore. Load runs in a background thread when JAX runs in
    one process; with several processes Orbax needs every process on its main
    thread, so the load runs in the click. Either way checkpointables are loaded
    one at a time (the bar names the current one) and an ``AsyncProgress``
    follows an estimate of the bytes brought in (see ``load_meter``).

    Attributes:
      path: The checkpoint compared and loaded from, or ``None``. Setting it (or
        linking it to ``CheckpointExplorer.checkpoint``) re-runs the comparison.
      reason: Why Load is disabled, or ``""``.
      status: ``""``, ``"loading"``, ``"loaded"`` or ``"failed"``.
      error: The last error shown in the widget, or ``""``.
      result: The restored values (name → value) after a load, else ``None``.
      progress: The ``AsyncProgress`` of the last load, or ``None``.
    """

    path = traitlets.Unicode(None, allow_none=True)
    reason = traitlets.Unicode("")
    status = traitlets.Unicode("")
    error = traitlets.Unicode("")

    def __init__(
        self,
        state: Mapping[str, Any],
        path: str | os.PathLike[str] | None = None,
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
        self._state = _check_state(state)
        if load_in_thread is not None and not isinstance(load_in_thread, bool):
            raise TypeError("load_in_thread must be a bool or None")
        self._load_in_thread = load_in_thread
        self._abstract = {name: abstract_restore_target(tree) for name, tree in state.items()}
        self._callbacks: list[Callable[[dict[str, Any]], None]] = []
        self._lock = threading.RLock()
        self.result: dict[str, Any] | None = None
        self.progress: AsyncProgress | None = None
        self.comparison: pd.DataFrame | None = None
        self._table = pd.DataFrame()
        guard = shown_in_widget(self._show_error)

        self.checkboxes: dict[str, w.Checkbox] = {}
        self.subtree_checkboxes: dict[tuple[str, str], w.Checkbox] = {}
        choice_rows = []
        for name, tree in self._abstract.items():
            box = w.Checkbox(
                value=True, description=name, indent=False, style={"font_weight": "bold"}
            )
            self.checkboxes[name] = box
            subs = []
            for key in top_level_subtrees(tree):
                sub = w.Checkbox(
                    value=True, description=key, indent=False, layout=w.Layout(width="auto")
                )
                self.subtree_checkboxes[(name, key)] = sub
                subs.append(sub)
            choice_rows.append(box)
            if subs:
                choice_rows.append(
                    w.HBox(subs, layout=w.Layout(flex_flow="row wrap", margin="0 0 0 2em"))
                )
        for box in [*self.checkboxes.values(), *self.subtree_checkboxes.values()]:
            box.observe(guard(self._on_choice), names="value")

        self.message = w.HTML("")
        self.state_view = PagedTable(
            STATE_COLUMNS, page_size=page_size, empty_text="nothing chosen"
        )
        self.compare_title = w.HTML("")
        self.compare_box = w.VBox([])
        self.load_button = w.Button(description="Load", icon="download", button_style="primary")
        self.load_button.on_click(guard(self._on_load))
        self.reason_html = w.HTML("")
        self.progress_box = w.VBox([])
        self._page_size = page_size
        self.compare_section = w.VBox(
            [
                self.compare_title,
                self.compare_box,
                w.HBox([self.load_button, self.reason_html]),
                self.progress_box,
            ],
            layout=w.Layout(display="none"),
        )
        super().__init__(
            children=[
                w.HTML("<b>Restore targets</b> (untick what to leave out)"),
                w.VBox(choice_rows),
                self.state_view,
                self.message,
                self.compare_section,
            ]
        )
        self.observe(guard(self._on_path), names="path")
        self._rebuild()
        if path is not None:
            self.path = self._check_path(path)  # checked here too, to raise from the constructor

    # -- public ---------------------------------------------------------------------

    @property
    def target(self) -> dict[str, Any]:
        """Name → abstract restore target for the ticked checkpointables, ready for loading."""
        chosen = {}
        for name, tree in self._abstract.items():
            if self.checkboxes[name].value:
                chosen[name] = _leave_out(tree, self._left_out(name))
        return chosen

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

    # -- choice ---------------------------------------------------------------------

    def _left_out(self, name: str) -> set[str]:
        return {
            key for (n, key), box in self.subtree_checkboxes.items() if n == name and not box.value
        }

    def _show_error(self, error: BaseException) -> None:
        self.error = f"{type(error).__name__}: {error}"
        self.message.value = error_html(error)

    @staticmethod
    def _check_path(path: object) -> str:
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        # Orbax reads only absolute paths; a notebook's paths are often relative.
        resolved = Path(os.fspath(path)).absolute()
        if not resolved.exists():
            raise FileNotFoundError(f"checkpoint {str(resolved)!r} does not exist")
        return str(resolved)

    def _on_choice(self, _change: Any) -> None:
        for (name, _key), box in self.subtree_checkboxes.items():
            box.disabled = not self.checkboxes[name].value
        self._rebuild()

    @traitlets.validate("path")
    def _valid_path(self, proposal: Any) -> str | None:
        value = proposal["value"]
        return None if value is None else self._check_path(value)

    def _on_path(self, change: Any) -> None:
        self.result = None
        self.status = ""
        self.progress_box.children = ()
        self._rebuild()

    def _rebuild(self) -> None:
        with self._lock:
            self.error = ""
            self.message.value = ""
            chosen = {n: t for n, t in self._abstract.items() if self.checkboxes[n].value}
            if chosen:
                table = explore.state_table(chosen)
                left_out = (
                    table.apply(
                        lambda r: any(
                            in_subtree(str(r["key"]), s)
                            for s in self._left_out(r["checkpointable"])
                        ),
                        axis=1,
                    )
                    if len(table)
                    else pd.Series(dtype=bool)
                )
                table = table[~left_out.astype(bool)] if len(table) else table
            else:
                table = pd.DataFrame(columns=[c.field for c in STATE_COLUMNS])
            self._table = table.reset_index(drop=True)
            self.state_view.show(self._table)
            self._compare_with_checkpoint(chosen)

    # -- comparison -----------------------------------------------------------------

    def _compare_with_checkpoint(self, chosen: Mapping[str, Any]) -> None:
        self.comparison = None
        if self.path is None:
            self.compare_section.layout.display = "none"
            self.reason = "no checkpoint to load from"
            return
        self.compare_section.layout.display = ""
        self.compare_title.value = f"<b>Compared with</b> <code>{html.escape(self.path)}</code>"
        if not chosen:
            self._block("nothing is chosen to load")
            self.compare_box.children = ()
            return
        try:
            comparison = explore.compare_table(self.path, dict(chosen)).reset_index(drop=True)
        except Exception as e:
            self._block(f"cannot compare: {type(e).__name__}: {e}")
            self.compare_box.children = ()
            raise
        ticked = comparison["checkpointable"].isin(list(chosen))
        # Unticked checkpointables are stored but not asked for: left out, not a problem.
        comparison.loc[~ticked, "status"] = LEFT_OUT_STATUS
        for name in chosen:
            for subtree in self._left_out(name):
                inside = (
                    ticked
                    & (comparison["checkpointable"] == name)
                    & comparison["key"].astype(str).map(lambda k, s=subtree: in_subtree(k, s))
                )
                comparison.loc[inside, "status"] = LEFT_OUT_STATUS
        self.comparison = comparison
        self._show_comparison(comparison)
        relevant = comparison[ticked & comparison["status"].isin(list(BLOCKING))]
        if len(relevant):
            problems = [
                f"{r['checkpointable']} {r['key']}: {r['status']}"
                for _, r in relevant.head(_SHOWN_PROBLEMS).iterrows()
            ]
            more = len(relevant) - len(problems)
            self._block(
                f"{_leaves(len(relevant))} cannot be restored: "
                + "; ".join(problems)
                + (f"; and {more} more" if more else "")
            )
        else:
            warnings = comparison[ticked & comparison["status"].isin(list(_WARNING))]
            self.reason = ""
            self.load_button.disabled = self.status == "loading"
            self.reason_html.value = (
                note_html(
                    f"{_leaves(len(warnings))} will be cast to the target dtype", color="#7a4f01"
                )
                if len(warnings)
                else note_html("every chosen leaf matches the checkpoint", color="#1b5e20")
            )

    def _block(self, reason: str) -> None:
        self.reason = reason
        self.load_button.disabled = True
        self.reason_html.value = error_html(reason, title="Cannot load:")

    def _show_comparison(self, comparison: pd.DataFrame) -> None:
        fields = ["checkpointable", "key", "status"]
        extra = [
            c
            for c in comparison.columns
            if c not in fields and any(part in c for part in ("kind", "shape", "dtype"))
        ]
        columns = [
            Column("checkpointable", "checkpointable", "9em"),
            Column("key", "key", None),
            Column("status", "status", "11em"),
            *[Column(c, _side_title(c), "7.5em") for c in extra],
        ]
        view = self.compare_box.children[0] if self.compare_box.children else None
        if not isinstance(view, PagedTable) or [c.field for c in view.columns] != [
            c.field for c in columns
        ]:
            view = PagedTable(columns, page_size=self._page_size, look=_compare_look)
            self.compare_box.children = (view,)
        # Differences first, so they are on the first page.
        order = comparison["status"].map(
            lambda s: 0 if s in BLOCKING else 1 if s in _WARNING else 3 if s == "ok" else 2
        )
        view.show(
            comparison.assign(_order=order)
            .sort_values("_order", kind="stable")
            .drop(columns="_order")
        )
        counts = comparison["status"].value_counts()
        self.compare_title.value = (
            f"<b>Compared with</b> <code>{html.escape(str(self.path))}</code>: "
            + html.escape(", ".join(f"{n} {s}" for s, n in counts.items()))
        )

    # -- loading --------------------------------------------------------------------

    def _on_load(self, _button: Any = None) -> None:
        if self.status == "loading" or self.path is None:
            return
        self._rebuild()
        if self.reason:
            return
        path, targets = self.path, self.target
        total = int(pd.to_numeric(self._table["nbytes"], errors="coerce").fillna(0).sum())
        task: Task[dict[str, Any]] = Task("load")
        progress = AsyncProgress(
            task,
            total_bytes=total,
            count_bytes=load_meter(),
            description=f"loading {Path(path).name}",
        )
        self.progress = progress
        self.progress_box.children = (progress,)
        self.status = "loading"
        self.result = None
        self.load_button.disabled = True
        progress.observe(
            shown_in_widget(self._show_error)(self._on_progress_status), names="status"
        )
        in_thread = (
            jax.process_count() == 1 if self._load_in_thread is None else self._load_in_thread
        )
        task.start(lambda: self._loaded(self._load(path, targets, progress)), in_thread=in_thread)
        failure = task.exception()
        if failure is not None:
            # Loaded in this click: report the failure now, not when the bar notices.
            self.status = "failed"
            self.error = f"{type(failure).__name__}: {failure}"
            self.load_button.disabled = bool(self.reason)

    @staticmethod
    def _load(path: str, targets: dict[str, Any], progress: AsyncProgress) -> dict[str, Any]:
        restored: dict[str, Any] = {}
        base = progress.label.value
        for i, (name, target) in enumerate(targets.items(), start=1):
            progress.label.value = f"{base}: {name} ({i}/{len(targets)})"
            restored.update(load_checkpointables(path, {name: target}))
        progress.label.value = base
        return restored

    def _loaded(self, result: dict[str, Any]) -> dict[str, Any]:
        # Runs inside the task, so that result, status and callbacks are all in place
        # before the progress bar reports done.
        self.result = result
        self.status = "loaded"
        for callback in list(self._callbacks):
            shown_in_widget(self._show_error)(callback)(result)
        return result

    def _on_progress_status(self, change: Any) -> None:
        if change["new"] == RUNNING:
            return
        if change["new"] == "failed":
            self.status = "failed"
            self.error = self.progress.error if self.progress is not None else ""
        self.load_button.disabled = bool(self.reason)
