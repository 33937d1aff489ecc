"""The order of a table's rows: numbers, times and text by value, shapes by their size,
leaf keys in natural order (``display.natural_key``: block 2 before block 10)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from tinax.explore import display

from ._page_text import format_cell


def _sort_value(value: Any) -> Any:
    """A cell's place in a sort of a column that is not numbers: shapes by their size."""
    if isinstance(value, tuple):
        return (0, math.prod(v if isinstance(v, int) else 0 for v in value), len(value), str(value))
    return (1, 0, 0, str(value))


def _sort_key(series: pd.Series) -> pd.Series:
    if pd.api.types.is_bool_dtype(series.dtype):
        return series.astype("Int64")
    if (
        pd.api.types.is_numeric_dtype(series.dtype)
        or pd.api.types.is_datetime64_any_dtype(series.dtype)
        or pd.api.types.is_timedelta64_dtype(series.dtype)
        or (pd.api.types.is_string_dtype(series.dtype) and series.dtype != object)
    ):
        return series
    # Objects (shapes, tuples of names, mixed values): missing ones stay missing, so
    # that they sort last whichever way.
    return series.map(lambda v: None if format_cell(v) == "" else _sort_value(v))


def _natural_rank(series: pd.Series) -> pd.Series:
    """Each key's place in natural order (``display.natural_key``): block 2 before 10."""
    text = series.map(lambda v: "" if format_cell(v) == "" else str(v))
    places = [display.natural_key(t) for t in text.tolist()]
    order = sorted(range(len(places)), key=places.__getitem__)
    rank = pd.Series(0, index=series.index, dtype="int64")
    rank.iloc[order] = range(len(order))
    return rank.where(text != "", other=None) if (text == "").any() else rank


def sorted_frame(
    frame: pd.DataFrame, field: str | None, *, ascending: bool = True, natural: bool = False
) -> pd.DataFrame:
    """``frame`` sorted by its column ``field`` (stable, missing values last).

    Numbers, times and strings sort by value; shapes by their number of elements;
    anything else by its text; with ``natural``, text with its integer parts as
    numbers (leaf keys). ``None`` (or a field ``frame`` lacks) keeps ``frame``'s own
    order.
    """
    if field is None or field not in frame.columns or len(frame) < 2:
        return frame
    key = _natural_rank(frame[field]) if natural else _sort_key(frame[field])
    try:
        order = key.sort_values(ascending=ascending, kind="stable", na_position="last").index
    except TypeError:
        # Values that do not compare with one another sort by their text.
        text = frame[field].map(lambda v: format_cell(v) or None)
        order = text.sort_values(ascending=ascending, kind="stable", na_position="last").index
    return frame.loc[order]
