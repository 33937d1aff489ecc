"""Checkpoints exported to safetensors and read back by the reference reader, and loaded back.

Real flax NNX and Linen models and optax states are saved by tinax, exported with
``tinax.explore.export_safetensors`` and read with the ``safetensors`` library itself;
``tinax.checkpointing.load_safetensors`` puts the files back into live state.
"""

from __future__ import annotations

import json
import os
import struct
import uuid
from pathlib import Path
from typing import Any

import flax.linen as linen
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest
from conftest import BUCKET
from explore_fixtures import corrupt_chunks
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import load_file

import tinax.explore as ex
from tinax.checkpointing import (
    TargetMismatchError,
    abstract_restore_target,
    allow_lossy_casts,
    load_safetensors,
    save_checkpointables,
)


class _Nnx(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.dense1 = nnx.Linear(6, 16, rngs=rngs)
        self.norm = nnx.BatchNorm(16, rngs=rngs)
        self.dropout = nnx.Dropout(0.2, rngs=rngs)
        self.dense2 = nnx.Linear(16, 3, rngs=rngs)


class _Linen(linen.Module):
    @linen.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return linen.Dense(3, name="head")(linen.relu(linen.Dense(8, name="body")(x)))


def _key_data(x: Any) -> Any:
    return jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x


def _flat(tree: Any) -> dict[str, np.ndarray]:
    """Every array leaf by its default tensor name, PRNG keys as their key data."""
    from tinax._format.naming.keys import key_parts
    from tinax._format.safetensors import tensor_name

    out = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        out[tensor_name(key_parts(path))] = np.asarray(_key_data(leaf))
    return out


def _assert_bitwise(found: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(found) == sorted(expected)
    for name, want in expected.items():
        got = found[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert got.tobytes() == want.tobytes(), name


@pytest.fixture(scope="module")
def states() -> dict[str, Any]:
    model = _Nnx(nnx.Rngs(0, dropout=1))
    nnx_state = nnx.state(model)
    params = _Linen().init(jax.random.key(1), jnp.ones((2, 6)))["params"]
    opt = optax.adamw(1e-3).init(params)
    # Moments that are not all zeros, and a step count.
    opt = jax.tree.map(lambda x: x + 0.5 if jnp.issubdtype(x.dtype, jnp.floating) else x + 3, opt)
    return {"model": nnx_state, "params": params, "opt": opt}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, states) -> Path:
    path = tmp_path_factory.mktemp("st") / "step_120"
    save_checkpointables(path, states).result()
    return path


@pytest.mark.parametrize("checkpointable", ["model", "params", "opt"])
def test_exports_read_back_bit_for_bit_by_the_safetensors_library(
    checkpoint, states, tmp_path, checkpointable
):
    files = ex.export_safetensors(checkpoint, tmp_path / "out", checkpointable=checkpointable)
    # Named after the checkpointable: model.safetensors (the hub's name), params…, opt…
    name = f"{checkpointable}.safetensors"
    assert files == [tmp_path / "out" / name]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [name]
    _assert_bitwise(load_file(files[0]), _flat(states[checkpointable]))
    with safe_open(files[0], framework="numpy") as f:
        meta = f.metadata()
    assert meta["tinax.source"] == str(checkpoint)
    assert meta["tinax.step"] == "120" and meta["tinax.checkpointable"] == checkpointable
    assert meta["tinax.checksums"] == "checked" and "tinax.dtype" not in meta


def test_nnx_names_drop_the_trailing_value_and_keys_select(checkpoint, tmp_path):
    files = ex.export_safetensors(checkpoint, tmp_path / "a", keys="dense1")
    assert sorted(load_file(files[0])) == ["dense1.bias", "dense1.kernel"]
    files = ex.export_safetensors(
        checkpoint,
        tmp_path / "b",
        keys=lambda key: "norm" in key,
        name=lambda path: "/".join(map(str, path)),
    )
    assert sorted(load_file(files[0])) == [
        f"norm/{n}/value" for n in ("bias", "mean", "scale", "var")
    ]


def test_bfloat16_export_casts_floats_only_and_says_so(checkpoint, states, tmp_path):
    files = ex.export_safetensors(checkpoint, tmp_path / "bf16", dtype="bfloat16", verify=True)
    expected = _flat(states["model"])
    with safe_open(files[0], framework="flax") as f:
        assert "bfloat16" in f.metadata()["tinax.dtype"]
        found = {name: np.asarray(f.get_tensor(name)) for name in f.keys()}  # noqa: SIM118
    assert sorted(found) == sorted(expected)
    for name, want in expected.items():
        if np.issubdtype(want.dtype, np.floating):
            assert found[name].dtype == ml_dtypes.bfloat16, name
            assert found[name].tobytes() == want.astype(ml_dtypes.bfloat16).tobytes(), name
        else:
            # Integers (the RNG counter and key data) keep their dtype and bits.
            assert found[name].dtype == want.dtype and found[name].tobytes() == want.tobytes()
    assert found["dropout.rngs.key"].dtype == np.uint32


def test_a_split_export_has_an_index_covering_every_tensor_once(checkpoint, states, tmp_path):
    files = ex.export_safetensors(checkpoint, tmp_path / "split", max_file_bytes=300)
    index = files[-1]
    assert index.name == "model.safetensors.index.json"
    shards = files[:-1]
    count = len(shards)
    assert count > 2
    assert [p.name for p in shards] == [
        f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)
    ]
    document = json.loads(index.read_text())
    weight_map = document["weight_map"]
    seen: dict[str, str] = {}
    tensors: dict[str, np.ndarray] = {}
    for shard in shards:
        loaded = load_file(shard)
        for name in loaded:
            assert name not in seen, name
            seen[name] = shard.name
        tensors.update(loaded)
        assert shard.stat().st_size - sum(v.nbytes for v in loaded.values()) < 1024
    assert seen == weight_map
    assert document["metadata"]["total_size"] == sum(v.nbytes for v in tensors.values())
    _assert_bitwise(tensors, _flat(states["model"]))


def test_load_safetensors_round_trips_into_a_fresh_nnx_model(checkpoint, states, tmp_path):
    ex.export_safetensors(checkpoint, tmp_path / "out", max_file_bytes=500)
    fresh = _Nnx(nnx.Rngs(42, dropout=7))
    target = abstract_restore_target(nnx.state(fresh))
    for source in (tmp_path / "out", tmp_path / "out" / "model.safetensors.index.json"):
        loaded = load_safetensors(source, target)
        nnx.update(fresh, loaded)
        _assert_bitwise(_flat(nnx.state(fresh)), _flat(states["model"]))
    # Live targets work too, and typed PRNG keys come back as keys.
    assert jnp.issubdtype(fresh.dropout.rngs.key.value.dtype, jax.dtypes.prng_key)


def test_load_safetensors_takes_linen_params_and_optax_state_as_targets(
    checkpoint, states, tmp_path
):
    for name in ("params", "opt"):
        files = ex.export_safetensors(checkpoint, tmp_path / name, checkpointable=name)
        loaded = load_safetensors(files[0], states[name])
        assert jax.tree.structure(loaded) == jax.tree.structure(states[name])
        _assert_bitwise(_flat(loaded), _flat(states[name]))


def _truncate_after_header(path: Path) -> None:
    with open(path, "r+b") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        f.truncate(8 + length + 4)


def test_a_wrong_shape_target_is_refused_before_any_tensor_byte_is_read(
    checkpoint, states, tmp_path
):
    (file,) = ex.export_safetensors(checkpoint, tmp_path / "out")
    # Only the header is left: any read of tensor data would fail another way.
    _truncate_after_header(file)
    wrong = nnx.state(_Nnx(nnx.Rngs(0)))
    wrong["dense1"]["kernel"].value = jnp.zeros((6, 8))
    with pytest.raises(TargetMismatchError) as refused:
        load_safetensors(file, abstract_restore_target(wrong))
    message = str(refused.value)
    assert "(1 leaf)" in message
    assert "['dense1']['kernel']['value']: stored (6, 16) float32, target (6, 8) float32" in message
    # The right target gets as far as the data, and finds it truncated.
    with pytest.raises(ValueError, match="truncated"):
        load_safetensors(file, abstract_restore_target(states["model"]))


def test_missing_extra_and_lossy_leaves_are_listed(checkpoint, states, tmp_path):
    (file,) = ex.export_safetensors(checkpoint, tmp_path / "out", keys="dense")
    target = abstract_restore_target({"dense1": states["model"]["dense1"], "extra": jnp.ones(2)})
    with pytest.raises(TargetMismatchError) as refused:
        load_safetensors(file, target)
    message = str(refused.value)
    assert "['extra']: not stored, target (2,) float32" in message
    assert "['dense2.bias']: stored (3,) float32, not in the target" in message
    lossy = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16),
        {"dense1": states["model"]["dense1"], "dense2": states["model"]["dense2"]},
    )
    with pytest.raises(TargetMismatchError, match="a lossy cast"):
        load_safetensors(file, lossy)
    with allow_lossy_casts():
        loaded = load_safetensors(file, lossy)
    assert loaded["dense1"]["kernel"].value.dtype == jnp.bfloat16


