"""A panel that saves named checkpointables as a new checkpoint, with progress."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import ipywidgets as w
import traitlets

from tinax import explore
from tinax.explore import toolkit

from ._guard import shown_in_widget
from ._progress import RUNNING, AsyncProgress
from ._task import PendingResponse
from ._text import error_html, format_seconds, note_html

# The first checkpoint of an empty directory is named as TrainingRun names its
# checkpoints (``step_000050``), so that the next names follow the same pattern.
_FIRST_NAME = "step_000000"
# What next_checkpoint_name proposes for a directory without checkpoints.
_EMPTY_RUN_NAME = "step-0"


def _leaf_nbytes(leaf: Any) -> int:
    nbytes = getattr(leaf, "nbytes", None)
    if isinstance(nbytes, int) and not isinstance(nbytes, bool):
        return nbytes
    return 0


def array_bytes(checkpointables: Mapping[str, Any]) -> int:
    """Bytes of array data in ``checkpointables``: what a save mostly writes."""
    import jax  # the caller's state is JAX's, so JAX is loaded already

    return sum(_leaf_nbytes(leaf) for leaf in jax.tree_util.tree_leaves(dict(checkpointables)))


def _save_directory(directory: str | os.PathLike[str]) -> tuple[str, bool]:
    """``directory`` resolved, and whether it exists yet.

    A missing local directory is accepted (the first save makes it) when the
    nearest existing folder above it is a directory.
    """
    try:
        return toolkit.save_directory(directory, what="directory"), True
    except FileNotFoundError:
        where = toolkit.resolve_path(directory, what="directory")
        if where.startswith("gs://"):
            raise  # the bucket is missing: nothing here can make one
    above = Path(where).parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise ValueError(f"cannot make directory {where!r}: {str(above)!r} is not a directory")
    return where, False


def beside(directory: str) -> str:
    """Where the panel offers to save instead of a training run's directory."""
    return directory.rstrip("/") + "-saves"


def training_run_refusal(directory: str, names: list[str] | None = None) -> str:
    """Why the panel does not save into ``directory``: ``""`` unless it is a ``TrainingRun``'s.

    A training run resumes from its newest complete checkpoint and prunes by its own
    policy; a checkpoint of some of the state saved beside its own would list as
    the newest and be resumed from, without the optimizer, RNG or data position the
    run needs. So the panel refuses, and says where to save instead.
    """
    if not toolkit.path_exists(directory) or explore.run_policy(directory) is None:
        return ""
    what = f" ({', '.join(names)})" if names else ""
    return (
        f"{directory!r} is a TrainingRun's directory (it holds the run's record): "
        f"a checkpoint saved here{what} would become the run's newest, and the run "
        "would resume from it without the whole training state. Save beside it, into "
        f"{beside(directory)!r} (the button below), or save the whole state with "
        "TrainingRun.save(..., force=True)."
    )


