"""Short human-readable forms of sizes, durations and rates for widget labels."""

from __future__ import annotations

import html
from typing import Any

from tinax.explore.display import human_bytes
from tinax.explore.toolkit import human_duration


def format_bytes(n: object) -> str:
    """``1536`` → ``'1.5 KiB'``; anything that is not a number (``None``, NaN, NA) → ``'—'``."""
    try:
        return human_bytes(n, missing="—")
    except TypeError:
        return "—"


def format_seconds(seconds: float) -> str:
    """``0.25`` → ``'0.25 s'``; ``75`` → ``'1 min 15 s'`` (``human_duration``, precise)."""
    return human_duration(seconds, precise=True)


def format_age(value: Any) -> str:
    """A listing's ``age`` as ``'42 s'``, ``'7 min'``, ``'3 h'`` or ``'2 d'``; ``''`` if unknown."""
    try:
        return human_duration(value)
    except (TypeError, ValueError):
        return ""


def format_rate(nbytes: float, seconds: float) -> str:
    """Bytes per second as ``'12.3 MiB/s'``; ``'—'`` when no time has passed."""
    if seconds <= 0:
        return "—"
    return format_bytes(nbytes / seconds) + "/s"


def error_html(error: BaseException | str, *, title: str = "Error") -> str:
    """An escaped, readable block for an exception shown inside a widget."""
    text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else error
    return (
        '<div style="color:#b00020;white-space:pre-wrap;font-family:monospace;'
        'font-size:90%;max-height:12em;overflow:auto">'
        f"<b>{html.escape(title)}</b> {html.escape(text)}</div>"
    )


def note_html(text: str, *, color: str = "#555") -> str:
    """A short escaped note in the given colour."""
    return f'<span style="color:{color}">{html.escape(text)}</span>'
