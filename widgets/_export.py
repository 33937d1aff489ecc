"""A panel that exports a checkpoint's arrays to safetensors files, with progress."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ipywidgets as w
import ml_dtypes
import numpy as np
import traitlets

from tinax.explore import checkpoint_health, checkpoint_table, export_safetensors
from tinax.vocabulary import DIVERGED

from ._caught import warnings_of_this_thread
from ._guard import shown_in_widget
from ._nonfinite import NONFINITE_COLOR
from ._progress import RUNNING, AsyncProgress, BytesMoved
from ._task import Task
from ._text import error_html, format_bytes, format_seconds, note_html

AS_STORED = "as stored"
DTYPES = (AS_STORED, "bfloat16", "float16", "float32")
_ARRAY_KINDS = ("jax.Array", "np.ndarray", "scalar")


def _itemsize(name: str) -> int | None:
    try:
        return np.dtype(name).itemsize
    except TypeError:
        found = getattr(ml_dtypes, name, None)
        return None if found is None else np.dtype(found).itemsize


def free_destination(wanted: Path) -> Path:
    """``wanted``, or the first of ``wanted_2``, ``wanted_3``… that does not exist: a
    destination to propose, which an export will not refuse."""
    if not wanted.exists() and not wanted.is_symlink():
        return wanted
    number = 2
    while True:
        found = wanted.with_name(f"{wanted.name}_{number}")
        if not found.exists() and not found.is_symlink():
            return found
        number += 1


def taken(destination: Path) -> bool:
    """Whether an export would refuse ``destination``: it exists and is not an empty
    directory."""
    if destination.is_symlink() or (destination.exists() and not destination.is_dir()):
        return True
    return destination.is_dir() and any(destination.iterdir())


def _is_float(name: str) -> bool:
    try:
        dtype = np.dtype(getattr(ml_dtypes, name, None) or name)
    except TypeError:
        return False
    return dtype.kind == "f" or name in ("bfloat16",) or name.startswith("float8")


class ExportPanel(w.VBox):
    """Export a checkpointable of one checkpoint as ``.safetensors`` files.

    A checkpointable dropdown (those holding arrays), a dtype for the floating-point
    arrays, a destination directory and an Export button; the export streams the
    arrays from the checkpoint (``tinax.explore.export_safetensors``) in a background
    thread behind an ``AsyncProgress``. The destination proposed never exists (a
    number is added to the name, and the next one is proposed after an export); one
    that exists and is not empty is refused at the click, before anything starts.
    A failure (a corrupt array) is shown once in the panel.

    Warnings the export raises (NaN or Inf in the tensors written) are shown in the
    panel as they come, and kept in ``warnings``.

    Attributes:
      error: The last export's failure, or ``""``.
      warnings: The warnings the last export raised.
      exporting: Whether an export started here is still running.
      files: The files the last export wrote.
      progress: The ``AsyncProgress`` of the last export, or ``None``.
    """

    error = traitlets.Unicode("")
    exporting = traitlets.Bool(False)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        nonfinite: Mapping[str, tuple[int, int]] | None = None,
        found_by: str = "",
    ) -> None:
        """Reads the checkpoint's metadata and builds the panel.

        Args:
          path: A checkpoint directory, local or ``gs://``.
          nonfinite: What is known of the checkpoint's NaN and Inf, per
            checkpointable: ``(nan, inf)`` counts. ``None``: what the library knows
            (``checkpoint_health``: the counts of its data read in this process, by
            a data check, a scan or a load, or recorded by its run). A checkpointable
            with any is warned of before it is written, and its button reads
            "Export anyway".
          found_by: What found them (``"the data check"``), for the warning.

        Raises:
          TypeError: If ``path`` is not a path.
          FileNotFoundError: If it does not exist.
          ValueError: If it is not a readable checkpoint, or holds no arrays.
        """
        table = checkpoint_table(path)
        self.path = str(os.fspath(path))
        arrays = table[table["kind"].isin(_ARRAY_KINDS) & table["dtype"].notna()]
        names = list(dict.fromkeys(arrays["checkpointable"]))
        if not names:
            raise ValueError(f"checkpoint {self.path!r} holds no arrays to export")
        self._arrays = arrays
        self._metrics_note = ""
        if nonfinite is None:
            health = checkpoint_health(path)
            counts = health.counts or {}
            nonfinite = {n: (c.nan, c.inf) for n, c in counts.items() if c.nan or c.inf}
            found_by = found_by or (health.source if nonfinite else "")
            if not nonfinite and health.verdict == DIVERGED:
                # No data read yet: what its logged metrics say.
                self._metrics_note = (
                    f"⚠ diverged: {health.reason}; “check data” reads its arrays for NaN and Inf"
                )
        self._nonfinite = dict(nonfinite)
        self._found_by = found_by
        self.files: list[str] = []
        self.warnings: list[str] = []
        self.progress: AsyncProgress | None = None
        self._bytes = BytesMoved()

        self.checkpointable = w.Dropdown(
            options=names,
            value="model" if "model" in names else names[0],
            description="Export",
            layout=w.Layout(width="18em"),
        )
        self.dtype = w.Dropdown(
            options=DTYPES, value=AS_STORED, description="floats", layout=w.Layout(width="14em")
        )
        self.key_filter = w.Text(
            value="",
            description="keys",
            placeholder="all (or a part of a key)",
            layout=w.Layout(width="18em"),
        )
        name = self.path.rstrip("/").rsplit("/", 1)[-1]
        self._proposed = Path.cwd() / f"{name}_safetensors"
        self.destination = w.Text(
            # Never one that exists: the export would refuse it.
            value=str(free_destination(self._proposed)),
            description="to",
            layout=w.Layout(width="100%"),
        )
        self.export_button = w.Button(
            description="Export",
            icon="download",
            button_style="primary",
            # As wide as its words ("Export anyway"), never cut by the path beside it.
            layout=w.Layout(width="auto", flex="0 0 auto"),
        )
        self.warning = w.HTML("")
        self.message = w.HTML("")
        self.progress_box = w.VBox([])
        super().__init__(
            children=[
                w.HTML(note_html(f"safetensors from {self.path}")),
                w.HBox(
                    [self.checkpointable, self.dtype, self.key_filter],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                self.warning,
                w.HBox([self.destination, self.export_button]),
                self.message,
                self.progress_box,
            ]
        )
        self.add_class("tinax-export-panel")
        self.export_button.on_click(shown_in_widget(self._show_error)(self._on_export))
        self.checkpointable.observe(lambda _: self._show_warning(), names="value")
        self._show_warning()

    def _show_warning(self) -> None:
        """Warns, before anything is written, of the NaN and Inf known to be in the
        checkpointable chosen; the button then reads "Export anyway"."""
        name = self.checkpointable.value
        nan, inf = self._nonfinite.get(name, (0, 0))
        if nan or inf:
            by = f" ({self._found_by})" if self._found_by else ""
            text = (
                f"⚠ {name} holds {nan:,} NaN and {inf:,} Inf{by}: the safetensors files "
                "would hold them too"
            )
            self.warning.value = note_html(text, color=NONFINITE_COLOR)
            self.export_button.description = "Export anyway"
            self.export_button.button_style = "warning"
        else:
            self.warning.value = (
                note_html(self._metrics_note, color=NONFINITE_COLOR) if self._metrics_note else ""
            )
            self.export_button.description = "Export"
            self.export_button.button_style = "primary"

    def _show_error(self, error: BaseException) -> None:
        self.error = f"{type(error).__name__}: {error}"
        self.message.value = error_html(error, title="Export failed:")
        self.exporting = False
        self.export_button.disabled = False

    def total_bytes(self) -> int:
        """Bytes the export writes with the current choices (before a key filter)."""
        rows = self._arrays[self._arrays["checkpointable"] == self.checkpointable.value]
        cast = None if self.dtype.value == AS_STORED else _itemsize(self.dtype.value)
        total = 0
        for dtype, size, nbytes in zip(rows["dtype"], rows["size"], rows["nbytes"], strict=True):
            if cast is not None and _is_float(str(dtype)) and size is not None:
                total += int(size) * cast
            elif nbytes is not None and nbytes == nbytes:
                total += int(nbytes)
        return total

    def _on_export(self, _button: Any = None) -> None:
        if self.exporting:
            return
        self.error = ""
        self.files = []
        destination = self.destination.value.strip()
        if not destination:
            raise ValueError("choose a destination directory")
        chosen = Path(destination).expanduser()
        if not destination.startswith("gs://") and taken(chosen):
            # Refused before any work starts, once, with a name that is free.
            free = free_destination(chosen)
            raise ValueError(
                f"{destination} exists and is not empty; choose a new directory "
                f"({free.name} is free)"
            )
        checkpointable = self.checkpointable.value
        dtype = None if self.dtype.value == AS_STORED else self.dtype.value
        keys = self.key_filter.value.strip() or None
        self._bytes = BytesMoved()
        self.exporting = True
        self.export_button.disabled = True
        self.message.value = note_html(f"exporting {checkpointable}…")
        task: Task[list[Path]] = Task("export")
        progress = AsyncProgress(
            task,
            total_bytes=None if keys else self.total_bytes(),
            count_bytes=self._bytes.count,
            description=f"exporting {checkpointable}",
        )
        self.progress = progress
        self.progress_box.children = (progress,)
        progress.observe(self._on_status, names="status")

        def export() -> list[Path]:
            # The library warns of NaN and Inf as it finds them, before the files take
            # their name: said here, in the panel, at once.
            with warnings_of_this_thread(self._warned):
                return export_safetensors(
                    self.path,
                    destination,
                    checkpointable=checkpointable,
                    keys=keys,
                    dtype=dtype,
                    progress=self._bytes.moved,
                )

        self.warnings = []
        task.start(export, in_thread=True)

    def _warned(self, warning: Warning) -> None:
        self.warnings.append(str(warning))
        shown = "".join(
            f"<div>{note_html('⚠ ' + text, color=NONFINITE_COLOR)}</div>" for text in self.warnings
        )
        self.warning.value = shown

    def _on_status(self, _change: Any) -> None:
        progress = self.progress
        if progress is None or progress.status == RUNNING or not self.exporting:
            return
        self.exporting = False
        self.export_button.disabled = False
        if progress.status == "done":
            self.files = [str(p) for p in progress.value]
            size = sum(Path(p).stat().st_size for p in self.files)
            self.message.value = note_html(
                f"wrote {len(self.files)} file(s), {format_bytes(size)}, to "
                f"{Path(self.files[0]).parent} in {format_seconds(progress.elapsed)}",
                color="#1b5e20",
            )
            # The directory written is taken now: the next export is offered another
            # (the next number of the name proposed, when it was one of those).
            written = Path(self.files[0]).parent
            numbered = written.parent == self._proposed.parent and (
                written.name == self._proposed.name
                or written.name.startswith(self._proposed.name + "_")
            )
            self.destination.value = str(free_destination(self._proposed if numbered else written))
        else:
            # Said once, here: the bar, which would say it again, goes.
            self.progress_box.children = ()
            self.error = progress.error
            self.message.value = error_html(progress.error, title="Export failed:")
