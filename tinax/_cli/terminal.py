"""Tables laid out for a terminal of a given width, values in human units.

Which columns a line has room for is decided here; rich draws the table. Columns
that say nothing about the rows in view (every cell blank, one value in every row,
the same cells as another column) give way first; then the others in the order of
their priority, the least important first. A leaf's key is shown as
``tinax.explore.display`` shows keys everywhere (dotted, what every row shares left
out) and is given its room before secondary columns: when the line is narrow, keys
are shortened by ``display_keys``, which never makes two rows read alike. Messages
wrap.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
import math
import numbers
import shutil
import textwrap
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TextIO

from tinax.explore import display
from tinax.explore.display import human_bytes as human_bytes

ELLIPSIS = display.ELLIPSIS
GAP = "  "
# A column other than the key or a wrapped one is never wider than this.
MAX_CELL = 32
# Columns of this priority or lower are kept while the keys still get this many
# characters; the others only while every key still shows in full.
ESSENTIAL = 2
MIN_KEY = 24
# A wrapped column (a message) is given at least this much.
MIN_WRAP = 24


# ``--wide``: every column of a table shown, however long its lines.
WIDE = 100_000
_wide = False


def set_wide(wide: bool) -> None:
    """Lays tables out for ``--wide`` (every column) or for the terminal's width."""
    global _wide
    _wide = wide


def width() -> int:
    """The terminal's width: ``COLUMNS``, else the terminal's own, else 80 (with
    ``--wide``, wide enough for every column)."""
    if _wide:
        return WIDE
    return max(20, shutil.get_terminal_size((80, 24)).columns)


# pandas' missing values, told by their types: a table of plain rows needs no pandas.
_PANDAS_MISSING = frozenset({"NAType", "NaTType"})


def is_missing(value: Any) -> bool:
    if value is None or type(value).__name__ in _PANDAS_MISSING:
        return True
    return isinstance(value, float) and math.isnan(value)


def human_age(committed: Any, now: Any = None) -> str:
    """``3 min ago`` for a recent time, ``2026-12-01 14:03`` (UTC) for an older one.

    ``committed`` is a ``pandas.Timestamp`` or nanoseconds since the epoch (UTC)."""
    if is_missing(committed):
        return ""
    # A pandas Timestamp's ``value``: nanoseconds since the epoch, UTC.
    nanoseconds = int(getattr(committed, "value", committed))
    stamp = datetime.datetime.fromtimestamp(nanoseconds / 1e9, datetime.UTC)
    current = time.time_ns() if now is None else int(getattr(now, "value", now))
    seconds = (current - nanoseconds) / 1e9
    if 0 <= seconds < 60:
        return f"{int(seconds)} s ago"
    if 0 <= seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if 0 <= seconds < 86400:
        return f"{int(seconds // 3600)} h ago"
    return stamp.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M")


def _is_bool(value: Any) -> bool:
    """A Python or NumPy bool (told by its type: NumPy is not imported to ask)."""
    return isinstance(value, bool) or (
        type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
    )


def _numpy(value: Any) -> bool:
    """Whether ``value`` is a NumPy scalar or array."""
    return type(value).__module__ == "numpy"


def number(value: Any) -> str:
    """A float to 4 significant digits, an integer whole; blank when missing."""
    if is_missing(value):
        return ""
    if _is_bool(value):
        return str(bool(value))
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return f"{float(value):.4g}"
    return str(value)


def measured(value: Any) -> str:
    """A logged metric: ``nan`` for a NaN that was logged, blank for nothing recorded
    (``None``, ``<NA>``)."""
    if isinstance(value, numbers.Real) and not _is_bool(value) and math.isnan(value):
        return "nan"
    return number(value)


def count_if_any(value: Any) -> str:
    """A count, blank when zero: a column of zeros (no NaN anywhere) gives way."""
    return "" if is_missing(value) or value == 0 else number(value)


def shape(value: Any) -> str:
    if is_missing(value):
        return ""
    dims = tuple(value)
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


def text(value: Any) -> str:
    """Any cell as short text: missing blank, tuples joined, numbers as ``number``."""
    if is_missing(value):
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, tuple | list):
        return ", ".join(text(v) for v in value)
    if isinstance(value, numbers.Number) or _is_bool(value):
        return number(value)
    return repr(value)


def shorten_middle(value: str, limit: int) -> str:
    """``value`` cut to ``limit`` characters by an ellipsis in its middle (titles and
    paths; never keys, which ``display_keys`` shortens)."""
    if len(value) <= limit:
        return value
    if limit <= 1:
        return ELLIPSIS[:limit]
    head = limit // 2
    tail = limit - 1 - head
    return value[:head] + ELLIPSIS + (value[-tail:] if tail else "")


class Table(Protocol):
    """What the layout reads of a table: a ``pandas.DataFrame``, or ``Rows``."""

    @property
    def columns(self) -> Any: ...

    @property
    def empty(self) -> bool: ...

    def __getitem__(self, name: str) -> Any: ...

    def __len__(self) -> int: ...


