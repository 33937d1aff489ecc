"""New checkpoints made from old ones: derived (some checkpointables, some leaves, cast,
renamed) and averaged, from real flax NNX and Linen models and optax AdamW states.

(Over 500 lines: derive and average read the same three training checkpoints, a
module fixture made once; split, each file would make them again.)

Each result is read back by tinax's load (through the restore verdict), by Orbax
alone, and by ``verify`` with its data; refusals leave nothing where they would have
written; the lineage says what the result was made from.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import flax.linen as linen
import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from damage import flip_bits, stored_value
from flax import nnx
from orbax.checkpoint import v1 as ocp

import tinax.explore as ex
from tinax._format.naming.keys import key_parts
from tinax._format.safetensors import tensor_name
from tinax.checkpointing import (
    CorruptDataError,
    abstract_restore_target,
    average_checkpoints,
    derive_checkpoint,
    load_checkpointables,
    load_training_checkpoint,
    save_checkpointables,
    save_training_checkpoint,
)

STEPS = (100, 200, 300)
# Orbax alone, given no targets, reads each array's sharding from the checkpoint and says so.
pytestmark = pytest.mark.filterwarnings("ignore:Sharding info not provided when restoring")


class _Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.up = nnx.Linear(8, 16, rngs=rngs)
        self.down = nnx.Linear(16, 8, rngs=rngs)


class _Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.blocks = nnx.List([_Block(rngs) for _ in range(3)])
        self.norm = nnx.LayerNorm(8, rngs=rngs)


class _Linen(linen.Module):
    @linen.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return linen.Dense(3, name="head")(linen.relu(linen.Dense(8, name="body")(x)))


def _dataset() -> Any:
    return grain.MapDataset.range(64).batch(4).to_iter_dataset()


def _flat(tree: Any) -> dict[str, np.ndarray]:
    """Every array leaf by its dotted key, as the raw bytes' owner (dtype kept)."""
    return {
        tensor_name(key_parts(path)): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
        if hasattr(leaf, "dtype")
    }


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict[str, Any]:
    """Three training checkpoints of one NNX model and its AdamW state (the model moved
    between them), each with a Grain iterator, an RNG key and auxiliary values."""
    root = tmp_path_factory.mktemp("surgery")
    model = _Model(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    iterator = iter(_dataset())
    states = {}
    for i, step in enumerate(STEPS):
        next(iterator)
        # Pure trees: nnx.state's leaves follow the model's later updates.
        state = jax.tree.map(lambda x, i=i: x * (1.0 + 0.25 * i) + 0.01 * i, nnx.state(model))
        nnx.update(model, state)
        opt_state = jax.tree.map(lambda x: x + 0, nnx.state(optimizer))
        path = root / f"step_{step:06d}"
        save_training_checkpoint(
            path,
            step,
            state,
            opt_state,
            jax.random.key(step),
            {"loss": 1.0 / step},
            iterator,
        ).result()
        states[step] = {"model": state, "optimizer": opt_state}
    return {"root": root, "states": states, "paths": [root / f"step_{s:06d}" for s in STEPS]}


@pytest.fixture(scope="module")
def linen_checkpoint(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    params = _Linen().init(jax.random.key(1), jnp.ones((2, 6)))["params"]
    opt = optax.adamw(1e-3).init(params)
    opt = jax.tree.map(lambda x: x + 0.5 if jnp.issubdtype(x.dtype, jnp.floating) else x + 3, opt)
    state = {"params": params, "opt_state": opt}
    path = tmp_path_factory.mktemp("linen") / "step_000007"
    save_checkpointables(path, state).result()
    return path, state


def _nothing_left(parent: Path, before: set[str]) -> None:
    assert set(os.listdir(parent)) == before


# -- derive -------------------------------------------------------------------------------


def test_params_only_in_bfloat16_read_back_exactly(run, tmp_path):
    source = run["paths"][0]
    out = tmp_path / "params_bf16"
    derive_checkpoint(source, out, checkpointables=["model"], cast="bfloat16")

    table = ex.checkpoint_table(out)
    assert set(table["checkpointable"]) == {"model"}
    assert set(table["dtype"]) == {"bfloat16"}
    live = run["states"][STEPS[0]]["model"]
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16), live)
    loaded = load_checkpointables(out, {"model": target})["model"]
    expected = {k: v.astype(jnp.bfloat16) for k, v in _flat(live).items()}
    found = _flat(loaded)
    assert sorted(found) == sorted(expected)
    assert all(_same_bits(found[k], expected[k]) for k in expected)
    # Orbax alone reads it as its own.
    raw = ocp.load_checkpointables(str(out))["model"]
    assert all(_same_bits(v, expected[k]) for k, v in _flat(raw).items())
    assert ex.verify(out, data=True).ok

    made = ex.lineage(out)
    assert list(made["source"]) == [str(source)]
    assert list(made["step"]) == [STEPS[0]]
    assert list(made["operation"]) == ["derive"]
    assert made["arguments"].iloc[0]["cast"] == "bfloat16"
    assert made["arguments"].iloc[0]["checkpointables"] == ["model"]
    assert isinstance(made["checksums"].iloc[0], str)
    assert ex.toolkit.lineage_summary(made).startswith("derived from step_000100")
    assert ex.lineage(source).empty


