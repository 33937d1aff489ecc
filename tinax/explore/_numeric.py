"""Running sums over array values that arrive a region at a time: NaN/Inf counts, and
how far one array is from another.

Both work through each region in blocks small enough that their float64 working
copies stay in cache, so the memory they add is a few MiB whatever the array size.
"""

from __future__ import annotations

import math

import numpy as np

# Elements per block: 256 Ki float64s are 2 MiB, a working set that stays in cache.
_BLOCK = 1 << 18


def _blocks(flat: np.ndarray) -> range:
    return range(0, flat.size, _BLOCK)


def _flat(values: np.ndarray) -> np.ndarray:
    flat = np.ascontiguousarray(values).reshape(-1)
    if flat.dtype.kind == "b":
        return flat.view(np.uint8)
    return flat


def _floating(dtype: np.dtype) -> bool:
    """Whether values of ``dtype`` can be NaN or infinite (ml_dtypes floats too)."""
    if dtype.kind in "fc":
        return True
    if dtype.kind == "V" and dtype.fields is None:
        try:
            return bool(np.isnan(np.array([np.nan]).astype(dtype).astype(np.float64))[0])
        except (TypeError, ValueError):
            return False
    return False


def _bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two flat arrays of one dtype hold the same bytes (NaNs, -0.0 and all)."""
    size = a.dtype.itemsize
    if size in (1, 2, 4, 8):
        unsigned = np.dtype(f"u{size}")
        return bool(np.array_equal(a.view(unsigned), b.view(unsigned)))
    if size % 8 == 0:
        return bool(np.array_equal(a.view(np.uint64), b.view(np.uint64)))
    return a.tobytes() == b.tobytes()


def _working_dtype(dtype: np.dtype) -> type:
    return np.complex128 if dtype.kind == "c" else np.float64


class ValueCounts:
    """NaN and infinity counts of an array seen a region at a time."""

    def __init__(self, dtype: np.dtype) -> None:
        self.floating = _floating(np.dtype(dtype))
        self.nan = 0
        self.inf = 0

    def update(self, values: np.ndarray) -> None:
        """Adds one region's values."""
        if not self.floating:
            return
        flat = _flat(values)
        for start in _blocks(flat):
            block = flat[start : start + _BLOCK]
            if block.dtype.kind == "V":
                block = block.astype(np.float32)
            # Sums are cheap and finite exactly when every element is (or nearly:
            # huge finite values can overflow, and are then counted one by one).
            total = block.sum(dtype=np.complex128 if block.dtype.kind == "c" else np.float64)
            if np.isfinite(total):
                continue
            self.nan += int(np.count_nonzero(np.isnan(block)))
            self.inf += int(np.count_nonzero(np.isinf(block)))


class PairStats:
    """How array ``b`` differs from array ``a`` of the same shape, seen a region at a time.

    Sums run over the elements that are finite on both sides; NaNs and infinities
    are counted apart, for each side. Complex values are compared as complex numbers.

    Attributes:
      equal: Whether every region so far was bitwise equal.
      counts_a, counts_b: NaN and infinity counts of each side.
    """

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = np.dtype(dtype)
        self.numeric = self.dtype.kind in "biufc" or _floating(self.dtype)
        self.equal = True
        self.counts_a = ValueCounts(self.dtype)
        self.counts_b = ValueCounts(self.dtype)
        self._aa = self._bb = self._dd = 0.0
        self._ab: complex = 0.0
        self._max = 0.0

    def update(self, a: np.ndarray, b: np.ndarray) -> None:
        """Adds one region of each side (the same region, the same dtype)."""
        fa, fb = _flat(a), _flat(b)
        if fa.dtype != fb.dtype or fa.shape != fb.shape:
            raise ValueError(f"regions differ: {fa.dtype}{a.shape} and {fb.dtype}{b.shape}")
        same = _bitwise_equal(fa, fb)
        self.counts_a.update(fa)
        if same:
            if self.numeric:
                self._add_same(fa)
            self.counts_b.nan, self.counts_b.inf = self.counts_a.nan, self.counts_a.inf
            return
        self.equal = False
        self.counts_b.update(fb)
        if self.numeric:
            self._add_changed(fa, fb)

    def _add_same(self, flat: np.ndarray) -> None:
        work = _working_dtype(flat.dtype)
        for start in _blocks(flat):
            x = flat[start : start + _BLOCK].astype(work)
            if self.counts_a.floating:
                x = x[np.isfinite(x)]
            norm = float(np.vdot(x, x).real)
            self._aa += norm
            self._bb += norm
            self._ab += norm

    def _add_changed(self, fa: np.ndarray, fb: np.ndarray) -> None:
        work = _working_dtype(fa.dtype)
        for start in _blocks(fa):
            x = fa[start : start + _BLOCK].astype(work)
            y = fb[start : start + _BLOCK].astype(work)
            d = y - x
            aa, bb, ab, dd = np.vdot(x, x).real, np.vdot(y, y).real, np.vdot(x, y), np.vdot(d, d)
            if not (np.isfinite(aa) and np.isfinite(bb) and np.isfinite(dd)):
                both = np.isfinite(x) & np.isfinite(y)
                x, y = x[both], y[both]
                d = y - x
                aa, bb, ab, dd = (
                    np.vdot(x, x).real,
                    np.vdot(y, y).real,
                    np.vdot(x, y),
                    np.vdot(d, d),
                )
            if d.size:
                largest = np.abs(d).max() if work is np.complex128 else max(d.max(), -d.min())
                self._max = max(self._max, float(largest))
            self._aa += float(aa)
            self._bb += float(bb)
            self._ab += complex(ab) if work is np.complex128 else float(ab.real)
            self._dd += float(dd.real)

    @property
    def max_abs_diff(self) -> float:
        """The largest ``|b - a|`` over elements finite on both sides."""
        return self._max

    @property
    def norm_a(self) -> float:
        """``‖a‖`` over elements finite on both sides (on ``a``'s, where equal)."""
        return math.sqrt(self._aa)

    @property
    def norm_b(self) -> float:
        """``‖b‖``, as ``norm_a``."""
        return math.sqrt(self._bb)

    @property
    def norm_diff(self) -> float:
        """``‖b - a‖``, as ``norm_a``."""
        return math.sqrt(self._dd)

    @property
    def rel_change(self) -> float:
        """``‖b - a‖ / ‖a‖``: infinite when ``a`` is zero and ``b`` is not."""
        if self._aa == 0.0:
            return 0.0 if self._dd == 0.0 else math.inf
        return math.sqrt(self._dd) / math.sqrt(self._aa)

    @property
    def cosine(self) -> float:
        """``Re⟨a, b⟩ / (‖a‖ ‖b‖)``; NaN when either side is zero."""
        if self._aa == 0.0 or self._bb == 0.0:
            return math.nan
        ab = self._ab.real if isinstance(self._ab, complex) else self._ab
        return max(-1.0, min(1.0, ab / math.sqrt(self._aa * self._bb)))
