"""NaN and Inf as the widgets show them: a colour of their own, apart from the red of
errors and of the largest change, and the diff's leaves that hold them."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from tinax import vocabulary as words

# Text and background of what holds NaN or Inf (a diff's rows and bars, a verdict).
NONFINITE_COLOR = "#6a1b9a"
NONFINITE_BACKGROUND = "#f3e5f5"


def counted(value: Any) -> int:
    """A count from a table cell: 0 for ``None``, ``<NA>``, NaN and non-numbers."""
    if value is None or value is pd.NA:
        return 0
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0
    return int(number) if math.isfinite(number) else 0


def nonfinite_counts(
    table: pd.DataFrame, sides: tuple[str, ...] = ("a", "b")
) -> tuple[np.ndarray, np.ndarray]:
    """The NaN and the Inf count of each row of a ``diff_table`` in ``sides`` (``a``,
    ``b`` or both, added), 0 where the values were not decoded."""
    nan = np.zeros(len(table), np.int64)
    inf = np.zeros(len(table), np.int64)
    for side in sides:
        if f"nan_{side}" in table:
            nan += np.array([counted(v) for v in table[f"nan_{side}"]], np.int64)
        if f"inf_{side}" in table:
            inf += np.array([counted(v) for v in table[f"inf_{side}"]], np.int64)
    return nan, inf


def is_nonfinite_change(table: pd.DataFrame) -> np.ndarray:
    """Which rows of a ``diff_table`` are changed leaves holding NaN or Inf on either
    side (its ``nonfinite`` word, or else its counts): their relative change cannot
    be told, whatever the finite elements say."""
    changed = (table["status"] == words.CHANGED).to_numpy(bool)
    if "nonfinite" in table:
        return changed & table["nonfinite"].notna().to_numpy(bool)
    nan, inf = nonfinite_counts(table)
    return changed & ((nan + inf) > 0)


def sides_text(nan_b: int, inf_b: int, nan_a: int, inf_a: int) -> str:
    """NaN and Inf counted in each checkpoint of a diff, once each (what a scan of
    either finds): ``b: 487,168 NaN · a: 160,512 NaN``; a side with none left out."""
    said = []
    for side, nan, inf in (("b", nan_b, inf_b), ("a", nan_a, inf_a)):
        counts = [f"{n:,} {word}" for n, word in ((nan, "NaN"), (inf, "Inf")) if n]
        if counts:
            said.append(f"{side}: {', '.join(counts)}")
    return " · ".join(said)


def _told(row: pd.Series, side: str) -> str:
    counts = [(word, counted(row.get(f"{word.lower()}_{side}"))) for word in ("NaN", "Inf")]
    return ", ".join(f"{word} {n:,}" for word, n in counts if n)


def nonfinite_change(row: pd.Series) -> str:
    """The change of a leaf holding NaN or Inf, told by its counts: ``NaN 512 (was
    finite)``, ``NaN 512 (a: NaN 500)``, ``finite (a: Inf 3)``."""
    b, a = _told(row, "b"), _told(row, "a")
    if not b:
        return f"finite (a: {a})" if a else "NaN/Inf"
    return f"{b} (a: {a})" if a else f"{b} (was finite)"
