"""What the explorer hands each of its panes: one lock, one place for errors and
notes, one way to run work in the background."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Services:
    """The explorer's shared services, handed to each pane.

    Attributes:
      lock: Held while a pane reads or changes what the explorer shows; background
        threads take it before they touch a widget.
      show_error: Shows an exception in the explorer's message line.
      note: Shows a short note (text, colour) in the message line; ``""`` clears it.
      in_background: Runs a callable in a background thread the explorer's ``wait``
        waits for (and the interpreter's exit stops); its exceptions are shown.
    """

    lock: threading.RLock
    show_error: Callable[[BaseException], None]
    note: Callable[[str, str], None]
    in_background: Callable[[Callable[[], None], str], None]
