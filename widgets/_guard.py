"""Keeping exceptions out of button callbacks: they are shown, not raised."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, ParamSpec

P = ParamSpec("P")
_log = logging.getLogger("tinax.widgets")


def shown_in_widget(
    report: Callable[[BaseException], None],
) -> Callable[[Callable[P, Any]], Callable[P, None]]:
    """Wraps a widget callback so that an exception is passed to ``report``.

    ipywidgets prints an exception raised in a callback as a traceback in the
    output area (or loses it); the widgets show it in place instead, and the
    notebook stays usable.

    Args:
      report: Called with the exception; it should show it in the widget. If it
        fails too, the failure is logged and swallowed.

    Returns:
      A decorator for callbacks.
    """

    def decorate(callback: Callable[P, Any]) -> Callable[P, None]:
        @functools.wraps(callback)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
            try:
                callback(*args, **kwargs)
            except Exception as e:
                try:
                    report(e)
                except Exception:
                    _log.exception("could not show an error in the widget")

        return wrapper

    return decorate
