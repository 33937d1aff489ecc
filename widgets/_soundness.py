"""A checkpoint's verdict as the widgets show it: its integrity (sound, damaged,
incomplete) and its health (healthy, diverged, not yet known), both decided by the
library (``verify``, ``checkpoint_health``, the tables' ``integrity`` and ``health``
columns) and shown here in the same words, each in a colour and mark of its own:
never a green check beside "diverged"."""

from __future__ import annotations

import html
from typing import Any

import pandas as pd

from tinax import explore
from tinax import vocabulary as words
from tinax.explore import display

from ._nonfinite import NONFINITE_COLOR
from ._text import error_html

GREEN = "#1b7f3b"
RED = "#b00020"
AMBER = "#8a6d00"
GREY = "#555"

# A health word's colour and mark; an integrity word's where it is not sound.
HEALTH_LOOKS = {
    words.HEALTHY: (GREEN, "✔"),
    words.DIVERGED: (NONFINITE_COLOR, "⚠"),
    words.HEALTH_UNKNOWN: (GREY, "?"),
}
INTEGRITY_LOOKS = {
    words.SOUND: (GREEN, "✔"),
    words.DAMAGED: (RED, "✘"),
    words.INCOMPLETE: (AMBER, "…"),
}


def look(integrity: str, health: str) -> tuple[str, str]:
    """The colour and mark of a checkpoint's verdict: its integrity's where it is not
    sound, else its health's."""
    if integrity != words.SOUND:
        return INTEGRITY_LOOKS.get(integrity, (RED, "✘"))
    if health == words.HEALTH_UNKNOWN:
        # Sound bytes whose values have not been read: the mark is the bytes'.
        return INTEGRITY_LOOKS[words.SOUND]
    return HEALTH_LOOKS.get(health, (GREY, "?"))


def verdict_span(result: Any, *, css_class: str) -> str:
    """A ``Verification`` as a coloured line in the library's words (``verdict``), its
    status (``sound``, ``diverged``, ``not sound``), integrity and health in data
    attributes, whether it is sound and not diverged in ``data-ok``, and the reason
    for its health on hover."""
    integrity, health = str(result.integrity), str(result.health.verdict)
    color, mark = look(integrity, health)
    status = str(result.status)
    return (
        f'<span class="{css_class}" data-ok="{str(status == words.SOUND).lower()}" '
        f'data-status="{html.escape(status)}" data-integrity="{html.escape(integrity)}" '
        f'data-health="{html.escape(health)}" title="{html.escape(result.health.reason)}" '
        f'style="color:{color}">{mark} {html.escape(result.verdict)}</span>'
    )


def words_html(integrity: str, health: str, reason: str, *, css_class: str = "") -> str:
    """A checkpoint's two words in a line, from a table's columns: ``⚠ diverged · sound``,
    the reason on hover."""
    color, mark = look(integrity, health)
    said = health if integrity == words.SOUND else integrity
    other = integrity if integrity == words.SOUND else health
    attributes = f' class="{css_class}"' if css_class else ""
    return (
        f'<span{attributes} data-integrity="{html.escape(integrity)}" '
        f'data-health="{html.escape(health)}" title="{html.escape(reason)}" '
        f'style="color:{color}">{mark} {html.escape(said)}</span>'
        f'<span style="color:{GREY}"> · {html.escape(other)}</span>'
    )


def readable_part(part: str) -> str:
    """A finding's part as keys are shown everywhere: ``model ['blocks'][0]['w']``
    reads ``model blocks.0.w``; a file's path stays as it is."""
    name, _, key = str(part).partition(" ")
    if not key.startswith("["):
        return str(part)
    try:
        return f"{name} {display.readable_key(key)}"
    except ValueError:
        return str(part)


def findings_list(findings: pd.DataFrame, *, limit: int) -> str:
    """Up to ``limit`` findings that are not ``info``, as a small list (``""``: none)."""
    shown = findings[findings["severity"] != words.INFO].head(limit)
    if shown.empty:
        return ""
    items = "".join(
        f'<li>{html.escape(str(s))}: <code title="{html.escape(str(p))}">'
        f"{html.escape(readable_part(p))}</code> "
        f'<span style="white-space:normal">{html.escape(str(m))}</span></li>'
        for p, s, m in zip(shown["part"], shown["severity"], shown["message"], strict=True)
    )
    return f'<ul style="margin:0;font-size:90%;overflow-wrap:anywhere">{items}</ul>'


def verdict_html(path: str | explore.Checkpoint) -> str:
    """``verify(path)`` (metadata, and what this process has read of its data) as a
    short coloured line, errors listed below it; of an opened checkpoint, nothing is
    listed or read again."""
    try:
        result = explore.verify(path)
    except Exception as e:
        return error_html(e, title="Cannot verify:")
    return verdict_span(result, css_class="tinax-verdict") + findings_list(result.findings, limit=5)
