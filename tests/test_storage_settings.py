"""Storage settings: tinax saves uncompressed on a CPU by default, compressed on an
accelerator, as asked inside ``compression`` blocks, and reads both."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from orbax.checkpoint import v1 as ocp
from tinax.widgets import CheckpointExplorer

import tinax.explore as ex
from tinax._format.metadata import arrays
from tinax._paths import location
from tinax.checkpointing import (
    abstract_restore_target,
    compression,
    load_checkpointables,
    load_training_checkpoint,
    save_checkpointables,
    save_training_checkpoint,
)
from tinax.checkpointing._context import CHUNK_BYTES, compressing, default_compression


def _state() -> dict[str, Any]:
    # Zeros compress to almost nothing, so a compressed store is visibly smaller.
    return {
        "w": jnp.zeros((256, 256), jnp.float32),
        "noise": np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32),
        "bias": np.arange(8, dtype=np.int32),
        "step": 3,
    }


def _codecs(checkpointable: Path, param: str) -> list[str]:
    """The names of the chunk codecs of one stored array (inside Orbax's shard codec)."""
    key = f"{param}/zarr.json"
    stored = arrays.read_values(location(checkpointable), [key], ocdbt=True, ctx=arrays.context())[
        key
    ]
    outer = json.loads(stored)["codecs"]
    assert outer[0]["name"] == "sharding_indexed"
    return [codec["name"] for codec in outer[0]["configuration"]["codecs"]]


def _data_bytes(checkpointable: Path) -> int:
    return sum(p.stat().st_size for p in checkpointable.rglob("*") if p.parent.name == "d")


def test_tinax_saves_arrays_uncompressed_by_default(tmp_path: Path) -> None:
    save_checkpointables(tmp_path / "plain", {"p": _state()}).result()
    for param in ("w", "noise", "bias"):
        assert "zstd" not in _codecs(tmp_path / "plain" / "p", param)


def test_the_default_is_zstd_on_an_accelerator_and_uncompressed_on_a_cpu() -> None:
    assert jax.default_backend() == "cpu" and not compressing()
    assert [default_compression(b) for b in ("cpu", "tpu", "gpu")] == [False, True, True]
    with compression():
        assert compressing()
        with compression(False):
            assert not compressing()


def test_compression_switch_brings_zstd_back_for_saves_in_the_block(tmp_path: Path) -> None:
    with compression():
        save_checkpointables(tmp_path / "small", {"p": _state()}).result()
        with compression(False):
            save_checkpointables(tmp_path / "inner", {"p": _state()}).result()
    save_checkpointables(tmp_path / "after", {"p": _state()}).result()
    assert "zstd" in _codecs(tmp_path / "small" / "p", "w")
    assert "zstd" not in _codecs(tmp_path / "inner" / "p", "w")
    assert "zstd" not in _codecs(tmp_path / "after" / "p", "w")
    assert _data_bytes(tmp_path / "small" / "p") < _data_bytes(tmp_path / "after" / "p") / 2


def test_compression_switch_refuses_a_non_bool() -> None:
    for bad in (1, "yes", None):
        with pytest.raises(TypeError, match="enabled must be a bool"), compression(bad):  # type: ignore[arg-type]
            pass


def test_compression_switch_is_per_thread(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    def other_thread() -> None:
        save_checkpointables(tmp_path / "other", {"p": _state()}).result()
        seen.append(_codecs(tmp_path / "other" / "p", "w"))

    with compression():
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    assert "zstd" not in seen[0]


def test_the_callers_orbax_context_is_honoured_and_left_unchanged(tmp_path: Path) -> None:
    ctx = ocp.Context()
    ctx.array.saving.use_ocdbt = False
    ctx.array.saving.use_zarr3 = False
    with ctx:
        save_checkpointables(tmp_path / "zarr2", {"p": _state()}).result()
    # The caller's choice of format stands: plain zarr2 directories, no OCDBT.
    stored = tmp_path / "zarr2" / "p"
    assert (stored / "w" / ".zarray").is_file()
    assert not (stored / "manifest.ocdbt").exists()
    assert json.loads((stored / "w" / ".zarray").read_text())["compressor"] is None
    # tinax copied the caller's context; it did not change it.
    assert ctx.array.saving.use_compression is True
    restored = load_checkpointables(tmp_path / "zarr2", {"p": abstract_restore_target(_state())})
    np.testing.assert_array_equal(restored["p"]["noise"], _state()["noise"])


def _tinax(path: Path, state: dict[str, Any]) -> None:
    save_checkpointables(path, state).result()


def _tinax_compressed(path: Path, state: dict[str, Any]) -> None:
    with compression():
        save_checkpointables(path, state).result()


def _orbax(path: Path, state: dict[str, Any]) -> None:
    ocp.save_checkpointables(path, state)


def _orbax_uncompressed(path: Path, state: dict[str, Any]) -> None:
    ctx = ocp.Context()
    ctx.array.saving.use_compression = False
    with ctx:
        ocp.save_checkpointables(path, state)


WRITERS: dict[str, tuple[Callable[[Path, dict[str, Any]], None], bool]] = {
    "tinax": (_tinax, False),
    "tinax compressed": (_tinax_compressed, True),
    "orbax": (_orbax, True),
    "orbax uncompressed": (_orbax_uncompressed, False),
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_reader_reads_compressed_and_uncompressed_checkpoints(
    tmp_path: Path, writer: str
) -> None:
    save, compressed = WRITERS[writer]
    state = {"model": _state(), "optimizer": {"mu": jnp.ones((32,), jnp.bfloat16)}}
    save(tmp_path / "ckpt", state)
    assert ("zstd" in _codecs(tmp_path / "ckpt" / "model", "w")) == compressed

    table = ex.checkpoint_table(tmp_path / "ckpt")
    assert set(table["key"]) >= {"['w']", "['noise']", "['bias']", "['step']", "['mu']"}
    assert table.set_index("key").loc["['step']", "value"] == 3
    np.testing.assert_array_equal(
        ex.read_leaf(tmp_path / "ckpt", "model", "['noise']"), state["model"]["noise"]
    )
    restored = load_checkpointables(
        tmp_path / "ckpt", {name: abstract_restore_target(value) for name, value in state.items()}
    )
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))

    explorer = CheckpointExplorer(tmp_path)
    assert explorer.checkpoints["status"].tolist() == ["complete"]
    explorer.open_checkpoint(str(tmp_path / "ckpt"))
    explorer.open_leaf("model", "['noise']")
    assert explorer.statistics is not None
    assert explorer.statistics.maximum == pytest.approx(float(state["model"]["noise"].max()))


@pytest.mark.parametrize("compressed", [False, True])
def test_training_checkpoints_round_trip_either_way(tmp_path: Path, compressed: bool) -> None:
    data = grain.MapDataset.range(100).batch(4).to_iter_dataset()
    batches = iter(data)
    next(batches)
    model = {"w": jnp.linspace(0, 1, 64).reshape(8, 8)}
    rng = jax.random.key_data(jax.random.key(1))
    with compression(compressed):
        save_training_checkpoint(tmp_path / "t", 5, model, {}, rng, {"loss": 0.5}, batches).result()
    targets = [abstract_restore_target(x) for x in (model, {}, rng)]
    ckpt = load_training_checkpoint(tmp_path / "t", *targets, {"loss": 0.0}, iter(data))
    assert ckpt.step == 5 and ckpt.auxiliary == {"loss": 0.5}
    np.testing.assert_array_equal(np.asarray(ckpt.model["w"]), np.asarray(model["w"]))
    np.testing.assert_array_equal(next(ckpt.iterator), next(batches))


def _chunk_shapes(checkpointable: Path, param: str) -> tuple[list[int], list[int]]:
    """The write (outer) and read (inner) chunk shapes of one stored array."""
    key = f"{param}/zarr.json"
    stored = arrays.read_values(location(checkpointable), [key], ocdbt=True, ctx=arrays.context())[
        key
    ]
    meta = json.loads(stored)
    outer = meta["chunk_grid"]["configuration"]["chunk_shape"]
    inner = meta["codecs"][0]["configuration"]["chunk_shape"]
    return outer, inner


def test_big_arrays_are_stored_in_chunks_of_at_most_chunk_bytes(tmp_path: Path) -> None:
    # 12 MiB: more than one chunk (slabs of whole rows); the small arrays stay one
    # chunk each.
    big = jnp.arange(3072 * 1024, dtype=jnp.float32).reshape(3072, 1024)
    state = {**_state(), "big": big}
    save_checkpointables(tmp_path / "c", {"p": state}).result()
    outer, inner = _chunk_shapes(tmp_path / "c" / "p", "big")
    assert outer == inner
    assert int(np.prod(inner)) * 4 <= CHUNK_BYTES
    assert int(np.prod(inner)) < big.size and inner[1:] == [1024]
    assert _chunk_shapes(tmp_path / "c" / "p", "w")[1] == [256, 256]
    restored = load_checkpointables(tmp_path / "c", {"p": abstract_restore_target(state)})
    np.testing.assert_array_equal(np.asarray(restored["p"]["big"]), np.asarray(big))
    np.testing.assert_array_equal(
        ex.read_leaf(tmp_path / "c", "p", "['big']")[3000:3010, 1000:],
        np.asarray(big)[3000:3010, 1000:],
    )


def test_a_chunk_size_in_the_callers_orbax_context_stays_in_force(tmp_path: Path) -> None:
    ctx = ocp.Context()
    ctx.array.saving.storage_options.chunk_byte_size = 64 * 1024
    with ctx:
        save_checkpointables(tmp_path / "c", {"p": _state()}).result()
    outer, inner = _chunk_shapes(tmp_path / "c" / "p", "w")
    assert int(np.prod(inner)) * 4 <= 64 * 1024 and outer == inner
    assert ctx.array.saving.storage_options.chunk_byte_size == 64 * 1024
    # And tinax's own choice did not leak into the caller's context either.
    fresh = ocp.Context()
    with fresh:
        save_checkpointables(tmp_path / "d", {"p": _state()}).result()
    assert fresh.array.saving.storage_options.chunk_byte_size is None
