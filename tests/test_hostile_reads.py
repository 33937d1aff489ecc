"""Reads that cannot be fooled: claims checked before decoding, checksums that cannot be
stripped, verify as strict as a load, diff_table that checks what it reads, and saves
that refuse what they cannot give back."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts
from explore_fixtures import chunk_locations

import tinax.explore as ex
from tinax import checkpointing as ck
from tinax._format.metadata import budget
from tinax._format.naming import words

KEY = "['dense']['w']"


def _state(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "model": {
            "dense": {"w": jnp.asarray(rng.standard_normal((64, 32)), jnp.float32)},
            "b": rng.standard_normal(8).astype(np.float32),
            "name": "tiny",
            "step": 3,
        }
    }


def _targets() -> dict:
    return {k: ck.abstract_restore_target(v) for k, v in _state().items()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "base"
    ck.save_checkpointables(path, _state()).result()
    return path


def _copy(saved: Path, tmp_path: Path, name: str = "step_1") -> Path:
    dest = tmp_path / "run" / name
    shutil.copytree(saved, dest)
    return dest


def _rewrite_zarr(path: Path, param: str, edit) -> None:
    store = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{path / 'model'}"}).result()
    meta = json.loads(store.read(f"{param}/zarr.json").result().value)
    edit(meta)
    store.write(f"{param}/zarr.json", json.dumps(meta).encode()).result()


def _flip_data(path: Path) -> None:
    file, offset, length = chunk_locations(path / "model")[0]
    with open(file, "r+b") as f:
        f.seek(offset + length // 2)
        byte = f.read(1)
        f.seek(offset + length // 2)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_claims_beyond_memory_or_a_decodable_chunk_are_impossible():
    assert budget.claim_problem((10**6, 10**6), 4, None, max_array_bytes=1 << 30)
    assert budget.claim_problem((64, 64), 4, (10**6, 10**6), max_chunk_bytes=1 << 30)
    assert budget.claim_problem((64, 64), 4, (64,))  # a chunk of another rank
    assert budget.claim_problem((64, 64), 4, (64, 64)) is None
    assert budget.stored_problem(1000, 999) and budget.stored_problem(1000, 1000) is None


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.update(shape=[10**6, 10**6]),
        lambda m: m["codecs"][0]["configuration"].update(chunk_shape=[10**6, 10**6]),
        lambda m: m.update(shape=[64, 32_000]),  # a thousand times its stored bytes
    ],
    ids=["shape", "chunk", "shape beyond its bytes"],
)
def test_a_memory_bomb_is_a_clean_error_on_every_read_path(saved, tmp_path, edit):
    path = _copy(saved, tmp_path)
    _rewrite_zarr(path, "dense.w", edit)
    calls = [
        lambda: ck.load_checkpointables(path, _targets()),
        lambda: ex.read_leaf(path, "model", KEY),
        lambda: ex.checkpoint_table(path),
        lambda: ex.diff_table(saved, path),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="dense.w") as info:
            call()
        assert str(path) in str(info.value)
    result = ex.verify(path, data=True)
    assert not result.ok and "dense.w" in result.verdict


def test_stripped_checksums_are_corruption_for_a_tinax_save(saved, tmp_path):
    path = _copy(saved, tmp_path)
    shutil.rmtree(path / "model" / "tinax_checksums")
    _flip_data(path)
    with pytest.raises(ck.CorruptDataError, match="lost the checksums"):
        ck.load_checkpointables(path, _targets())
    with pytest.raises(ck.CorruptDataError):
        ex.checkpoint_table(path)
    result = ex.verify(path)
    assert not result.ok and "lost the checksums" in result.verdict


def test_one_leaf_stripped_from_the_record_is_corruption(saved, tmp_path):
    path = _copy(saved, tmp_path)
    (record,) = (path / "model" / "tinax_checksums").glob("*.json")
    document = json.loads(record.read_bytes())
    del document["leaves"][KEY]
    record.write_text(json.dumps(document))
    with pytest.raises(ck.CorruptDataError, match=r"\['dense'\]\['w'\] has no checksum"):
        ck.load_checkpointables(path, _targets())


def test_checkpoints_orbax_wrote_keep_loading_without_checksums(tmp_path):
    from orbax.checkpoint import v1 as ocp

    path = tmp_path / "orbax"
    ocp.save_checkpointables(path, _state())
    loaded = ck.load_checkpointables(path, _targets())
    assert np.array_equal(loaded["model"]["b"], _state()["model"]["b"])
    assert ex.verify(path, data=True).ok


def test_verify_refuses_what_a_load_refuses(saved, tmp_path):
    path = _copy(saved, tmp_path)
    (path / "model" / "_sharding").write_bytes(b'{"truncated')
    with pytest.raises(ValueError, match="_sharding"):
        ck.load_checkpointables(path, _targets())
    result = ex.verify(path, data=True)
    assert not result.ok and "_sharding" in " ".join(
        result.errors["part"] + result.errors["message"]
    )


def test_verify_refuses_a_huge_sparse_manifest_without_reading_it(saved, tmp_path):
    path = _copy(saved, tmp_path)
    with open(path / "model" / "manifest.ocdbt", "r+b") as f:
        f.truncate(50 << 30)
    result = ex.verify(path, data=True)
    assert not result.ok and "manifest.ocdbt" in result.verdict


def test_a_nesting_bomb_in_metadata_is_a_clean_error(saved, tmp_path):
    path = _copy(saved, tmp_path)
    (path / "model" / "_METADATA").write_bytes(b'{"a":' * 100_000 + b"1" + b"}" * 100_000)
    with pytest.raises(ValueError, match="_METADATA"):
        ck.load_checkpointables(path, _targets())
    assert not ex.verify(path).ok


def test_diff_marks_corrupt_leaves_and_decides_equal_checksums_without_reading(saved, tmp_path):
    same = _copy(saved, tmp_path, "step_0")
    damaged = _copy(saved, tmp_path, "step_1")
    _flip_data(damaged)
    rows = {r.key: r for r in ex.diff_table(same, damaged).itertuples()}
    # Their saved checksums agree: same, without reading (verify reads and finds it).
    assert rows[KEY].status == words.SAME
    assert rows[KEY].decided_by == "checksum" and not rows[KEY].decoded
    assert not ex.verify(damaged, data=True).ok
    other = tmp_path / "run" / "other"
    ck.save_checkpointables(other, _state(seed=1)).result()
    _flip_data(other)
    rows = {r.key: r for r in ex.diff_table(same, other).itertuples()}
    assert rows[KEY].status == words.CORRUPT and rows[KEY].decided_by == "data"
    assert rows["['b']"].status == words.CHANGED


def test_diff_marks_a_damaged_string_corrupt(saved, tmp_path):
    same = _copy(saved, tmp_path, "step_0")
    damaged = _copy(saved, tmp_path, "step_1")
    strings = damaged / "model" / "_strings.json"
    strings.write_text(strings.read_text().replace("tiny", "tinx"))
    rows = {r.key: r for r in ex.diff_table(same, damaged).itertuples()}
    assert rows["['name']"].status == words.CORRUPT
    with pytest.raises(ck.CorruptDataError, match="name"):
        ex.checkpoint_table(damaged)


@pytest.mark.parametrize(
    ("tree", "error", "words_"),
    [
        ({"a.b": 1.0, "a": {"b": 2.0}}, ValueError, "both be stored as 'a.b'"),
        ({1.5: 1.0}, TypeError, "dict key 1.5 is a float"),
        ({"": 1.0}, ValueError, "empty dict key"),
        ({"a": np.zeros((0, 3))}, ValueError, "without elements"),
        # What os.fsdecode makes of a file name's undecodable byte.
        (
            {"w": np.ones(2), "path": ["ok", "r\udcfcn"]},
            ValueError,
            r"leaf \['path'\]\[1\] is a string with a lone surrogate \('\\udcfc' at position 1\)",
        ),
    ],
    ids=["colliding keys", "float key", "empty key", "empty array", "lone surrogate"],
)
def test_saves_refuse_what_they_cannot_give_back(tmp_path, tree, error, words_):
    path = tmp_path / "c"
    with pytest.raises(error, match=words_):
        ck.save_checkpointables(path, {"m": tree})
    assert not path.exists() and os.listdir(tmp_path) == []


def test_a_step_beyond_int64_is_refused(tmp_path):
    with pytest.raises(ValueError, match="64-bit"):
        ck.save_training_checkpoint(tmp_path / "t", 2**63, {"w": np.ones(2)}, {}, None, {}, None)
    assert os.listdir(tmp_path) == []


def test_integer_dict_keys_of_flax_nnx_round_trip(tmp_path):
    state = {"m": {"layers": {0: np.ones(2, np.float32), 1: np.zeros(2, np.float32)}}}
    ck.save_checkpointables(tmp_path / "c", state).result()
    loaded = ck.load_checkpointables(tmp_path / "c", {"m": ck.abstract_restore_target(state["m"])})
    assert list(loaded["m"]["layers"]) == [0, 1]


def test_verify_of_a_run_says_it_is_a_run(saved, tmp_path):
    _copy(saved, tmp_path, "step_1")
    _copy(saved, tmp_path, "step_2")
    result = ex.verify(tmp_path / "run")
    assert not result.ok
    assert "a run of 2 checkpoints (step_1, step_2), not a checkpoint" in result.verdict


def test_a_full_disk_names_the_destination_once():
    import errno

    from tinax.checkpointing import _failures

    failure = _failures.save_failure("/data/run/step_1", OSError(errno.ENOSPC, "full"))
    assert isinstance(failure, OSError) and failure.errno == errno.ENOSPC
    assert str(failure).count("/data/run/step_1") == 1
