"""tinax.explore.list_checkpoints on Orbax runs, with temporaries and broken checkpoints."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest
from explore_fixtures import save_v0_run, save_v1, save_v1_run

import tinax.explore as ex
from tinax._format.naming import names as _layout
from tinax.explore import toolkit

LISTING_COLUMNS = [
    "name",
    "path",
    "step",
    "status",
    "checkpointables",
    "nbytes",
    "committed",
    "age",
    "integrity",
    "health",
    "health_reason",
    "nan",
    "inf",
]


def test_v1_training_checkpointer_run(tmp_path):
    root = save_v1_run(tmp_path / "run", steps=(0, 5, 10))
    listing = ex.list_checkpoints(root)
    assert list(listing.columns) == LISTING_COLUMNS
    assert {c: str(listing[c].dtype) for c in listing.columns} == {
        "name": "string",
        "path": "string",
        "step": "Int64",
        "status": "string",
        "checkpointables": "object",
        "nbytes": "Int64",
        "committed": "datetime64[ns, UTC]",
        "age": "timedelta64[ns]",
        "integrity": "string",
        "health": "string",
        "health_reason": "string",
        "nan": "Int64",
        "inf": "Int64",
    }
    assert list(listing["step"]) == [0, 5, 10]
    # Sound; no data read and no metric logged: whether it can be resumed is not known.
    assert list(listing["integrity"]) == ["sound"] * 3
    assert list(listing["health"]) == ["not yet known"] * 3 and listing["nan"].isna().all()
    assert list(listing["status"]) == ["complete"] * 3
    assert list(listing["checkpointables"]) == [("iterator", "pytree")] * 3
    assert listing["path"][1] == str(root / "5")
    assert listing.attrs["errors"] == {}


def test_v0_checkpoint_manager_run(tmp_path):
    root = save_v0_run(tmp_path / "run", steps=(0, 10))
    listing = ex.list_checkpoints(root)
    assert list(listing["name"]) == ["0", "10"]
    assert list(listing["status"]) == ["complete", "complete"]
    assert set(listing["checkpointables"][0]) == {"model", "data_iter"}


def test_size_and_commit_time_come_from_disk(tmp_path):
    path = save_v1(tmp_path / "ckpt", {"model": {"w": np.ones((32, 32), np.float32)}})
    listing = ex.list_checkpoints(path)
    assert list(listing["name"]) == ["ckpt"]
    assert pd.isna(listing["step"][0])
    files = [p for p in path.rglob("*") if p.is_file()]
    assert listing["nbytes"][0] == sum(p.stat().st_size for p in files)
    meta = json.loads((path / "_CHECKPOINT_METADATA").read_text())
    committed = pd.Timestamp(meta["commit_timestamp_nsecs"], unit="ns", tz="UTC")
    assert listing["committed"][0] == committed


def test_temporaries_are_in_progress_and_broken_ones_invalid_beside_the_rest(tmp_path):
    root = save_v1_run(tmp_path / "run", steps=(0, 5, 10))
    (root / "5" / "pytree" / "_METADATA").write_text('{"tree_metadata": {')
    tmp = root / "15.orbax-checkpoint-tmp-1234"
    (tmp / "pytree").mkdir(parents=True)
    (tmp / "pytree" / "partial").write_bytes(b"x" * 10)
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("not a checkpoint")
    listing = ex.list_checkpoints(root, deep=True)
    assert list(listing["name"]) == ["0", "5", "10", tmp.name]
    assert list(listing["status"]) == ["complete", "invalid", "complete", "in progress"]
    assert list(listing["step"]) == [0, 5, 10, 15]
    assert listing["checkpointables"][3] == ("pytree",)
    assert listing["nbytes"][3] == 10
    assert pd.isna(listing["committed"][3])
    errors = listing.attrs["errors"]
    assert list(errors) == [str(root / "5")]
    assert "_METADATA" in errors[str(root / "5")]


def test_sorted_by_step_then_name(tmp_path):
    for name in ("b_2", "a_2", "10", "9", "ckpt_latest"):
        save_v1(tmp_path / name, {"x": {"v": 1}})
    listing = ex.list_checkpoints(tmp_path)
    assert list(listing["name"]) == ["a_2", "b_2", "9", "10", "ckpt_latest"]
    assert list(listing["step"])[:4] == [2, 2, 9, 10]


def test_a_verdict_is_not_kept_once_the_checkpoint_changes(tmp_path):
    root = save_v1_run(tmp_path / "run", steps=(1,))
    assert list(ex.list_checkpoints(root, deep=True)["status"]) == ["complete"]
    iterator_file = next((root / "1" / "iterator").glob("process_*.json"))
    iterator_file.write_text("not json")
    assert list(ex.list_checkpoints(root, deep=True)["status"]) == ["invalid"]


def test_links_under_the_root_are_not_followed(tmp_path):
    elsewhere = save_v1(tmp_path / "elsewhere", {"x": {"v": 1}})
    root = tmp_path / "run"
    root.mkdir()
    save_v1(root / "1", {"x": {"v": 1}})
    os.symlink(elsewhere, root / "2")
    listing = ex.list_checkpoints(root)
    assert list(listing["name"]) == ["1"]


def test_an_empty_run_has_no_rows(tmp_path):
    listing = ex.list_checkpoints(tmp_path)
    assert listing.empty
    assert list(listing.columns) == LISTING_COLUMNS


def test_refuses_missing_and_non_directories(tmp_path):
    with pytest.raises(FileNotFoundError):
        ex.list_checkpoints(tmp_path / "absent")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        ex.list_checkpoints(tmp_path / "file")
    with pytest.raises(TypeError):
        ex.list_checkpoints(3)


@pytest.mark.parametrize(
    ("name", "temporary"),
    [
        ("7.orbax-checkpoint-tmp", True),
        ("7.orbax-checkpoint-tmp-123", True),
        ("step_7.orbax-checkpoint-tmp-99", True),
        ("7.orbax-checkpoint-tmp-x", False),
        ("7", False),
        ("orbax-checkpoint-tmp", False),
        ("7.orbax-checkpoint-tmp.bak", False),
    ],
)
def test_temporary_names_are_recognised_in_listings(name, temporary):
    assert _layout.is_temporary_name(name) is temporary


def test_step_from_name():
    assert _layout.step_from_name("000120") == 120
    assert _layout.step_from_name("ckpt_42") == 42
    assert _layout.step_from_name("step-42") == 42
    assert _layout.step_from_name("42.orbax-checkpoint-tmp-1") == 42
    assert _layout.step_from_name("final") is None


def test_a_checkpoint_copied_elsewhere_is_read_afresh(tmp_path):
    path = save_v1(tmp_path / "a", {"x": {"v": 1}})
    assert list(ex.list_checkpoints(path, deep=True)["status"]) == ["complete"]
    shutil.copytree(path, tmp_path / "b")
    (tmp_path / "b" / "x" / "_METADATA").write_text("[")
    assert list(ex.list_checkpoints(tmp_path / "b", deep=True)["status"]) == ["invalid"]
    assert list(ex.list_checkpoints(path, deep=True)["status"]) == ["complete"]


def test_root_that_is_itself_a_broken_checkpoint_is_listed_invalid(tmp_path):
    path = save_v1(tmp_path / "a", {"x": {"v": 1}})
    (path / "_CHECKPOINT_METADATA").write_text("{")
    listing = ex.list_checkpoints(path)
    assert list(listing["status"]) == ["invalid"]
    assert str(path) in listing.attrs["errors"]


def test_paths_with_dotdot_components(tmp_path, monkeypatch):
    from tinax.checkpointing import save_checkpointables
    from tinax.explore import checkpoint_table, list_checkpoints, read_leaf

    (tmp_path / "run").mkdir()
    (tmp_path / "elsewhere").mkdir()
    save_checkpointables(tmp_path / "run" / "step-1", {"m": {"x": np.arange(4.0)}}).result()
    monkeypatch.chdir(tmp_path / "elsewhere")
    listing = list_checkpoints("../run")
    assert list(listing["status"]) == ["complete"]
    table = checkpoint_table("../run/step-1")
    assert list(table["key"]) == ["['x']"]
    np.testing.assert_array_equal(read_leaf("../run/step-1", "m", "['x']"), np.arange(4.0))


def test_the_listing_cache_can_be_bounded_cleared_and_bypassed(tmp_path, monkeypatch):
    for step in range(3):
        save_v1(tmp_path / f"step_{step}", {"m": {"w": np.full(2, step)}})
    cache = toolkit.ListingCache(max_entries=2)
    assert list(ex.list_checkpoints(tmp_path, cache=cache, deep=True)["status"]) == ["complete"] * 3
    assert len(cache) == 2  # bounded: the oldest verdict went
    cache.max_entries = 1
    assert len(cache) == 1
    cache.clear()
    assert len(cache) == 0

    reads = []
    from tinax.explore import _listing

    real = _listing._metadata_problem
    monkeypatch.setattr(_listing, "_metadata_problem", lambda c: reads.append(c) or real(c))
    cache = toolkit.ListingCache()
    ex.list_checkpoints(tmp_path, cache=cache, deep=True)
    ex.list_checkpoints(tmp_path, cache=cache, deep=True)
    assert len(reads) == 3  # the second listing reused every verdict
    ex.list_checkpoints(tmp_path, cache=None, deep=True)
    assert len(reads) == 6  # no cache: every checkpoint read again
    with pytest.raises(ValueError):
        toolkit.ListingCache(max_entries=-1)
    with pytest.raises(TypeError):
        ex.list_checkpoints(tmp_path, cache={})


def test_a_quick_listing_reads_commit_records_only_and_names_what_it_left_unchecked(
    tmp_path, monkeypatch
):
    for step in range(2):
        save_v1(tmp_path / f"step_{step}", {"m": {"w": np.full(2, step)}})
    (tmp_path / "step_1" / "m" / "_METADATA").write_text('{"tree_metadata": {')
    from tinax._format.integrity import preflight

    checked = []
    real = preflight.check
    monkeypatch.setattr(
        preflight, "check", lambda path, *scan: checked.append(path) or real(path, *scan)
    )
    cache = toolkit.ListingCache()
    quick = ex.list_checkpoints(tmp_path, cache=cache)
    assert checked == []
    assert list(quick["status"]) == ["complete", "complete"]
    assert quick.attrs["unchecked"] == [str(tmp_path / "step_0"), str(tmp_path / "step_1")]
    assert list(quick["checkpointables"]) == [("m",), ("m",)]
    assert list(quick["committed"].notna()) == [True, True]
    full = ex.list_checkpoints(tmp_path, deep=False, cache=None)
    assert quick[["name", "nbytes", "committed"]].equals(full[["name", "nbytes", "committed"]])

    deep = ex.list_checkpoints(tmp_path, cache=cache, deep=True)
    assert list(deep["status"]) == ["complete", "invalid"] and deep.attrs["unchecked"] == []
    assert "_METADATA" in deep.attrs["errors"][str(tmp_path / "step_1")]
    assert len(checked) == 2
    # Remembered: a deep listing again reads nothing it read before.
    again = ex.list_checkpoints(tmp_path, cache=cache, deep=True)
    assert list(again["status"]) == ["complete", "invalid"] and again.attrs["unchecked"] == []
    assert len(checked) == 2
    # A quick listing tells what it can from the commit records alone, and says so.
    assert ex.list_checkpoints(tmp_path, cache=cache).attrs["unchecked"] == quick.attrs["unchecked"]
    with pytest.raises(TypeError, match="deep"):
        ex.list_checkpoints(tmp_path, deep="yes")
    assert not hasattr(ex, "listing_cache")  # no cache but the caller's own


def test_a_quick_listing_still_refuses_what_it_cannot_read(tmp_path):
    save_v1(tmp_path / "good", {"m": {"w": np.zeros(2)}})
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "_CHECKPOINT_METADATA").write_text("{not json")
    listing = ex.list_checkpoints(tmp_path, deep=False, cache=None)
    assert dict(zip(listing["name"], listing["status"], strict=True)) == {
        "broken": "invalid",
        "good": "complete",
    }
    assert "_CHECKPOINT_METADATA" in listing.attrs["errors"][str(broken)]


def test_a_remembered_verdict_lists_the_same_row_as_a_fresh_read(tmp_path):
    root = save_v1_run(tmp_path / "run", steps=(0, 5))
    (root / "5" / "pytree" / "_METADATA").write_text('{"tree_metadata": {')
    cache = toolkit.ListingCache()
    for deep in (True, False):
        fresh = ex.list_checkpoints(root, deep=deep)
        kept = ex.list_checkpoints(root, cache=cache, deep=deep)
        kept = ex.list_checkpoints(root, cache=cache, deep=deep)  # remembered
        assert kept.drop(columns="age").equals(fresh.drop(columns="age"))
        assert kept.attrs["errors"] == fresh.attrs["errors"]


def test_array_metadata_read_together_is_judged_checkpoint_by_checkpoint(tmp_path):
    # The deep listing reads every checkpoint's array store at once: damage to one
    # store must mark that checkpoint alone, in its own words.
    for step in range(5):
        save_v1(tmp_path / f"step_{step}", {"m": {"w": np.full(3, step), "b": np.zeros(2)}})
    meta_file = tmp_path / "step_1" / "m" / "_METADATA"
    meta = json.loads(meta_file.read_text())
    (name, entry), *_ = meta["tree_metadata"].items()
    ghost = json.loads(json.dumps(entry))
    ghost["key_metadata"][-1]["key"] = "ghost"
    meta["tree_metadata"][name.replace(entry["key_metadata"][-1]["key"], "ghost")] = ghost
    meta_file.write_text(json.dumps(meta))
    for data in (tmp_path / "step_3" / "m").rglob("d/*"):
        data.unlink()
    listing = ex.list_checkpoints(tmp_path, cache=None, deep=True)
    statuses = dict(zip(listing["name"], listing["status"], strict=True))
    assert statuses == {
        "step_0": "complete",
        "step_1": "invalid",
        "step_2": "complete",
        "step_3": "invalid",
        "step_4": "complete",
    }
    errors = listing.attrs["errors"]
    assert set(errors) == {str(tmp_path / "step_1"), str(tmp_path / "step_3")}
    assert "ghost" in errors[str(tmp_path / "step_1")]
    assert str(tmp_path / "step_3") in errors[str(tmp_path / "step_3")]
    # Each verdict is the one a listing of that checkpoint alone gives.
    for step in (1, 3):
        alone = ex.list_checkpoints(tmp_path / f"step_{step}", cache=None, deep=True)
        assert alone.attrs["errors"] == {
            str(tmp_path / f"step_{step}"): errors[str(tmp_path / f"step_{step}")]
        }


def test_a_listing_of_unchanged_checkpoints_reads_no_file_again(tmp_path, monkeypatch):
    from tinax._format.storage import files

    for step in range(3):
        save_v1(tmp_path / f"step_{step}", {"m": {"w": np.full(2, step)}})
    cache = toolkit.ListingCache()
    first = ex.list_checkpoints(tmp_path, cache=cache, deep=True)
    ex.list_checkpoints(tmp_path, cache=cache)
    reads = []
    real = files.read_listed_bytes
    monkeypatch.setattr(
        files,
        "read_listed_bytes",
        lambda path, entry, **kw: reads.append(path) or real(path, entry, **kw),
    )
    for deep in (True, False):
        again = ex.list_checkpoints(tmp_path, cache=cache, deep=deep)
        assert again.drop(columns="age").equals(first.drop(columns="age"))
    assert reads == []
    (tmp_path / "step_1" / "m" / "_METADATA").write_text("{")
    changed = ex.list_checkpoints(tmp_path, cache=cache, deep=True)
    assert list(changed["status"]) == ["complete", "invalid", "complete"]
    # Only the changed checkpoint is read again.
    assert reads and all(str(path).startswith(str(tmp_path / "step_1")) for path in reads)


def _damage_store(checkpoint, how):
    """Damages the array store of ``checkpoint``'s checkpointable ``m``."""
    store = checkpoint / "m"
    data = sorted(p for p in store.rglob("*") if p.is_file() and p.parent.name == "d")
    manifests = sorted(store.rglob("manifest.ocdbt"))
    if how == "data files gone":
        for path in data:
            path.unlink()
    elif how == "data garbled":
        for path in data:
            path.write_bytes(b"\x00" * path.stat().st_size)
    elif how == "manifests garbled":
        for path in manifests:
            path.write_bytes(b"not a manifest")


