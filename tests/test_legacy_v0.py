"""tinax.checkpointing.legacy.v0 on real Orbax V0 checkpoints."""

import os

import grain
import numpy as np
import orbax.checkpoint as ocp0
import pytest

from tinax._paths import location
from tinax.checkpointing.legacy.v0 import (
    load_legacy_v0_grain_iterator,
    load_legacy_v0_pytree,
    save_legacy_v0_grain_iterator,
    save_legacy_v0_pytree,
)


def _iterator(skip=0):
    it = iter(grain.MapDataset.range(100).shuffle(seed=3).to_iter_dataset())
    for _ in range(skip):
        next(it)
    return it


def test_pytree_round_trip_with_and_without_target(root):
    """On local disk, then on gs://."""
    state = {"w": np.arange(6.0).reshape(2, 3), "n": 4, "name": "x"}
    save_legacy_v0_pytree(f"{root}/p", state)
    assert location(f"{root}/p/_METADATA").is_file()
    plain = load_legacy_v0_pytree(f"{root}/p")
    np.testing.assert_array_equal(plain["w"], state["w"])
    assert plain["n"] == 4 and plain["name"] == "x"
    targeted = load_legacy_v0_pytree(f"{root}/p", {"w": np.zeros((2, 3)), "n": 0, "name": ""})
    np.testing.assert_array_equal(targeted["w"], state["w"])


def test_pytree_saves_are_immutable_and_paths_checked(tmp_path):
    save_legacy_v0_pytree(tmp_path / "p", {"a": 1})
    with pytest.raises(FileExistsError):
        save_legacy_v0_pytree(tmp_path / "p", {"a": 2})
    assert load_legacy_v0_pytree(tmp_path / "p") == {"a": 1}
    with pytest.raises(ValueError, match="temporary suffix"):
        save_legacy_v0_pytree(tmp_path / "q.orbax-checkpoint-tmp-12", {"a": 1})
    with pytest.raises(ValueError, match="temporary suffix"):
        load_legacy_v0_pytree(tmp_path / "q.orbax-checkpoint-tmp")
    with pytest.raises(FileNotFoundError):
        load_legacy_v0_pytree(tmp_path / "missing")
    assert sorted(os.listdir(tmp_path)) == ["p"]


def test_grain_iterator_round_trip(root):
    """On local disk, then on gs://."""
    it = _iterator(skip=11)
    save_legacy_v0_grain_iterator(f"{root}/i", it)
    assert location(f"{root}/i/process_0-of-1.json").is_file()
    fresh = _iterator()
    restored = load_legacy_v0_grain_iterator(f"{root}/i", fresh)
    assert restored is fresh
    assert [next(restored) for _ in range(5)] == [next(it) for _ in range(5)]


def test_grain_iterator_errors(tmp_path):
    with pytest.raises(TypeError, match="grain.DatasetIterator"):
        save_legacy_v0_grain_iterator(tmp_path / "i", iter(range(3)))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="temporary suffix"):
        save_legacy_v0_grain_iterator(tmp_path / "i.orbax-checkpoint-tmp", _iterator())
    assert os.listdir(tmp_path) == []
    save_legacy_v0_grain_iterator(tmp_path / "i", _iterator())
    with pytest.raises(TypeError, match="grain.DatasetIterator"):
        load_legacy_v0_grain_iterator(tmp_path / "i", [1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="temporary suffix"):
        load_legacy_v0_grain_iterator(tmp_path / "i.orbax-checkpoint-tmp-1/.", _iterator())


def test_reads_a_checkpoint_manager_run_with_grain_checkpoint_save(tmp_path):
    """The layout of Grain's own example: a Composite of StandardSave and CheckpointSave."""
    weights = {"layer1": np.ones(3), "layer2": 2.0}
    it = _iterator(skip=10)
    with ocp0.CheckpointManager(tmp_path / "run") as manager:
        manager.save(
            step=0,
            args=ocp0.args.Composite(
                model=ocp0.args.StandardSave(weights),
                data_iter=grain.checkpoint.CheckpointSave(item=it),
            ),
        )
    step_dir = tmp_path / "run" / "0"
    model = load_legacy_v0_pytree(step_dir / "model")
    np.testing.assert_array_equal(model["layer1"], weights["layer1"])
    fresh = load_legacy_v0_grain_iterator(step_dir / "data_iter", _iterator())
    assert next(fresh) == next(it)
