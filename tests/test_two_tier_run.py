"""Two-tier training runs: local saves, promotions to a durable directory (a path or
gs://), retention per tier, restore across tiers, kills in promotions, SIGTERM, a new
machine, listings.

Loops that are killed or signalled run in real subprocesses (tests/two_tier_worker.py);
the rest runs here. Every state is a fixed function of its step (the worker's
``state``), so each restore is checked bit for bit, with the batch that follows.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
import two_tier_worker as worker
from conftest import BUCKET
from damage import biggest_data_file, flip_middle_byte
from orbax.checkpoint import v1 as ocp

import tinax.explore as ex
from tinax import _paths
from tinax._cli.main import main
from tinax._format.naming import names, words
from tinax.checkpointing import CorruptDataError, TrainingRun, _promotion, load_training_checkpoint

WORKER = Path(worker.__file__)


def _run(durable: object, local: object, **policy: Any) -> TrainingRun:
    options = {"save_every": 10, "keep": 2, "local_every": 2, "local_keep": 2, **policy}
    return TrainingRun(durable, local=local, **options)


def _loop(run: TrainingRun, steps: range, iterator: Any) -> None:
    for step in steps:
        batch = next(iterator)
        run.save(step, *worker.state(step), {"loss": float(batch[0])}, iterator)


def _exact(restored: Any, step: int) -> bool:
    model, optimizer, rng = worker.state(step)
    return (
        restored.step == step
        and np.array_equal(np.asarray(restored.model["w"]), np.asarray(model["w"]))
        and np.array_equal(restored.model["b"], model["b"])
        and np.array_equal(np.asarray(restored.optimizer["mu"]), np.asarray(optimizer["mu"]))
        and np.array_equal(np.asarray(restored.rng), np.asarray(rng))
        # The iterator continues with the batch after the step's.
        and int(next(restored.iterator)[0]) == 4 * step
    )


def _iterator_at(batches: int) -> Any:
    """The stream after its first ``batches`` batches (where a restore of that step puts it)."""
    iterator = iter(worker.dataset())
    for _ in range(batches):
        next(iterator)
    return iterator


def _restore(run: TrainingRun, **kwargs: Any) -> Any:
    return run.restore(*worker.targets(), iter(worker.dataset()), **kwargs)


def _names(root: object, status: str = words.COMPLETE) -> list[str]:
    table = ex.list_checkpoints(root, cache=None)
    return sorted(set(table.loc[table["status"] == status, "name"]))


def _tiers(root: object) -> dict[str, str]:
    table = ex.list_checkpoints(root, cache=None)
    done = table[table["status"] == words.COMPLETE]
    return dict(zip(done["name"], done["tier"], strict=True))


def _worker(durable: str, local: Path, **options: Any) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, str(WORKER), durable, str(local), json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    events = [
        json.loads(line[len(worker.PREFIX) :])
        for line in done.stdout.splitlines()
        if line.startswith(worker.PREFIX)
    ]
    events.append({"event": "exit", "code": done.returncode, "stderr": done.stderr[-3000:]})
    return events


def _event(events: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [e for e in events if e["event"] == name]
    assert found, events
    return found[-1]


# -- saves, promotions and retention per tier -------------------------------------------------


def test_saves_go_local_and_every_save_every_th_is_promoted_and_each_tier_keeps_its_own(
    durable, tmp_path
):
    local = tmp_path / "local"
    iterator = iter(worker.dataset())
    with _run(durable, local, keep_best=1, best_by="loss") as run:
        _loop(run, range(1, 31), iterator)
    # Locally the newest two; durably the newest two plus the best (step 10's loss,
    # the batch's first value, is the smallest of the three promoted).
    assert run.local_steps == [28, 30]
    assert run.durable_steps == [10, 20, 30]
    assert run.steps == [10, 20, 28, 30]
    # The durable copy is bit for bit the local one, and loads as any checkpoint.
    promoted = _paths.location(run.path(30))
    for relative in ("model", "optimizer", "iterator", "auxiliary"):
        for file in (local / "step_000030" / relative).rglob("*"):
            if file.is_file():
                copied = promoted / relative
                for part in file.relative_to(local / "step_000030" / relative).parts:
                    copied = copied / part
                assert copied.storage.read(copied.path, 1 << 30) == file.read_bytes()
    assert _exact(
        load_training_checkpoint(run.path(20), *worker.targets(), iter(worker.dataset())), 20
    )
    # Committed the way Orbax commits on its storage: the marker names the durable path.
    marker = promoted / names.COMMIT_SUCCESS
    assert marker.storage.read(marker.path, 1000).decode().endswith(run.path(30))
    # Nothing of the copy is left beside it (no temporary, no upload part, no claim).
    listed = [entry for _, entry in _paths.location(durable).snapshot().walk()]
    assert not any(
        names.UPLOAD_PART_SUFFIX in e.name
        or names.is_temporary_name(e.name)
        or e.name.endswith(names.CLAIM_SUFFIX)
        for e in listed
    )
    # Each tier's record says why it keeps what it keeps; listings show both tiers.
    kept = ex.retention_table(durable)
    assert dict(zip(kept["step"], kept["kept"], strict=True)) == {
        10: "best loss",
        20: "newest 2",
        28: words.kept_local_newest(2),
        30: f"newest 2, {words.kept_local_newest(2)}",
    }
    assert (
        _tiers(durable)
        == _tiers(local)
        == {
            "step_000010": words.TIER_DURABLE,
            "step_000020": words.TIER_DURABLE,
            "step_000028": words.TIER_LOCAL,
            "step_000030": words.TIER_BOTH,
        }
    )
    policy = ex.run_policy(durable)
    assert policy is not None
    assert (policy["local"], policy["local_every"], policy["local_keep"]) == (str(local), 2, 2)
    table = ex.run_table(durable)
    assert list(table["tier"]) == ["durable", "durable", "local", "both"]
    assert list(table["loss"]) == [36.0, 76.0, 108.0, 116.0]


def test_raw_orbax_loads_a_promoted_checkpoint(tmp_path):
    iterator = iter(worker.dataset())
    with _run(tmp_path / "durable", tmp_path / "local") as run:
        _loop(run, range(1, 11), iterator)
    model, optimizer, rng, _ = worker.targets()
    loaded = ocp.load_checkpointables(
        run.path(10), {"model": model, "optimizer": optimizer, "rng": rng}
    )
    assert np.array_equal(np.asarray(loaded["model"]["w"]), np.asarray(worker.state(10)[0]["w"]))


def test_a_save_every_that_local_every_does_not_divide_still_promotes_its_steps(tmp_path):
    iterator = iter(worker.dataset())
    with _run(tmp_path / "d", tmp_path / "l", save_every=5, local_every=3, local_keep=1) as run:
        decided = [step for step in range(1, 11) if run.should_save(step)]
        _loop(run, range(1, 11), iterator)
    assert decided == [3, 5, 6, 9, 10]
    assert run.durable_steps == [5, 10] and run.local_steps == [10]


def test_a_forced_save_is_promoted_and_close_waits_for_it(tmp_path):
    iterator = iter(worker.dataset())
    run = _run(tmp_path / "d", tmp_path / "l", save_every=None)
    _loop(run, range(1, 4), iterator)
    run.save(4, *worker.state(4), {"loss": 0.0}, iterator, force=True)
    run.close()
    assert run.durable_steps == [4]
    assert run.local_steps == [2, 4]


# -- restore across tiers ------------------------------------------------------------------


def test_restore_takes_the_newest_of_either_tier_local_on_a_tie(tmp_path):
    durable, local = tmp_path / "durable", tmp_path / "local"
    iterator = iter(worker.dataset())
    with _run(durable, local) as run:
        _loop(run, range(1, 13), iterator)
    assert run.local_steps == [10, 12] and run.durable_steps == [10]
    # The newest is local.
    assert _exact(_restore(_run(durable, local)), 12)
    # A tie is read from the local copy (the durable one is made unreadable to tell).
    shutil.rmtree(local / "step_000012")
    flip_middle_byte(biggest_data_file(durable / "step_000010" / "model"))
    assert _exact(_restore(_run(durable, local)), 10)


def test_a_corrupt_local_step_falls_back_is_set_aside_and_the_run_goes_on(tmp_path):
    durable, local = tmp_path / "durable", tmp_path / "local"
    iterator = iter(worker.dataset())
    with _run(durable, local) as run:
        _loop(run, range(1, 13), iterator)
    flip_middle_byte(biggest_data_file(local / "step_000012" / "model"))
    resumed = _run(durable, local)
    with pytest.warns(RuntimeWarning, match="step_000012"):
        restored = _restore(resumed)
    assert _exact(restored, 10)
    assert (local / names.corrupt_name("step_000012")).is_dir()
    assert _names(local, words.FOUND_CORRUPT) == [names.corrupt_name("step_000012")]
    # The resumed job saves step 12 again, and goes on promoting.
    _loop(resumed, range(11, 21), _iterator_at(10))
    resumed.close()
    assert resumed.durable_steps == [10, 20] and resumed.local_steps == [18, 20]
    assert _exact(_restore(_run(durable, local)), 20)


def test_a_corrupt_local_copy_of_a_promoted_step_falls_back_to_its_durable_copy(tmp_path):
    durable, local = tmp_path / "durable", tmp_path / "local"
    iterator = iter(worker.dataset())
    with _run(durable, local) as run:
        _loop(run, range(1, 11), iterator)
    flip_middle_byte(biggest_data_file(local / "step_000010" / "optimizer"))
    resumed = _run(durable, local)
    with pytest.warns(RuntimeWarning, match="skipping checkpoint"):
        assert _exact(_restore(resumed, step=10), 10)
    assert _tiers(durable)["step_000010"] == words.TIER_DURABLE
    resumed.close()


def test_a_new_machine_resumes_from_the_durable_tier_at_the_right_batch(durable, tmp_path):
    iterator = iter(worker.dataset())
    with _run(durable, tmp_path / "old") as run:
        _loop(run, range(1, 16), iterator)
    assert run.durable_steps == [10] and run.local_steps == [12, 14]
    # Another machine: its local directory does not exist yet.
    fresh = tmp_path / "new" / "local"
    fresh.parent.mkdir()
    resumed = _run(durable, fresh)
    assert fresh.is_dir()
    assert _exact(_restore(resumed), 10)
    resumed.close()
    # The durable tier's record names the new local tier now: the old one is not listed.
    assert _tiers(durable) == {"step_000010": words.TIER_DURABLE}
    assert _tiers(fresh) == {"step_000010": words.TIER_DURABLE}


def _flip_durable_data_byte(durable: str, name: str) -> None:
    """Flips the middle byte of the biggest data file of the model, on disk or in the bucket."""
    if not durable.startswith("gs://"):
        flip_middle_byte(biggest_data_file(Path(durable) / name / "model"))
        return
    from tinax._format.storage import gcs

    fs = gcs.GCS.filesystem()
    found = fs.find(f"{durable[len('gs://') :]}/{name}/model", detail=True)
    path = max((p for p in found if p.split("/")[-2] == "d"), key=lambda p: found[p]["size"])
    data = bytearray(fs.cat_file(path))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(path, bytes(data))


def test_a_corrupt_durable_step_is_set_aside_and_its_step_promoted_again(durable, tmp_path):
    iterator = iter(worker.dataset())
    with _run(durable, tmp_path / "old") as run:
        _loop(run, range(1, 21), iterator)
    assert run.durable_steps == [10, 20]
    _flip_durable_data_byte(durable, "step_000020")
    # A new machine: the bucket alone.
    (tmp_path / "new").mkdir()
    resumed = _run(durable, tmp_path / "new" / "local")
    with pytest.warns(RuntimeWarning, match="step_000020"):
        restored = _restore(resumed)
    assert _exact(restored, 10)
    assert _names(durable, words.FOUND_CORRUPT)
    _loop(resumed, range(11, 21), _iterator_at(10))
    resumed.close()
    assert resumed.durable_steps == [10, 20]
    assert _exact(
        load_training_checkpoint(resumed.path(20), *worker.targets(), iter(worker.dataset())), 20
    )


# -- a corrupt checkpoint is never promoted -------------------------------------------------


def test_a_promotion_refuses_a_local_checkpoint_that_is_not_what_was_saved(durable, tmp_path):
    iterator = iter(worker.dataset())
    with _run(tmp_path / "d", tmp_path / "l", save_every=None) as run:
        _loop(run, range(1, 3), iterator)
    source = tmp_path / "l" / "step_000002"
    flip_middle_byte(biggest_data_file(source / "optimizer"))
    if not durable.startswith("gs://"):
        os.mkdir(durable)
    destination = _paths.location(f"{durable}/step_000002")
    with pytest.raises(CorruptDataError, match=r"not promoted: optimizer: leaf .*\['mu'\]"):
        _promotion.promote(_paths.location(source), destination)
    # Nothing was left in the durable directory.
    assert not destination.exists() or not destination.snapshot().entries()
    if not durable.startswith("gs://"):
        assert os.listdir(durable) == []


def test_a_local_checkpoint_damaged_before_its_promotion_is_set_aside_and_the_run_goes_on(
    tmp_path, monkeypatch
):
    from tinax.checkpointing import _local_tier

    retain = _local_tier.LocalTier.retain
    damaged: list[int] = []

    def damage_then_retain(self: Any, waiting: Any, policy: Any) -> None:
        # Bit rot between the local commit and the promotion that follows it.
        if 10 in waiting and not damaged:
            damaged.append(10)
            flip_middle_byte(biggest_data_file(Path(self.path(10).path) / "model"))
        retain(self, waiting, policy)

    monkeypatch.setattr(_local_tier.LocalTier, "retain", damage_then_retain)
    iterator = iter(worker.dataset())
    with (
        pytest.warns(RuntimeWarning, match="was not promoted.*set aside"),
        _run(tmp_path / "d", tmp_path / "l") as run,
    ):
        _loop(run, range(1, 21), iterator)
    assert damaged == [10]
    assert run.durable_steps == [20]
    assert _names(tmp_path / "l", words.FOUND_CORRUPT) == [names.corrupt_name("step_000010")]


# -- kills, SIGTERM ----------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["kill_in_copy", "kill_before_promotion"])
def test_a_promotion_cut_short_by_a_kill_is_finished_by_the_resumed_run(durable, tmp_path, where):
    local = tmp_path / "local"
    events = _worker(durable, local, steps=40, **{where: True})
    assert _event(events, "killed")["where"] in ("copy", "before promotion")
    assert _event(events, "exit")["code"] == -9
    # Step 10 is committed locally and waits for its promotion; nothing is committed
    # durably, and a copy cut short is not complete.
    table = ex.list_checkpoints(local, cache=None)
    waiting = table[(table["step"] == 10) & (table["tier"] == words.TIER_LOCAL)]
    copy = table[(table["step"] == 10) & (table["tier"] == words.TIER_DURABLE)]
    # A killed copy: an interrupted temporary directory on a disk (its claim is free);
    # on gs://, where nothing tells a dead writer from a live one, in progress until
    # it has been quiet for five minutes.
    if where == "kill_in_copy":
        assert list(copy["status"]) == [
            words.IN_PROGRESS if durable.startswith("gs://") else words.INTERRUPTED
        ]
    busy = where == "kill_in_copy" and durable.startswith("gs://")
    assert list(waiting["promotion"]) == [
        words.PROMOTION_RUNNING if busy else words.PROMOTION_WAITING
    ]
    assert (
        not (table["tier"] != words.TIER_LOCAL).any()
        or (table.loc[table["tier"] == words.TIER_DURABLE, "status"] != words.COMPLETE).all()
    )
    # The loop went on while step 10 was being promoted: its newest local step is the
    # one to resume from.
    newest = int(table.loc[table["status"] == words.COMPLETE, "step"].max())
    assert newest >= 10
    resumed = _run(durable, local)
    # The leftovers of the copy are gone as the run opens.
    assert not [
        e for _, e in _paths.location(durable).snapshot().walk() if e.name != names.RUN_RECORD
    ]
    assert _exact(_restore(resumed), newest)
    resumed.close()
    assert resumed.durable_steps[0] == 10
    # Committed durably (and still locally, unless the local tier has moved on).
    assert _tiers(durable)["step_000010"] in (words.TIER_BOTH, words.TIER_DURABLE)
    assert _exact(
        load_training_checkpoint(resumed.path(10), *worker.targets(), iter(worker.dataset())), 10
    )


def test_a_byte_damaged_on_its_way_to_the_bucket_fails_the_promotion_and_commits_nothing(
    gcs, tmp_path
):
    iterator = iter(worker.dataset())
    with _run(tmp_path / "d", tmp_path / "l", save_every=None) as run:
        _loop(run, range(1, 3), iterator)
    source = _paths.location(tmp_path / "l" / "step_000002")
    destination = _paths.location(f"gs://{BUCKET}/{tmp_path.name}/step_000002")
    gcs.damage_uploads(1)
    try:
        with pytest.raises(OSError, match=r"arrived corrupt: the bucket stored CRC32C"):
            _promotion.promote(source, destination)
    finally:
        gcs.damage_uploads(0)
    # What was copied is gone; the local checkpoint is whole, and promoted again.
    assert not destination.snapshot().entries()
    _promotion.promote(source, destination)
    model, optimizer, rng, _ = worker.targets()
    loaded = ocp.load_checkpointables(str(destination), {"model": model, "optimizer": optimizer})
    assert np.array_equal(np.asarray(loaded["model"]["w"]), np.asarray(worker.state(2)[0]["w"]))


def test_a_promotion_to_gs_killed_before_its_marker_is_committed_by_the_resumed_run(gcs, tmp_path):
    durable = f"gs://{BUCKET}/{tmp_path.name}"
    local = tmp_path / "local"
    events = _worker(durable, local, steps=40, kill_before_marker=True)
    assert _event(events, "killed")["where"] == "before the marker"
    step = _paths.location(f"{durable}/step_000010")
    found = step.snapshot().entries()
    # Every file is in, the commit record too: tinax takes it for committed, as Orbax's
    # rule for a copied checkpoint does; the marker Orbax's own listing wants is missing.
    assert names.CHECKPOINT_METADATA in found and names.COMMIT_SUCCESS not in found
    # Orbax's loader wants the marker: until the run finishes the commit, that copy is
    # never listed complete, and the listing says why.
    listed = ex.list_checkpoints(durable)
    row = listed[listed["path"] == str(step)]
    assert list(row["status"]) == [words.INVALID]
    assert names.COMMIT_SUCCESS in listed.attrs["errors"][str(step)]
    newest = max(
        int(p.name[len("step_") :])
        for p in local.iterdir()
        if names.RUN_CHECKPOINT.match(p.name) and (p / names.CHECKPOINT_METADATA).exists()
    )
    resumed = _run(durable, local)
    assert names.COMMIT_SUCCESS in step.snapshot().entries()
    assert _exact(_restore(resumed), newest)
    resumed.close()
    # Step 10's promotion committed; any the loop started later was finished too.
    assert resumed.durable_steps[0] == 10
    model, optimizer, rng, _ = worker.targets()
    loaded = ocp.load_checkpointables(
        str(step), {"model": model, "optimizer": optimizer, "rng": rng}
    )
    assert np.array_equal(np.asarray(loaded["model"]["w"]), np.asarray(worker.state(10)[0]["w"]))


def test_sigterm_saves_locally_promotes_at_once_and_ends_after_the_durable_commit(
    durable, tmp_path
):
    events = _worker(durable, tmp_path / "local", steps=100, sigterm_at=7, save_every=50)
    assert _event(events, "exit")["code"] == 0, events
    # Step 7 is off both intervals: saved for the preemption, and durable when save returned.
    assert _event(events, "preempted") == {"event": "preempted", "step": 7, "durable": [7]}
    assert _exact(_restore(_run(durable, tmp_path / "local", save_every=50)), 7)


# -- arguments, processes ------------------------------------------------------------------


def test_bad_local_arguments_are_refused_with_clear_errors(tmp_path):
    durable, local = tmp_path / "d", tmp_path / "l"
    with pytest.raises(ValueError, match="local needs local_every"):
        TrainingRun(durable, local=local)
    with pytest.raises(ValueError, match="local_every needs local"):
        TrainingRun(durable, local_every=2)
    with pytest.raises(TypeError, match="local_every must be an integer"):
        TrainingRun(durable, local=local, local_every=True)
    with pytest.raises(ValueError, match="local_keep must be at least 1"):
        TrainingRun(durable, local=local, local_every=2, local_keep=0)
    with pytest.raises(TypeError, match="local must be a str or os.PathLike"):
        TrainingRun(durable, local=3, local_every=2)
    with pytest.raises(ValueError, match="not a bucket"):
        TrainingRun(durable, local="gs://bucket/run", local_every=2)
    for inside in (durable, durable / "local", tmp_path):
        with pytest.raises(ValueError, match="must be apart"):
            TrainingRun(durable, local=inside, local_every=2)
    # A new machine's local directory is made, with its parents.
    TrainingRun(durable, local=tmp_path / "new" / "ssd" / "local", local_every=2).close()
    assert (tmp_path / "new" / "ssd" / "local" / names.RUN_RECORD).is_file()
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        TrainingRun(tmp_path / "d2", local=tmp_path / "file" / "local", local_every=2)
    # A local directory that holds another run's checkpoints.
    TrainingRun(tmp_path / "other", local=local, local_every=2).close()
    with pytest.raises(ValueError, match="holds the checkpoints of the run in"):
        TrainingRun(durable, local=local, local_every=2)
    with pytest.raises(ValueError, match="of a run of its own"):
        TrainingRun(durable, local=tmp_path / "other", local_every=2)


def test_a_missing_local_tier_with_must_exist_resumes_from_the_durable_one(tmp_path, caplog):
    (tmp_path / "d").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no complete checkpoint"):
        TrainingRun(tmp_path / "d", local=tmp_path / "l", local_every=2, must_exist=True)
    iterator = iter(worker.dataset())
    with _run(tmp_path / "d2", tmp_path / "l2") as run:
        _loop(run, range(1, 3), iterator)
    # Only local checkpoints: the run is not empty.
    TrainingRun(tmp_path / "d2", local=tmp_path / "l2", local_every=2, must_exist=True).close()
    with caplog.at_level(logging.WARNING, logger="tinax.checkpointing"):
        assert _restore(_run(tmp_path / "d3", tmp_path / "l3")) is None
    assert f"or its local tier {str(tmp_path / 'l3')!r}" in caplog.text


def test_a_two_tier_listing_says_which_tier_when_the_other_is_unreachable(tmp_path):
    iterator = iter(worker.dataset())
    with _run(tmp_path / "d", tmp_path / "l") as run:
        _loop(run, range(1, 11), iterator)
    shutil.rmtree(tmp_path / "d")
    # The local tier alone, its durable directory gone.
    assert _tiers(tmp_path / "l") == {
        "step_000008": words.TIER_LOCAL,
        "step_000010": words.TIER_LOCAL,
    }
    out = io.StringIO()
    with mock.patch.dict(os.environ, {"COLUMNS": "120"}):
        assert main(["ls", str(tmp_path / "l")], out, io.StringIO()) == 0
    # One tier in every row: said once, under the table.
    text = " ".join(out.getvalue().split())
    said = text[text.index("every row:") :]
    assert f"tier: {words.TIER_LOCAL};" in said and words.TIER_DURABLE not in text


def test_a_two_tier_run_with_no_checkpoint_yet_lists_with_its_tier_columns(tmp_path):
    _run(tmp_path / "d", tmp_path / "l").close()
    for tier in ("d", "l"):
        listed = ex.list_checkpoints(tmp_path / tier)
        assert len(listed) == 0 and {"tier", "promotion"} <= set(listed.columns)


def test_processes_of_one_host_share_the_local_tier_and_a_mixed_layout_is_refused(tmp_path):
    import cluster
    import two_tier_cluster_worker

    script = Path(two_tier_cluster_worker.__file__)
    durable, local = tmp_path / "durable", tmp_path / "local"
    loop = cluster.launch(script, "loop", durable, local, processes=2)
    assert loop.ok, str(loop)
    reports = [loop.result(i, "loop") for i in range(2)]
    # Process 1 alone got the SIGTERM (at step 25); both saved at the same later step,
    # and that save was promoted before the loop ended, on both.
    stop = reports[0]["preempted_at"]
    assert stop is not None and stop >= 25 and stop == reports[1]["preempted_at"]
    assert all(stop in loop.result(i, "preempted")["durable"] for i in range(2))
    promoted = sorted(set(range(10, stop + 1, 10)) | {stop})
    assert reports[0]["durable"] == reports[1]["durable"] == promoted[-2:]
    assert reports[0]["local"] == reports[1]["local"] == sorted({*range(5, stop + 1, 5), stop})[-2:]
    resume = cluster.launch(script, "resume", durable, local, processes=2)
    assert resume.ok, str(resume)
    for i in range(2):
        # Each process's shard of the data: 1000 examples split by process, batches of 4.
        first = 2 * 4 * stop + i
        for phase in ("resume", "new machine"):
            report = resume.result(i, phase)
            assert report["restored"] == stop and report["exact"] is True
            assert report["next"] == list(range(first, first + 8, 2))
    # Processes 0 and 1 share a directory, process 2 has one of its own.
    refused = cluster.launch(script, "refused", durable, tmp_path / "other", processes=3, devices=1)
    assert refused.ok, str(refused)
    for i in range(3):
        error = refused.result(i, "refused")["error"]
        assert error is not None and "processes 0, 1 share one and the others do not" in error


def test_the_explorer_lists_both_tiers_and_opens_a_checkpoint_of_each(tmp_path):
    from tinax.widgets import CheckpointExplorer

    iterator = iter(worker.dataset())
    with _run(tmp_path / "durable", tmp_path / "local", local_keep=1) as run:
        _loop(run, range(1, 13), iterator)
    explorer = CheckpointExplorer(str(tmp_path / "durable"))
    assert explorer.wait(60)
    listed = explorer.checkpoints
    assert dict(zip(listed["name"], listed["tier"], strict=True)) == {
        "step_000010": words.TIER_DURABLE,
        "step_000012": words.TIER_LOCAL,
    }
    # The run list's table has the tier column, shown since the rows differ in it.
    shown = explorer.checkpoint_view
    assert "tier" in [column.field for column in shown.columns]
    assert "tier" not in shown.quiet_columns()
    for name, where in (("step_000010", "durable"), ("step_000012", "local")):
        label = listed.index[listed["name"] == name][0]
        explorer.checkpoint_view.click(label)
        assert explorer.checkpoint == str(tmp_path / where / name)
        assert "['w']" in set(explorer.leaves["key"])