class Rows:
    """A table of plain rows (dicts) as the layout reads one, for a command that prints
    without pandas (``tinax ls``)."""

    def __init__(self, rows: list[dict[str, Any]], columns: list[str]) -> None:
        self._rows = rows
        self._columns = [c for c in columns if not rows or c in rows[0]]

    @property
    def columns(self) -> list[str]:
        return self._columns

    @property
    def empty(self) -> bool:
        return not self._rows

    def __getitem__(self, name: str) -> list[Any]:
        return [row.get(name) for row in self._rows]

    def __len__(self) -> int:
        return len(self._rows)


@dataclasses.dataclass(frozen=True)
class Column:
    """How one column of a DataFrame is shown.

    Attributes:
      source: The DataFrame's column.
      header: Its heading.
      format: Cell value → text.
      priority: Lower is kept longer when the terminal is narrow; 0 is always kept.
      right: Right-aligned (numbers).
      key: Leaf keys (``keystr``), shown by ``display.display_keys``.
      wrap: Wrapped to the width left over (a message).
    """

    source: str
    header: str
    format: Callable[[Any], str] = text
    priority: int = 5
    right: bool = False
    key: bool = False
    wrap: bool = False


@dataclasses.dataclass
class Layout:
    """The columns a table is drawn with, their widths and their cells.

    Attributes:
      columns: The columns shown, in the table's order.
      widths: Each shown column's width.
      cells: Each column's cell texts (keys as labels).
      uniform: Columns left out because every row holds one value, with that value.
      hidden: Columns left out for the line's width (``--wide`` shows them).
    """

    columns: list[Column]
    widths: dict[str, int]
    cells: dict[str, list[str]]
    uniform: dict[str, str]
    hidden: list[Column] = dataclasses.field(default_factory=list)


def key_labels(
    keys: Sequence[str], width: int | None, checkpointables: Sequence[str] | None = None
) -> list[str]:
    """The keys as rows in view show them (``display.display_keys``)."""
    return display.display_keys(list(keys), width=width, checkpointables=checkpointables)


def layout(
    table: Table,
    columns: Sequence[Column],
    total: int,
    *,
    checkpointables: Sequence[str] | None = None,
) -> Layout:
    """Which of ``columns`` fit ``total`` characters, and how wide each is.

    Args:
      table: The rows.
      columns: The columns that may be shown, in the order they are drawn.
      total: The line's width.
      checkpointables: For a key column over rows of several checkpointables:
        each row's, named first in its label.
    """
    columns = [c for c in columns if c.source in table.columns]
    cells: dict[str, list[str]] = {}
    for c in columns:
        if not c.key:
            cells[c.source] = [c.format(v) for v in table[c.source]]
    uniform: dict[str, str] = {}
    dropped: set[str] = set()
    for i, c in enumerate(columns):
        if c.key or c.priority == 0:
            continue
        values = cells[c.source]
        distinct = set(values)
        if distinct <= {""}:
            dropped.add(c.source)
        elif any(not o.key and cells[o.source] == values for o in columns[:i]):
            dropped.add(c.source)  # the same cells as a column before it
        elif len(distinct) == 1 and len(values) > 1:
            # One value in every row: said once under the table instead.
            dropped.add(c.source)
            uniform[c.source] = values[0]
    columns = [c for c in columns if c.source not in dropped]
    key = next((c for c in columns if c.key), None)
    keys = [str(k) for k in table[key.source]] if key else []
    full = key_labels(keys, None, checkpointables) if key else []
    key_full = max([len(key.header), *map(len, full)]) if key else 0

    def natural(c: Column) -> int:
        widest = max([len(c.header), *(len(s) for s in cells[c.source])])
        return min(widest, MIN_WRAP) if c.wrap else min(widest, max(MAX_CELL, len(c.header)))

    widths = {c.source: natural(c) for c in columns if not c.key}

    def room(kept: list[Column]) -> int:
        """What is left for the key (or the wrapped column) beside ``kept``."""
        others = [c for c in kept if not c.key]
        gaps = len(GAP) * (len(others) if key is not None else len(others) - 1)
        return total - sum(widths[c.source] for c in others) - gaps

    def key_fits(left: int, least: int) -> bool:
        if key is None:
            return left >= 0
        if left < min(key_full, least):
            return False
        return (
            max(len(key.header), *map(len, key_labels(keys, max(left, 1), checkpointables))) <= left
        )

    kept = [c for c in columns if c.key or c.priority == 0]
    order = sorted(
        (c for c in columns if not (c.key or c.priority == 0)),
        key=lambda c: c.priority,
    )
    for c in order:
        trial = [*kept, c]
        essential = c.priority <= ESSENTIAL
        if key_fits(room(trial), MIN_KEY if essential else key_full):
            kept = trial
    hidden = [c for c in columns if c not in kept]
    kept = [c for c in columns if c in kept]
    left = room(kept)
    if key is not None:
        labels = key_labels(keys, max(left, 1), checkpointables) if left < key_full else full
        cells[key.source] = labels
        widths[key.source] = max([len(key.header), *map(len, labels)])
    # What is left goes to a wrapped column (a message), else widens the columns that
    # were cut (a path), in priority order.
    spare = left - widths[key.source] if key is not None else left
    for c in sorted(kept, key=lambda c: (not c.wrap, c.priority)):
        if c.key or spare <= 0:
            continue
        widest = max([len(c.header), *(len(s) for s in cells[c.source])])
        more = spare if c.wrap else min(widest - widths[c.source], spare)
        if more > 0:
            widths[c.source] += more
            spare -= more
    for c in kept:
        if not (c.key or c.wrap):
            cells[c.source] = [shorten_middle(s, widths[c.source]) for s in cells[c.source]]
    return Layout(kept, {c.source: widths[c.source] for c in kept}, cells, uniform, hidden)