@pytest.mark.parametrize("how", ["data files gone", "data garbled", "manifests garbled"])
def test_a_listing_calls_complete_what_a_table_reads_whatever_the_store_holds(tmp_path, how):
    # One leaf (its store looked up) and many (walked), each healthy beside a damaged copy.
    few = {"w": np.arange(3.0)}
    many = {f"w{i}": np.full(2, i) for i in range(12)}
    for name, tree in (("few", few), ("many", many)):
        save_v1(tmp_path / f"{name}_1", {"m": tree})
        shutil.copytree(tmp_path / f"{name}_1", tmp_path / f"{name}_2")
        _damage_store(tmp_path / f"{name}_2", how)
    listing = ex.list_checkpoints(tmp_path, cache=None, deep=True)
    readable = {}
    for path in listing["path"]:
        try:
            ex.checkpoint_table(path)
            readable[str(path)] = True
        except ValueError:
            readable[str(path)] = False
    statuses = dict(zip(listing["path"], listing["status"], strict=True))
    assert {p: s == "complete" for p, s in statuses.items()} == readable
    assert statuses[str(tmp_path / "few_1")] == statuses[str(tmp_path / "many_1")] == "complete"
    assert statuses[str(tmp_path / "few_2")] == statuses[str(tmp_path / "many_2")] == "invalid"
