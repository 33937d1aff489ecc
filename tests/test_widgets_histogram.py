"""Leaf statistics in bounded memory, and the histogram image."""

from __future__ import annotations

import io

import jax.numpy as jnp
import numpy as np
import pytest
from tinax.widgets._histogram import fit_title, histogram_png

from tinax.explore._summary import HISTOGRAM_BINS
from tinax.explore.toolkit import is_numeric, leaf_statistics


def test_float_statistics_skip_nan_and_inf_but_count_them() -> None:
    values = np.array([1.0, 2.0, np.nan, 3.0, np.inf, -np.inf, 6.0], np.float32)
    stats = leaf_statistics(values)
    assert stats.shape == (7,) and stats.dtype == "float32" and stats.size == 7
    assert (stats.minimum, stats.maximum) == (1.0, 6.0)
    assert stats.mean == pytest.approx(3.0)
    assert stats.std == pytest.approx(np.std([1.0, 2.0, 3.0, 6.0]))
    assert (stats.nan_count, stats.inf_count) == (1, 2)
    assert stats.histogram is not None
    counts, edges = stats.histogram
    assert counts.sum() == 4 and len(edges) == HISTOGRAM_BINS + 1


def test_chunks_combine_exactly_over_several_million_values() -> None:
    values = np.random.default_rng(1).normal(3.0, 2.0, size=(3, 1_100_000)).astype(np.float32)
    stats = leaf_statistics(values)
    assert stats.mean == pytest.approx(values.astype(np.float64).mean(), rel=1e-9)
    assert stats.std == pytest.approx(values.astype(np.float64).std(), rel=1e-9)
    assert stats.minimum == float(values.min()) and stats.maximum == float(values.max())
    assert stats.histogram is not None and stats.histogram[0].sum() == values.size


def test_integers_keep_exact_extremes() -> None:
    values = np.array([2**62, -5, 7], np.int64)
    stats = leaf_statistics(values)
    assert stats.minimum == -5 and stats.maximum == 2**62
    assert isinstance(stats.maximum, int)
    assert (stats.nan_count, stats.inf_count) == (0, 0)


def test_bool_bfloat16_and_jax_arrays() -> None:
    flags = leaf_statistics(np.array([True, False, True]))
    assert (flags.minimum, flags.maximum) == (0, 1)
    assert flags.mean == pytest.approx(2 / 3)
    half = leaf_statistics(jnp.array([1.0, 2.0, jnp.nan], jnp.bfloat16))
    assert half.dtype == "bfloat16"
    assert half.mean == pytest.approx(1.5) and half.nan_count == 1


def test_complex_values_by_magnitude() -> None:
    stats = leaf_statistics(np.array([3 + 4j, 0j, complex("nan")]))
    assert (stats.minimum, stats.maximum, stats.mean) == (0.0, 5.0, 2.5)
    assert stats.nan_count == 1 and stats.dtype == "complex128"


def test_no_finite_values_and_empty_arrays() -> None:
    stats = leaf_statistics(np.full(3, np.nan))
    assert stats.mean is None and stats.minimum is None and stats.histogram is None
    assert stats.nan_count == 3
    assert histogram_png(stats) == b""
    empty = leaf_statistics(np.zeros((0, 4), np.float32))
    assert empty.size == 0 and empty.std is None


def test_constant_values_get_a_histogram_around_them() -> None:
    stats = leaf_statistics(np.full(5, 2.5))
    assert stats.std == 0.0
    assert stats.histogram is not None
    assert stats.histogram[1][0] < 2.5 < stats.histogram[1][-1]


def test_histogram_is_a_png() -> None:
    png = histogram_png(leaf_statistics(np.arange(100.0)), title="['w']")
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000


@pytest.mark.parametrize("value", ["text", 3, None, np.array(["a", "b"]), {"a": 1}])
def test_non_numeric_values_are_refused(value: object) -> None:
    assert not is_numeric(value)
    with pytest.raises(TypeError):
        leaf_statistics(value)


def test_the_histogram_keeps_its_size_and_a_long_title_keeps_its_end() -> None:
    from matplotlib.image import imread

    stats = leaf_statistics(np.random.default_rng(0).normal(size=1000))
    long_key = "['opt_state']['0']['mu']['encoder']['layers_11']['attention']['kernel']['value']"
    for title in ("['w']", long_key):
        png = histogram_png(stats, title=title)
        height, width = imread(io.BytesIO(png), format="png").shape[:2]
        # 4.2 × 2.6 in at 96 dpi: shown at its natural size, 10 pt labels are 13 px.
        assert (width, height) == (403, 249)
    fitted = fit_title(long_key)
    assert fitted.startswith("…") and fitted.endswith("['attention']['kernel']['value']")
    assert len(fitted) == 48
    assert fit_title("['w']") == "['w']"
