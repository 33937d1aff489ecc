"""Tables laid out for a terminal of a given width, values in human units.

Each column has a priority: the most important ones are kept, the others dropped
while the line would be wider than the terminal. The one flexible column (a leaf's
key, a message) takes what width is left: keys are shortened in the middle, where a
long key path repeats itself least; messages are wrapped. A terminal table library
lays out cells but cannot drop a column nor cut a key in its middle, which is what a
narrow terminal needs, so this is done here by hand.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import numpy as np
import pandas as pd

ELLIPSIS = "…"
GAP = "  "
# A column other than the flexible one is never wider than this.
MAX_CELL = 32
# The flexible column asks for this much (or its widest cell) before lower-priority
# columns are given theirs; it takes whatever is left after them.
MIN_FLEXIBLE = 40


def width() -> int:
    """The terminal's width: ``COLUMNS``, else the terminal's own, else 80."""
    return max(20, shutil.get_terminal_size((80, 24)).columns)


def is_missing(value: Any) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, float) and math.isnan(value)


def human_bytes(value: Any) -> str:
    """``87.4 KiB``: a byte count in binary units; blank when unknown."""
    if is_missing(value):
        return ""
    n = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""  # pragma: no cover


def human_age(committed: Any, now: pd.Timestamp | None = None) -> str:
    """``3 min ago`` for a recent time, ``2026-12-01 14:03`` (UTC) for an older one."""
    if is_missing(committed):
        return ""
    stamp = pd.Timestamp(committed)
    if stamp.tzinfo is None:
        stamp = stamp.tz_localize("UTC")
    now = now or pd.Timestamp.now(tz="UTC")
    seconds = (now - stamp).total_seconds()
    if 0 <= seconds < 60:
        return f"{int(seconds)} s ago"
    if 0 <= seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if 0 <= seconds < 86400:
        return f"{int(seconds // 3600)} h ago"
    return stamp.tz_convert("UTC").strftime("%Y-%m-%d %H:%M")


def number(value: Any) -> str:
    """A float to 4 significant digits, an integer whole; blank when missing."""
    if is_missing(value):
        return ""
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return f"{float(value):.4g}"
    return str(value)


def shape(value: Any) -> str:
    if is_missing(value):
        return ""
    dims = tuple(value)
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


def key(value: Any) -> str:
    """A leaf's key; ``(root)`` for a checkpointable that is one value (key ``""``)."""
    return "(root)" if value == "" else text(value)


def text(value: Any) -> str:
    """Any cell as short text: missing blank, tuples joined, numbers as ``number``."""
    if is_missing(value):
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, tuple | list):
        return ", ".join(text(v) for v in value)
    if isinstance(value, int | float | np.number | bool | np.bool_):
        return number(value)
    return repr(value)


def shorten_middle(value: str, limit: int) -> str:
    """``value`` cut to ``limit`` characters by an ellipsis in its middle."""
    if len(value) <= limit:
        return value
    if limit <= 1:
        return ELLIPSIS[:limit]
    head = (limit - 1 + 1) // 2
    tail = limit - 1 - head
    return value[:head] + ELLIPSIS + (value[-tail:] if tail else "")


@dataclasses.dataclass(frozen=True)
class Column:
    """How one column of a DataFrame is shown.

    Attributes:
      source: The DataFrame's column.
      header: Its heading.
      format: Cell value → text.
      priority: Lower is kept longer when the terminal is narrow.
      right: Right-aligned (numbers).
      flexible: Takes the width left over: shortened in the middle, or wrapped.
      wrap: For the flexible column: wrap rather than shorten.
    """

    source: str
    header: str
    format: Callable[[Any], str] = text
    priority: int = 5
    right: bool = False
    flexible: bool = False
    wrap: bool = False


def _fit(columns: Sequence[Column], cells: dict[str, list[str]], total: int) -> dict[str, int]:
    """The width of each column kept, in priority order, within ``total``."""
    natural = {c.source: max([len(c.header), *(len(s) for s in cells[c.source])]) for c in columns}
    kept: dict[str, int] = {}
    used = 0
    for c in sorted(columns, key=lambda c: c.priority):
        limit = MIN_FLEXIBLE if c.flexible else max(MAX_CELL, len(c.header))
        need = min(natural[c.source], limit)
        extra = need + (len(GAP) if kept else 0)
        if used + extra <= total or not kept:
            kept[c.source] = need
            used += extra
    # What is left widens the columns that were cut, the flexible one first.
    for c in sorted(columns, key=lambda c: (not c.flexible, c.priority)):
        if c.source in kept:
            more = min(natural[c.source] - kept[c.source], max(0, total - used))
            kept[c.source] += more
            used += more
    return kept


def render(table: pd.DataFrame, columns: Sequence[Column], out: TextIO, total: int) -> None:
    """Prints ``table`` with the ``columns`` that fit in ``total`` characters."""
    columns = [c for c in columns if c.source in table.columns]
    if table.empty:
        print("(no rows)", file=out)
        return
    cells = {c.source: [c.format(v) for v in table[c.source]] for c in columns}
    # A column with nothing in it only takes room.
    columns = [c for c in columns if c.priority == 0 or any(cells[c.source])]
    widths = _fit(columns, cells, total)
    shown = [c for c in columns if c.source in widths]

    def cell(c: Column, value: str) -> str:
        w = widths[c.source]
        value = shorten_middle(value, w)
        return value.rjust(w) if c.right else value.ljust(w)

    print(GAP.join(cell(c, c.header) for c in shown).rstrip(), file=out)
    for row in range(len(table)):
        parts: list[str] = []
        wrapped: list[str] = []
        start = 0
        for c in shown:
            value = cells[c.source][row]
            if c.wrap:
                lines = textwrap.wrap(value, widths[c.source], break_on_hyphens=False) or [""]
                start = len(GAP.join(parts)) + (len(GAP) if parts else 0)
                parts.append(lines[0].ljust(widths[c.source]))
                wrapped = lines[1:]
            else:
                parts.append(cell(c, value))
        print(GAP.join(parts).rstrip(), file=out)
        for line in wrapped:
            print((" " * start + line).rstrip(), file=out)


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data: tuples as lists, missing as null, times as ISO 8601,
    durations as seconds.

    Non-finite floats become the strings ``"nan"``, ``"inf"`` and ``"-inf"``.
    """
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    if isinstance(value, pd.Timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    return str(value)


def csv_cell(value: Any) -> Any:
    """A cell for ``--csv``: missing blank, sequences and mappings as JSON."""
    plain = jsonable(value)
    if plain is None:
        return ""
    if isinstance(plain, list | dict):
        return json.dumps(plain)
    return plain
