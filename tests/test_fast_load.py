"""The load engine (tinax.checkpointing._fast_load, tinax._format.arraydata.chunkload): what it
reads comes back bit-identical on its devices and shardings, damage is refused naming
the leaf, and what it cannot read byte for byte still loads, through Orbax."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax_spy
import pytest
from damage import flip_bits, stored_value
from flax import nnx
from gcs import object_name
from orbax.checkpoint import v1 as ocp

import tinax.checkpointing as tc
from tinax._format.arraydata import chunkload, chunks
from tinax._format.metadata import arrays, pytree
from tinax._format.naming import names
from tinax._paths import location
from tinax.checkpointing import _checkpointables

orbax_loads = orbax_spy.orbax_loads  # the fixture


class _Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(96, 64, param_dtype=jnp.bfloat16, rngs=rngs)
        self.up = nnx.Linear(64, 256, rngs=rngs)
        self.norm = nnx.LayerNorm(256, rngs=rngs)


@pytest.fixture(scope="module")
def state() -> dict[str, Any]:
    """A flax NNX model's parameters and their optax adamw state, after one update."""
    params = nnx.state(_Model(nnx.Rngs(0)), nnx.Param)
    optimizer = optax.adamw(1e-3)
    opt = optimizer.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    updates, opt = optimizer.update(grads, opt, params)
    return {"model": optax.apply_updates(params, updates), "opt": opt}


