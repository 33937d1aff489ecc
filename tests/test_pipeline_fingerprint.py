"""The input pipeline checked: a save records how Grain describes the pipeline behind
each iterator; a restore into another one is refused naming what differs, unless the
change is allowed; checkpoints saved without a record still restore."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import grain
import jax
import numpy as np
import pytest

import tinax.explore as ex
from tinax._format.naming import names
from tinax.checkpointing import (
    PipelineMismatchError,
    TargetMismatchError,
    TrainingRun,
    allow_pipeline_change,
    load_checkpointables,
    load_training_checkpoint,
    save_checkpointables,
    save_training_checkpoint,
)


def _saved_pipeline() -> grain.IterDataset:
    return grain.MapDataset.range(1000).shuffle(seed=0).batch(4).to_iter_dataset()


def _state() -> tuple[dict, dict, jax.Array, dict]:
    return {"w": np.ones(2, np.float32)}, {}, jax.random.key(0), {"loss": 1.0}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A training checkpoint whose iterator has read three batches."""
    path = tmp_path_factory.mktemp("pipeline") / "ckpt"
    it = iter(_saved_pipeline())
    for _ in range(3):
        next(it)
    save_training_checkpoint(path, 3, *_state(), it).result()
    return path


CHANGED = {
    "batch_size": (
        grain.MapDataset.range(1000).shuffle(seed=0).batch(8),
        "saved BatchMapDataset(batch_size=4, drop_remainder=False), "
        "now BatchMapDataset(batch_size=8, drop_remainder=False)",
    ),
    "no shuffle": (
        grain.MapDataset.range(1000).batch(4),
        "saved ShuffleMapDataset(seed=0), now none",
    ),
    "another seed": (
        grain.MapDataset.range(1000).shuffle(seed=1).batch(4),
        "saved ShuffleMapDataset(seed=0), now ShuffleMapDataset(seed=1)",
    ),
    "a map added": (
        grain.MapDataset.range(1000).shuffle(seed=0).map(lambda x: x * 2).batch(4),
        "added MapMapDataset(transform=<lambda>)",
    ),
    "another source": (
        grain.MapDataset.range(2000).shuffle(seed=0).batch(4),
        "saved RangeMapDataset(start=0, stop=1000, step=1), "
        "now RangeMapDataset(start=0, stop=2000, step=1)",
    ),
}


@pytest.mark.parametrize("change", sorted(CHANGED))
def test_a_restore_into_another_pipeline_is_refused_naming_what_differs(saved, change):
    dataset, said = CHANGED[change]
    iterator = iter(dataset.to_iter_dataset())
    with pytest.raises(PipelineMismatchError) as refused:
        load_training_checkpoint(saved, *_state(), iterator)
    message = str(refused.value)
    assert said in message and str(saved) in message
    assert "allow_pipeline_change()" in message
    # A target mismatch like any other (ValueError and KeyError), raised before the
    # iterator was touched: it still starts at the first batch.
    assert isinstance(refused.value, TargetMismatchError)
    first = next(iter(dataset.to_iter_dataset()))
    np.testing.assert_array_equal(next(iterator), first)


def test_the_same_pipeline_restores_and_a_deliberate_change_is_allowed(saved):
    restored = load_training_checkpoint(saved, *_state(), iter(_saved_pipeline()))
    expected = list(_saved_pipeline())[3]
    np.testing.assert_array_equal(next(restored.iterator), expected)
    # Rebuilt in another script, a lambda written elsewhere: the same pipeline.
    again = grain.MapDataset.range(1000).shuffle(seed=0).batch(4).to_iter_dataset()
    assert load_training_checkpoint(saved, *_state(), iter(again)).step == 3
    bigger = grain.MapDataset.range(1000).shuffle(seed=0).batch(8).to_iter_dataset()
    with allow_pipeline_change():
        moved = load_training_checkpoint(saved, *_state(), iter(bigger))
    assert next(moved.iterator).shape == (8,)
    with (
        allow_pipeline_change(),
        allow_pipeline_change(False),
        pytest.raises(PipelineMismatchError),
    ):
        load_training_checkpoint(saved, *_state(), iter(bigger))
    with pytest.raises(TypeError, match="allow must be a bool"), allow_pipeline_change(1):  # type: ignore[arg-type]
        pass


def test_training_run_restore_refuses_it_without_setting_anything_aside(tmp_path):
    it = iter(_saved_pipeline())
    with TrainingRun(tmp_path / "r", save_every=1) as run:
        for step in (1, 2):
            next(it)
            run.save(step, *_state(), it)
    with TrainingRun(tmp_path / "r", handle_sigterm=False) as run:
        other = iter(grain.MapDataset.range(1000).batch(4).to_iter_dataset())
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "skipping checkpoint" warning either
            with pytest.raises(PipelineMismatchError, match="ShuffleMapDataset"):
                run.restore(*_state(), other)
        assert run.steps == [1, 2]  # nothing set aside: the checkpoints are sound
        with allow_pipeline_change():
            assert run.restore(*_state(), other).step == 2


def test_checkpoints_without_a_record_still_restore(saved, tmp_path):
    # As an older tinax wrote them: no record in _CHECKPOINT_METADATA.
    old = tmp_path / "old"
    import shutil

    shutil.copytree(saved, old)
    meta_file = old / names.CHECKPOINT_METADATA
    meta = json.loads(meta_file.read_text())
    del meta["custom_metadata"][names.PIPELINES]
    meta_file.write_text(json.dumps(meta))
    other = iter(grain.MapDataset.range(1000).batch(8).to_iter_dataset())
    assert load_training_checkpoint(old, *_state(), other).step == 3
    assert ex.checkpoint_table(old).attrs["pipelines"] == {}


def test_load_checkpointables_checks_iterators_too_and_explore_reads_the_record(tmp_path):
    it = iter(grain.MapDataset.range(50).shuffle(seed=3).to_iter_dataset())
    save_checkpointables(tmp_path / "c", {"data": it, "w": {"x": np.zeros(2)}}).result()
    pipelines = ex.checkpoint_table(tmp_path / "c").attrs["pipelines"]
    assert pipelines == {
        "data": ("RangeMapDataset(start=0, stop=50, step=1)", "ShuffleMapDataset(seed=3)")
    }
    with pytest.raises(PipelineMismatchError, match="stop=50, step=1\\), now"):
        load_checkpointables(
            tmp_path / "c", {"data": iter(grain.MapDataset.range(60).to_iter_dataset())}
        )
    restored = load_checkpointables(
        tmp_path / "c", {"data": iter(grain.MapDataset.range(50).shuffle(seed=3).to_iter_dataset())}
    )
    assert isinstance(restored["data"], grain.DatasetIterator)