def test_keys_and_rename_rebuild_the_tree_from_the_dotted_keys(run, tmp_path):
    out = tmp_path / "two_layers"
    derive_checkpoint(
        run["paths"][1],
        out,
        checkpointables="model",
        keys=r"^blocks\.(0|2)\.",
        rename=[(r"^blocks\.(\d+)\.", r"layer_\1.")],
    )
    keys = sorted(ex.checkpoint_table(out)["key"])
    assert keys == sorted(
        f"['layer_{i}']['{part}']['{name}']['value']"
        for i in (0, 2)
        for part in ("up", "down")
        for name in ("bias", "kernel")
    )
    live = _flat(run["states"][STEPS[1]]["model"])
    raw = ocp.load_checkpointables(str(out))["model"]
    assert set(raw) == {"layer_0", "layer_2"}
    for name, value in _flat(raw).items():
        assert _same_bits(value, live[name.replace("layer_", "blocks.")]), name
    assert ex.lineage(out)["arguments"].iloc[0]["rename"] == [[r"^blocks\.(\d+)\.", r"layer_\1."]]


def test_a_linen_and_optax_state_loads_into_its_live_structure(linen_checkpoint, tmp_path):
    source, state = linen_checkpoint
    whole = tmp_path / "whole"
    derive_checkpoint(source, whole)
    loaded = load_checkpointables(whole, abstract_restore_target(state))
    # optax's own NamedTuples come back, every leaf bit for bit.
    assert jax.tree_util.tree_structure(loaded) == jax.tree_util.tree_structure(state)
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(state), strict=True):
        assert _same_bits(np.asarray(a), np.asarray(b))

    # Only AdamW's first moments: the tuple keeps its first entry, whole.
    moments = tmp_path / "mu"
    derive_checkpoint(source, moments, keys=r"\.mu\.|^params\.", cast=np.float16)
    raw = ocp.load_checkpointables(str(moments))
    assert len(raw["opt_state"]) == 1 and set(raw["opt_state"][0]) == {"mu"}
    mu = _flat(state["opt_state"][0].mu)
    assert all(
        _same_bits(np.asarray(v), mu[k].astype(np.float16))
        for k, v in _flat(raw["opt_state"][0]["mu"]).items()
    )


def test_a_training_checkpoint_derived_whole_resumes_its_iterator(run, tmp_path):
    out = tmp_path / "copy"
    derive_checkpoint(run["paths"][2], out)
    assert ex.verify(out).ok
    live = run["states"][STEPS[2]]
    restored = load_training_checkpoint(
        out,
        abstract_restore_target(live["model"]),
        abstract_restore_target(live["optimizer"]),
        abstract_restore_target(jax.random.key(0)),
        {"loss": 0.0},
        iter(_dataset()),
    )
    assert restored.step == STEPS[2]
    # Three batches were taken before the save: the fourth comes next.
    assert np.array_equal(next(restored.iterator), np.arange(12, 16))
    for a, b in zip(jax.tree.leaves(restored.model), jax.tree.leaves(live["model"]), strict=True):
        assert _same_bits(np.asarray(a), np.asarray(b))
    # A name without a step: the lineage takes the one the training checkpoint saved.
    derive_checkpoint(out, tmp_path / "params", checkpointables="model")
    assert list(ex.lineage(tmp_path / "params")["step"]) == [STEPS[2]]


