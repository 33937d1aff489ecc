"""The running sums behind diff_table and verify, against NumPy computed in one go."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from tinax.explore._numeric import PairStats, ValueCounts


def _stats(a: np.ndarray, b: np.ndarray, pieces: int = 3) -> PairStats:
    stats = PairStats(a.dtype)
    for x, y in zip(np.array_split(a, pieces), np.array_split(b, pieces), strict=True):
        stats.update(x, y)
    return stats


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
def test_floats_match_numpy(dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(700_000).astype(dtype)
    b = (a.astype(np.float64) + rng.standard_normal(a.size) * 1e-2).astype(dtype)
    stats = _stats(a, b)
    x, y = a.astype(np.float64), b.astype(np.float64)
    assert not stats.equal
    assert stats.max_abs_diff == pytest.approx(np.abs(y - x).max(), rel=1e-6)
    # Float64 is summed in float64; the rest in float32 blocks (sdot), added in float64.
    rel = 1e-9 if dtype == np.float64 else 1e-5
    assert stats.rel_change == pytest.approx(np.linalg.norm(y - x) / np.linalg.norm(x), rel=rel)
    assert stats.cosine == pytest.approx(x @ y / np.linalg.norm(x) / np.linalg.norm(y), abs=1e-9)
    assert stats.norm_b == pytest.approx(np.linalg.norm(y), rel=rel)


def test_integers_do_not_wrap_around():
    a = np.array([127, -128, 0], np.int8)
    b = np.array([-128, 127, 0], np.int8)
    stats = _stats(a, b, 1)
    assert stats.max_abs_diff == 255
    assert stats.norm_diff == pytest.approx(np.sqrt(2 * 255**2))


def test_complex_values():
    a = np.array([1 + 1j, 2 - 1j], np.complex64)
    b = np.array([1 + 2j, 2 - 1j], np.complex64)
    stats = _stats(a, b, 1)
    assert stats.max_abs_diff == pytest.approx(1.0)
    expected = np.vdot(a.astype(np.complex128), b).real / np.linalg.norm(a) / np.linalg.norm(b)
    assert stats.cosine == pytest.approx(expected)


def test_equal_means_the_same_bits():
    a = np.array([0.0, 1.0, np.nan], np.float32)
    assert _stats(a, a.copy(), 1).equal
    assert not _stats(a, np.array([-0.0, 1.0, np.nan], np.float32), 1).equal
    ints = np.arange(10, dtype=np.int64)
    assert _stats(ints, ints.copy()).equal
    flags = np.array([True, False])
    assert not _stats(flags, ~flags, 1).equal


def test_nan_and_inf_are_counted_and_a_change_to_them_is_no_number():
    a = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    b = np.array([1.0, np.nan, np.inf, 5.0], np.float32)
    stats = _stats(a, b, 2)
    assert (stats.counts_a.nan, stats.counts_b.nan, stats.counts_b.inf) == (0, 1, 1)
    assert stats.moved == 2 and not stats.comparable
    # Finite values that became NaN or Inf: no difference measures that, never 0.
    for value in (stats.max_abs_diff, stats.rel_change, stats.norm_diff, stats.cosine):
        assert np.isnan(value)
    # Each side's norm is that of its own finite values: a's is its true norm.
    assert stats.norm_a == pytest.approx(np.sqrt(30.0))
    assert stats.norm_b == pytest.approx(np.sqrt(26.0))
    everything = _stats(a, np.full(4, np.nan, np.float32), 1)
    assert everything.norm_a == pytest.approx(np.sqrt(30.0)) and np.isnan(everything.norm_b)


def test_nan_where_both_sides_hold_it_leaves_the_rest_compared():
    a = np.array([1.0, np.nan, -np.inf, 4.0], np.float32)
    b = np.array([1.0, np.nan, -np.inf, 5.0], np.float32)
    stats = _stats(a, b, 2)
    assert stats.moved == 0 and stats.comparable and not stats.equal
    assert stats.max_abs_diff == 1.0
    assert stats.rel_change == pytest.approx(1.0 / np.sqrt(17.0))
    # NaN on one side and Inf on the other, or Inf turned -Inf, is a move too.
    assert _stats(a, np.array([1.0, np.inf, np.inf, 4.0], np.float32), 1).moved == 2
    # Nothing finite on both sides: nothing to measure.
    nothing = _stats(np.full(3, np.nan, np.float32), np.full(3, np.nan, np.float32), 1)
    assert np.isnan(nothing.rel_change) and np.isnan(nothing.norm_a)


def test_zero_baseline():
    zeros = np.zeros(4, np.float32)
    assert _stats(zeros, np.ones(4, np.float32), 1).rel_change == np.inf
    assert np.isnan(_stats(zeros, np.ones(4, np.float32), 1).cosine)


def test_value_counts():
    counts = ValueCounts(np.dtype(np.float32))
    values = np.ones(600_000, np.float32)
    values[[3, 400_000]] = np.nan
    values[500_000] = -np.inf
    values[10] = 3e38  # finite, but the block's sum overflows
    counts.update(values)
    assert (counts.nan, counts.inf) == (2, 1)
    ints = ValueCounts(np.dtype(np.int32))
    ints.update(np.arange(5, dtype=np.int32))
    assert (ints.nan, ints.inf) == (0, 0)


def test_float32_sums_across_blocks_and_a_tail() -> None:
    # More than one block of the statistics, and a length no BLAS row divides.
    rng = np.random.default_rng(7)
    x = rng.standard_normal(300_001).astype(np.float32)
    y = (x + rng.standard_normal(x.size).astype(np.float32) * np.float32(1e-3)).astype(np.float32)
    stats = PairStats(np.dtype(np.float32))
    stats.update(x, y)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    d64 = y64 - x64
    assert stats.norm_a == pytest.approx(math.sqrt(math.fsum(x64 * x64)), rel=1e-6)
    assert stats.norm_b == pytest.approx(math.sqrt(math.fsum(y64 * y64)), rel=1e-6)
    assert stats.norm_diff == pytest.approx(math.sqrt(math.fsum(d64 * d64)), rel=1e-6)
    assert stats.max_abs_diff == pytest.approx(float(np.abs(d64).max()), rel=1e-7)
    aa, bb = math.fsum(x64 * x64), math.fsum(y64 * y64)
    cosine = math.fsum(x64 * y64) / math.sqrt(aa * bb)
    assert stats.cosine == pytest.approx(cosine, abs=1e-12)
    # Near 1 the cosine's distance from it is what is read: exact to its own size,
    # from the squared distance and the exact gap between the norms.
    gap = math.fsum(d64 * (x64 + y64)) / (math.sqrt(aa) + math.sqrt(bb))
    one_minus = (math.fsum(d64 * d64) - gap * gap) / (2 * math.sqrt(aa * bb))
    assert one_minus == pytest.approx(1 - cosine, rel=1e-4)
    assert 1 - stats.cosine == pytest.approx(one_minus, rel=1e-5)


@pytest.mark.parametrize("scale", [1e-25, 1e-19, 1e19, 1e30])
def test_float32_values_whose_squares_leave_float32(scale: float) -> None:
    # Squares of these under- or overflow float32; the sums must not lose them.
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(70_000) * scale).astype(np.float32)
    y = (x.astype(np.float64) * (1 + rng.standard_normal(x.size) * 1e-3)).astype(np.float32)
    stats = _stats(x, y)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    assert stats.norm_a == pytest.approx(math.sqrt(math.fsum(x64 * x64)), rel=1e-6)
    assert stats.norm_diff == pytest.approx(math.sqrt(math.fsum((y64 - x64) ** 2)), rel=1e-6)
    assert stats.rel_change == pytest.approx(1e-3, rel=0.05)
    assert not stats.equal


def test_regions_counted_apart_merge_into_the_whole() -> None:
    rng = np.random.default_rng(11)
    a = rng.standard_normal(90_000).astype(np.float32)
    b = a + np.float32(0.5) * (rng.random(a.size) < 0.01).astype(np.float32)
    a[17] = b[17] = np.nan  # NaN on both sides: the rest is still compared
    whole = _stats(a, b, 1)
    parts = [PairStats(a.dtype) for _ in range(3)]
    for stats, x, y in zip(parts, np.array_split(a, 3), np.array_split(b, 3), strict=True):
        stats.update(x, y)
    merged = parts[0]
    for part in parts[1:]:
        merged.merge(part)
    assert merged.counts_b.nan == whole.counts_b.nan == 1 == merged.counts_a.nan
    assert merged.size == whole.size == a.size and merged.moved == 0
    assert merged.norm_a == pytest.approx(whole.norm_a, rel=1e-6)
    assert merged.max_abs_diff == whole.max_abs_diff == pytest.approx(0.5, rel=1e-6)
    assert merged.norm_diff == pytest.approx(whole.norm_diff, rel=1e-6)
    assert 1 - merged.cosine == pytest.approx(1 - whole.cosine, rel=1e-6)
    assert not merged.equal
    same = PairStats(a.dtype)
    same.update(a, a.copy())
    other = PairStats(a.dtype)
    other.update(a, a.copy())
    same.merge(other)
    assert same.equal and same.norm_diff == 0.0
    # A move to NaN in one region makes the merged whole no number.
    c = b.copy()
    c[45_000] = np.nan
    moved = [PairStats(a.dtype) for _ in range(3)]
    for stats, x, y in zip(moved, np.array_split(a, 3), np.array_split(c, 3), strict=True):
        stats.update(x, y)
    for part in moved[1:]:
        moved[0].merge(part)
    assert moved[0].moved == 1 and np.isnan(moved[0].rel_change)


def test_a_counters_change_is_summed_exactly() -> None:
    before = np.array([1_000_000_007, 5, -3], dtype=np.int64)
    after = np.array([1_000_000_157, 5, -3], dtype=np.int64)
    stats = _stats(before, after, pieces=2)
    assert stats.sum_diff == 150.0
    assert stats.max_abs_diff == 150.0
    assert not stats.equal
