"""A checkpoint's verdict from ``verify``, as one line of a widget."""

from __future__ import annotations

import html

from tinax import explore
from tinax import vocabulary as words

from ._text import error_html


def verdict_html(path: str) -> str:
    """``verify(path)`` (metadata only) as a short coloured line, errors listed below it."""
    try:
        result = explore.verify(path)
    except Exception as e:
        return error_html(e, title="Cannot verify:")
    color = "#1b7f3b" if result.ok else "#b00020"
    mark = "✔" if result.ok else "✘"
    line = (
        f'<span class="tinax-verdict" data-ok="{str(result.ok).lower()}" style="color:{color}">'
        f"{mark} {html.escape(result.verdict)}</span>"
    )
    shown = result.findings[result.findings["severity"] != words.INFO].head(5)
    if shown.empty:
        return line
    items = "".join(
        f"<li>{html.escape(str(s))}: <code>{html.escape(str(p))}</code> {html.escape(str(m))}</li>"
        for p, s, m in zip(shown["part"], shown["severity"], shown["message"], strict=True)
    )
    return f'{line}<ul style="margin:0;font-size:90%">{items}</ul>'
