"""The restore-target builder's verdict of the checkpoint it loads from, and the
question it asks before loading one that diverged."""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

import ipywidgets as w

from tinax import explore
from tinax import vocabulary as words

from ._guard import shown_in_widget
from ._nonfinite import NONFINITE_COLOR
from ._soundness import verdict_span
from ._text import error_html


class LoadGuard:
    """The checkpoint's verdict in the library's words (``verify``: its integrity and
    its health), and, when it diverged, a question before its values are loaded:
    "Load anyway" goes on, "Cancel" does not. The host places the two: the verdict
    above its Load button, the question under it (so that Load stays where it was).

    Attributes:
      verdict: The line with the checkpoint's verdict.
      question: The question asked before a diverged checkpoint is loaded (hidden
        until then), with ``load_anyway`` and ``cancel``.
      health: The ``Health`` of the checkpoint checked last, or ``None``.
    """

    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self._go_on: Callable[[], None] | None = None
        self.health: Any = None
        self.verdict = w.HTML("")
        self.asking = w.HTML("")
        self.load_anyway = w.Button(
            description="Load anyway",
            button_style="danger",
            tooltip="load its values, NaN and Inf included",
            layout=w.Layout(width="auto"),
        )
        self.cancel = w.Button(description="Cancel", layout=w.Layout(width="auto"))
        guard = shown_in_widget(on_error)
        self.load_anyway.on_click(guard(lambda _: self._answer(True)))
        self.cancel.on_click(guard(lambda _: self._answer(False)))
        self.question = w.HBox(
            [self.asking, self.load_anyway, self.cancel],
            layout=w.Layout(flex_flow="row wrap", align_items="center", display="none"),
        )
        self.verdict.add_class("tinax-load-guard")
        self.question.add_class("tinax-load-guard")

    @property
    def diverged(self) -> bool:
        """Whether the checkpoint checked last diverged."""
        return self.health is not None and self.health.verdict == words.DIVERGED

    @property
    def asked(self) -> bool:
        """Whether the question is waiting for an answer."""
        return self.question.layout.display != "none"

    def check(self, path: str | None) -> None:
        """Shows the verdict of ``path`` (metadata, and what this process read of its
        data before); ``None`` shows none. A question waiting is withdrawn."""
        self._withdraw()
        self.health = None
        if path is None:
            self.verdict.value = ""
            return
        try:
            result = explore.verify(path)
        except Exception as e:
            self.verdict.value = error_html(e, title="Cannot verify:")
            return
        self.health = result.health
        self.verdict.value = verdict_span(result, css_class="tinax-load-verdict")

    def ask(self, path: str, go_on: Callable[[], None]) -> None:
        """Calls ``go_on`` now when the checkpoint did not diverge; else asks first and
        calls it on "Load anyway"."""
        if not self.diverged:
            go_on()
            return
        self._go_on = go_on
        name = html.escape(PurePath(path).name)
        self.asking.value = (
            f'<span style="color:{NONFINITE_COLOR}">⚠ <b>{name}</b> diverged '
            f"({html.escape(self.health.reason)}): a run that goes on from it goes on "
            "from NaN or Inf. Load it all the same?</span>"
        )
        self.question.layout.display = ""

    def _answer(self, yes: bool) -> None:
        go_on = self._go_on
        self._withdraw()
        if yes and go_on is not None:
            go_on()

    def _withdraw(self) -> None:
        self._go_on = None
        self.asking.value = ""
        self.question.layout.display = "none"
