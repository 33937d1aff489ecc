"""tinax.explore tables: checkpoint_table, state_table and compare_table on Orbax's layouts."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
import tensorstore as ts
from explore_fixtures import (
    iterator,
    model_state,
    optimizer_state,
    save_v0_run,
    save_v1,
    save_v1_run,
)
from orbax.checkpoint import v1 as ocp

import tinax.explore as ex
from tinax import checkpointing as tc
from tinax._format.metadata import arrays as _store
from tinax._format.storage.location import local
from tinax.checkpointing.legacy import v0 as legacy_v0
from tinax.explore import toolkit

LEAF_COLUMNS = [
    "checkpointable",
    "key",
    "kind",
    "shape",
    "dtype",
    "size",
    "nbytes",
    "value",
    "sharding",
    "chunk_shape",
]


@pytest.fixture(scope="module")
def state():
    return {"model": model_state(), "optimizer": optimizer_state(), "iterator": iterator()}


@pytest.fixture(scope="module")
def v1_path(tmp_path_factory, state) -> Path:
    return save_v1(tmp_path_factory.mktemp("v1") / "ckpt", state)


@pytest.fixture(scope="module")
def table(v1_path) -> pd.DataFrame:
    return ex.checkpoint_table(v1_path)


class Row(dict):
    """A table row whose cells read as attributes (a Series' own ``shape`` would shadow them)."""

    __getattr__ = dict.__getitem__


def same(a: object, b: object) -> bool:
    """Equal cells, counting two missing cells as equal."""
    if a is None or b is None or a is pd.NA or b is pd.NA:
        return (a is None or a is pd.NA) and (b is None or b is pd.NA)
    return bool(a == b)


def row(table: pd.DataFrame, checkpointable: str, key: str) -> Row:
    found = table[(table["checkpointable"] == checkpointable) & (table["key"] == key)]
    assert len(found) == 1, (checkpointable, key, list(table["key"]))
    return Row(found.iloc[0].to_dict())


def test_columns_and_dtypes_are_stable(table):
    assert list(table.columns) == LEAF_COLUMNS
    assert {c: str(table[c].dtype) for c in table.columns} == {
        "checkpointable": "string",
        "key": "string",
        "kind": "string",
        "shape": "object",
        "dtype": "string",
        "size": "Int64",
        "nbytes": "Int64",
        "value": "object",
        "sharding": "string",
        "chunk_shape": "object",
    }


def test_every_checkpointable_and_leaf_has_a_row(table, state):
    assert list(dict.fromkeys(table["checkpointable"])) == ["model", "optimizer", "iterator"]
    model_keys = set(table[table["checkpointable"] == "model"]["key"])
    expected = {
        jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_flatten_with_path(
            state["model"], is_leaf=lambda x: x is None
        )[0]
    }
    assert model_keys == expected
    assert "['layers'][11]" in model_keys


def test_arrays_show_shape_dtype_size_chunking_and_sharding(table):
    w = row(table, "model", "['dense']['w']")
    assert (w.kind, w.shape, w.dtype, w.size, w.nbytes) == ("jax.Array", (3, 4), "float32", 12, 48)
    assert w.chunk_shape == (3, 4)
    assert w.sharding == "SingleDeviceSharding(cpu:0)"
    assert w.value is None
    b = row(table, "model", "['dense']['b']")
    assert (b.kind, b.shape, b.dtype, b.nbytes) == ("np.ndarray", (4,), "float32", 16)
    assert pd.isna(b.sharding)
    emb = row(table, "model", "['emb']")
    assert (emb.dtype, emb.nbytes) == ("bfloat16", 20)


def test_scalars_strings_and_none_show_their_stored_values(table):
    step = row(table, "model", "['step']")
    assert (step.kind, step.shape, step.dtype, step.value) == ("scalar", (), "int64", 7)
    assert row(table, "model", "['lr']").value == 0.25
    assert row(table, "model", "['flag']").value is True
    name = row(table, "model", "['name']")
    assert (name.kind, name.value) == ("string", "tiny")
    assert pd.isna(name.dtype) and name.shape is None
    assert row(table, "model", "['nothing']").kind == "empty"


def test_iterator_state_is_shown(table, state):
    it = row(table, "iterator", "")
    assert it.kind == "iterator"
    assert it.value == state["iterator"].get_state()


def test_namedtuple_fields_and_empty_containers_use_orbax_keys(table):
    keys = list(table[table["checkpointable"] == "optimizer"]["key"])
    assert keys == ["[0]['mu']['w']", "[0]['nu']['w']", "[1]"]
    assert row(table, "optimizer", "[1]").kind == "empty"


# Orbax's metadata call can leave a callback for its closed uvloop behind.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_shapes_and_dtypes_agree_with_orbax_own_metadata(v1_path, table):
    metadata = ocp.checkpointables_metadata(v1_path).metadata
    for path, leaf in jax.tree_util.tree_flatten_with_path(metadata["model"])[0]:
        if hasattr(leaf, "shape"):
            r = row(table, "model", toolkit.leaf_key(path))
            assert r.shape == tuple(leaf.shape)
            assert r.dtype == np.dtype(leaf.dtype).name


def test_state_table_of_the_saved_state_joins_row_for_row(table, state):
    live = ex.state_table(state)
    assert list(live.columns) == LEAF_COLUMNS
    joined = table.merge(live, on=["checkpointable", "key"], how="outer", indicator=True)
    assert (joined["_merge"] == "both").all(), joined[joined["_merge"] != "both"]
    for column in ("kind", "shape", "dtype", "size", "nbytes", "sharding"):
        pairs = zip(joined[f"{column}_x"], joined[f"{column}_y"], strict=True)
        differ = [
            (k, a, b) for k, (a, b) in zip(joined["key"], pairs, strict=True) if not same(a, b)
        ]
        assert not differ, (column, differ)
    values = joined[joined["kind_x"].isin(["scalar", "string", "iterator"])]
    assert list(values["value_x"]) == list(values["value_y"])


def test_state_table_accepts_abstract_targets(state):
    target = tc.abstract_restore_target({"model": state["model"]})
    live = ex.state_table(target)
    concrete = ex.state_table({"model": state["model"]})
    pd.testing.assert_frame_equal(
        live.drop(columns="value"), concrete.drop(columns="value"), check_exact=True
    )
    assert row(live, "model", "['dense']['b']").kind == "np.ndarray"
    assert row(live, "model", "['dense']['w']").sharding == "SingleDeviceSharding(cpu:0)"
    sds = ex.state_table({"x": {"a": jax.ShapeDtypeStruct((2, 3), jnp.int8)}})
    assert tuple(sds.iloc[0][["kind", "shape", "dtype", "nbytes"]]) == (
        "jax.Array",
        (2, 3),
        "int8",
        6,
    )


def test_state_table_shows_an_iterator_with_its_state():
    it = iterator(5)
    live = ex.state_table({"data": it, "nested": {"it": it}})
    assert list(live["kind"]) == ["iterator", "iterator"]
    assert list(live["key"]) == ["", "['it']"]
    assert live.iloc[0]["value"] == it.get_state()


def test_state_table_refuses_what_is_not_a_mapping():
    with pytest.raises(TypeError, match="mapping"):
        ex.state_table([1, 2])
    with pytest.raises(TypeError, match="str"):
        ex.state_table({1: 2})
    assert list(ex.state_table({}).columns) == LEAF_COLUMNS


def test_leaf_key_writes_attribute_and_integer_dict_keys_as_orbax_stores_them():
    paths = jax.tree_util.tree_flatten_with_path({0: optimizer_state()[0]})[0]
    assert [toolkit.leaf_key(p) for p, _ in paths] == ["['0']['mu']['w']", "['0']['nu']['w']"]


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    state = {
        "model": {"dense": {"w": jnp.ones((4, 2)), "b": np.zeros(2, np.float32)}},
        "optimizer": (),
        "rng": jax.random.key(3),
        "auxiliary": {"epoch": 2, "note": "warmup"},
        "iterator": iterator(),
    }
    path = tmp_path_factory.mktemp("training") / "ckpt"
    tc.save_training_checkpoint(path, 11, **state).result()
    return path, state


def test_compare_table_of_matching_targets_is_all_ok(training):
    path, state = training
    targets = tc.abstract_restore_target(
        {
            "model": state["model"],
            "optimizer": state["optimizer"],
            "rng": state["rng"],
            "auxiliary": {"step": 0, "state": state["auxiliary"]},
        }
    )
    targets["iterator"] = iterator(0)
    compared = ex.compare_table(path, targets)
    assert list(compared.columns) == [
        "checkpointable",
        "key",
        "status",
        "kind_checkpoint",
        "kind_target",
        "shape_checkpoint",
        "shape_target",
        "dtype_checkpoint",
        "dtype_target",
        "lossy",
    ]
    assert (compared["status"] == "ok").all(), compared
    assert compared["lossy"].isna().all()
    # A typed PRNG key is stored as its key data, and still counts as the same leaf.
    rng = row(compared, "rng", "")
    assert (rng.shape_checkpoint, rng.dtype_checkpoint) == ((2,), "uint32")
    assert (rng.shape_target, rng.dtype_target) == ((), "key<fry>")
    assert row(compared, "optimizer", "").kind_checkpoint == "empty"


def test_compare_table_names_every_difference(training):
    path, state = training
    targets = {
        "model": {
            "dense": {
                "w": jax.ShapeDtypeStruct((2, 4), jnp.float32),
                "b": tc.NumpyTarget((2,), np.float16),
            },
            "extra": np.zeros(3),
        },
        "rng": state["rng"],
        "auxiliary": {"step": "eleven", "state": {"epoch": 2, "note": "warmup"}},
        "missing": {"x": 1},
    }
    compared = ex.compare_table(path, targets)
    status = {(r.checkpointable, r.key): r.status for r in compared.itertuples()}
    assert status[("model", "['dense']['w']")] == "shape differs"
    assert status[("model", "['dense']['b']")] == "dtype cast"
    lossy = {(r.checkpointable, r.key): r.lossy for r in compared.itertuples()}
    assert lossy[("model", "['dense']['b']")] == True  # noqa: E712 (float32 into float16)
    assert status[("model", "['extra']")] == "missing from checkpoint"
    assert status[("auxiliary", "['step']")] == "kind differs"
    assert status[("auxiliary", "['state']['epoch']")] == "ok"
    assert status[("missing", "['x']")] == "missing from checkpoint"
    assert status[("optimizer", "")] == "not in target"
    assert status[("iterator", "")] == "not in target"
    assert status[("rng", "")] == "ok"
    # Stored leaves first, then what only the target has, checkpointable by checkpointable.
    assert list(compared["key"][:3]) == ["['dense']['b']", "['dense']['w']", "['extra']"]


def test_compare_table_counts_jax_and_numpy_arrays_as_one_kind(training):
    path, _ = training
    targets = {"model": {"dense": {"w": np.ones((4, 2), np.float32), "b": jnp.zeros(2)}}}
    compared = ex.compare_table(path, targets)
    model = compared[compared["checkpointable"] == "model"]
    assert (model["status"] == "ok").all(), model


def test_compare_table_refuses_bad_targets(training):
    path, _ = training
    with pytest.raises(TypeError):
        ex.compare_table(path, ["model"])


def test_v1_training_checkpointer_run(tmp_path):
    root = save_v1_run(tmp_path / "run", steps=(0, 5))
    table = ex.checkpoint_table(root / "5")
    assert list(table["checkpointable"]) == ["iterator", "pytree", "pytree"]
    w = row(table, "pytree", "['w']")
    assert (w.shape, w.dtype) == ((2, 2), "int32")
    assert row(table, "pytree", "['step']").value == 5
    assert row(table, "iterator", "").value["next_index"] == 5


def test_v0_checkpoint_manager_run_with_grain(tmp_path):
    root = save_v0_run(tmp_path / "run", steps=(0, 10))
    table = ex.checkpoint_table(root / "10")
    assert set(table["checkpointable"]) == {"model", "data_iter"}
    w = row(table, "model", "['w']")
    # V0 wrote zarr v2 metadata.
    assert (w.kind, w.shape, w.dtype, w.chunk_shape) == ("np.ndarray", (2, 3), "float64", (2, 3))
    assert row(table, "model", "['layer2']").value == 10.0
    assert row(table, "data_iter", "").value["next_index"] == 5


def test_flat_v0_checkpoints_hold_one_unnamed_checkpointable(tmp_path):
    legacy_v0.save_legacy_v0_pytree(tmp_path / "tree", {"a": np.arange(3.0), "b": 2})
    table = ex.checkpoint_table(tmp_path / "tree")
    assert list(table["checkpointable"]) == ["", ""]
    assert row(table, "", "['b']").value == 2
    legacy_v0.save_legacy_v0_grain_iterator(tmp_path / "it", iterator(4))
    it = ex.checkpoint_table(tmp_path / "it")
    assert (it["kind"][0], it["value"][0]["next_index"]) == ("iterator", 4)


def test_checkpoints_without_ocdbt(tmp_path):
    ctx = ocp.Context()
    ctx.array.saving.use_ocdbt = False
    with ctx:
        ocp.save_checkpointables(
            tmp_path / "c", {"m": {"a": {"w": jnp.ones((4, 3))}, "s": 3, "n": "x"}}
        )
    table = ex.checkpoint_table(tmp_path / "c")
    assert row(table, "m", "['a']['w']").shape == (4, 3)
    assert row(table, "m", "['s']").value == 3
    assert row(table, "m", "['n']").value == "x"
    np.testing.assert_array_equal(ex.read_leaf(tmp_path / "c", "m", "['a']['w']"), np.ones((4, 3)))


def test_a_checkpointable_that_is_one_array_has_the_root_key(tmp_path):
    save_v1(tmp_path / "c", {"rng": jax.random.key(0), "x": jnp.arange(3)})
    table = ex.checkpoint_table(tmp_path / "c")
    assert list(table["key"]) == ["", ""]
    np.testing.assert_array_equal(ex.read_leaf(tmp_path / "c", "x", ""), np.arange(3))


def test_bulk_reads_walk_every_level_of_a_deep_ocdbt_tree(tmp_path):
    # Orbax's nodes are large; force a deep tree with small nodes and values out of line.
    spec = {
        "driver": "ocdbt",
        "base": {"driver": "file", "path": str(tmp_path) + "/"},
        "config": {"max_decoded_node_bytes": 200, "max_inline_value_bytes": 16},
    }
    store = ts.KvStore.open(spec).result()
    written = {f"p{i:03d}/zarr.json": (b"v" * (i % 40)) + str(i).encode() for i in range(60)}
    with ts.Transaction() as txn:
        for key, value in written.items():
            store.with_transaction(txn)[key] = value
    base = ts.KvStore.open({"driver": "file", "path": str(tmp_path) + "/"}).result()
    assert ts.ocdbt.dump(base).result()["versions"][-1]["root_height"] > 1
    wanted = [*list(written)[::3], "absent/zarr.json"]
    got = _store.read_values(local(tmp_path), wanted, ocdbt=True, ctx=_store.context())
    assert got == {key: written[key] for key in wanted if key in written}


def test_paths_with_spaces_percent_signs_and_unicode(tmp_path):
    path = save_v1(tmp_path / "a run %20 ü" / "ckpt #1", {"m": {"w": jnp.arange(4.0)}})
    assert ex.checkpoint_table(path)["shape"][0] == (4,)
    np.testing.assert_array_equal(ex.read_leaf(path, "m", "['w']"), np.arange(4.0))
    assert list(ex.list_checkpoints(path.parent)["status"]) == ["complete"]


def test_iterator_states_of_several_processes_and_json_checkpointables(tmp_path):
    import json

    path = save_v1(tmp_path / "c", {"data": iterator(2), "m": {"x": 1}})
    state = ex.read_leaf(path, "data", "")
    (path / "data" / "process_0-of-1.json").rename(path / "data" / "process_0-of-2.json")
    (path / "data" / "process_1-of-2.json").write_text(json.dumps({"next_index": 9}))
    (path / "notes").mkdir()
    (path / "notes" / "data.json").write_text(json.dumps({"lr": [0.1, 0.01]}))
    meta = json.loads((path / "_CHECKPOINT_METADATA").read_text())
    meta["item_handlers"]["notes"] = "orbax.checkpoint.experimental.v1.handlers.JsonHandler"
    (path / "_CHECKPOINT_METADATA").write_text(json.dumps(meta))
    table = ex.checkpoint_table(path)
    # One row per process, keyed by its state file's name.
    data = table[table["checkpointable"] == "data"]
    assert list(data["key"]) == ["['process_0-of-2']", "['process_1-of-2']"]
    assert list(data["kind"]) == ["iterator", "iterator"]
    assert list(data["value"]) == [state, {"next_index": 9}]
    assert ex.read_leaf(path, "data", "['process_1-of-2']") == {"next_index": 9}
    assert ex.read_leaf(path, "data", "") == {
        "process_0-of-2": state,
        "process_1-of-2": {"next_index": 9},
    }
    with pytest.raises(ValueError, match=r"process_0-of-2.*process_1-of-2"):
        ex.read_leaf(path, "data", "['process_2-of-2']")
    notes = row(table, "notes", "")
    assert (notes.kind, notes.value) == ("json", {"lr": [0.1, 0.01]})
    assert ex.read_leaf(path, "notes", "") == {"lr": [0.1, 0.01]}


def test_keys_with_slashes_as_haiku_names_modules(tmp_path):
    params = {"mlp/~/linear_0": {"w": jnp.ones((2, 3))}, "mlp/~/linear_1": {"b": np.zeros(3)}}
    path = save_v1(tmp_path / "c", {"params": params})
    table = ex.checkpoint_table(path)
    assert list(table["key"]) == ["['mlp/~/linear_0']['w']", "['mlp/~/linear_1']['b']"]
    assert list(table["key"]) == list(ex.state_table({"params": params})["key"])
    np.testing.assert_array_equal(
        ex.read_leaf(path, "params", "['mlp/~/linear_0']['w']"), np.ones((2, 3))
    )
