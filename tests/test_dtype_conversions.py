"""tinax's own float32 <-> bfloat16 conversion gives NumPy's (ml_dtypes') bits exactly,
whatever the values: ties, subnormals, overflow to infinity, every kind of NaN."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from tinax._format.naming import dtypes

BF16 = np.dtype(ml_dtypes.bfloat16)


def _numpy(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    out = np.empty(values.shape, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        np.copyto(out, values, casting="unsafe")
    return out


def _bits(values: np.ndarray) -> np.ndarray:
    return values.view({2: np.uint16, 4: np.uint32}[values.dtype.itemsize])


def _float32_patterns() -> np.ndarray:
    rng = np.random.default_rng(7)
    random = rng.integers(0, 2**32, 3 * dtypes.CONVERT_BLOCK, dtype=np.uint64).astype(np.uint32)
    edges = []
    for high in (0x0000, 0x0001, 0x007F, 0x0080, 0x3F80, 0x7F7F, 0x7F80, 0x7FC0, 0x7FFF):
        for sign in (0, 0x8000):
            for low in (0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF):
                edges.append(((high | sign) << 16) | low)
    return np.concatenate([random, np.array(edges, np.uint32)])


def test_float32_to_bfloat16_rounds_as_numpy_on_every_kind_of_value():
    bits = _float32_patterns()
    values = bits.view(np.float32)
    finite = values[np.isfinite(values)]
    for case in (values, finite, finite[: dtypes.CONVERT_BLOCK + 3]):
        out = np.empty(case.shape, BF16)
        dtypes.convert_into(out, case)
        np.testing.assert_array_equal(_bits(out), _bits(_numpy(case, BF16)))


def test_ties_go_to_even_and_the_largest_floats_overflow_to_infinity():
    bits = np.array([0x3F808000, 0x3F818000, 0x7F7FFFFF, 0xFF7F8000, 0x00008000], np.uint32)
    out = np.empty(bits.shape, BF16)
    dtypes.convert_into(out, np.repeat(bits.view(np.float32), 1))
    assert _bits(out).tolist() == [0x3F80, 0x3F82, 0x7F80, 0xFF80, 0x0000]


@pytest.mark.parametrize("shape", [(3, 5), (dtypes.CONVERT_BLOCK // 128, 129), (0, 4)])
def test_shapes_and_strides_of_any_kind(shape):
    values = np.random.default_rng(1).standard_normal(shape, dtype=np.float32)
    for given in (values, values.T, values[:, ::2]):
        out = np.empty(given.shape, BF16)
        dtypes.convert_into(out, given)
        np.testing.assert_array_equal(_bits(out), _bits(_numpy(given, BF16)))


def test_bfloat16_to_float32_is_exact_for_all_65536_patterns():
    values = np.arange(2**16, dtype=np.uint16).view(BF16)
    out = np.empty(values.shape, np.float32)
    dtypes.convert_into(out, values)
    np.testing.assert_array_equal(_bits(out), _bits(_numpy(values, np.dtype(np.float32))))


@pytest.mark.parametrize(
    ("source", "target"), [("float32", "float16"), ("float64", "bfloat16"), ("float16", "float32")]
)
def test_other_pairs_are_numpy_s_own(source, target):
    values = np.random.default_rng(2).standard_normal(1000).astype(dtypes.numpy_dtype(source))
    out = np.empty(values.shape, dtypes.numpy_dtype(target))
    dtypes.convert_into(out, values)
    np.testing.assert_array_equal(out, _numpy(values, dtypes.numpy_dtype(target)))
