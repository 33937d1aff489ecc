"""Tables made for reading: human units in place of raw numbers, for notebooks and logs.

``tinax.explore`` tables keep machine values (bytes as integers, UTC timestamps,
ages as timedeltas), so that code can sort and sum them. ``readable`` turns a copy
into text a person reads at a glance: ``87.4 KiB``, ``3 min``, ``2026-12-03 19:37``,
``(16, 32)``, and blanks for missing values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from tinax.explore.display import human_bytes

# Columns that hold bytes, by the names the explore tables use.
_BYTE_COLUMNS = frozenset({"nbytes", "nbytes_a", "nbytes_b", "bytes"})
# A cell longer than this is shortened in the middle.
MAX_CHARS = 48


def human_duration(value: Any, *, precise: bool = False) -> str:
    """A duration as people read it, from a timedelta or a number of seconds.

    Coarse by default, for ages and intervals: the largest whole unit, ``'42 s'``,
    ``'7 min'``, ``'3 h'`` or ``'2 d'``. ``precise``, for how long something took or
    will take: ``'0.25 s'``, ``'12.3 s'``, ``'1 min 15 s'`` or ``'2 h 3 min'``.

    Args:
      value: A ``timedelta`` (Python's, NumPy's or pandas'), or seconds as a number.
      precise: Whether to show fractions of a second and the next smaller unit.

    Returns:
      The text; ``''`` for a missing value (``None``, NaN, NaT, NA).

    Raises:
      TypeError, ValueError: If ``value`` is neither a timedelta nor a number.
    """
    if _missing(value):
        return ""
    if isinstance(value, np.timedelta64):  # a NumPy integer: its count is not seconds
        value = pd.Timedelta(value)
    seconds = value.total_seconds() if hasattr(value, "total_seconds") else float(value)
    if precise:
        if seconds < 10:
            return f"{seconds:.2f} s"
        if seconds < 60:
            return f"{seconds:.1f} s"
        minutes, rest = divmod(round(seconds), 60)
        if minutes < 60:
            return f"{minutes} min {rest} s"
        hours, minutes = divmod(minutes, 60)
        return f"{hours} h {minutes} min"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


def _missing(value: Any) -> bool:
    if value is None or value is pd.NaT or value is pd.NA:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _text(value: Any) -> str:
    if isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
        return _text(", ".join(value))  # names: model, optimizer, …
    if isinstance(value, tuple):
        inner = ", ".join(_text(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if _missing(value):
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    if isinstance(value, pd.Timestamp):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    text = str(value)
    if len(text) > MAX_CHARS:
        half = (MAX_CHARS - 1) // 2
        text = text[:half] + "…" + text[-(MAX_CHARS - 1 - half) :]
    return text


def readable(table: pd.DataFrame, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """A copy of an explore table with every cell as short text for reading.

    Bytes columns (``nbytes``) read ``87.4 KiB``, ages ``3 min``, timestamps
    ``2026-12-03 19:37:18`` (UTC, as stored), shapes ``(16, 32)``, floats with six
    significant digits, long values shortened in the middle; missing values are
    blank. The index is kept, so rows still line up with ``table``.

    Args:
      table: Any DataFrame, typically from ``list_checkpoints``,
        ``checkpoint_table``, ``diff_table`` or ``state_table``.
      columns: The columns kept, in this order (default: all).

    Returns:
      A new DataFrame of strings.

    Raises:
      TypeError: If ``table`` is not a DataFrame.
      KeyError: If a column asked for is not in ``table``.
    """
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"table must be a pandas DataFrame, got {type(table).__name__}")
    if columns is not None:
        missing = [c for c in columns if c not in table.columns]
        if missing:
            raise KeyError(f"no column {missing[0]!r} in the table")
        table = table[list(columns)]
    out = {}
    for name in table.columns:
        series = table[name]
        if name in _BYTE_COLUMNS:
            out[name] = series.map(human_bytes)
        elif pd.api.types.is_timedelta64_dtype(series.dtype):
            out[name] = series.map(human_duration)
        else:
            out[name] = series.map(_text)
    return pd.DataFrame(out, index=table.index).astype("string")
