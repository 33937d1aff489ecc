"""Running sums over array values that arrive a region at a time: NaN/Inf counts, and
how far one array is from another.

Both work through each region in blocks small enough that their working copies
stay in cache, so the memory they add is a few MiB whatever the array size.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tinax._format.arraydata import nonfinite

_BLOCK = nonfinite.BLOCK
_floating = nonfinite.is_floating
_flat = nonfinite.flat
_computable = nonfinite.computable


def _blocks(flat: np.ndarray) -> range:
    return range(0, flat.size, _BLOCK)


def _bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two flat arrays of one dtype hold the same bytes (NaNs, -0.0 and all)."""
    size = a.dtype.itemsize
    if size in (1, 2, 4, 8):
        unsigned = np.dtype(f"u{size}")
        return bool(np.array_equal(a.view(unsigned), b.view(unsigned)))
    if size % 8 == 0:
        return bool(np.array_equal(a.view(np.uint64), b.view(np.uint64)))
    return a.tobytes() == b.tobytes()


def _difference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    # Integers and single floats are subtracted as float64, where they can neither
    # wrap around nor overflow.
    if x.dtype.kind == "c" or x.dtype == np.float64:
        return y - x
    return np.subtract(y, x, dtype=np.float64)


def _dot(x: np.ndarray, y: np.ndarray) -> Any:
    """``Σ conj(x)·y``, accumulated in double precision without a float64 copy."""
    if x.dtype.kind == "c":
        return np.vdot(x.astype(np.complex128), y.astype(np.complex128))
    return np.einsum("i,i->", x, y, dtype=np.float64)


def _sums(x: np.ndarray, y: np.ndarray, d: np.ndarray) -> tuple[float, float, Any, float]:
    """``Σ|x|²``, ``Σ|y|²``, ``Σ conj(x)·y`` (for real values ``Σd·(x+y)``, as
    ``_real_sums``) and ``Σ|d|²`` for ``d = y - x``, in double precision."""
    aa, bb, dd = float(_dot(x, x).real), float(_dot(y, y).real), float(_dot(d, d).real)
    if x.dtype.kind == "c":
        return aa, bb, complex(_dot(x, y)), dd
    return aa, bb, bb - aa, dd


# Elements per BLAS dot of float64 rows in ``_row_dot``: below OpenBLAS's threshold
# for threading a dot product (10 000), whose threads would contend with the readers'.
_ROW = 4096


def _row_dot(x: np.ndarray, y: np.ndarray) -> float:
    """``Σ x·y`` of two float64 vectors, by BLAS dot products of ``_ROW`` elements."""
    whole = x.size - x.size % _ROW
    rows = np.vecdot(x[:whole].reshape(-1, _ROW), y[:whole].reshape(-1, _ROW))
    return float(rows.sum()) + float(np.dot(x[whole:], y[whole:]))


# Below this a float32 sum of squares may have lost terms to underflow (the square
# of a value under 2**-63 is subnormal or zero): the block is summed in float64.
_TINY = 2.0**-80


def _real_sums(
    x: np.ndarray, y: np.ndarray, scratch: np.ndarray
) -> tuple[float, float, float, float, float] | None:
    """``Σx²``, ``Σy²``, ``Σd²``, ``Σd·(x+y)`` and ``max |d|`` for ``d = y - x`` of one
    block of float32 or float64 values; ``scratch`` holds bytes enough for ``d``.

    Float32 is summed by BLAS ``sdot`` (float32 accumulators: a relative error from
    1e-7 to a few 1e-6 for a block; blocks are added in float64): five passes over
    a block that stays in cache, each releasing the GIL, so that threads comparing
    different regions run side by side. ``Σd·(x+y)`` is ``Σy² - Σx²`` without the
    cancellation, which keeps ``1 - cosine`` accurate when the two are nearly equal. ``None`` when
    float32 could have lost a sum (squares under- or overflowing): the caller then
    sums the block in float64.
    """
    dot: Any = _row_dot if x.dtype == np.float64 else np.dot
    with np.errstate(over="ignore", invalid="ignore"):  # told apart just below
        d = np.subtract(y, x, out=scratch.view(x.dtype)[: x.size])
        aa, bb, dd = float(dot(x, x)), float(dot(y, y)), float(dot(d, d))
        ds = float(dot(d, x)) + float(dot(d, y))
    if not all(map(math.isfinite, (aa, bb, dd, ds))):
        return None
    if x.dtype != np.float64:
        for total, values in ((aa, x), (bb, y), (dd, d)):
            if total < _TINY and (total != 0.0 or values.any()):
                return None
    largest = max(float(d.max()), -float(d.min())) if d.size and dd != 0.0 else 0.0
    return aa, bb, dd, ds, largest