def test_progress_counts_every_byte_read(run, tmp_path):
    seen: list[tuple[int, int]] = []
    derive_checkpoint(run["paths"][0], tmp_path / "out", progress=lambda d, t: seen.append((d, t)))
    done = [d for d, _ in seen]
    assert seen[0][0] == 0 and done == sorted(done)
    total = seen[-1][1]
    assert done[-1] == total > 0


# -- refusals -----------------------------------------------------------------------------


def test_new_keys_that_cannot_make_a_tree_are_refused_naming_the_leaves(tmp_path):
    source = tmp_path / "src"
    save_checkpointables(
        source, {"model": {"a": {"b": np.ones(2)}, "c": np.zeros(2), "t": (np.ones(1), np.ones(1))}}
    ).result()
    before = set(os.listdir(tmp_path))
    cases = [
        (
            {"rename": [(r"^(a\.b|c)$", "same")]},
            r"\['a'\]\['b'\] and \['c'\] would both get the key 'same'",
        ),
        ({"rename": [("^c$", "a")]}, "'a' would be both a leaf"),
        ({"keys": r"^t\.1$"}, "sequence 't' would miss index 0"),
        ({"rename": [(r"^t\.0$", "t.x")]}, "both sequence indices and names"),
        ({"rename": [("^c$", "c..d")]}, "not a dotted key"),
        (
            {"keys": "nothing"},
            "no leaf of \\['model'\\] has a dotted key that keys 'nothing' finds",
        ),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            derive_checkpoint(source, tmp_path / "out", **kwargs)
        _nothing_left(tmp_path, before)


def test_a_corrupt_source_is_refused_naming_the_leaf_and_leaves_nothing(tmp_path):
    rng = np.random.default_rng(0)
    paths = [tmp_path / "step_1", tmp_path / "step_2"]
    for path in paths:
        tree = {"w": jnp.asarray(rng.standard_normal((64, 64), np.float32)), "b": jnp.ones(3)}
        save_checkpointables(path, {"model": tree}).result()
    where, at = stored_value(paths[1] / "model", "w/c/0/0")
    flip_bits(where, at + 100)
    before = set(os.listdir(tmp_path))
    message = (
        r"checkpoint '.*step_2': checkpointable 'model': leaf \['w'\]: the stored data is corrupt"
    )
    with pytest.raises(CorruptDataError, match=message):
        derive_checkpoint(paths[1], tmp_path / "out", cast="bfloat16")
    _nothing_left(tmp_path, before)
    with pytest.raises(CorruptDataError, match=message):
        average_checkpoints(paths, tmp_path / "out")
    _nothing_left(tmp_path, before)


def test_an_existing_destination_is_refused_before_anything_is_read(tmp_path):
    (tmp_path / "there").mkdir()
    with pytest.raises(FileExistsError, match="already exists"):
        derive_checkpoint(tmp_path / "missing", tmp_path / "there")
    with pytest.raises(FileExistsError, match="already exists"):
        average_checkpoints([tmp_path / "a", tmp_path / "b"], tmp_path / "there")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        derive_checkpoint(tmp_path / "missing", tmp_path / "new")
    with pytest.raises(FileNotFoundError, match="parent directory"):
        derive_checkpoint(tmp_path / "missing", tmp_path / "no" / "new")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"cast": 3}, TypeError, "cast must be a dtype"),
        ({"cast": "int8"}, ValueError, "not a floating-point dtype"),
        ({"cast": "float31"}, ValueError, "names no dtype"),
        ({"keys": 3}, TypeError, "keys must be a regular expression"),
        ({"keys": "("}, ValueError, "not a regular expression"),
        ({"rename": "a=b"}, TypeError, "rename must be a list"),
        ({"rename": [("a",)]}, TypeError, "rename takes"),
        ({"rename": ["ab"]}, ValueError, "not PATTERN=REPLACEMENT"),
        ({"checkpointables": 3}, TypeError, "checkpointables must be"),
        ({"checkpointables": []}, ValueError, "at least one"),
        ({"checkpointables": ["params"]}, ValueError, "no checkpointable 'params'"),
        ({"progress": 1}, TypeError, "progress must be a callable"),
    ],
)
def test_bad_derive_arguments_are_refused(run, tmp_path, kwargs, error, message):
    with pytest.raises(error, match=message):
        derive_checkpoint(run["paths"][0], tmp_path / "out", **kwargs)
    assert os.listdir(tmp_path) == []


