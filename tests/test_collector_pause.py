"""Loads and saves pause Python's cyclic garbage collector while they run, and restore it after."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grain
import jax.numpy as jnp
import numpy as np
import pytest
from orbax.checkpoint import v1 as ocp
from test_checkpointables import _FailingWriter

from tinax._format.storage import files
from tinax.checkpointing import (
    TargetMismatchError,
    abstract_restore_target,
    load_checkpointables,
    load_training_checkpoint,
    save_checkpointables,
    save_training_checkpoint,
)

# Enough leaves that a load allocates far more objects than the collector's first
# threshold (700), so a collector left on runs many times during it.
LEAVES = 300


def _state() -> dict[str, Any]:
    return {f"w{i:03d}": jnp.full((4,), float(i), jnp.float32) for i in range(LEAVES)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("collector") / "ckpt"
    save_checkpointables(path, {"params": _state()}).result()
    return path


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generation of every collection that runs while the test does."""
    seen: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.enable()
    gc.callbacks.append(note)
    try:
        yield seen
    finally:
        gc.callbacks.remove(note)
        gc.enable()


def test_a_load_runs_without_collections_and_turns_the_collector_back_on(
    saved: Path, collections: list[int]
) -> None:
    target = abstract_restore_target(_state())
    gc.collect()
    collections.clear()
    restored = load_checkpointables(saved, {"params": target})["params"]
    # At most the one the pent-up allocations set off when the collector resumes.
    assert len(collections) <= 1
    assert gc.isenabled()
    assert all(float(restored[f"w{i:03d}"][0]) == i for i in range(LEAVES))
    # The same allocations with the collector on do trigger it: the pause is what
    # kept it quiet.
    collections.clear()
    garbage = [[{"i": i}] for i in range(20_000)]
    del garbage
    assert len(collections) > 10


def test_a_refused_load_turns_the_collector_back_on(saved: Path, collections: list[int]) -> None:
    bad = abstract_restore_target({**_state(), "w000": jnp.zeros((5,), jnp.float32)})
    with pytest.raises(TargetMismatchError, match="w000"):
        load_checkpointables(saved, {"params": bad})
    assert gc.isenabled()


def test_a_caller_who_turned_the_collector_off_keeps_it_off(
    saved: Path, collections: list[int]
) -> None:
    gc.disable()
    load_checkpointables(saved, {"params": abstract_restore_target(_state())})
    assert not gc.isenabled()


def test_loads_on_several_threads_turn_it_back_on_after_the_last(
    saved: Path, collections: list[int]
) -> None:
    target = abstract_restore_target(_state())
    errors: list[BaseException] = []

    def load() -> None:
        try:
            load_checkpointables(saved, {"params": target})
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert gc.isenabled()


def test_a_training_load_runs_without_collections(tmp_path: Path, collections: list[int]) -> None:
    def iterator() -> grain.DatasetIterator:
        return iter(grain.MapDataset.range(64).batch(4).to_iter_dataset())

    saving = iterator()
    next(saving)
    model = _state()
    aux = {"seen": np.arange(3)}
    rng = np.zeros(2, np.uint32)
    save_training_checkpoint(tmp_path / "t", 5, model, {}, rng, aux, saving).result()
    gc.collect()
    collections.clear()
    loaded = load_training_checkpoint(
        tmp_path / "t",
        abstract_restore_target(model),
        {},
        abstract_restore_target(rng),
        abstract_restore_target(aux),
        iterator(),
    )
    assert len(collections) <= 1
    assert gc.isenabled()
    assert loaded.step == 5
    assert float(loaded.model["w299"][0]) == 299.0


def test_a_save_pauses_the_collector_for_its_synchronous_part_only(
    tmp_path: Path, collections: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    paused: list[int] = []
    resume = files.resume_gc

    def noted_resume() -> None:
        paused.append(len(collections))  # collections so far, all made while paused
        resume()

    monkeypatch.setattr(files, "resume_gc", noted_resume)
    state = _state()
    gc.collect()
    collections.clear()
    response = save_checkpointables(tmp_path / "c", {"params": state})
    # The pause ended before the call returned.
    assert len(paused) == 1
    during_the_call = paused[0]
    # The caller's training loop goes on while the save writes: its cyclic garbage is
    # collected meanwhile, not held until the save ends.
    assert gc.isenabled()
    response.result()
    # tinax's and Orbax's work per leaf before the call returns set off no collection,
    # only (at most) the pent-up allocations once the pause ended.
    assert during_the_call <= 1
    assert gc.isenabled()
    restored = load_checkpointables(tmp_path / "c", {"params": abstract_restore_target(state)})
    assert float(restored["params"]["w299"][0]) == 299.0
    # Orbax's own start of a save of the same state, with the collector left on, runs
    # it several times over: the pause is what kept it quiet.
    gc.collect()
    collections.clear()
    started = ocp.save_checkpointables_async(tmp_path / "d", {"params": state})
    assert len(collections) > 2
    started.result()


def test_a_save_that_fails_in_the_background_turns_the_collector_back_on(
    tmp_path: Path, collections: list[int]
) -> None:
    response = save_checkpointables(tmp_path / "c", {"w": _FailingWriter(), "p": _state()})
    with pytest.raises(OSError, match="No space left"):
        response.result(timeout=60)
    assert gc.isenabled()
    assert not (tmp_path / "c").exists()


def test_a_refused_save_leaves_the_collector_as_it_was(
    tmp_path: Path, collections: list[int]
) -> None:
    save_checkpointables(tmp_path / "c", {"p": _state()}).result()
    with pytest.raises(FileExistsError):
        save_checkpointables(tmp_path / "c", {"p": _state()})
    assert gc.isenabled()
    gc.disable()
    save_checkpointables(tmp_path / "d", {"p": _state()}).result()
    assert not gc.isenabled()


def test_overlapping_saves_and_loads_turn_it_back_on_after_the_last(
    tmp_path: Path, saved: Path, collections: list[int]
) -> None:
    responses = [save_checkpointables(tmp_path / f"c{i}", {"p": _state()}) for i in range(3)]
    load_checkpointables(saved, {"params": abstract_restore_target(_state())})
    for response in responses:
        response.result()
    assert gc.isenabled()
