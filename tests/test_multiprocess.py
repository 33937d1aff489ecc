"""Training checkpoints of real multi-process JAX jobs on localhost.

Each job is N processes (``jax.distributed`` over a loopback coordinator, Gloo on the
CPU, two devices each) running tests/multiprocess_worker.py; see that file for the
training state and the phases. Jobs are bounded by a wall-clock timeout and killed
as soon as one process fails, so nothing here can hang.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import cluster
import multiprocess_worker as worker
import numpy as np
import pytest
from conftest import BUCKET

import tinax.explore as ex
from tinax import _claims
from tinax._format.metadata import arrays
from tinax._format.naming import names, words
from tinax._format.storage.location import local
from tinax.checkpointing import NumpyTarget, load_checkpointables
from tinax.checkpointing._context import CHUNK_BYTES

WORKER = Path(worker.__file__)


def _job(phase: str, directory: Path, *, processes: int, devices: int = 2) -> cluster.Outcome:
    return cluster.launch(WORKER, phase, directory, processes=processes, devices=devices)


def _same_on_every_process(outcome: cluster.Outcome, step: str) -> dict[str, object]:
    """What every process reported of ``step`` (apart from its index and timing)."""
    reports = [outcome.result(i, step) for i in range(len(outcome.logs))]
    shared = [{k: v for k, v in r.items() if k not in ("process", "seconds")} for r in reports]
    assert all(r == shared[0] for r in shared), shared
    return shared[0]


def _run_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One run of every phase with two processes (and one), in order."""
    directory = tmp_path_factory.mktemp("two")
    outcomes: dict[str, object] = {"directory": directory}
    outcomes["one-save"] = _job("one-save", directory, processes=1, devices=1)
    # This test process holds a claim: a live writer the job must refuse to share with.
    held = _claims.claim(local(directory / "held"))
    try:
        outcomes["save"] = _job("save", directory, processes=2)
    finally:
        assert held is not None
        held.release()
    outcomes["files after save"] = _run_files(directory)
    outcomes["load"] = _job("load", directory, processes=2)
    outcomes["kill"] = _job("kill", directory, processes=2)
    outcomes["files after kill"] = _run_files(directory)
    outcomes["listing after kill"] = ex.list_checkpoints(directory)
    outcomes["recover"] = _job("recover", directory, processes=2)
    outcomes["one-load"] = _job("one-load", directory, processes=1, devices=1)
    return outcomes


def test_every_process_saves_its_part_of_a_sharded_training_checkpoint(two):
    save = two["save"]
    assert save.ok, save
    assert _same_on_every_process(save, "started") == {
        "step": "started",
        "processes": 2,
        "devices": 4,
    }
    ck = two["directory"] / "ck"
    assert sorted(p.name for p in (ck / "iterator").glob("*.json")) == [
        names.iterator_file_name(0, 2),
        names.iterator_file_name(1, 2),
    ]
    # Each process wrote its own shards before the primary merged them.
    assert {p.name for p in (ck / "model").iterdir()} >= {"ocdbt.process_0", "ocdbt.process_1"}
    # Claims end with their saves: none is left beside a committed checkpoint.
    assert _claims.probe(local(ck)) is None
    assert "ck" in two["files after save"] and "after" in two["files after save"]
    assert names.claim_name("ck") not in two["files after save"]
    # Every process's checksum record is inside the committed checkpoint: none was
    # written after the primary's commit, into a temporary directory renamed away.
    assert not [f for f in two["files after save"] if names.TEMPORARY_SUFFIX in f]
    for name in ("ck", "after"):
        for part in ("model", "optimizer"):
            records = two["directory"] / name / part / names.CHECKSUMS_DIR
            assert sorted(p.name for p in records.iterdir()) == sorted(
                names.checksum_file_name(i) for i in range(2)
            ), (name, part)


def test_fresh_processes_load_it_exactly_each_with_its_own_iterator(two):
    load = two["load"]
    assert load.ok, load
    for i in range(2):
        report = load.result(i, "load")
        # 14 arrays, each checked shard by shard on this process's two devices.
        assert report["shards"] == 34
        # Each process read its shards itself: nothing went through Orbax's load.
        assert report["orbax"] == [], report
        assert report["batch"] == next(worker.iterator_at(worker.position(i), i, 2)).tolist()
    assert load.result(0, "load")["batch"] != load.result(1, "load")["batch"]