# -- average ------------------------------------------------------------------------------


def test_an_average_of_three_and_a_weighted_one(run, tmp_path):
    paths = run["paths"]
    models = [_flat(run["states"][s]["model"]) for s in STEPS]
    for weights, name in ((None, "mean"), ([1, 2, 5], "weighted")):
        out = tmp_path / name
        average_checkpoints(paths, out, weights=weights, checkpointables=["model"])
        w = np.asarray([1.0, 1.0, 1.0] if weights is None else weights, np.float64)
        loaded = _flat(ocp.load_checkpointables(str(out))["model"])
        assert sorted(loaded) == sorted(models[0])
        for key, value in loaded.items():
            stack = np.stack([m[key].astype(np.float64) for m in models])
            expected = (np.tensordot(w, stack, axes=1) / w.sum()).astype(models[0][key].dtype)
            np.testing.assert_array_equal(value, expected, err_msg=key)
        assert ex.verify(out, data=True).ok
        made = ex.lineage(out)
        assert list(made["source"]) == [str(p) for p in paths]
        assert list(made["step"]) == list(STEPS)
        np.testing.assert_allclose(list(made["weight"]), w / w.sum())
        assert set(made["operation"]) == {"average"}


def test_an_average_of_training_checkpoints_refuses_counters_that_differ(run, tmp_path):
    # The training step, saved in the auxiliary state: an integer, different in each.
    with pytest.raises(
        ValueError, match=r"checkpointable 'auxiliary': leaf \['step'\]: its values differ"
    ):
        average_checkpoints(run["paths"], tmp_path / "out", checkpointables=["auxiliary", "model"])
    with pytest.raises(ValueError, match="checkpointable 'iterator' .* differs"):
        average_checkpoints(run["paths"], tmp_path / "out")
    assert os.listdir(tmp_path) == []


def test_an_average_of_different_structures_names_the_first_difference(run, tmp_path):
    other = tmp_path / "other"
    save_checkpointables(other, {"model": {"blocks": {"0": np.ones(3, np.float32)}}}).result()
    with pytest.raises(ValueError, match="the sources differ"):
        average_checkpoints([run["paths"][0], other], tmp_path / "out", checkpointables="model")
    assert sorted(os.listdir(tmp_path)) == ["other"]


@pytest.mark.parametrize(
    ("weights", "error", "message"),
    [
        ([1, 1], ValueError, "2 values for 3 sources"),
        ([1, True, 1], TypeError, "booleans are not"),
        ([1, -1, 1], ValueError, "not negative"),
        ([0, 0, 0], ValueError, "sum to zero"),
        ([1, float("nan"), 1], ValueError, "finite"),
        ("111", TypeError, "list of numbers"),
        ([1, "2", 1], TypeError, "a weight is a number"),
    ],
)
def test_bad_weights_are_refused(run, tmp_path, weights, error, message):
    with pytest.raises(error, match=message):
        average_checkpoints(run["paths"], tmp_path / "out", weights=weights)
    assert os.listdir(tmp_path) == []


def test_an_average_needs_two_sources_in_a_list(run, tmp_path):
    with pytest.raises(ValueError, match="at least two sources"):
        average_checkpoints(run["paths"][:1], tmp_path / "out")
    with pytest.raises(TypeError, match="list of checkpoint paths"):
        average_checkpoints(str(run["paths"][0]), tmp_path / "out")


# -- the command line ---------------------------------------------------------------------


