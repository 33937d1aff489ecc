"""A line of text with links that call back into Python (``links.js``): a derived
checkpoint's sources, each a link that opens it."""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import anywidget
import traitlets

from ._guard import shown_in_widget

_HERE = pathlib.Path(__file__).parent


@dataclass(frozen=True)
class Part:
    """A piece of the line.

    Attributes:
      text: What it says.
      link: The number its click sends (``LinkLine.on_click``'s argument), or
        ``None`` for plain text.
      title: Its tooltip.
      color: Its colour, or ``None``.
      code: Whether it is set in monospace (a path).
      css: A class of its own, for tests and styles.
    """

    text: str
    link: int | None = None
    title: str = ""
    color: str | None = None
    code: bool = False
    css: str = ""


class LinkLine(anywidget.AnyWidget):
    """A line of ``Part``s; clicking a link part calls ``on_click(number)``.

    Attributes:
      parts: The parts shown, as dictionaries (``show`` sets them).
      error: The last error a click raised, or ``""`` (the host shows it).
    """

    _esm = _HERE / "links.js"
    parts: traitlets.List[Any] = traitlets.List([]).tag(sync=True)

    def __init__(
        self, on_click: Callable[[int], None], on_error: Callable[[BaseException], None]
    ) -> None:
        super().__init__()
        self._on_click = on_click
        self.on_msg(shown_in_widget(on_error)(self._on_msg))
        self.add_class("tinax-link-line")

    def show(self, parts: Sequence[Part]) -> None:
        """Shows ``parts`` (none: an empty line)."""
        self.parts = [asdict(p) for p in parts]

    @property
    def text(self) -> str:
        """The line as plain text."""
        return "".join(str(part["text"]) for part in self.parts)

    def click(self, link: int) -> None:
        """What clicking the link numbered ``link`` does."""
        self._on_msg(self, {"link": link}, [])

    def _on_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and isinstance(content.get("link"), int):
            self._on_click(int(content["link"]))