class SavePanel(w.VBox):
    """A name field, a Save button and an ``AsyncProgress`` for the save.

    The name defaults to the run's next checkpoint name in the run's own pattern
    (``step_000400`` after ``step_000050 … step_000350``), and to ``step_000000``,
    ``TrainingRun``'s pattern, in a directory without checkpoints. A name that is
    not a portable directory name, or that is already taken, is refused in the panel
    with the reason and the Save button stays disabled; nothing is written.

    A missing directory is made by the first save. The directory of a
    ``TrainingRun`` (one holding the run's record) is refused, with the reason:
    a checkpoint saved there would list as the run's newest complete checkpoint
    and be resumed from without the rest of the training state. A button under the
    reason saves beside the run instead (``<run>-saves``; ``save_elsewhere``).

    Attributes:
      name_error: Why the current name is refused, or ``""``.
      refused: Why the directory takes no save from the panel, or ``""``.
      error: The last save's failure to start (shown in the panel), or ``""``.
      saving: Whether a save started here is still running.
      progress: The ``AsyncProgress`` of the last save, or ``None``.
      response: The last save's response, or ``None``.
      path: The last save's checkpoint path, or ``None``.
    """

    name_error = traitlets.Unicode("")
    refused = traitlets.Unicode("")
    error = traitlets.Unicode("")
    saving = traitlets.Bool(False)

    def __init__(
        self,
        directory: str | os.PathLike[str],
        checkpointables: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
    ) -> None:
        """Builds the panel.

        Args:
          directory: The directory the checkpoints are saved in: an existing one, or
            a new local one the first save makes (on ``gs://``, any prefix in an
            existing bucket).
          checkpointables: A mapping of checkpointable name to value, or a
            zero-argument callable returning one, evaluated at each click.

        Raises:
          TypeError: If ``directory`` is not a path or ``checkpointables`` is
            neither a mapping nor callable.
          FileNotFoundError: If ``directory`` is on ``gs://`` and its bucket does
            not exist.
          ValueError: If ``directory`` is not a directory, or cannot be made one
            (a file stands in its way).
        """
        self.directory, exists = _save_directory(directory)
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
            value=self._next_name(),
            description="Name",
            continuous_update=True,
            layout=w.Layout(width="22em"),
        )
        self.save_button = w.Button(description="Save", icon="save", button_style="primary")
        self.message = w.HTML("")
        self.progress_box = w.VBox([])
        self.where_html = w.HTML(self._where(exists))
        self.elsewhere_button = w.Button(
            icon="folder-open",
            layout=w.Layout(
                width="auto", max_width="100%", align_self="flex-start", display="none"
            ),
        )
        self.elsewhere_button.on_click(
            shown_in_widget(self._show_error)(lambda _button: self.save_elsewhere())
        )
        super().__init__(
            children=[
                self.where_html,
                w.HBox(
                    [self.name_field, self.save_button],
                    layout=w.Layout(flex_flow="row wrap", align_items="center"),
                ),
                self.message,
                self.elsewhere_button,
                self.progress_box,
            ]
        )
        self.add_class("tinax-save-panel")
        self.refused = training_run_refusal(self.directory)
        self.name_field.observe(self._on_name, names="value")
        self.save_button.on_click(shown_in_widget(self._show_error)(self._on_save))
        self._check_name()

    def save_elsewhere(self, directory: str | os.PathLike[str] | None = None) -> None:
        """Saves into ``directory`` from now on (default: beside the refused training run's
        directory, ``<run>-saves``), as the button under a refusal does.

        Raises:
          TypeError, ValueError, FileNotFoundError: As the constructor does for
            ``directory``.
        """
        where, exists = _save_directory(beside(self.directory) if directory is None else directory)
        self.directory = where
        self.refused = training_run_refusal(where)
        self.where_html.value = self._where(exists)
        self.name_field.value = self._next_name()
        self._check_name()

    def _where(self, exists: bool) -> str:
        return note_html(
            f"Saves to {self.directory}" + ("" if exists else " (made at the first save)")
        )

    # -- name ----------------------------------------------------------------------------

    def _next_name(self) -> str:
        name = toolkit.next_checkpoint_name(self.directory)
        if name != _EMPTY_RUN_NAME:
            return name
        step, name = 0, _FIRST_NAME
        while toolkit.path_exists(self.directory.rstrip("/") + "/" + name):
            step += 1
            name = f"step_{step:06d}"
        return name

    def _check_name(self) -> bool:
        self.elsewhere_button.layout.display = "" if self.refused else "none"
        if self.refused:
            self.name_error = ""
            # Read as a paragraph, not spaced out as a row of controls.
            self.message.value = (
                '<div style="line-height:1.4">'
                + error_html(self.refused, title="Cannot save here:")
                + "</div>"
            )
            elsewhere = beside(self.directory)
            self.elsewhere_button.description = f"save into {PurePosixPath(elsewhere).name} instead"
            self.elsewhere_button.tooltip = f"save into {elsewhere} (made at the first save)"
            self.save_button.disabled = True
            return False
        try:
            toolkit.check_new_checkpoint_name(self.directory, self.name_field.value)
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
        mapping = self._evaluate()
        # A run may have started in the directory since the panel was made.
        self.refused = training_run_refusal(self.directory, [str(name) for name in mapping])
        if not self._check_name():
            return
        from tinax.checkpointing import save_checkpointables  # Orbax, only for a save

        name = self.name_field.value
        destination = self.directory.rstrip("/") + "/" + name
        if not self.directory.startswith("gs://"):
            Path(self.directory).mkdir(parents=True, exist_ok=True)
            self.where_html.value = self._where(True)
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
            self.name_field.value = self._next_name()
        self._check_name()
        if progress.status != RUNNING:
            self.message.value = (
                note_html(f"saved {saved} in {format_seconds(progress.elapsed)}", color="#1b5e20")
                if progress.status == "done"
                else error_html(progress.error, title="Save failed:")
            )