def _tinax(*args: object) -> tuple[int, str, str]:
    from tinax._cli.main import main

    out, err = io.StringIO(), io.StringIO()
    status = main([str(a) for a in args], out, err)
    return status, out.getvalue(), err.getvalue()


def test_the_command_line_derives_averages_and_shows_the_lineage(run, tmp_path):
    status, out, err = _tinax(
        "derive", run["paths"][0], tmp_path / "d", "--only", "model", "--cast", "bfloat16",
        "--keys", r"^blocks\.0\.", "--rename", r"blocks\.0=first", "--json",
    )  # fmt: skip
    assert status == 0, err
    record = json.loads(out)
    assert record["operation"] == "derive" and record["leaves"] == 4
    assert record["arguments"]["rename"] == [[r"blocks\.0", "first"]]
    assert record["sources"][0]["step"] == STEPS[0]
    status, out, err = _tinax(
        "average", *run["paths"], "--out", tmp_path / "a", "--weights", "1", "1", "2",
        "--only", "model",
    )  # fmt: skip
    assert status == 0, err
    # Read as one line: the paths in it wrap it at the terminal's width.
    said = " ".join(out.split())
    assert "average of 3" in said and "weight 0.5" in said
    status, out, _ = _tinax("show", tmp_path / "d")
    assert status == 0 and " ".join(out.split()).startswith(f"derived from {run['paths'][0]}")
    status, _, err = _tinax("derive", run["paths"][0], tmp_path / "d")
    assert status == 2 and "already exists" in err


# -- arrays copied as stored ------------------------------------------------------------


