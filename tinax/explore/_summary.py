"""Statistics of one leaf's value, for a terminal or a widget, in bounded memory."""

from __future__ import annotations

import dataclasses
import math
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

# Elements per pass: large leaves are walked in chunks so that converting to float64
# never needs more than a few MiB beyond the leaf itself.
_CHUNK = 1 << 20
HISTOGRAM_BINS = 40


@dataclasses.dataclass(frozen=True)
class LeafStatistics:
    """Summary of a numeric array's values.

    ``minimum``, ``maximum``, ``mean`` and ``std`` cover the finite values only
    (complex values by magnitude);
    they are ``None`` when there are none. ``histogram`` holds bin counts and the
    ``bins + 1`` bin edges over the finite values (``None`` when there are none or
    no histogram was asked for).
    """

    shape: tuple[int, ...]
    dtype: str
    size: int
    minimum: float | int | None
    maximum: float | int | None
    mean: float | None
    std: float | None
    nan_count: int
    inf_count: int
    histogram: tuple[np.ndarray, np.ndarray] | None


def is_numeric(value: Any) -> bool:
    """Whether ``value`` is an array whose values can be summarised as numbers."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or not hasattr(value, "shape"):
        return False
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        return False
    if dtype.kind in "biufc":
        return True
    # ml_dtypes floats (bfloat16, float8_*) are kind 'V' but convert to float.
    if dtype.kind == "V" and dtype.fields is None:
        try:
            np.zeros(1, dtype).astype(np.float64)
        except (TypeError, ValueError):
            return False
        return True
    return False


def _chunks(flat: np.ndarray) -> Any:
    for start in range(0, flat.size, _CHUNK):
        yield flat[start : start + _CHUNK]


def leaf_statistics(value: Any, *, bins: int | None = HISTOGRAM_BINS) -> LeafStatistics:
    """Shape, dtype, min/max/mean/std, NaN and Inf counts and a histogram of ``value``.

    The array is walked in chunks, so the float64 working copies never need more
    than a few MiB beyond the array itself.

    Args:
      value: A numeric array (NumPy, JAX, or anything ``np.asarray`` accepts with a
        numeric dtype, including bfloat16).
      bins: Number of histogram bins; ``None`` skips the histogram (and its second
        pass over the data).

    Returns:
      The statistics.

    Raises:
      TypeError: If ``value`` is not a numeric array.
    """
    if not is_numeric(value):
        raise TypeError(f"no statistics for a value of type {type(value).__name__}")
    array = np.asarray(value)
    flat = array.reshape(-1)
    if flat.dtype.kind == "b":
        flat = flat.view(np.uint8)
    elif flat.dtype.kind == "c":
        flat = np.abs(flat)  # complex values are summarised by magnitude
    is_int = array.dtype.kind in "biu"
    count = 0
    mean = 0.0
    m2 = 0.0
    nan_count = inf_count = 0
    lo: Any = None
    hi: Any = None
    for chunk in _chunks(flat):
        as_float = chunk.astype(np.float64)
        if is_int:
            finite = as_float
            if chunk.size:
                c_lo, c_hi = chunk.min().item(), chunk.max().item()
                lo = c_lo if lo is None else min(lo, c_lo)
                hi = c_hi if hi is None else max(hi, c_hi)
        else:
            nans = np.isnan(as_float)
            infs = np.isinf(as_float)
            nan_count += int(nans.sum())
            inf_count += int(infs.sum())
            finite = as_float[~(nans | infs)]
            if finite.size:
                c_lo, c_hi = float(finite.min()), float(finite.max())
                lo = c_lo if lo is None else min(lo, c_lo)
                hi = c_hi if hi is None else max(hi, c_hi)
        n = finite.size
        if n:
            # Chan et al.'s pairwise update keeps the variance exact across chunks.
            c_mean = float(finite.mean())
            c_m2 = float(((finite - c_mean) ** 2).sum())
            delta = c_mean - mean
            total = count + n
            mean += delta * n / total
            m2 += c_m2 + delta * delta * count * n / total
            count = total
    histogram = None
    if count and bins is not None:
        edges_lo, edges_hi = float(lo), float(hi)
        if edges_lo == edges_hi:
            edges_lo, edges_hi = edges_lo - 0.5, edges_hi + 0.5
        counts = np.zeros(bins, dtype=np.int64)
        edges = np.linspace(edges_lo, edges_hi, bins + 1)
        for chunk in _chunks(flat):
            as_float = chunk.astype(np.float64)
            finite = as_float[np.isfinite(as_float)]
            counts += np.histogram(finite, bins=edges)[0]
        histogram = (counts, edges)
    return LeafStatistics(
        shape=tuple(int(d) for d in array.shape),
        dtype=str(array.dtype),
        size=int(array.size),
        minimum=lo,
        maximum=hi,
        mean=mean if count else None,
        std=math.sqrt(m2 / count) if count else None,
        nan_count=nan_count,
        inf_count=inf_count,
        histogram=histogram,
    )


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
    if not is_numeric(array):
        return summary
    stats = leaf_statistics(array, bins=None)
    summary.update(nan_count=stats.nan_count, inf_count=stats.inf_count)
    if stats.mean is not None:
        summary.update(
            min=float(stats.minimum),  # type: ignore[arg-type]
            max=float(stats.maximum),  # type: ignore[arg-type]
            mean=stats.mean,
            std=stats.std,
        )
    return summary