class ValueCounts:
    """NaN and infinity counts of an array seen a region at a time."""

    def __init__(self, dtype: np.dtype) -> None:
        self.floating = _floating(np.dtype(dtype))
        self.nan = 0
        self.inf = 0

    def update(self, values: np.ndarray) -> None:
        """Adds one region's values (``tinax._format.arraydata.nonfinite.count``)."""
        if not self.floating:
            return
        nan, inf = nonfinite.count(values)
        self.nan += nan
        self.inf += inf


def _moved(x: np.ndarray, y: np.ndarray) -> int:
    """Elements whose non-finite state differs between ``x`` and ``y``: finite on one
    side only, or NaN on one and infinite on the other, or infinities of opposite sign."""
    finite_x, finite_y = np.isfinite(x), np.isfinite(y)
    one_side = int(np.count_nonzero(finite_x != finite_y))
    both = ~finite_x & ~finite_y
    if not both.any():
        return one_side
    bx, by = x[both], y[both]
    nan_x, nan_y = np.isnan(bx), np.isnan(by)
    other = (nan_x != nan_y) | (~nan_x & ~nan_y & (bx != by))
    return one_side + int(np.count_nonzero(other))


class PairStats:
    """How array ``b`` differs from array ``a`` of the same shape, seen a region at a time.

    NaNs and infinities are counted apart, for each side. The norm of each side
    is over its own finite elements; the difference (``‖b − a‖``, the largest
    ``|b − a|``, the cosine) over the elements finite on both sides, and undefined
    (NaN) where some element's non-finite state differs between the sides (a
    finite value that became NaN): no number measures that change. Complex values
    are compared as complex numbers.

    Attributes:
      equal: Whether every region so far was bitwise equal.
      counts_a, counts_b: NaN and infinity counts of each side.
      size: Elements seen on each side.
      moved: Elements whose non-finite state differs between the sides (finite on
        one side only, or NaN against Inf, or Inf against -Inf).
      both_finite: Elements finite on both sides.
    """

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = np.dtype(dtype)
        self.numeric = self.dtype.kind in "biufc" or _floating(self.dtype)
        self.equal = True
        self.counts_a = ValueCounts(self.dtype)
        self.counts_b = ValueCounts(self.dtype)
        self.size = 0
        self.moved = 0
        self.both_finite = 0
        # Σ|a|² and Σ|b|² over each side's own finite elements.
        self._own_aa = self._own_bb = 0.0
        self._aa = self._bb = self._dd = 0.0
        # Σ conj(a)·b for complex values; for real ones Σ(b-a)·(a+b) (see cosine).
        self._ab: complex | float = 0.0
        self._max = 0.0
        self._sum_d = 0.0
        self._scratch: np.ndarray | None = None

    def update(self, a: np.ndarray, b: np.ndarray) -> None:
        """Adds one region of each side (the same region, the same dtype)."""
        fa, fb = _flat(a), _flat(b)
        if fa.dtype != fb.dtype or fa.shape != fb.shape:
            raise ValueError(f"regions differ: {fa.dtype}{a.shape} and {fb.dtype}{b.shape}")
        for start in _blocks(fa):
            raw_a, raw_b = fa[start : start + _BLOCK], fb[start : start + _BLOCK]
            if self.numeric:
                self._add(raw_a, raw_b)
            elif self.equal and not _bitwise_equal(raw_a, raw_b):
                self.equal = False

    def done(self) -> None:
        """Drops the working buffer once every region is in (the sums stay)."""
        self._scratch = None

    def _add(self, raw_a: np.ndarray, raw_b: np.ndarray) -> None:
        x, y = _computable(raw_a), _computable(raw_b)
        self.size += x.size
        if x.dtype in (np.float32, np.float64):
            if self._scratch is None:
                self._scratch = np.empty(_BLOCK * 8, np.uint8)
            sums = _real_sums(x, y, self._scratch)
            if sums is not None:
                aa, bb, dd, ds, largest = sums
                if self.equal and (dd != 0.0 or not _bitwise_equal(raw_a, raw_b)):
                    # Equal values can still differ in their bits (0.0 and -0.0).
                    self.equal = False
                self._own_aa += aa
                self._own_bb += bb
                self.both_finite += x.size
                self._take(aa, bb, ds, dd, largest)
                return
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: told apart below
            d = _difference(x, y)
            aa, bb, ab, dd = _sums(x, y, d)
        if not (math.isfinite(aa) and math.isfinite(bb) and math.isfinite(dd)):
            # Rare: NaNs or infinities (or squares too large for float64). Count
            # them, and compare the rest.
            self.counts_a.update(raw_a)
            self.counts_b.update(raw_b)
            if self.equal and not _bitwise_equal(raw_a, raw_b):
                self.equal = False
            finite_x, finite_y = np.isfinite(x), np.isfinite(y)
            self._own_aa += float(_dot(x[finite_x], x[finite_x]).real)
            self._own_bb += float(_dot(y[finite_y], y[finite_y]).real)
            if x.dtype.kind in "fc":
                self.moved += _moved(x, y)
            both = finite_x & finite_y
            x, y = x[both], y[both]
            d = _difference(x, y)
            aa, bb, ab, dd = _sums(x, y, d)
        else:
            self._own_aa += aa
            self._own_bb += bb
            if self.equal and (dd != 0.0 or not _bitwise_equal(raw_a, raw_b)):
                self.equal = False
        self.both_finite += x.size
        largest = 0.0
        if d.size and dd != 0.0:
            largest = float(np.abs(d).max() if d.dtype.kind == "c" else max(d.max(), -d.min()))
        if x.dtype.kind in "iub" and d.size:
            self._sum_d += float(d.sum(dtype=np.float64))
        self._take(aa, bb, ab, dd, largest)

    def _take(self, aa: float, bb: float, ab: complex | float, dd: float, largest: float) -> None:
        self._max = max(self._max, largest)
        self._aa += aa
        self._bb += bb
        self._ab += ab
        self._dd += dd

    def merge(self, other: PairStats) -> None:
        """Adds the sums of ``other``: the same array's other regions."""
        self.equal = self.equal and other.equal
        for mine, theirs in ((self.counts_a, other.counts_a), (self.counts_b, other.counts_b)):
            mine.nan += theirs.nan
            mine.inf += theirs.inf
        self._take(other._aa, other._bb, other._ab, other._dd, other._max)
        self._sum_d += other._sum_d
        self._own_aa += other._own_aa
        self._own_bb += other._own_bb
        self.size += other.size
        self.moved += other.moved
        self.both_finite += other.both_finite

    @property
    def nonfinite_a(self) -> bool:
        """Whether side ``a`` holds NaN or Inf."""
        return bool(self.counts_a.nan or self.counts_a.inf)

    @property
    def nonfinite_b(self) -> bool:
        """Whether side ``b`` holds NaN or Inf."""
        return bool(self.counts_b.nan or self.counts_b.inf)

    @property
    def comparable(self) -> bool:
        """Whether the difference is a number: some element is finite on both sides
        and none changed its non-finite state (the differences are then over those
        finite on both sides)."""
        return self.moved == 0 and self.both_finite > 0

    @property
    def max_abs_diff(self) -> float:
        """The largest ``|b - a|`` over elements finite on both sides; NaN where not
        ``comparable``."""
        return self._max if self.comparable else math.nan

    @property
    def sum_diff(self) -> float:
        """``Σ (b - a)`` over elements finite on both sides, for integer and boolean
        values (the change of a counter: ``+150``); 0.0 for floats, where it is not
        read and would cost a pass over every block."""
        return self._sum_d

    @property
    def norm_a(self) -> float:
        """``‖a‖`` over ``a``'s own finite elements (its true norm when it has no
        NaN or Inf); NaN when it has no finite element at all."""
        if self.size and self.counts_a.nan + self.counts_a.inf >= self.size:
            return math.nan
        return math.sqrt(self._own_aa)

    @property
    def norm_b(self) -> float:
        """``‖b‖``, as ``norm_a``."""
        if self.size and self.counts_b.nan + self.counts_b.inf >= self.size:
            return math.nan
        return math.sqrt(self._own_bb)

    @property
    def norm_diff(self) -> float:
        """``‖b - a‖`` over elements finite on both sides; NaN where not ``comparable``."""
        return math.sqrt(self._dd) if self.comparable else math.nan

    @property
    def rel_change(self) -> float:
        """``‖b - a‖ / ‖a‖`` over elements finite on both sides: infinite when ``a``
        is zero there and ``b`` is not; NaN where not ``comparable``."""
        if not self.comparable:
            return math.nan
        if self._aa == 0.0:
            return 0.0 if self._dd == 0.0 else math.inf
        return math.sqrt(self._dd) / math.sqrt(self._aa)

    @property
    def cosine(self) -> float:
        """``Re⟨a, b⟩ / (‖a‖ ‖b‖)`` over elements finite on both sides; NaN when
        either side is zero there, or where not ``comparable``."""
        if not self.comparable or self._aa == 0.0 or self._bb == 0.0:
            return math.nan
        na, nb = math.sqrt(self._aa), math.sqrt(self._bb)
        if isinstance(self._ab, complex):
            return max(-1.0, min(1.0, self._ab.real / (na * nb)))
        # 1 - cos = (‖d‖² - (‖b‖ - ‖a‖)²) / 2‖a‖‖b‖, with ‖b‖ - ‖a‖ from Σd·(a+b):
        # accurate to the sums' own precision however close a and b are.
        gap = self._ab / (na + nb)
        return max(-1.0, min(1.0, 1.0 - (self._dd - gap * gap) / (2.0 * na * nb)))
