"""Panels that derive a new checkpoint from one, or average several, with a preview of
what the result will hold and a progress bar bound to the work."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as w
import pandas as pd
import traitlets

from tinax.explore import checkpoint_health, checkpoint_table, display
from tinax.explore.toolkit import average_preview, derive_preview
from tinax.vocabulary import DIVERGED

from ._guard import shown_in_widget
from ._nonfinite import NONFINITE_COLOR
from ._progress import DONE, RUNNING, AsyncProgress, BytesMoved
from ._task import Task
from ._text import error_html, format_bytes, format_seconds, note_html

AS_STORED = "as stored"
CASTS = (AS_STORED, "bfloat16", "float16", "float32")
_PYTREE_KINDS = ("jax.Array", "np.ndarray", "scalar", "string", "empty")
_ARRAY_KINDS = ("jax.Array", "np.ndarray")


def _model_parts(table: pd.DataFrame) -> list[str]:
    """The checkpointables that hold a model's parameters: pytrees of floating-point
    arrays that are not an optimizer's state, an iterator or auxiliary values."""
    found = []
    for name, rows in table.groupby("checkpointable", sort=False):
        if not rows["kind"].isin(_PYTREE_KINDS).all():
            continue
        arrays = rows[rows["kind"].isin(_ARRAY_KINDS)]
        if not arrays["dtype"].astype(str).str.contains("float").any():
            continue
        first = str(rows["key"].iloc[0])
        if display.state_part(str(name), first) == display.MODEL:
            found.append(str(name))
    return found


def _text(description: str, placeholder: str) -> w.Text:
    """A text box read when it is left (not at every key stroke: each change reads
    the sources' metadata for the preview)."""
    return w.Text(
        value="",
        description=description,
        placeholder=placeholder,
        continuous_update=False,
        layout=w.Layout(width="22em"),
    )


def _sibling(path: str, name: str) -> str:
    """``name`` in the directory holding ``path``."""
    parent = path.rstrip("/").rsplit("/", 1)[0]
    return f"{parent}/{name}"


class _SurgeryPanel(w.VBox):
    """What deriving and averaging panels share: a destination, a preview line, a
    button, a progress bar bound to the work, and the result opened when done.

    Attributes:
      error: The last failure, or ``""``.
      running: Whether work started here is still going on.
      written: The new checkpoint's path once the last run succeeded, else ``""``.
      progress: The ``AsyncProgress`` of the last run, or ``None``.
    """

    error = traitlets.Unicode("")
    running = traitlets.Bool(False)
    written = traitlets.Unicode("")
    _on_done: Callable[[str], None] | None

    def _build(self, title: str, controls: list[Any], button: str, default: str) -> None:
        self.progress: AsyncProgress | None = None
        self._bytes = BytesMoved()
        self.destination = w.Text(value=default, description="to", layout=w.Layout(width="100%"))
        self.run_button = w.Button(description=button, button_style="primary")
        self.preview = w.HTML("")
        self.message = w.HTML("")
        self.progress_box = w.VBox([])
        # A source that diverged: said before anything is written, and made from only
        # when this box is ticked (the library refuses it otherwise).
        self.health_note = w.HTML("")
        self.allow_diverged = w.Checkbox(
            value=False,
            description="make it from a diverged source all the same",
            indent=False,
            layout=w.Layout(width="auto", display="none"),
        )
        super().__init__(
            children=[
                w.HTML(note_html(title)),
                w.HBox(controls, layout=w.Layout(flex_flow="row wrap")),
                self.preview,
                self.health_note,
                self.allow_diverged,
                w.HBox([self.destination, self.run_button]),
                self.message,
                self.progress_box,
            ]
        )
        guard = shown_in_widget(self._show_error)
        self.run_button.on_click(guard(self._on_run))
        self.allow_diverged.observe(guard(lambda _: self._enable()), names="value")
        self._show_health()

    # -- to be given by each panel --------------------------------------------------

    def _sources(self) -> list[str]:
        raise NotImplementedError

    def _planned(self) -> pd.DataFrame:
        raise NotImplementedError

    def _work(self, destination: str, progress: Callable[[int, int], None]) -> None:
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------

    def update_preview(self) -> pd.DataFrame | None:
        """Shows what the result would hold with the current choices; ``None`` (and the
        reason shown) where they cannot make one."""
        try:
            table = self._planned()
        except (ValueError, TypeError, OSError) as e:
            self.preview.value = error_html(e, title="Cannot be made:")
            self.run_button.disabled = True
            return None
        arrays = int(table["shape"].notna().sum())
        self.preview.value = note_html(
            f"will hold {len(table):,} leaves ({arrays:,} arrays) in "
            f"{table['checkpointable'].nunique()} checkpointable(s): "
            f"{format_bytes(table.attrs['written_bytes'])} written, "
            f"{format_bytes(table.attrs['read_bytes'])} read"
        )
        self._enable()
        return table

    def _show_health(self) -> None:
        """Names each source that diverged, in the library's words (metadata, and what
        this process read of its data), and offers the box that allows it."""
        found = []
        for source in self._sources():
            health = checkpoint_health(source)
            if health.verdict == DIVERGED:
                name = source.rstrip("/").rsplit("/", 1)[-1]
                found.append(f"{name} diverged: {health.reason}")
        self._diverged = bool(found)
        self.health_note.value = (
            note_html("⚠ " + "; ".join(found), color=NONFINITE_COLOR) if found else ""
        )
        self.allow_diverged.layout.display = "" if found else "none"
        self._enable()

    def _enable(self) -> None:
        blocked = getattr(self, "_diverged", False) and not self.allow_diverged.value
        self.run_button.disabled = self.running or blocked

    def _show_error(self, error: BaseException) -> None:
        self.error = f"{type(error).__name__}: {error}"
        self.message.value = error_html(error, title="Failed:")
        self.running = False
        self.run_button.disabled = False

    def _on_run(self, _button: Any = None) -> None:
        if self.running:
            return
        destination = self.destination.value.strip()
        if not destination:
            raise ValueError("choose a destination for the new checkpoint")
        table = self.update_preview()
        if table is None:
            return
        self.error = ""
        self.written = ""
        self._bytes = BytesMoved()
        self.running = True
        self.run_button.disabled = True
        self.message.value = note_html(f"writing {destination}…")
        task: Task[None] = Task("surgery")
        progress = AsyncProgress(
            task,
            total_bytes=int(table.attrs["read_bytes"]),
            count_bytes=self._bytes.count,
            description=self.run_button.description.lower().rstrip("…"),
        )
        self.progress = progress
        self.progress_box.children = (progress,)
        self._destination = destination
        self._started = time.monotonic()
        progress.observe(shown_in_widget(self._show_error)(self._on_status), names="status")
        moved = self._bytes.moved
        task.start(lambda: self._work(destination, moved), in_thread=True)

    def _on_status(self, _change: Any) -> None:
        progress = self.progress
        if progress is None or progress.status == RUNNING or not self.running:
            return
        self.running = False
        self.run_button.disabled = False
        if progress.status != DONE:
            self.error = progress.error
            self.message.value = error_html(progress.error, title="Failed:")
            if progress.error.startswith("DivergedCheckpointError"):
                # Found diverged as it was read: the box that allows it is offered.
                self._show_health()
            return
        table = checkpoint_table(self._destination)
        nbytes = int(pd.to_numeric(table["nbytes"], errors="coerce").fillna(0).sum())
        self.message.value = note_html(
            f"wrote {self._destination}: {len(table):,} leaves, {format_bytes(nbytes)}, in "
            f"{format_seconds(time.monotonic() - self._started)}",
            color="#1b5e20",
        )
        self.written = self._destination
        if self._on_done is not None:
            self._on_done(self._destination)