def _identical(got: Any, want: Any) -> None:
    got_leaves, got_def = jax.tree_util.tree_flatten(got)
    want_leaves, want_def = jax.tree_util.tree_flatten(want)
    assert got_def == want_def
    for a, b in zip(got_leaves, want_leaves, strict=True):
        assert type(a) is type(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        if isinstance(b, jax.Array):
            assert a.sharding == b.sharding
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def _save(path: Path, values: dict[str, Any], how: str) -> None:
    if how == "orbax":
        ocp.save_checkpointables(path, values)
    else:
        with tc.compression(how == "tinax zstd"):
            tc.save_checkpointables(path, values).result()


@pytest.mark.parametrize("how", ["tinax", "tinax zstd", "tinax zstd streamed", "orbax"])
def test_nnx_and_adamw_states_load_through_the_engine_bit_identical(
    tmp_path: Path,
    state: dict[str, Any],
    orbax_loads: list[list[str]],
    how: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    streamed: list[int] = []
    if how.endswith(" streamed"):
        # Compressed chunks longer than this are streamed from their files, not read whole.
        monkeypatch.setattr(chunkload, "WHOLE_READ_BYTES", 0)

        class Counted(chunkload._FileRange):
            def __init__(self, fd: int, offset: int, length: int) -> None:
                streamed.append(length)
                super().__init__(fd, offset, length)

        monkeypatch.setattr(chunkload, "_FileRange", Counted)
        how = how.removesuffix(" streamed")
    _save(tmp_path / "c", state, how)
    back = tc.load_checkpointables(tmp_path / "c", tc.abstract_restore_target(state))
    assert orbax_loads == []
    _identical(back, state)
    assert bool(streamed) == (chunkload.WHOLE_READ_BYTES == 0)


def test_numpy_leaves_load_through_the_engine_as_numpy_arrays(
    tmp_path: Path, orbax_loads: list[list[str]]
) -> None:
    values = {"a": np.arange(12, dtype=np.int16).reshape(3, 4), "b": np.float32(2.5)}
    tc.save_checkpointables(tmp_path / "c", {"host": values}).result()
    back = tc.load_checkpointables(tmp_path / "c", {"host": tc.abstract_restore_target(values)})
    assert orbax_loads == []
    assert back["host"]["a"].tobytes() == values["a"].tobytes()
    assert isinstance(back["host"]["b"], np.ndarray) and back["host"]["b"].shape == ()
    assert back["host"]["b"] == np.float32(2.5)


@pytest.mark.parametrize("compressed", [False, True])
def test_a_flipped_byte_is_refused_naming_the_leaf(
    tmp_path: Path,
    orbax_loads: list[list[str]],
    caplog: pytest.LogCaptureFixture,
    compressed: bool,
) -> None:
    w = jax.random.normal(jax.random.key(1), (64, 64))
    values = {"w": w, "b": jnp.zeros(8)}
    with tc.compression(compressed):
        tc.save_checkpointables(tmp_path / "c", {"model": values}).result()
    file, at = stored_value(tmp_path / "c" / "model", "w/c/0/0")
    flip_bits(file, at + 100)
    caplog.set_level("DEBUG", logger="tinax.checkpointing._fast_load")
    with pytest.raises(tc.CorruptDataError, match=r"checkpointable 'model'.*leaf \['w'\]"):
        tc.load_checkpointables(tmp_path / "c", {"model": tc.abstract_restore_target(values)})
    # The engine found it and left the words to the load every checkpoint has.
    assert orbax_loads == [["model"]]
    # A flipped byte in a zstd frame may still decode, to other values.
    assert "leaf ['w']: the stored data is corrupt" in caplog.text or (
        compressed and "zstd decompress failed" in caplog.text
    )


def test_scalars_strings_and_prng_keys_load_through_the_engine_as_orbax_gives_them(
    tmp_path: Path, orbax_loads: list[list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    # A training checkpoint's auxiliary state and RNG: Python scalars, strings and keys.
    values = {
        "w": jnp.arange(16.0).reshape(4, 4),
        "step": 3,
        "loss": 0.25,
        "done": True,
        "name": "run-7",
        "tags": ["é", "", "a\nb"],
    }
    keys = {
        "key": jax.random.key(0),
        "rbg": jax.random.key(1, impl="rbg"),
        "split": jax.random.split(jax.random.key(2), 4),
    }
    tc.save_checkpointables(tmp_path / "c", {"mixed": values, "rng": keys}).result()
    targets = {"mixed": tc.abstract_restore_target(values), "rng": keys}
    caplog.set_level("DEBUG", logger="tinax.checkpointing._fast_load")
    back = tc.load_checkpointables(tmp_path / "c", targets)
    assert orbax_loads == [] and "left to Orbax" not in caplog.text
    theirs = ocp.load_checkpointables(tmp_path / "c", targets)
    assert back["mixed"] == {k: v for k, v in theirs["mixed"].items() if k != "w"} | {
        "w": back["mixed"]["w"]
    }
    for k in ("step", "loss", "done", "name"):
        assert type(back["mixed"][k]) is type(theirs["mixed"][k]) is type(values[k])
    assert back["mixed"]["tags"] == values["tags"] and back["mixed"]["name"] == "run-7"
    assert np.asarray(back["mixed"]["w"]).tobytes() == np.asarray(values["w"]).tobytes()
    for name, key in keys.items():
        got = back["rng"][name]
        assert got.dtype == key.dtype == theirs["rng"][name].dtype, name
        assert got.shape == key.shape and got.sharding == key.sharding
        assert np.asarray(jax.random.key_data(got)).tobytes() == (
            np.asarray(jax.random.key_data(key)).tobytes()
        )


def test_a_scalar_string_or_key_that_does_not_match_its_checksum_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    import json

    values = {"step": 3, "key": jax.random.key(4), "name": "run-7"}
    tc.save_checkpointables(tmp_path / "c", {"extra": values}).result()
    record_file = tmp_path / "c" / "extra" / "tinax_checksums" / "process_0.json"
    pristine = record_file.read_text()
    for leaf in ("['step']", "['key']", "['name']"):
        record = json.loads(pristine)
        pieces = record["leaves"][leaf]["pieces"]
        pieces[0][1] = f"{int(pieces[0][1], 16) ^ 1:016x}"
        record_file.write_text(json.dumps(record))
        with pytest.raises(tc.CorruptDataError, match=rf"'extra'.*leaf {re.escape(leaf)}"):
            tc.load_checkpointables(tmp_path / "c", {"extra": tc.abstract_restore_target(values)})
    record_file.write_text(pristine)
    back = tc.load_checkpointables(tmp_path / "c", {"extra": tc.abstract_restore_target(values)})
    assert back["extra"]["step"] == 3 and back["extra"]["name"] == "run-7"
    # The stored string itself changed (its JSON still well formed): refused the same.
    strings = tmp_path / "c" / "extra" / "_strings.json"
    strings.write_text(strings.read_text().replace("run-7", "run-8"))
    with pytest.raises(tc.CorruptDataError, match=r"'extra'.*leaf \['name'\]"):
        tc.load_checkpointables(tmp_path / "c", {"extra": tc.abstract_restore_target(values)})


def test_what_the_engine_does_not_read_loads_through_orbax(
    tmp_path: Path, orbax_loads: list[list[str]]
) -> None:
    values = {"w": jnp.arange(16.0).reshape(4, 4), "name": "tiny"}
    tc.save_checkpointables(tmp_path / "c", {"mixed": values}).result()
    # A partial load: the engine reads what is asked for, and the leaves left out
    # (Orbax's placeholder) come back as the placeholder, as Orbax gives them.
    back = tc.load_checkpointables(tmp_path / "c", {"mixed": {"w": ..., "name": "tiny"}})
    assert orbax_loads == []
    assert back["mixed"] == {"w": ..., "name": "tiny"}
    back = tc.load_checkpointables(tmp_path / "c", {"mixed": {"w": values["w"], "name": ...}})
    assert orbax_loads == [] and back["mixed"]["name"] is ...
    assert np.asarray(back["mixed"]["w"]).tolist() == np.asarray(values["w"]).tolist()
    # A scalar asked for as another kind (a number saved, a bool asked for) too.
    orbax_loads.clear()
    tc.save_checkpointables(tmp_path / "n", {"extra": {"flag": 1}}).result()
    with tc.allow_lossy_casts():
        back = tc.load_checkpointables(tmp_path / "n", {"extra": {"flag": True}})
    assert orbax_loads == [["extra"]]
    assert back["extra"]["flag"] is True
    # A cast between float dtypes is the engine's (tests/test_cast_loads.py); one into
    # an integer is Orbax's.
    orbax_loads.clear()
    only = {"w": values["w"]}
    tc.save_checkpointables(tmp_path / "d", {"m": only}).result()
    sharding = values["w"].sharding
    for dtype, reader in ((jnp.float16, []), (jnp.int32, [["m"]])):
        cast = {"m": {"w": jax.ShapeDtypeStruct((4, 4), dtype, sharding=sharding)}}
        with tc.allow_lossy_casts():
            back = tc.load_checkpointables(tmp_path / "d", cast)
        assert orbax_loads == reader
        assert back["m"]["w"].dtype == dtype
        assert np.asarray(back["m"]["w"]).tolist() == list(map(list, np.arange(16).reshape(4, 4)))


def test_a_load_with_leaves_left_out_counts_nan_once_and_copies_nothing(
    tmp_path: Path, orbax_loads: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tinax._paths import open_checkpoint
    from tinax.checkpointing import _nonfinite

    w = np.arange(16.0, dtype=np.float32).reshape(4, 4)
    w[1, 2] = np.nan
    values = {"w": jnp.asarray(w), "b": jnp.ones(4)}
    tc.save_checkpointables(tmp_path / "c", {"m": values}).result()
    copied: list[Any] = []
    real = _nonfinite._on_host
    monkeypatch.setattr(_nonfinite, "_on_host", lambda v: copied.append(v) or real(v))
    counts = _nonfinite.LoadCounts()
    target = {"m": {"w": tc.abstract_restore_target(values["w"]), "b": ...}}
    _checkpointables.restore_checkpointables(open_checkpoint(tmp_path / "c"), target, counts)
    assert orbax_loads == [] and copied == []  # counted as read: no second pass
    assert [(c.key, c.nan, c.inf) for c in counts.leaves()] == [("['w']", 1, 0)]


def test_reused_host_buffers_hand_each_slice_to_one_part_at_a_time(
    tmp_path: Path, state: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on an accelerator: parts read into slices of one small arena (parts larger
    than it into memory of their own), copied to their devices, slices reused."""
    from tinax.checkpointing import _fast_load, _host_buffers

    monkeypatch.setattr(_fast_load, "_copied_to_devices", lambda plans: True)
    monkeypatch.setattr(_fast_load, "DEVICE_HOST_BUFFER_BYTES", 48 << 10)
    taken: list[int] = []
    real_take = _host_buffers.HostBuffers.take

    def take(self: Any, nbytes: int, **kwargs: Any) -> Any:
        taken.append(nbytes)
        return real_take(self, nbytes, **kwargs)

    monkeypatch.setattr(_host_buffers.HostBuffers, "take", take)
    with tc.compression():
        tc.save_checkpointables(tmp_path / "c", state).result()
    back = tc.load_checkpointables(tmp_path / "c", tc.abstract_restore_target(state))
    _identical(back, state)
    assert max(taken) > 48 << 10 and sum(taken) > 4 * (48 << 10)  # both ways, slices reused
    buffers = _host_buffers.HostBuffers(1024, reuse=True)
    a, ta = buffers.take(100)
    b, tb = buffers.take(500)
    assert a.ctypes.data % 64 == 0 and b.ctypes.data - a.ctypes.data == 128
    buffers.give(ta, keep=True)
    c, tc_ = buffers.take(64)
    assert c.ctypes.data == a.ctypes.data  # first fit: the slice given back
    buffers.give(tb, keep=True)
    buffers.give(tc_, keep=True)
    assert buffers._free == [(0, 1024)]
    # A slice not given back (its transfers may go on) is not handed out again; with
    # nothing else in use, a part that no longer fits gets memory of its own.
    d, td = buffers.take(1000)
    buffers.give(td, keep=False)
    e, te = buffers.take(1000)
    assert not np.shares_memory(d, e) and te[0] is None


def test_the_host_buffer_outlives_a_load_for_the_next_one(
    tmp_path: Path, state: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on an accelerator: the arena a load read into is kept for the next load
    (its pages already touched), not for a load whose slices may still be in use,
    and freed ``KEEP_SECONDS`` after the last load."""
    from tinax.checkpointing import _fast_load, _host_buffers

    monkeypatch.setattr(_fast_load, "_copied_to_devices", lambda plans: True)
    monkeypatch.setattr(_fast_load, "DEVICE_HOST_BUFFER_BYTES", 1 << 20)
    _host_buffers.drop_kept()
    arenas: list[int] = []
    real_arena = _host_buffers._arena

    def arena(size: int) -> np.ndarray:
        found = real_arena(size)
        arenas.append(found.ctypes.data)
        return found

    monkeypatch.setattr(_host_buffers, "_arena", arena)
    tc.save_checkpointables(tmp_path / "c", state).result()
    target = tc.abstract_restore_target(state)
    for _ in range(2):
        _identical(tc.load_checkpointables(tmp_path / "c", target), state)
    assert len(arenas) == 2 and arenas[0] == arenas[1]
    kept = _host_buffers._kept
    assert kept is not None and kept.ctypes.data == arenas[0]
    # A load that takes the kept arena while another runs gets memory of its own.
    first, second = (
        _host_buffers.HostBuffers(1024, reuse=True),
        _host_buffers.HostBuffers(1024, reuse=True),
    )
    a, ta = first.take(10)
    b, tb = second.take(10)
    assert a.ctypes.data == arenas[0] and not np.shares_memory(a, b)
    # A slice not given back whole: that arena is not kept; the other one is.
    first.give(ta, keep=False)
    first.close()
    second.give(tb, keep=True)
    second.close()
    assert _host_buffers._kept is not None and _host_buffers._kept.ctypes.data == b.ctypes.data
    monkeypatch.setattr(_host_buffers, "KEEP_SECONDS", 0.05)
    third = _host_buffers.HostBuffers(1024, reuse=True)
    c, tc_ = third.take(10)
    third.give(tc_, keep=True)
    third.close()
    timer = _host_buffers._kept_timer
    assert timer is not None
    timer.join(timeout=10)
    assert _host_buffers._kept is None and _host_buffers._kept_timer is None


@pytest.mark.parametrize("how", ["tinax", "orbax"])
def test_boxes_that_cut_chunks_read_what_tensorstore_reads(tmp_path: Path, how: str) -> None:
    """Parts of an array stored in many inner chunks (and zstd frames), boxes that cut
    chunks in every dimension included, against numpy's own slices."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((96, 40)).astype(np.float32)
    ctx = ocp.Context()
    ctx.array.saving.storage_options.chunk_byte_size = 2048  # 512 values a chunk
    with ctx:
        _save(tmp_path / "c", {"m": {"w": jnp.asarray(w)}}, how)
    where = location(str(tmp_path / "c" / "m"))
    layout = pytree.parse_layout(where)
    contents = chunks.store_contents(layout, ["w/"], ctx=arrays.context())
    stored = chunkload.plan(
        where, contents.other[b"w/" + names.ZARR3_METADATA.encode()], contents.chunks["w/"], "w/"
    )
    assert layout.leaves[0].key == "['w']" and stored is not None
    assert stored.chunk_shape != stored.shape  # several chunks, or the test tests nothing
    files = chunkload.Files(where)
    reader = chunkload.BoxReader(stored, files)
    scratch = chunkload.Scratch()
    try:
        for box in [
            (slice(0, 96), slice(0, 40)),
            (slice(5, 61), slice(3, 37)),
            (slice(12, 24), slice(0, 40)),
            (slice(95, 96), slice(39, 40)),
        ]:
            out = np.full([s.stop - s.start for s in box], np.nan, np.float32)
            reader.read(stored.chunks_in(box), out, scratch, reader.fetch(box))
            assert out.tobytes() == w[box].tobytes(), box
    finally:
        files.close()


@pytest.mark.parametrize("compressed", [False, True])
def test_a_gs_checkpoint_loads_through_the_engine_one_request_per_run_of_bytes(
    gcs: Any, orbax_loads: list[list[str]], monkeypatch: pytest.MonkeyPatch, compressed: bool
) -> None:
    rng = np.random.default_rng(5)
    values = {
        str(i): jnp.asarray(rng.standard_normal((64, 256)).astype(np.float32)) for i in range(6)
    }
    path = f"gs://tinax-test/fast-load/{compressed}"
    with tc.compression(compressed):
        tc.save_checkpointables(path, {"m": values}).result()
    with gcs.counting() as made:
        back = tc.load_checkpointables(path, {"m": tc.abstract_restore_target(values)})
    assert orbax_loads == []
    _identical(back["m"], values)
    data = [(name, r[2]) for r in made if (name := object_name(r)) is not None and "/d/" in name]
    # The arrays' shards fetched in ranged reads of runs of adjacent bytes (the
    # B+tree's node reads aside): fewer reads than arrays, all their bytes once.
    # No more requests than the same load through Orbax's restore.
    with monkeypatch.context() as patched:
        patched.setattr(_checkpointables._fast_load, "load", lambda src, planned, **_: {})
        with gcs.counting() as through_orbax:
            tc.load_checkpointables(path, {"m": tc.abstract_restore_target(values)})
    assert len(made) <= len(through_orbax), (len(made), len(through_orbax))
    stored = len(values) * 64 * 256 * 4 * (0.8 if compressed else 1)
    big = [n for _, n in data if n >= 32 * 256 * 4]
    assert big and len(big) < len(values), data
    assert stored <= sum(big) < 1.25 * stored, data


_MESH_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np, sys
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from orbax.checkpoint import v1 as ocp
import tinax.checkpointing as tc
from tinax.checkpointing import _checkpointables

calls = []
real = ocp.load_checkpointables
_checkpointables.ocp.load_checkpointables = lambda p, a, *x, **k: (
    calls.append(sorted(a)) or real(p, a, *x, **k)
)
assert jax.device_count() == 4
mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
other = Mesh(np.array(jax.devices()[::-1]).reshape(4, 1), ("a", "b"))
rng = np.random.default_rng(0)
host = {
    "w": rng.standard_normal((64, 48)).astype(np.float32),
    "e": rng.standard_normal((40, 8)).astype(jnp.bfloat16),
    "r": rng.standard_normal((16,)).astype(np.float32),
}
specs = {"w": P("a", "b"), "e": P(None, "b"), "r": P()}
state = {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in host.items()}
root = sys.argv[1]

def check(back, shardings):
    for k, v in host.items():
        assert back[k].sharding == shardings[k], (k, back[k].sharding)
        assert np.asarray(back[k]).tobytes() == v.tobytes(), k
        for shard in back[k].addressable_shards:
            assert np.asarray(shard.data).tobytes() == v[shard.index].tobytes(), k
        # Replicas on CPU devices hold memory of their own (a donation writes in place).
        held = [shard.data.unsafe_buffer_pointer() for shard in back[k].addressable_shards]
        assert len(set(held)) == len(held), k

def target(shardings):
    return {"m": {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k])
                  for k, v in host.items()}}

same = {k: v.sharding for k, v in state.items()}
for how in ("tinax", "tinax zstd"):
    with tc.compression(how == "tinax zstd"):
        tc.save_checkpointables(f"{root}/{how}", {"m": state}).result()
    check(tc.load_checkpointables(f"{root}/{how}", target(same))["m"], same)
assert calls == [], calls
# Saved by Orbax (no checksums) and read onto another mesh: boxes cut the stored shards.
ocp.save_checkpointables(f"{root}/orbax", {"m": state})
moved = {k: NamedSharding(other, P("a")) for k in host}
check(tc.load_checkpointables(f"{root}/orbax", target(moved))["m"], moved)
assert calls == [], calls
# Saved split, loaded split another way: a device whose part cuts the pieces saved
# (and checksummed) reads them whole, checks them, and takes its window of them.
check(tc.load_checkpointables(f"{root}/tinax", target(moved))["m"], moved)
assert calls == [], calls
# The same, cast (float32 to float16, bfloat16 to float32): each piece is checked as
# stored and cast into the windows, every bit as Orbax's own load casts it.
wider = {np.dtype(np.float32): jnp.float16, np.dtype(jnp.bfloat16): jnp.float32}
cast = {"m": {k: jax.ShapeDtypeStruct(v.shape, wider[v.dtype], sharding=moved[k])
              for k, v in host.items()}}
with tc.allow_lossy_casts():
    got = tc.load_checkpointables(f"{root}/tinax", cast)["m"]
assert calls == [], calls
want = real(f"{root}/tinax", cast)["m"]
for k in host:
    assert got[k].dtype == want[k].dtype == wider[host[k].dtype] and got[k].sharding == moved[k]
    assert np.asarray(got[k]).tobytes() == np.asarray(want[k]).tobytes(), k
print("ok")
"""


@pytest.mark.slow  # a JAX process of its own, with four CPU devices
def test_sharded_states_load_onto_their_meshes_through_the_engine(tmp_path: Path) -> None:
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    import os

    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_MESH_SCRIPT), str(tmp_path)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