def render(
    table: Table,
    columns: Sequence[Column],
    out: TextIO,
    total: int,
    *,
    checkpointables: Sequence[str] | None = None,
) -> Layout | None:
    """Prints ``table`` with the ``columns`` that fit in ``total`` characters.

    Columns left out because every row holds the same value are named on a line
    under the table (``every row: kind: jax.Array``), and so are those left out for
    the width (``… 3 more columns: lr, blocked, save; --wide``). Returns the layout
    drawn (``None`` for an empty table).
    """
    if table.empty:
        print("(no rows)", file=out)
        return None
    plan = layout(table, columns, total, checkpointables=checkpointables)
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    grid = Table(box=None, pad_edge=False, padding=(0, 1), show_edge=False, header_style=None)
    for c in plan.columns:
        grid.add_column(
            c.header,
            justify="right" if c.right else "left",
            width=plan.widths[c.source],
            no_wrap=not c.wrap,
            overflow="fold" if c.wrap else "ellipsis",
        )
    for row in range(len(table)):
        grid.add_row(*(Text(plan.cells[c.source][row]) for c in plan.columns))
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=total,
        color_system=None,
        force_terminal=False,
        highlight=False,
        markup=False,
        emoji=False,
        legacy_windows=False,
    )
    console.print(grid)
    for line in buffer.getvalue().splitlines():
        print(line.rstrip(), file=out)
    if plan.uniform:
        byname = {c.source: c.header for c in columns}
        # "header: value", so that a value that repeats its header reads once ("kept:
        # all kept", never "kept all kept").
        said = "; ".join(f"{byname[s]}: {v}" for s, v in plan.uniform.items())
        for line in textwrap.wrap(f"every row: {said}", total, break_on_hyphens=False):
            print(line, file=out)
    if plan.hidden:
        count = len(plan.hidden)
        named = ", ".join(c.header for c in plan.hidden)
        told = f"… {count} more column{'s' * (count != 1)}: {named}; --wide shows them"
        for line in textwrap.wrap(told, total, break_on_hyphens=False):
            print(line, file=out)
    return plan


# The member of a JSON object that names its numbers JSON cannot write (NaN, ±Inf).
NONFINITE_VALUES = "nonfinite_values"


def _nonfinite_text(value: Any) -> str | None:
    """``"nan"``, ``"inf"`` or ``"-inf"`` for a non-finite float; ``None`` otherwise."""
    if _numpy(value) and not _is_bool(value) and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return None


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data: tuples as lists, missing as null, times as ISO 8601,
    durations as seconds.

    JSON has no NaN or infinity: a number that is NaN or ±Inf is written as null,
    and the object holding it names it in its ``nonfinite_values`` member
    (``{"loss": null, "nonfinite_values": {"loss": "nan"}}``), so that null alone
    always means missing. A non-finite number in a list is null.
    """
    if is_missing(value) and not isinstance(value, float):
        return None
    if isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if _numpy(value) and hasattr(value, "tolist"):  # a NumPy scalar or array
        return jsonable(value.tolist())
    if type(value).__name__ == "Timestamp":  # pandas': imported only where there is one
        return value.isoformat()
    if type(value).__name__ == "Timedelta":
        return value.total_seconds()
    if isinstance(value, dict):
        plain = {str(k): jsonable(v) for k, v in value.items()}
        told = {str(k): t for k, v in value.items() if (t := _nonfinite_text(v)) is not None}
        if told:
            plain[NONFINITE_VALUES] = told
        return plain
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return str(value)


def csv_cell(value: Any) -> Any:
    """A cell for ``--csv``: missing blank, a non-finite number as ``nan``, ``inf`` or
    ``-inf`` (as pandas reads them back), sequences and mappings as JSON."""
    told = _nonfinite_text(value)
    if told is not None:
        return told
    plain = jsonable(value)
    if plain is None:
        return ""
    if isinstance(plain, list | dict):
        return json.dumps(plain)
    return plain


def say(text: str, out: TextIO, total: int) -> None:
    """``text`` wrapped to ``total`` characters (a blank line for ``""``)."""
    for line in textwrap.wrap(text, total, break_on_hyphens=False) or [""]:
        print(line, file=out)