class _Wide(nnx.Module):
    """Arrays large enough to be read raw: chunks of 6 MiB and 1 MiB, and a small bias."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(3000, 1024, rngs=rngs)
        self.head = nnx.Linear(1024, 256, rngs=rngs)


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> tuple[Path, Any]:
    state = nnx.state(_Wide(nnx.Rngs(3)))
    path = tmp_path_factory.mktemp("wide") / "step_000005"
    save_checkpointables(path, {"model": state}).result()
    return path, state


def _copied_as_stored(checkpointable: Path) -> bool:
    """Whether the checkpointable's OCDBT store got its copied chunks in a version of
    tinax's: its root B+tree node is uncompressed (tensorstore's are zstd-compressed, as
    Orbax configures the store)."""
    import tensorstore as ts

    from tinax._format.metadata.arrays import parse_location

    base = ts.KvStore.open({"driver": "file", "path": f"{checkpointable}/"}).result()
    root = parse_location(ts.ocdbt.dump(base).result()["versions"][-1]["root"]["location"])
    with open(checkpointable / root.file, "rb") as f:
        f.seek(root.offset)
        header = f.read(14)  # magic, length, version, compression format
    return header[13] == 0


def test_arrays_kept_as_they_are_are_copied_as_stored_and_read_back_exactly(wide, tmp_path):
    source, state = wide
    live = _flat(state)
    whole, part = tmp_path / "whole", tmp_path / "part"
    derive_checkpoint(source, whole)
    derive_checkpoint(source, part, keys=r"^(embed|head\.kernel)", rename=[(r"^head\.", "out.")])
    for out in (whole, part):
        assert _copied_as_stored(out / "model")
        assert ex.verify(out, data=True).ok
    raw = _flat(ocp.load_checkpointables(str(whole))["model"])
    assert sorted(raw) == sorted(live)
    assert all(_same_bits(raw[k], live[k]) for k in live)
    target = {"model": abstract_restore_target(state)}
    loaded = _flat(load_checkpointables(whole, target)["model"])
    assert all(_same_bits(loaded[k], live[k]) for k in live)
    raw = _flat(ocp.load_checkpointables(str(part))["model"])
    assert sorted(raw) == ["embed.embedding", "out.kernel"]
    assert _same_bits(raw["embed.embedding"], live["embed.embedding"])
    assert _same_bits(raw["out.kernel"], live["head.kernel"])
    assert list(ex.lineage(part)["source"]) == [str(source)]


def _data_inodes(checkpoint: Path) -> set[int]:
    return {p.stat().st_ino for p in checkpoint.rglob("*") if p.is_file() and p.parent.name == "d"}


def test_data_files_kept_whole_are_linked_and_one_kept_in_part_is_copied(wide, tmp_path):
    import shutil

    source, state = wide
    live = _flat(state)
    mine = tmp_path / "step_000005"
    shutil.copytree(source, mine)
    whole, part = tmp_path / "whole", tmp_path / "part"
    derive_checkpoint(mine, whole)
    derive_checkpoint(mine, part, keys=r"^head\.kernel")  # 1 MiB of a 13 MiB file
    linked = _data_inodes(whole) & _data_inodes(mine)
    assert linked and not _data_inodes(part) & _data_inodes(mine)
    # The source goes; what was linked stays, whole and checked.
    shutil.rmtree(mine)
    for out in (whole, part):
        assert ex.verify(out, data=True).ok
    raw = _flat(ocp.load_checkpointables(str(whole))["model"])
    assert sorted(raw) == sorted(live) and all(_same_bits(raw[k], live[k]) for k in live)
    raw = _flat(ocp.load_checkpointables(str(part))["model"])
    assert list(raw) == ["head.kernel"] and _same_bits(raw["head.kernel"], live["head.kernel"])


def test_a_link_the_file_system_refuses_is_a_copy_instead(wide, tmp_path, monkeypatch):
    import errno

    from tinax._format.writing import ocdbt_root

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(ocdbt_root.os, "link", refuse)
    source, state = wide
    derive_checkpoint(source, tmp_path / "out")
    assert not _data_inodes(tmp_path / "out") & _data_inodes(source)
    assert ex.verify(tmp_path / "out", data=True).ok
    raw = _flat(ocp.load_checkpointables(str(tmp_path / "out"))["model"])
    assert all(_same_bits(raw[k], v) for k, v in _flat(state).items())


def test_a_write_that_fails_behind_the_cast_fails_it_and_leaves_nothing(
    wide, tmp_path, monkeypatch
):
    import errno

    from tinax._format.writing import ocdbt_root

    real, calls = os.pwrite, []

    def full(fd: int, data: Any, offset: int) -> int:
        calls.append(offset)
        if len(calls) == 2:  # the second chunk's, written on the data file's own thread
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(ocdbt_root.os, "pwrite", full)
    source, _ = wide
    out = tmp_path / "out"
    before = set(os.listdir(tmp_path))
    with pytest.raises(OSError, match="No space left on device"):
        derive_checkpoint(source, out, cast="bfloat16")
    assert len(calls) >= 2
    _nothing_left(tmp_path, before)


def test_a_store_with_too_many_arrays_for_one_node_copies_its_chunks_through_tensorstore(
    wide, tmp_path, monkeypatch
):
    from tinax._format.writing import ocdbt_root

    source, state = wide
    monkeypatch.setattr(ocdbt_root, "MAX_ARRAYS", 2)
    derive_checkpoint(source, tmp_path / "out")
    assert not _copied_as_stored(tmp_path / "out" / "model")
    raw = _flat(ocp.load_checkpointables(str(tmp_path / "out"))["model"])
    assert all(_same_bits(raw[k], v) for k, v in _flat(state).items())
    assert ex.verify(tmp_path / "out", data=True).ok


def test_a_copy_of_damaged_stored_chunks_is_refused_naming_the_leaf_and_leaves_nothing(
    wide, tmp_path
):
    import shutil

    source = tmp_path / "step_000005"
    shutil.copytree(wide[0], source)
    where, at = stored_value(source / "model", "embed.embedding.value/c/1/0")
    before = set(os.listdir(tmp_path))
    leaf = r"checkpointable 'model': leaf \['embed'\]\['embedding'\]\['value'\]"
    flip_bits(where, at + 100)
    with pytest.raises(CorruptDataError, match=f"{leaf}: the stored data is corrupt: its checksum"):
        derive_checkpoint(source, tmp_path / "out", keys="embed")
    _nothing_left(tmp_path, before)
    flip_bits(where, at + 100)
    # The shard's index, after the 6 MiB of values: its CRC-32C no longer matches.
    flip_bits(where, at + 1500 * 1024 * 4 + 3)
    with pytest.raises(CorruptDataError, match=f"{leaf}: the stored data is corrupt: a shard"):
        derive_checkpoint(source, tmp_path / "out")
    _nothing_left(tmp_path, before)


def test_arrays_are_copied_as_stored_into_and_out_of_a_bucket(wide, gcs, tmp_path):
    import uuid

    from conftest import BUCKET

    source, state = wide
    live = _flat(state)
    bucket = f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}/copy"
    derive_checkpoint(source, bucket)
    assert ex.verify(bucket, data=True).ok
    back = tmp_path / "back"
    derive_checkpoint(bucket, back)
    assert _copied_as_stored(back / "model")
    assert ex.verify(back, data=True).ok
    raw = _flat(ocp.load_checkpointables(str(back))["model"])
    assert all(_same_bits(raw[k], live[k]) for k in live)


# -- gs:// --------------------------------------------------------------------------------


def test_derive_and_average_between_a_bucket_and_a_local_disk(run, gcs, tmp_path):
    import uuid

    from conftest import BUCKET

    prefix = f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"
    derive_checkpoint(run["paths"][0], f"{prefix}/bf16", checkpointables="model", cast="bfloat16")
    assert ex.verify(f"{prefix}/bf16", data=True).ok
    assert list(ex.lineage(f"{prefix}/bf16")["source"]) == [str(run["paths"][0])]
    derive_checkpoint(run["paths"][1], f"{prefix}/second", checkpointables="model")
    average_checkpoints(
        [f"{prefix}/second", run["paths"][2]], tmp_path / "avg", checkpointables=["model"]
    )
    models = [_flat(run["states"][s]["model"]) for s in STEPS[1:]]
    loaded = _flat(ocp.load_checkpointables(str(tmp_path / "avg"))["model"])
    for key, value in loaded.items():
        expected = ((models[0][key].astype(np.float64) + models[1][key]) / 2).astype(np.float32)
        np.testing.assert_array_equal(value, expected, err_msg=key)
    assert list(ex.lineage(tmp_path / "avg")["source"]) == [
        f"{prefix}/second",
        str(run["paths"][2]),
    ]
    with pytest.raises(FileExistsError):
        derive_checkpoint(run["paths"][0], f"{prefix}/bf16")
    # From the bucket into it.
    derive_checkpoint(f"{prefix}/bf16", f"{prefix}/copy", rename=[("^norm", "final_norm")])
    copied = ex.checkpoint_table(f"{prefix}/copy")
    assert "['final_norm']['scale']['value']" in set(copied["key"])
    assert ex.verify(f"{prefix}/copy", data=True).ok


def test_a_checkpoint_orbax_stored_in_whole_compressed_chunks_is_restored_in_slabs(tmp_path):
    # Raw Orbax's defaults: each array one zstd chunk, read only whole; the copy is
    # stored in slabs of rows, the last one ending past the array (zarr fills it).
    rng = np.random.default_rng(5)
    tree = {
        "w": rng.standard_normal((5000, 1000)).astype(np.float32),
        "v": rng.standard_normal((3, 7)).astype(np.float64),
        "i": np.arange(11, dtype=np.int8),
    }
    source = tmp_path / "orbax"
    ocp.save_checkpointables(source, {"model": tree})
    derive_checkpoint(source, tmp_path / "copy")
    chunks = ex.checkpoint_table(tmp_path / "copy").set_index("key")["chunk_shape"]
    assert chunks["['w']"] == (2097, 1000)
    loaded = _flat(
        load_checkpointables(tmp_path / "copy", {"model": abstract_restore_target(tree)})["model"]
    )
    assert all(_same_bits(loaded[k], v) for k, v in tree.items())
    assert _same_bits(ex.read_leaf(tmp_path / "copy", "model", "['w']"), tree["w"])
    assert ex.verify(tmp_path / "copy", data=True).ok
    # Its slabs, the last one past the array's end, are copied again as they are stored.
    derive_checkpoint(tmp_path / "copy", tmp_path / "again")
    assert _copied_as_stored(tmp_path / "again" / "model")
    again = _flat(ocp.load_checkpointables(str(tmp_path / "again"))["model"])
    assert all(_same_bits(again[k], v) for k, v in tree.items())
    assert ex.verify(tmp_path / "again", data=True).ok


def test_the_previews_say_what_the_result_will_hold_from_metadata_alone(run, tmp_path):
    options = {"checkpointables": ["model", "optimizer"], "keys": r"^blocks\.1\.|mu\.blocks\.1\."}
    preview = ex.toolkit.derive_preview(run["paths"][0], cast="bfloat16", **options)
    derive_checkpoint(run["paths"][0], tmp_path / "out", cast="bfloat16", **options)
    written = ex.checkpoint_table(tmp_path / "out")
    assert list(preview["key"]) == list(written["key"])
    assert list(preview["dtype"]) == list(written["dtype"])
    assert list(preview["nbytes"]) == list(written["nbytes"])
    assert preview.attrs["written_bytes"] * 2 == preview.attrs["read_bytes"]
    with pytest.raises(ValueError, match="would miss index|no leaf"):
        ex.toolkit.derive_preview(run["paths"][0], keys="nothing matches this")

    preview = ex.toolkit.average_preview(run["paths"], checkpointables="model")
    assert preview.attrs["read_bytes"] == 3 * preview.attrs["written_bytes"] > 0
    with pytest.raises(ValueError, match="the sources differ"):
        ex.toolkit.average_preview([run["paths"][0], tmp_path / "out"])


def test_an_average_keeps_only_the_keys_asked_for(tmp_path):
    # An NNX model with Dropout: its RNG counter moves at every step, its weights too.
    paths = []
    for step, count in ((1, 3), (2, 8)):
        model = nnx.Sequential(
            nnx.Linear(4, 4, rngs=nnx.Rngs(step)), nnx.Dropout(0.1, rngs=nnx.Rngs(count))
        )
        state = nnx.state(model)
        paths.append(tmp_path / f"step_{step}")
        save_checkpointables(paths[-1], {"model": state}).result()
    with pytest.raises(ValueError, match=r"\['rngs'\].*its values differ.*keys="):
        average_checkpoints(paths, tmp_path / "out")
    average_checkpoints(paths, tmp_path / "out", keys=r"^(?!.*\.rngs\.)")
    keys = list(ex.checkpoint_table(tmp_path / "out")["key"])
    assert keys == ["['layers']['0']['bias']['value']", "['layers']['0']['kernel']['value']"]
    assert ex.lineage(tmp_path / "out")["arguments"].iloc[0]["keys"] == r"^(?!.*\.rngs\.)"
    preview = ex.toolkit.average_preview(paths, keys=r"^(?!.*\.rngs\.)")
    assert list(preview["key"]) == keys


_DERIVE = """
import pathlib, sys, time
from tinax.checkpointing import derive_checkpoint