def test_a_resharded_restore_is_planned_per_process_and_a_refusal_is_agreed(two):
    load = two["load"]
    assert load.ok, load
    embed = 1024 * 6144 * 4
    for i in range(2):
        plan = load.result(i, "plan")
        hosts = {row[0]: row for row in plan["rows"] if row[1] == "host"}
        # A row per process and per device, alike on both: each process reads both
        # saved column halves whole and keeps a quarter of each (the small leaves'
        # chunks add a few bytes beyond).
        assert sorted(hosts) == [0, 1] and len(plan["rows"]) == 6
        assert all(embed <= row[2] < embed + (64 << 10) for row in hosts.values())
        assert all(embed // 2 <= row[3] < embed // 2 + 4096 for row in hosts.values())
        assert any("it reads 2.0x what it keeps" in w for w in plan["warnings"]), plan
        # What the load then read, against this process's plan.
        assert abs(hosts[i][2] / plan["read"] - 1) <= 0.05, plan
        # Only process 1 was over its budget; both were refused, before reading.
        budget = load.result(i, "budget")
        assert budget["error"] == "RestoreTooLargeError", budget
        assert "max_host_bytes is 64.0 KiB" in budget["message"]
        assert budget["message"].endswith("[process 1 of 2]")


def test_every_process_agrees_on_a_refusal_and_nobody_hangs(two):
    save = two["save"]
    assert save.ok, save
    exists = _same_on_every_process(save, "exists")
    assert exists["error"] == "FileExistsError" and "already exists" in exists["message"]
    # Checked once, on the primary.
    assert exists["message"].endswith("[process 0 of 2]")
    held = _same_on_every_process(save, "held")
    assert held["error"] == "FileExistsError"
    assert f"pid {os.getpid()}" in held["message"] and "held" in held["message"]
    bad = _same_on_every_process(save, "bad")
    assert bad["error"] == "TypeError" and "['state']['callback']" in bad["message"]
    assert bad["message"].endswith("[process 1 of 2]")
    # Nothing was written for any refused save, and the next save works.
    files = two["files after save"]
    assert "bad" not in files and not any(f.startswith("bad.") for f in files)
    assert not any(f.startswith("held.orbax") for f in files)
    _same_on_every_process(save, "after")


def test_a_process_killed_mid_save_leaves_an_interrupted_save(two):
    kill = two["kill"]
    assert not kill.timed_out and kill.returncodes[1] == -9 and kill.returncodes[0] != 0, kill
    assert "killing myself at barrier" in kill.logs[1]
    files = two["files after kill"]
    assert "killed" not in files
    assert "killed" + names.TEMPORARY_SUFFIX in files
    listing = two["listing after kill"]
    row = listing[listing["name"] == "killed" + names.TEMPORARY_SUFFIX].iloc[0]
    assert row["status"] == words.INTERRUPTED and row["age"].total_seconds() >= 0
    assert set(listing[listing["name"] != row["name"]]["status"]) == {words.COMPLETE}


def test_the_next_run_of_every_process_recovers_from_it(two):
    recover = two["recover"]
    assert recover.ok, recover
    _same_on_every_process(recover, "recovered")
    for i in range(2):
        assert recover.result(i, "load")["shards"] == 34
    directory = two["directory"]
    assert not (directory / ("killed" + names.TEMPORARY_SUFFIX)).exists()
    assert not (directory / names.claim_name("killed")).exists()
    listing = ex.list_checkpoints(directory)
    assert listing[listing["name"] == "killed"]["status"].tolist() == [words.COMPLETE]
    # An interrupted save is never loadable.
    with pytest.raises(ValueError, match="temporary suffix"):
        load_checkpointables(
            directory / ("killed" + names.TEMPORARY_SUFFIX), {"rng": NumpyTarget((2,), "uint32")}
        )


def test_two_processes_checkpoint_loads_in_one_process_with_one_device(two):
    one = two["one-load"]
    assert one.ok, one
    report = one.result(0, "from-two")
    assert report["devices"] == 1 and report["shards"] == 17
    training = one.result(0, "training-load")
    assert training["error"] == "ValueError"
    assert "saved by 2 process(es)" in training["message"]
    assert "process_0-of-1.json" in training["message"]


def test_one_process_checkpoint_loads_in_two_processes(two):
    assert two["one-save"].ok, two["one-save"]
    recover = two["recover"]
    assert recover.ok, recover
    for i in range(2):
        report = recover.result(i, "from-one")
        assert report["devices"] == 4 and report["shards"] == 34


def test_explore_reads_the_two_process_checkpoint_in_one_process(two):
    ck = two["directory"] / "ck"
    table = ex.checkpoint_table(ck)
    model = table[table["checkpointable"] == "model"].set_index("key")
    assert model.loc["['dense1']['kernel']", "sharding"] == (
        "NamedSharding(mesh=(data=2, model=2), spec=(data, model))"
    )
    assert model.loc["['dense1']['bias']", "sharding"] == (
        "NamedSharding(mesh=(data=2, model=2), spec=(model))"
    )
    assert model.loc["['dense2']['bias']", "sharding"] == (
        "NamedSharding(mesh=(data=2, model=2), spec=())"
    )
    iterator = table[table["checkpointable"] == "iterator"]
    assert list(iterator["key"]) == ["['process_0-of-2']", "['process_1-of-2']"]
    for i, state in enumerate(iterator["value"]):
        assert state == worker.iterator_at(worker.position(i), i, 2).get_state()
        assert ex.read_leaf(ck, "iterator", f"['process_{i}-of-2']") == state
    # The whole global array, every process's shards together.
    kernel = ex.read_leaf(ck, "model", "['dense1']['kernel']")
    np.testing.assert_array_equal(kernel, worker.expected("model/dense1/kernel", (16, 32), 0))
    # The embedding table's 12 MiB shards were stored in chunks of at most CHUNK_BYTES.
    key = "embed.table/zarr.json"
    stored = arrays.read_values(local(ck / "model"), [key], ocdbt=True, ctx=arrays.context())
    meta = json.loads(stored[key])
    shard = meta["chunk_grid"]["configuration"]["chunk_shape"]
    chunk = meta["codecs"][0]["configuration"]["chunk_shape"]
    assert shard == chunk and 4 * int(np.prod(chunk)) <= CHUNK_BYTES < 4 * 1024 * 3072, chunk
    table = ex.read_leaf(ck, "model", "['embed']['table']")
    np.testing.assert_array_equal(table, worker.expected("model/embed/table", (1024, 6144), 0))


def test_export_writes_the_two_process_checkpoint_whole(two, tmp_path):
    from safetensors.numpy import load_file

    ck = two["directory"] / "ck"
    files = ex.export_safetensors(ck, tmp_path / "out", verify=True)
    tensors = load_file(files[0])
    # Sharded over both processes' devices: each array whole, every process's shards.
    np.testing.assert_array_equal(
        tensors["dense1.kernel"], worker.expected("model/dense1/kernel", (16, 32), 0)
    )
    table = tensors["embed.table"]
    assert table.shape == (1024, 6144)
    assert table.tobytes() == worker.expected("model/embed/table", (1024, 6144), 0).tobytes()
    stored = ex.checkpoint_table(ck)
    model = stored[stored["checkpointable"] == "model"]
    assert len(tensors) == len(model)


def test_a_process_that_never_saves_does_not_hang_the_others(tmp_path):
    outcome = cluster.launch(WORKER, "absent", tmp_path, processes=2, barrier=5)
    assert outcome.ok, outcome
    report = outcome.result(0, "absent")
    assert report["error"] == "ProcessTimeoutError"
    assert report["message"].startswith("process 1 of 2 did not reach the save to ")
    assert report["message"].endswith(" within 5 s (process 0 did): it has died or stalled")
    assert _run_files(tmp_path) == []  # nothing written, nothing claimed


def test_four_processes_save_and_fresh_ones_load(tmp_path):
    held = _claims.claim(local(tmp_path / "held"))
    try:
        save = _job("save", tmp_path, processes=4)
    finally:
        assert held is not None
        held.release()
    assert save.ok, save
    assert _same_on_every_process(save, "started")["devices"] == 8
    assert _same_on_every_process(save, "bad")["message"].endswith("[process 1 of 4]")
    assert len(list((tmp_path / "ck" / "iterator").glob("process_*.json"))) == 4
    load = _job("load", tmp_path, processes=4)
    assert load.ok, load
    batches = [load.result(i, "load")["batch"] for i in range(4)]
    assert all(load.result(i, "load")["orbax"] == [] for i in range(4)), load
    assert batches == [
        next(worker.iterator_at(worker.position(i), i, 4)).tolist() for i in range(4)
    ]
    table = ex.checkpoint_table(tmp_path / "ck")
    model = table[table["checkpointable"] == "model"].set_index("key")
    assert model.loc["['dense1']['kernel']", "sharding"] == (
        "NamedSharding(mesh=(data=4, model=2), spec=(data, model))"
    )


def test_two_processes_save_to_gs_and_load_it_back(gcs):
    """Each process writes its shards, iterator and checksums to the bucket itself."""
    url = f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"
    outcome = cluster.launch(WORKER, "gcs", url, processes=2, devices=2)
    assert outcome.ok, outcome
    for i in range(2):
        assert outcome.result(i, "exists")["error"] == "FileExistsError"
        assert outcome.result(i, "load")["shards"] == 34
        assert outcome.result(i, "load")["orbax"] == []
    listed = ex.list_checkpoints(url)
    assert list(listed["status"]) == [words.COMPLETE]
    iterator_rows = ex.checkpoint_table(f"{url}/ck").query("checkpointable == 'iterator'")
    assert list(iterator_rows["key"]) == ["['process_0-of-2']", "['process_1-of-2']"]
    assert ex.verify(f"{url}/ck").ok
