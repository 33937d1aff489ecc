"""Removing interrupted saves from a run, with a confirmation: one small, separate control."""

from __future__ import annotations

import html
from collections.abc import Callable

import ipywidgets as w
import pandas as pd

from tinax.vocabulary import INTERRUPTED

from ._guard import shown_in_widget
from ._text import error_html, format_age, format_bytes, note_html


class InterruptedSaves(w.VBox):
    """Lists a run's interrupted saves and removes one after a confirmation.

    Hidden while the run has none. Removal claims the checkpoint first, so a save
    that started meanwhile is never touched: it is refused, and the reason shown.

    Attributes:
      choice: The interrupted saves, by path.
      remove_button: Asks for a confirmation of removing the chosen one.
      confirm_button, cancel_button: Answer it.
      message: What happened last.
    """

    def __init__(self, on_removed: Callable[[], None]) -> None:
        """Args:
        on_removed: Called after a removal (the owner re-lists its run).
        """
        self._on_removed = on_removed
        guard = shown_in_widget(self._show_error)
        self.choice = w.Dropdown(options=[], description="unfinished")
        self.remove_button = w.Button(description="Remove…", icon="trash")
        self.remove_button.on_click(guard(lambda _: self._ask()))
        self.question = w.HTML("")
        self.confirm_button = w.Button(description="Remove", button_style="danger")
        self.confirm_button.on_click(guard(lambda _: self._remove()))
        self.cancel_button = w.Button(description="Cancel")
        self.cancel_button.on_click(guard(lambda _: self._cancel()))
        self.confirmation = w.HBox(
            [self.question, self.confirm_button, self.cancel_button],
            layout=w.Layout(display="none"),
        )
        self.message = w.HTML("")
        super().__init__(
            [w.HBox([self.choice, self.remove_button]), self.confirmation, self.message],
            layout=w.Layout(display="none"),
        )
        self.add_class("tinax-interrupted-saves")
        self._rows: dict[str, pd.Series] = {}

    def update(self, listing: pd.DataFrame) -> None:
        """Shows the interrupted saves of ``listing`` (a ``list_checkpoints`` table)."""
        rows = listing[listing["status"] == INTERRUPTED] if len(listing) else listing
        self._rows = {str(row["path"]): row for _, row in rows.iterrows()}
        options = [
            (
                f"{row['name']} ({format_bytes(row['nbytes'])}, {format_age(row['age'])} old)",
                path,
            )
            for path, row in self._rows.items()
        ]
        if [o[1] for o in options] != [o[1] for o in self.choice.options]:
            keep = self.choice.value if self.choice.value in self._rows else None
            self.choice.options = options
            self.choice.value = keep if keep is not None else (options[0][1] if options else None)
        if self.choice.value not in self._rows:
            self._cancel()
        self.layout.display = "" if options else "none"

    def _ask(self) -> None:
        path = self.choice.value
        if path not in self._rows:
            return
        row = self._rows[path]
        self.question.value = (
            f"Remove <code>{html.escape(str(row['name']))}</code> "
            f"({html.escape(format_bytes(row['nbytes']))})? Its save cannot be resumed; "
            "the files are deleted."
        )
        self.confirmation.layout.display = ""
        self.remove_button.disabled = True

    def _cancel(self) -> None:
        self.confirmation.layout.display = "none"
        self.question.value = ""
        self.remove_button.disabled = False

    def _remove(self) -> None:
        path = self.choice.value
        self._cancel()
        if path not in self._rows:
            return
        name = str(self._rows[path]["name"])
        # Imported here: tinax.checkpointing brings JAX and Orbax, which browsing a
        # run never needs.
        from tinax.checkpointing import remove_interrupted_save

        try:
            remove_interrupted_save(path)
            self.message.value = note_html(f"removed {name}")
        finally:
            self._on_removed()

    def _show_error(self, error: BaseException) -> None:
        self._cancel()
        self.message.value = error_html(error, title="Not removed:")
