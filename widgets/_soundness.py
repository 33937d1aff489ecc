"""A checkpoint's verdict from ``verify`` as one line of a widget: sound, diverged (it
loads, but its state holds NaN or Inf) or not sound, each in a colour of its own."""

from __future__ import annotations

import html
from typing import Any

import pandas as pd

from tinax import explore
from tinax import vocabulary as words
from tinax.explore import display

from ._nonfinite import NONFINITE_COLOR
from ._text import error_html, note_html

# Each verdict's colour and mark: never the green tick for a checkpoint gone NaN.
LOOKS = {
    words.SOUND: ("#1b7f3b", "✔"),
    words.DIVERGED: (NONFINITE_COLOR, "⚠"),
    words.NOT_SOUND: ("#b00020", "✘"),
}


def status_of(result: Any) -> str:
    """A ``Verification``'s status word (``sound``, ``diverged``, ``not sound``)."""
    status = getattr(result, "status", None)
    if status in LOOKS:
        return str(status)
    return words.SOUND if result.ok else words.NOT_SOUND


def verdict_span(result: Any, *, css_class: str) -> str:
    """The verdict as a coloured span, its status in ``data-status`` and whether it
    is sound in ``data-ok``."""
    status = status_of(result)
    color, mark = LOOKS[status]
    return (
        f'<span class="{css_class}" data-ok="{str(status == words.SOUND).lower()}" '
        f'data-status="{html.escape(status)}" style="color:{color}">'
        f"{mark} {html.escape(result.verdict)}</span>"
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


def scanned_html(row: pd.Series) -> str:
    """What the run's scan (``scan_run``) found in a checkpoint it read whole, when it
    is worse than sound: a line in the verdict's colour, else ``""``."""
    verdict = str(row.get("verdict", ""))
    if verdict not in (words.DIVERGED, words.NONFINITE):
        return ""
    nan = 0 if pd.isna(row.get("nan")) else int(row["nan"])
    inf = 0 if pd.isna(row.get("inf")) else int(row["inf"])
    where = "its model or optimizer state" if verdict == words.DIVERGED else "its metrics only"
    return (
        f'<div class="tinax-verdict-scan" data-status="{html.escape(verdict)}" '
        f'style="color:{NONFINITE_COLOR}">⚠ {html.escape(verdict)}: the run\'s scan found '
        f"NaN or Inf in {where} ({nan:,} NaN, {inf:,} Inf in all)</div>"
    )


def nonfinite_metrics_note(path: str | explore.Checkpoint) -> str:
    """A line when the checkpoint's own metrics (its auxiliary state, read from
    metadata) are NaN or infinite: its weights may be too; "check data" says."""
    try:
        table = explore.run_table(path)
    except Exception:  # What is wrong with the checkpoint is said elsewhere.
        return ""
    if "nonfinite_metrics" not in table or table.empty:
        return ""
    named = table["nonfinite_metrics"].iloc[0]
    if pd.isna(named) or not str(named):
        return ""
    return (
        f"its {named} {'is' if ', ' not in str(named) else 'are'} NaN or infinite: "
        "“check data” reads its weights for NaN and Inf"
    )


def metrics_html(path: str | explore.Checkpoint) -> str:
    """``nonfinite_metrics_note`` in the colour of NaN, or ``""``."""
    note = nonfinite_metrics_note(path)
    return note_html(note, color=NONFINITE_COLOR) if note else ""


def verdict_html(path: str | explore.Checkpoint) -> str:
    """``verify(path)`` (metadata only) as a short coloured line, errors listed below
    it, and a note when the checkpoint's recorded metrics are NaN or infinite; of an
    opened checkpoint, nothing is listed or read again."""
    try:
        result = explore.verify(path)
    except Exception as e:
        return error_html(e, title="Cannot verify:")
    line = verdict_span(result, css_class="tinax-verdict")
    found = findings_list(result.findings, limit=5)
    metrics = metrics_html(path)
    return line + (f" {metrics}" if metrics else "") + found
