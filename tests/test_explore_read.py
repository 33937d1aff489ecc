"""tinax.explore: tables read metadata only; read_leaf reads one leaf; leaf_summary."""

from __future__ import annotations

import math

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pandas as pd
import pytest
from explore_fixtures import (
    corrupt_chunks,
    delete_chunk_files,
    iterator,
    model_state,
    optimizer_state,
    save_v1,
)
from orbax.checkpoint import v1 as ocp

import tinax.explore as ex
from tinax.explore import toolkit


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    state = {"model": model_state(), "optimizer": optimizer_state(), "iterator": iterator()}
    return save_v1(tmp_path_factory.mktemp("read") / "ckpt", state), state


def test_read_leaf_returns_each_kind_of_value(saved):
    path, state = saved
    model = state["model"]
    w = ex.read_leaf(path, "model", "['dense']['w']")
    assert isinstance(w, np.ndarray)
    np.testing.assert_array_equal(w, np.asarray(model["dense"]["w"]))
    np.testing.assert_array_equal(ex.read_leaf(path, "model", "['big']"), model["big"])
    emb = ex.read_leaf(path, "model", "['emb']")
    assert emb.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(
        ex.read_leaf(path, "model", "['layers'][10]"), model["layers"][10]
    )
    step = ex.read_leaf(path, "model", "['step']")
    assert step == 7 and isinstance(step, int)
    assert ex.read_leaf(path, "model", "['lr']") == 0.25
    assert ex.read_leaf(path, "model", "['flag']") is True
    assert ex.read_leaf(path, "model", "['name']") == "tiny"
    assert ex.read_leaf(path, "model", "['nothing']") is None
    assert ex.read_leaf(path, "optimizer", "[1]") is None
    assert ex.read_leaf(path, "iterator", "") == state["iterator"].get_state()


def test_read_leaf_refuses_what_is_not_there(saved):
    path, _ = saved
    with pytest.raises(ValueError, match="no checkpointable 'nope'"):
        ex.read_leaf(path, "nope", "")
    with pytest.raises(ValueError, match="no leaf"):
        ex.read_leaf(path, "model", "['dense']['nope']")
    with pytest.raises(ValueError, match="one value"):
        ex.read_leaf(path, "iterator", "['x']")
    with pytest.raises(TypeError):
        ex.read_leaf(path, "model", 3)
    with pytest.raises(TypeError):
        ex.read_leaf(path, None, "")
    with pytest.raises(FileNotFoundError):
        ex.read_leaf(path / "absent", "model", "")


def test_read_leaf_takes_a_key_as_the_tables_show_it(saved, tmp_path):
    path, state = saved
    model = state["model"]
    np.testing.assert_array_equal(ex.read_leaf(path, "model", "dense.w"), model["dense"]["w"])
    np.testing.assert_array_equal(ex.read_leaf(path, "model", "layers.10"), model["layers"][10])
    assert ex.read_leaf(path, "model", "step") == 7
    with pytest.raises(ValueError, match=r"ckpt.*no leaf 'dense\.v'.*nearest: dense\.w"):
        ex.read_leaf(path, "model", "dense.v")
    # NNX keeps an array under "value": the tables leave it out, and so may the name.
    kernel = np.arange(12, dtype=np.float32).reshape(3, 4)
    nnx_like = {"blocks": {"3": {"down": {"kernel": {"value": kernel}}}}, "step": 1}
    saved_nnx = save_v1(tmp_path / "nnx", {"model": nnx_like})
    for name in ("blocks.3.down.kernel", "blocks.3.down.kernel.value", "down.kernel"):
        np.testing.assert_array_equal(ex.read_leaf(saved_nnx, "model", name), kernel)


@pytest.fixture
def three_big(tmp_path):
    rng = np.random.default_rng(1)
    arrays = {name: rng.standard_normal((64, 64)).astype(np.float32) for name in "abc"}
    path = save_v1(tmp_path / "ckpt", {"model": {**arrays, "step": 3}})
    return path, arrays


def test_read_leaf_reads_only_that_leaf(three_big):
    path, arrays = three_big
    assert corrupt_chunks(path / "model", keep="b") == 2
    np.testing.assert_array_equal(ex.read_leaf(path, "model", "['b']"), arrays["b"])
    with pytest.raises(ValueError, match=r"leaf \['a'\]: the stored data is corrupt"):
        ex.read_leaf(path, "model", "['a']")


def test_checkpoint_table_never_reads_array_data(three_big):
    path, _ = three_big
    before = ex.checkpoint_table(path)
    deleted = delete_chunk_files(path / "model")
    after = ex.checkpoint_table(path)
    pd.testing.assert_frame_equal(before, after)
    assert list(after["shape"][:3]) == [(64, 64)] * 3
    assert after["value"][3] == 3
    with pytest.raises(ValueError) as caught:
        ex.read_leaf(path, "model", "['c']")
    assert str(path) in str(caught.value) and "['c']" in str(caught.value)
    assert deleted


def test_without_ocdbt_a_missing_chunk_is_an_error_not_fill_values(tmp_path):
    ctx = ocp.Context()
    ctx.array.saving.use_ocdbt = False
    with ctx:
        ocp.save_checkpointables(tmp_path / "c", {"m": {"w": jnp.arange(6.0) + 1}})
    for chunk in (tmp_path / "c" / "m" / "w" / "c").rglob("*"):
        if chunk.is_file():
            chunk.unlink()
    assert ex.checkpoint_table(tmp_path / "c")["shape"][0] == (6,)
    with pytest.raises(ValueError, match="cannot read leaf"):
        ex.read_leaf(tmp_path / "c", "m", "['w']")


def test_leaf_summary_of_an_array_with_nan_and_inf():
    value = np.array([1.0, 2.0, np.nan, np.inf, -np.inf, 3.0], np.float32)
    summary = toolkit.leaf_summary(value)
    assert summary == {
        "shape": (6,),
        "dtype": "float32",
        "size": 6,
        "min": 1.0,
        "max": 3.0,
        "mean": 2.0,
        "std": pytest.approx(math.sqrt(2 / 3)),
        "nan_count": 1,
        "inf_count": 2,
    }


def test_leaf_summary_of_other_values():
    bf = toolkit.leaf_summary(np.arange(4).astype(ml_dtypes.bfloat16))
    assert (bf["dtype"], bf["max"], bf["mean"]) == ("bfloat16", 3.0, 1.5)
    ints = toolkit.leaf_summary(np.array([[1, 5]], np.int32))
    assert (ints["shape"], ints["min"], ints["max"], ints["nan_count"]) == ((1, 2), 1.0, 5.0, 0)
    assert toolkit.leaf_summary(7)["mean"] == 7.0
    assert toolkit.leaf_summary(np.array([True, False]))["mean"] == 0.5
    nothing = toolkit.leaf_summary(np.array([np.nan]))
    assert (nothing["nan_count"], nothing["min"]) == (1, None)
    for value in ("text", None, {"next_index": 3}):
        assert set(toolkit.leaf_summary(value).values()) == {None}
