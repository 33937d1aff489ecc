"""NaN and infinities in array values: the one count every view and every load makes.

A region of values is summed in blocks small enough to stay in cache: a sum in the
values' own precision is finite exactly when every element is (unless it overflows),
so finite blocks, nearly all of them in a healthy checkpoint, cost one pass without
a temporary; a block whose sum is not finite has its NaN and infinities counted one
by one. No warning is raised for values that are NaN or overflow: they are what is
being counted.
"""

from __future__ import annotations

import numpy as np

# Elements per block: 256 Ki of them, 1 or 2 MiB, stay in cache.
BLOCK = 1 << 18


def is_floating(dtype: np.dtype) -> bool:
    """Whether values of ``dtype`` can be NaN or infinite (ml_dtypes floats too)."""
    if dtype.kind in "fc":
        return True
    if dtype.kind == "V" and dtype.fields is None:
        try:
            with np.errstate(invalid="ignore"):
                return bool(np.isnan(np.array([np.nan]).astype(dtype).astype(np.float64))[0])
        except (TypeError, ValueError):
            return False
    return False


def flat(values: np.ndarray) -> np.ndarray:
    """``values`` as one contiguous row (booleans as bytes)."""
    row = np.ascontiguousarray(values).reshape(-1)
    if row.dtype.kind == "b":
        return row.view(np.uint8)
    return row


def computable(block: np.ndarray) -> np.ndarray:
    """``block`` in a dtype NumPy computes with: 16-bit and ml_dtypes floats as float32."""
    if block.dtype.kind == "V" or (block.dtype.kind == "f" and block.dtype.itemsize < 4):
        return block.astype(np.float32)
    return block


def count(values: np.ndarray) -> tuple[int, int]:
    """How many of ``values`` are NaN, and how many infinite (``0, 0`` for a dtype that
    holds neither)."""
    if not is_floating(values.dtype):
        return 0, 0
    row = flat(values)
    nan = inf = 0
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, row.size, BLOCK):
            block = computable(row[start : start + BLOCK])
            if np.isfinite(block.sum()):
                continue
            nan += int(np.count_nonzero(np.isnan(block)))
            inf += int(np.count_nonzero(np.isinf(block)))
    return nan, inf
