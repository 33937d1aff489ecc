"""Statistics of one leaf's value, for a terminal or a widget."""

from __future__ import annotations

from typing import Any

import numpy as np

SUMMARY_FIELDS = (
    "shape",
    "dtype",
    "size",
    "min",
    "max",
    "mean",
    "std",
    "nan_count",
    "inf_count",
)


def _numeric(array: np.ndarray) -> np.ndarray | None:
    """``array`` in a dtype NumPy can reduce, or ``None`` if it is not numbers."""
    if array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer):
        return array
    if np.issubdtype(array.dtype, np.floating) and array.dtype.itemsize >= 4:
        return array
    try:
        # bfloat16, float8 and other ml_dtypes floats reduce as float32.
        converted = array.astype(np.float32)
    except (TypeError, ValueError):
        return None
    return converted if converted.dtype.kind == "f" else None


def leaf_summary(value: Any) -> dict[str, Any]:
    """Shape, dtype and statistics of a leaf's value (from ``read_leaf`` or live state).

    Statistics are over the finite elements (complex ones by magnitude); NaNs
    and infinities are counted apart. Values that are not numbers (strings, ``None``, iterator states)
    have only ``None`` fields.

    Args:
      value: An array, a scalar, or anything else a leaf can hold.

    Returns:
      A dict with ``shape`` (tuple), ``dtype`` (str), ``size``, ``min``, ``max``,
      ``mean``, ``std`` (Python floats, or ``None`` when there is no finite
      element), ``nan_count`` and ``inf_count``.
    """
    summary: dict[str, Any] = dict.fromkeys(SUMMARY_FIELDS)
    if value is None or isinstance(value, str | bytes | dict | list | tuple):
        return summary
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):
        return summary
    if array.dtype == object:
        return summary
    summary.update(
        shape=tuple(int(d) for d in array.shape), dtype=array.dtype.name, size=int(array.size)
    )
    if np.issubdtype(array.dtype, np.complexfloating):
        array = np.abs(array)
    numbers = _numeric(array)
    if numbers is None:
        return summary
    if numbers.dtype.kind == "f":
        nan = np.isnan(numbers)
        inf = np.isinf(numbers)
        summary.update(nan_count=int(nan.sum()), inf_count=int(inf.sum()))
        if nan.any() or inf.any():
            numbers = numbers[~(nan | inf)]
    else:
        summary.update(nan_count=0, inf_count=0)
        numbers = numbers.astype(np.float64) if numbers.dtype == np.bool_ else numbers
    if numbers.size:
        summary.update(
            min=float(numbers.min()),
            max=float(numbers.max()),
            mean=float(numbers.mean(dtype=np.float64)),
            std=float(numbers.std(dtype=np.float64)),
        )
    return summary