def test_a_gs_source_exports(gcs, states, tmp_path):
    url = f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}/step_3"
    save_checkpointables(url, {"params": states["params"]}).result()
    files = ex.export_safetensors(url, tmp_path / "out", checkpointable="params", verify=True)
    _assert_bitwise(load_file(files[0]), _flat(states["params"]))
    with safe_open(files[0], framework="numpy") as f:
        assert f.metadata()["tinax.source"] == url


def test_bad_inputs_are_refused_clearly_and_leave_nothing(checkpoint, tmp_path):
    with pytest.raises(FileNotFoundError):
        ex.export_safetensors(tmp_path / "nowhere", tmp_path / "out")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        ex.export_safetensors(checkpoint, taken)
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    with pytest.raises(ValueError, match="'nope'"):
        ex.export_safetensors(checkpoint, tmp_path / "out", checkpointable="nope")
    with pytest.raises(ValueError, match="float types"):
        ex.export_safetensors(checkpoint, tmp_path / "out", dtype="int8")
    with pytest.raises(TypeError, match="dtype"):
        ex.export_safetensors(checkpoint, tmp_path / "out", dtype=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_file_bytes"):
        ex.export_safetensors(checkpoint, tmp_path / "out", max_file_bytes=0)
    with pytest.raises(ValueError, match="both be named"):
        ex.export_safetensors(checkpoint, tmp_path / "out", name=lambda path: "same")
    with pytest.raises(ValueError, match="no arrays whose key matches"):
        ex.export_safetensors(checkpoint, tmp_path / "out", keys="no such key")
    # An empty directory is a fine destination.
    (tmp_path / "empty").mkdir()
    assert ex.export_safetensors(checkpoint, tmp_path / "empty", keys="norm")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "taken"]
    with pytest.raises(FileNotFoundError):
        load_safetensors(tmp_path / "nowhere", {})


def test_corrupt_data_stops_the_export_and_leaves_nothing(states, tmp_path):
    path = tmp_path / "ck"
    big = {"w": jnp.asarray(np.random.default_rng(0).standard_normal((64, 64)), jnp.float32)}
    save_checkpointables(path, {"model": big}).result()
    assert corrupt_chunks(path / "model") > 0
    with pytest.raises(ValueError, match="corrupt"):
        ex.export_safetensors(path, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_hostile_headers_are_refused_without_reading_past_the_file(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ValueError, match="header claims"):
        load_safetensors(bad, {})
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    bad.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    with pytest.raises(ValueError, match="needs 16 bytes"):
        load_safetensors(bad, {"w": np.zeros(4, np.float32)})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "../elsewhere.safetensors"}}))
    with pytest.raises(ValueError, match="not a file beside the index"):
        load_safetensors(index, {"w": np.zeros(4, np.float32)})
    assert os.path.getsize(bad) == 8 + len(header) + 8
