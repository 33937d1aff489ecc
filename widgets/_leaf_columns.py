"""The columns of the explorer's leaf table."""

from __future__ import annotations

from typing import Any

from ._table import Column, format_cell
from ._text import format_bytes

_VALUE_CHARS = 40


def format_value(value: Any) -> str:
    text = format_cell(value)
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 1] + "…"


def _format_key(value: Any) -> str:
    # A checkpointable that is a single leaf (an iterator, an array) has the empty key.
    return format_cell(value) or "(whole)"


LEAF_COLUMNS = (
    Column("key", "key", _format_key, key=True),
    Column("shape", "shape", descending_first=True),
    Column("dtype", "dtype"),
    Column("nbytes", "size", format_bytes, align="right", descending_first=True),
    Column("checkpointable", "checkpointable", essential=False, priority=1),
    Column("kind", "kind", essential=False, priority=2),
    Column("value", "value", format_value, essential=False, priority=3),
)
