"""How a leaf's change is told for what it is, and how a diff's rows are ranked.

Floating-point arrays by relative change ("1.2 %"), integer counters by how far
they moved ("+150"), PRNG keys as changed or the same (their bits are not
quantities); the model before the optimizer's state, and within each changed
weights first, then counters, then keys.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from tinax._format.naming import words
from tinax.explore import display
from tinax.explore._numeric import PairStats
from tinax.explore.display import state_part

# What a leaf's values are, for how its change is told and ranked: floating-point
# arrays by relative change, integer counters by how much they moved ("+150"), PRNG
# keys as changed or not (their bits are not quantities).
FLOAT = "float"
INTEGER = "integer"
PRNG_KEY = "PRNG key"
BOOL = "bool"
OTHER = "other"
# Changed leaves are ranked by what they are: weights first, counters, keys, the rest.
_KIND_ORDER = {FLOAT: 0, INTEGER: 1, BOOL: 2, PRNG_KEY: 3, OTHER: 4}
# Names under which a uint32 array of shape (..., 2) or (..., 4) is a PRNG key's data.
_KEY_NAMES = ("rng", "key", "seed", "prng")


def value_kind(checkpointable: str, key: str, dtype: Any, shape: Any) -> str:
    """What the values of a leaf are: ``"float"``, ``"integer"``, ``"bool"``,
    ``"PRNG key"`` or ``"other"``.

    A typed PRNG key (dtype ``key<…>``) is a key; so is a stored key's data, a
    ``uint32`` array whose last axis is 2 (threefry) or 4 (rbg) under a name
    that says so (``rng``, ``key``, ``seed``), since Orbax stores typed keys as
    their raw data.
    """
    text = str(dtype) if dtype is not None else ""
    if text.startswith("key<"):
        return PRNG_KEY
    try:
        np_dtype = np.dtype(text)
    except TypeError:
        return FLOAT if "float" in text else OTHER
    if np_dtype.kind == "b":
        return BOOL
    if np_dtype.kind in "iu":
        if (
            np_dtype == np.uint32
            and isinstance(shape, tuple)
            and shape
            and shape[-1] in (2, 4)
            and any(w in f"{checkpointable} {key}".lower() for w in _KEY_NAMES)
        ):
            return PRNG_KEY
        return INTEGER
    if np_dtype.kind in "fc" or "float" in text:
        return FLOAT
    return OTHER


def _signed(value: float) -> str:
    whole = round(value)
    if abs(value - whole) < 1e-9:
        return f"{whole:+,d}"
    return f"{value:+.4g}"


# Statuses after ``changed`` in the order ``sort`` puts them (changed rows go by size).
_STATUS_ORDER = {
    words.CHANGED: 0,
    words.SHAPE_DIFFERS: 1,
    words.DTYPE_DIFFERS: 2,
    words.KIND_DIFFERS: 3,
    words.ONLY_IN_A: 4,
    words.ONLY_IN_B: 5,
    words.SAME: 6,
    words.CORRUPT: -1,
}


def nonfinite_change(stats: PairStats | None) -> str | None:
    """How a leaf's NaN and Inf changed between the sides (``words.NONFINITE_CHANGES``);
    ``None`` when both sides are finite or the values were not read."""
    if stats is None:
        return None
    a, b = stats.nonfinite_a, stats.nonfinite_b
    if a and b:
        return words.NONFINITE_BOTH
    if b:
        return words.BECAME_NONFINITE
    if a:
        return words.BECAME_FINITE
    return None


# Changed leaves whose NaN/Inf changed, in the order they rank before all others.
_ALARM_ORDER = {marker: i for i, marker in enumerate(words.NONFINITE_CHANGES)}


def told_change(
    kind: str, status: str, stats: PairStats | None, a: Any
) -> tuple[list[Any], list[Any], str, Any]:
    """A diff row's statistics, NaN/Inf counts, ``change`` text and ``delta``.

    Args:
      kind: The leaf's ``value_kind``.
      status: Its diff status.
      stats: What the comparison of its values found, if they were compared.
      a: Side ``a``'s leaf (its ``shape`` tells a one-element counter).
    """
    numbers: list[Any] = [None] * 6
    counts: list[Any] = [None] * 4
    delta: Any = None
    change = status
    if stats is not None:
        counts = [stats.counts_a.nan, stats.counts_a.inf, stats.counts_b.nan, stats.counts_b.inf]
        if status == words.CHANGED and stats.numeric:
            if kind == FLOAT:
                numbers = [
                    stats.max_abs_diff,
                    stats.rel_change,
                    stats.cosine,
                    stats.norm_a,
                    stats.norm_b,
                    stats.norm_diff,
                ]
                rel = stats.rel_change
                marker = nonfinite_change(stats)
                if marker is not None:
                    # Never "0 %": a leaf whose values went NaN is told so.
                    change = marker
                elif math.isnan(rel):
                    change = "nan"
                else:
                    change = "∞ %" if math.isinf(rel) else f"{rel * 100:.3g} %"
            elif kind in (INTEGER, BOOL):
                # A counter's change is how far it moved, never a float statistic.
                numbers[0] = stats.max_abs_diff
                shape = getattr(a, "shape", None)
                if shape is not None and math.prod(shape) == 1:
                    delta = stats.sum_diff
                    change = _signed(stats.sum_diff)
                else:
                    change = f"max |Δ| {stats.max_abs_diff:,.0f}"
    if kind == PRNG_KEY and status in (words.CHANGED, words.SAME):
        change = status  # a key changed or not; its bits are no quantity
    return numbers, counts, change, delta


def sort_by_change(table: pd.DataFrame) -> pd.DataFrame:
    """``diff_table`` rows with what matters most first.

    Changed leaves whose NaN or Inf changed come before everything else, wherever
    they are (``nonfinite``: ``became non-finite`` first, then ``non-finite in
    both``, then ``became finite``): a leaf that went NaN is the first thing to see.
    Then the model's leaves come first, the optimizer's state last
    (``display.state_part``), and within each, changed leaves come first:
    floating-point arrays by ``rel_change`` (largest first), then integer counters
    by how far they moved, then PRNG keys and the rest; then the other
    differences; then leaves that are the same. Ties go in natural key order
    (block 2 before block 10).
    """
    if table.empty:
        return table.reset_index(drop=True)
    part = [state_part(c, k) for c, k in zip(table["checkpointable"], table["key"], strict=True)]
    names = [str(c) for c in table["checkpointable"]]
    keys = [display.natural_key(str(k)) for k in table["key"]]
    places = sorted(range(len(table)), key=lambda i: (names[i], keys[i]))
    natural = np.empty(len(table), np.int64)
    natural[places] = np.arange(len(table))
    order = table["status"].map(lambda s: _STATUS_ORDER.get(s, len(_STATUS_ORDER)))
    kinds = table["value_kind"].map(lambda k: _KIND_ORDER.get(k, len(_KIND_ORDER)))
    kinds = kinds.where(table["status"] == words.CHANGED, 0)
    change = pd.to_numeric(table["rel_change"], errors="coerce")
    moved = pd.to_numeric(table["delta"], errors="coerce").abs()
    size = change.fillna(moved).fillna(-1.0)
    alarm = pd.Series(len(_ALARM_ORDER), index=table.index)
    if "nonfinite" in table.columns:
        told = table["nonfinite"].map(lambda m: _ALARM_ORDER.get(m, len(_ALARM_ORDER)))
        alarm = told.where(table["status"] == words.CHANGED, len(_ALARM_ORDER))
    keyed = table.assign(
        _alarm=alarm, _part=part, _order=order, _kind=kinds, _change=-size, _natural=natural
    )
    by = ["_alarm", "_part", "_order", "_kind", "_change", "_natural"]
    keyed = keyed.sort_values(by, kind="stable")
    return keyed.drop(columns=by).reset_index(drop=True)
