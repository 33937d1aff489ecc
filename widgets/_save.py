"""A panel that saves named checkpointables as a new checkpoint, with progress."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as w
import jax
import traitlets

from tinax import explore
from tinax.checkpointing import save_checkpointables

from ._guard import shown_in_widget
from ._progress import RUNNING, AsyncProgress
from ._task import PendingResponse
from ._text import error_html, format_seconds, note_html


def _leaf_nbytes(leaf: Any) -> int:
    nbytes = getattr(leaf, "nbytes", None)
    if isinstance(nbytes, int) and not isinstance(nbytes, bool):
        return nbytes
    return 0


def array_bytes(checkpointables: Mapping[str, Any]) -> int:
    """Bytes of array data in ``checkpointables``: what a save mostly writes."""
    return sum(_leaf_nbytes(leaf) for leaf in jax.tree_util.tree_leaves(dict(checkpointables)))


class SavePanel(w.VBox):
    """A name field, a Save button and an ``AsyncProgress`` for the save.

    The name defaults to the run's next checkpoint name in the run's own pattern
    (``step_000400`` after ``step_000050 … step_000350``; ``step-0`` in an empty run). A name that
    is not a portable directory name, or that is already taken, is refused in the
    panel with the reason and the Save button stays disabled; nothing is written.

    Attributes:
      name_error: Why the current name is refused, or ``""``.
      error: The last save's failure to start (shown in the panel), or ``""``.
      saving: Whether a save started here is still running.
      progress: The ``AsyncProgress`` of the last save, or ``None``.
      response: The last save's response, or ``None``.
      path: The last save's checkpoint path, or ``None``.
    """

    name_error = traitlets.Unicode("")
    error = traitlets.Unicode("")
    saving = traitlets.Bool(False)

    def __init__(
        self,
        directory: str | os.PathLike[str],
        checkpointables: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
    ) -> None:
        """Builds the panel.

        Args:
          directory: Existing run directory the checkpoints are saved in (on
            ``gs://``, any prefix in an existing bucket).
          checkpointables: A mapping of checkpointable name to value, or a
            zero-argument callable returning one, evaluated at each click.

        Raises:
          TypeError: If ``directory`` is not a path or ``checkpointables`` is
            neither a mapping nor callable.
          FileNotFoundError: If ``directory`` does not exist.
          ValueError: If ``directory`` is not a directory.
        """
        self.directory = explore.save_directory(directory, what="directory")
        if not isinstance(checkpointables, Mapping) and not callable(checkpointables):
            raise TypeError(
                "checkpointables must be a mapping of name to value or a zero-argument "
                f"callable returning one, got {type(checkpointables).__name__}"
            )
        self._source = checkpointables
        self.progress: AsyncProgress | None = None
        self.response: Any = None
        self.path: str | None = None
        self._saved_name = ""

        self.name_field = w.Text(
            value=explore.next_checkpoint_name(self.directory),
            description="Name",
            continuous_update=True,
            layout=w.Layout(width="22em"),
        )
        self.save_button = w.Button(description="Save", icon="save", button_style="primary")
        self.message = w.HTML("")
        self.progress_box = w.VBox([])
        super().__init__(
            children=[
                w.HTML(note_html(f"Saves to {self.directory}")),
                w.HBox([self.name_field, self.save_button]),
                self.message,
                self.progress_box,
            ]
        )
        self.add_class("tinax-save-panel")
        self.name_field.observe(self._on_name, names="value")
        self.save_button.on_click(shown_in_widget(self._show_error)(self._on_save))
        self._check_name()

    # -- name ----------------------------------------------------------------------------

    def _check_name(self) -> bool:
        try:
            explore.check_new_checkpoint_name(self.directory, self.name_field.value)
        except (TypeError, ValueError) as e:
            self.name_error = str(e)
            self.message.value = error_html(str(e), title="Cannot save:")
            self.save_button.disabled = True
            return False
        self.name_error = ""
        self.message.value = ""
        self.save_button.disabled = self.saving
        return True

    def _on_name(self, change: Any) -> None:
        shown_in_widget(self._show_error)(self._check_name)()

    # -- save ----------------------------------------------------------------------------

    def _show_error(self, error: BaseException) -> None:
        self.error = f"{type(error).__name__}: {error}"
        self.message.value = error_html(error, title="Save failed:")
        self.saving = False
        self.save_button.disabled = False

    def _evaluate(self) -> Mapping[str, Any]:
        value = self._source() if callable(self._source) else self._source
        if not isinstance(value, Mapping):
            raise TypeError(
                "checkpointables callable must return a mapping of name to value, "
                f"got {type(value).__name__}"
            )
        return value

    def _on_save(self, _button: Any = None) -> None:
        if self.saving:
            return
        self.error = ""
        if not self._check_name():
            return
        name = self.name_field.value
        mapping = self._evaluate()
        destination = self.directory.rstrip("/") + "/" + name
        self.saving = True
        self.save_button.disabled = True
        self.message.value = note_html(f"saving {name}…")
        # The bar is up before Orbax's blocking copy to host memory starts, so that
        # phase shows as elapsed time rather than as a frozen notebook.
        pending: PendingResponse[None] = PendingResponse()
        progress = AsyncProgress(
            pending,
            total_bytes=array_bytes(mapping),
            watch=destination,
            description=f"saving {name}",
        )
        self.progress, self.response, self.path = progress, pending, destination
        self._saved_name = name
        self.progress_box.children = (progress,)
        progress.observe(self._on_progress_status, names="status")
        try:
            response = save_checkpointables(destination, mapping)
        except BaseException as e:
            pending.fail(e)
            raise
        pending.attach(response)
        self.response = response

    def _on_progress_status(self, _change: Any) -> None:
        progress = self.progress
        if progress is None or progress.status == RUNNING or not self.saving:
            return
        self.saving = False
        saved = self._saved_name
        # The bar's label said what was going on; now it says how it ended.
        progress.label.value = f"saved {saved}" if progress.status == "done" else f"{saved}: failed"
        if self.name_field.value == saved:
            # Offer the next free name; this also re-checks and re-enables Save.
            self.name_field.value = explore.next_checkpoint_name(self.directory)
        self._check_name()
        if progress.status != RUNNING:
            self.message.value = (
                note_html(f"saved {saved} in {format_seconds(progress.elapsed)}", color="#1b5e20")
                if progress.status == "done"
                else error_html(progress.error, title="Save failed:")
            )
