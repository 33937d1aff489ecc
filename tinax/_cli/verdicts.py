"""The lines under a table of checkpoints that say what its health column means: which
diverged and why, which belong to a branch the run left, how many are not yet known.

Read from any table the layout reads (``terminal.Table``): a DataFrame, or plain rows.
"""

from __future__ import annotations

from tinax._cli import terminal as term
from tinax._format.naming import words


def health_notes(table: term.Table) -> list[str]:
    """Lines under a listing: which checkpoints diverged and why (the steps of one
    reason together), which belong to a branch the run left, and how many have a health
    not yet known."""
    columns = ("name", "step", "status", "integrity", "health", "health_reason")
    rows = list(zip(*(list(table[c]) for c in columns), strict=True))

    def steps_of(found: list[tuple[object, ...]]) -> str:
        named = dict.fromkeys(str(n) if term.is_missing(s) else str(s) for n, s, *_ in found)
        return f"step{'s' * (len(named) > 1)} {', '.join(named)}"

    lines = []
    diverged = [r for r in rows if r[4] == words.DIVERGED]
    for reason in dict.fromkeys(r[5] for r in diverged):
        lines.append(f"diverged: {steps_of([r for r in diverged if r[5] == reason])}: {reason}")
    left = [r for r in rows if r[2] == words.ABANDONED]
    if left:
        lines.append(
            f"abandoned: {steps_of(left)}, set aside when the run went on from an earlier "
            "step; kept for inspection, never resumed from"
        )
    unknown = sum(1 for r in rows if r[4] == words.HEALTH_UNKNOWN and r[3] == words.SOUND)
    if unknown and diverged:
        lines.append(
            f"health not yet known: {unknown} checkpoint{'s' * (unknown != 1)} whose data has "
            "not been read ('tinax verify --data' reads it)"
        )
    return lines
