"""Short human-readable forms of sizes, durations and rates for widget labels."""

from __future__ import annotations

import html
from typing import Any

import pandas as pd

from tinax.explore.display import human_bytes


def format_bytes(n: object) -> str:
    """``1536`` → ``'1.5 KiB'``; anything that is not a number (``None``, NaN, NA) → ``'—'``."""
    try:
        return human_bytes(n, missing="—")
    except TypeError:
        return "—"


def format_seconds(seconds: float) -> str:
    """``0.25`` → ``'0.25 s'``; ``75`` → ``'1 min 15 s'``."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def format_age(value: Any) -> str:
    """A listing's ``age`` as ``'42 s'``, ``'7 min'``, ``'3 h'`` or ``'2 d'``; ``''`` if unknown."""
    if value is None or value is pd.NaT:
        return ""
    try:
        seconds = pd.Timedelta(value).total_seconds()
    except (TypeError, ValueError):
        return ""
    if seconds != seconds:  # NaT as a float
        return ""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


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