class DerivePanel(_SurgeryPanel):
    """Derive a new checkpoint from one: some checkpointables ("params only"), floats
    cast, only the leaves whose dotted key a regular expression finds.

    The preview line says what the result will hold (leaves, bytes written and read)
    as the choices change; Derive runs ``tinax.checkpointing.derive_checkpoint`` in a
    background thread behind an ``AsyncProgress``; ``on_done(path)`` is called once
    the new checkpoint has committed.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        on_done: Callable[[str], None] | None = None,
    ) -> None:
        """Reads the checkpoint's metadata and builds the panel.

        Raises:
          TypeError: If ``path`` is not a path.
          FileNotFoundError: If it does not exist.
          ValueError: If it is not a readable checkpoint.
        """
        table = checkpoint_table(path)
        self.path = str(os.fspath(path))
        self._on_done = on_done
        names = [str(n) for n in dict.fromkeys(table["checkpointable"])]
        self._model = _model_parts(table) or names
        self.checkpointables = w.SelectMultiple(
            options=names, value=tuple(names), description="keep", rows=min(len(names), 4)
        )
        self.params_only = w.Button(description="params only", tooltip=", ".join(self._model))
        self.cast = w.Dropdown(
            options=CASTS, value=AS_STORED, description="floats", layout=w.Layout(width="14em")
        )
        self.key_filter = _text("keys", "all (a regular expression: ^blocks\\.0\\.)")
        name = self.path.rstrip("/").rsplit("/", 1)[-1]
        self._build(
            f"a new checkpoint derived from {self.path}",
            [self.checkpointables, self.params_only, self.cast, self.key_filter],
            "Derive",
            _sibling(self.path, f"{name}_derived"),
        )
        self.add_class("tinax-derive-panel")
        guard = shown_in_widget(self._show_error)
        self.params_only.on_click(guard(lambda _: self._params_only()))
        for control in (self.checkpointables, self.cast, self.key_filter):
            control.observe(guard(lambda _: self._changed()), names="value")
        self.update_preview()

    def _params_only(self) -> None:
        self.checkpointables.value = tuple(self._model)
        if self.cast.value == AS_STORED:
            self.cast.value = "bfloat16"

    def _changed(self) -> None:
        name = self.path.rstrip("/").rsplit("/", 1)[-1]
        suffix = "derived" if self.cast.value == AS_STORED else self.cast.value
        default = {_sibling(self.path, f"{name}_{s}") for s in ("derived", *CASTS[1:])}
        if self.destination.value in default:
            self.destination.value = _sibling(self.path, f"{name}_{suffix}")
        self.update_preview()

    def _options(self) -> dict[str, Any]:
        chosen = list(self.checkpointables.value)
        every = list(self.checkpointables.options)
        return {
            "checkpointables": None if chosen == every else chosen,
            "keys": self.key_filter.value.strip() or None,
            "cast": None if self.cast.value == AS_STORED else self.cast.value,
        }

    def _sources(self) -> list[str]:
        return [self.path]

    def _planned(self) -> pd.DataFrame:
        return derive_preview(self.path, **self._options())

    def _work(self, destination: str, progress: Callable[[int, int], None]) -> None:
        # tinax.checkpointing brings JAX and Orbax: imported when a derive starts.
        from tinax.checkpointing import derive_checkpoint

        derive_checkpoint(
            self.path,
            destination,
            progress=progress,
            allow_diverged=self.allow_diverged.value,
            **self._options(),
        )


class AveragePanel(_SurgeryPanel):
    """Average several checkpoints of one structure into a new one.

    The sources, one weight each (equal by default), which checkpointables (a model's
    by default: counters and iterator states differ between steps) and which keys (an
    NNX Dropout's RNG counter differs too: leave it out), a destination and
    a preview of what the result will hold; Average runs
    ``tinax.checkpointing.average_checkpoints`` in a background thread behind an
    ``AsyncProgress``; ``on_done(path)`` is called once the new checkpoint has committed.
    """

    def __init__(
        self,
        sources: Sequence[str | os.PathLike[str]],
        *,
        on_done: Callable[[str], None] | None = None,
    ) -> None:
        """Reads the first source's metadata and builds the panel.

        Raises:
          TypeError: If ``sources`` is not a list of paths.
          ValueError: If fewer than two are given, or one is not a readable checkpoint.
          FileNotFoundError: If one does not exist.
        """
        if isinstance(sources, str | bytes | os.PathLike) or not isinstance(sources, Sequence):
            raise TypeError("sources must be a list of checkpoint paths")
        self.sources = [str(os.fspath(s)) for s in sources]
        if len(self.sources) < 2:
            raise ValueError("an average needs at least two checkpoints: pick two or more")
        self._on_done = on_done
        table = checkpoint_table(self.sources[0])
        names = [str(n) for n in dict.fromkeys(table["checkpointable"])]
        model = _model_parts(table) or names
        self.checkpointables = w.SelectMultiple(
            options=names, value=tuple(model), description="average", rows=min(len(names), 4)
        )
        self.key_filter = _text("keys", "all (a regular expression of dotted keys)")
        self.weights = _text("weights", "equal (or one number per checkpoint)")
        shown = ", ".join(s.rstrip("/").rsplit("/", 1)[-1] for s in self.sources)
        newest = self.sources[-1].rstrip("/").rsplit("/", 1)[-1]
        self._build(
            f"the average of {len(self.sources)}: {shown}",
            [self.checkpointables, self.weights, self.key_filter],
            "Average",
            _sibling(self.sources[-1], f"{newest}_average{len(self.sources)}"),
        )
        self.add_class("tinax-average-panel")
        guard = shown_in_widget(self._show_error)
        for control in (self.checkpointables, self.weights, self.key_filter):
            control.observe(guard(lambda _: self.update_preview()), names="value")
        self.update_preview()

    def _parsed_weights(self) -> list[float] | None:
        text = self.weights.value.replace(",", " ").split()
        if not text:
            return None
        try:
            values = [float(t) for t in text]
        except ValueError:
            raise ValueError(f"weights {self.weights.value!r} are not numbers") from None
        if len(values) != len(self.sources):
            raise ValueError(f"{len(values)} weights for {len(self.sources)} checkpoints")
        if any(v < 0 for v in values) or sum(values) <= 0:
            raise ValueError("weights must be non-negative and not all zero")
        return values

    def _sources(self) -> list[str]:
        return list(self.sources)

    def _planned(self) -> pd.DataFrame:
        self._parsed_weights()
        return average_preview(
            self.sources,
            checkpointables=list(self.checkpointables.value),
            keys=self.key_filter.value.strip() or None,
        )

    def _work(self, destination: str, progress: Callable[[int, int], None]) -> None:
        # tinax.checkpointing brings JAX and Orbax: imported when an average starts.
        from tinax.checkpointing import average_checkpoints

        average_checkpoints(
            self.sources,
            destination,
            weights=self._parsed_weights(),
            checkpointables=list(self.checkpointables.value),
            keys=self.key_filter.value.strip() or None,
            progress=progress,
            allow_diverged=self.allow_diverged.value,
        )