def progress(done, total):
    if done:  # boxes are written: say so, and stay here to be killed
        pathlib.Path(sys.argv[3]).touch()
        time.sleep(600)

derive_checkpoint(sys.argv[1], sys.argv[2], cast="bfloat16", progress=progress)
"""


@pytest.mark.slow
def test_a_derive_killed_midway_leaves_nothing_at_the_destination_and_is_redone(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    rng = np.random.default_rng(0)
    tree = {f"w{i}": rng.standard_normal((1024, 1024), np.float32) for i in range(4)}
    source = tmp_path / "step_000001"
    save_checkpointables(source, {"model": tree}).result()
    out, writing = tmp_path / "out", tmp_path.parent / f"{tmp_path.name}.writing"
    job = subprocess.Popen([sys.executable, "-c", _DERIVE, str(source), str(out), str(writing)])
    try:
        deadline = time.monotonic() + 120
        while not writing.exists():
            assert job.poll() is None and time.monotonic() < deadline, "no box was written"
            time.sleep(0.01)
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait()
    assert job.returncode == -signal.SIGKILL
    assert not out.exists()
    listed = ex.list_checkpoints(tmp_path).set_index("name")
    assert listed.loc["out.orbax-checkpoint-tmp", "status"] == "interrupted"
    # The next derive to the same place removes what the killed one left, and commits.
    derive_checkpoint(source, out, cast="bfloat16")
    assert ex.verify(out, data=True).ok
    assert sorted(os.listdir(tmp_path)) == ["out", "step_000001"]
