"""Jobs of several hosts, each with a local directory of its own: real ``jax.distributed``
jobs on localhost (tests/pod_worker.py), one local directory per process standing for
its host's disk, the durable tier a path or a ``gs://`` bucket (the emulator).

JAX's heartbeat is set beyond the runs' deadlines, so that a killed process is
reported by tinax (naming it and the step), not by JAX ending every process."""

from __future__ import annotations

import uuid
from pathlib import Path

import jax
import numpy as np
import pod_worker
import pytest
from conftest import BUCKET
from jax.sharding import SingleDeviceSharding
from multiprocess_worker import expected
from orbax.checkpoint import v1 as ocp

import tinax.explore as ex
from tinax._format.naming import names, words

WORKER = Path(pod_worker.__file__)


def _launch(phase: str, root: Path, durable: str, processes: int, **options: object):
    return pod_worker.launch(phase, root, durable, processes, options)


@pytest.fixture(scope="module")
def preempted(tmp_path_factory) -> dict[str, object]:
    """Four processes with a local directory each: process 1 gets SIGTERM at step 25;
    then a fresh job restores as it finds the run, after process 1's part of the newest
    step was damaged, and after process 3's local directory was deleted."""
    root = tmp_path_factory.mktemp("preempted")
    durable = str(root / "durable")
    loop = _launch("loop", root, durable, 4, sigterm=[1], at=25)
    resume = _launch("resume", root, durable, 4) if loop.ok else None
    return {"root": root, "durable": durable, "loop": loop, "resume": resume}


def test_a_sigterm_to_one_process_makes_one_step_durable_on_every_host(preempted):
    loop = preempted["loop"]
    assert loop.ok, str(loop)
    reports = [loop.result(i, "preempted") for i in range(4)]
    at = reports[0]["at"]
    # The same step everywhere, at or after the notice, and in the durable tier
    # before run.preempted was true anywhere.
    assert at >= 25 and all(r["at"] == at for r in reports)
    assert all(at in r["durable"] and at in r["local"] for r in reports)
    durable = Path(preempted["durable"])
    assert sorted(p.name for p in durable.iterdir() if p.name.startswith("step_")) == sorted(
        names.run_checkpoint_name(s) for s in reports[0]["durable"]
    )
    # Each host holds its own part only (hosts 1 and 3 lost theirs in the resume job).
    for i in (0, 2):
        model = preempted["root"] / f"host{i}" / names.run_checkpoint_name(at) / "model"
        stores = {p.name for p in model.iterdir() if p.name.startswith("ocdbt.process_")}
        assert stores == {f"ocdbt.process_{i}"}


def test_a_sigterm_to_every_process_makes_one_step_durable_on_every_host(tmp_path):
    """A whole slice preempted: every process gets SIGTERM (here at the same step)."""
    durable = str(tmp_path / "durable")
    loop = _launch("loop", tmp_path, durable, 2, sigterm=[0, 1], at=4)
    assert loop.ok, str(loop)
    reports = [loop.result(i, "preempted") for i in range(2)]
    at = reports[0]["at"]
    assert at >= 4 and reports[1]["at"] == at, reports
    assert all(at in r["durable"] and at in r["local"] for r in reports), reports
    assert names.run_checkpoint_name(at) in {p.name for p in Path(durable).iterdir()}
    assert ex.verify(f"{durable}/{names.run_checkpoint_name(at)}").ok


def test_the_job_resumes_from_every_host_s_own_part_bit_exactly_with_the_same_batches(
    preempted,
):
    at = preempted["loop"].result(0, "preempted")["at"]
    resume = preempted["resume"]
    assert resume is not None and resume.ok, str(resume)
    for i in range(4):
        report = resume.result(i, "resume")
        assert report["restored"] == at and report["exact"]
        assert report["from"] == str(preempted["root"] / f"host{i}" / names.run_checkpoint_name(at))
        assert report["next"] == pod_worker.batches_after(at, i, 4)


def test_a_corrupt_part_on_one_host_sends_every_process_to_the_durable_copy(preempted):
    at = preempted["loop"].result(0, "preempted")["at"]
    resume = preempted["resume"]
    assert resume is not None and resume.ok, str(resume)
    checkpoint = f"{preempted['durable']}/{names.run_checkpoint_name(at)}"
    for i in range(4):
        report = resume.result(i, "corrupt part")
        assert (report["restored"], report["from"], report["exact"]) == (at, checkpoint, True)
        assert report["next"] == pod_worker.batches_after(at, i, 4)
        # Process 1's damaged part is set aside (the others keep theirs).
        assert (at in report["local"]) == (i != 1)
    aside = preempted["root"] / "host1" / (names.run_checkpoint_name(at) + ".tinax-corrupt")
    assert aside.is_dir()


def test_a_replaced_host_makes_the_job_resume_from_what_every_host_shares(preempted):
    at = preempted["loop"].result(0, "preempted")["at"]
    resume = preempted["resume"]
    assert resume is not None and resume.ok, str(resume)
    checkpoint = f"{preempted['durable']}/{names.run_checkpoint_name(at)}"
    for i in range(4):
        report = resume.result(i, "new host")
        assert (report["restored"], report["from"], report["exact"]) == (at, checkpoint, True)
        assert report["next"] == pod_worker.batches_after(at, i, 4)


def test_raw_orbax_and_tinax_read_the_checkpoint_the_hosts_promoted(preempted):
    at = preempted["loop"].result(0, "preempted")["at"]
    checkpoint = f"{preempted['durable']}/{names.run_checkpoint_name(at)}"
    assert ex.verify(checkpoint, data=True).ok
    one = SingleDeviceSharding(jax.devices()[0])
    loaded = ocp.load_checkpointables(
        checkpoint,
        {
            "model": {
                k: jax.ShapeDtypeStruct(v, np.float32, sharding=one)
                for k, v in pod_worker.SHAPES.items()
            }
        },
    )
    for name, shape in pod_worker.SHAPES.items():
        assert np.array_equal(np.asarray(loaded["model"][name]), expected(name, shape, at))


@pytest.fixture(scope="module")
def killed(tmp_path_factory, gcs) -> dict[str, object]:
    """Two processes, the durable tier on gs://: process 1 is SIGKILLed at step 23;
    then a fresh job resumes."""
    root = tmp_path_factory.mktemp("killed")
    durable = f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"
    loop = _launch("loop", root, durable, 2, kill=[1], at=23, timeout=DEADLINE)
    resume = _launch("resume", root, durable, 2)
    return {"root": root, "durable": durable, "loop": loop, "resume": resume}


DEADLINE = 10


def test_a_killed_process_ends_the_other_with_one_error_naming_it_and_the_step(killed):
    loop = killed["loop"]
    kill = loop.result(1, "killed")
    lost = loop.result(0, "lost")
    assert lost["missing"] == [1]
    assert lost["message"].startswith("process 1 of 2 did not reach the end of the save of step ")
    assert lost["message"].endswith(f"within {DEADLINE} s (process 0 did): it has died or stalled")
    # Noticed at the next save, reported at its deadline.
    assert 0 < lost["time"] - kill["time"] < DEADLINE + 30, (lost, kill)
    assert loop.returncodes[0] == 1 and loop.returncodes[1] == -9


def test_the_restarted_job_cleans_up_and_resumes_from_a_step_every_host_holds(killed):
    resume = killed["resume"]
    assert resume.ok, str(resume)
    reports = [resume.result(i, "resume") for i in range(2)]
    step = reports[0]["restored"]
    assert step is not None and all(r["restored"] == step and r["exact"] for r in reports)
    for i, report in enumerate(reports):
        assert report["next"] == pod_worker.batches_after(step, i, 2)
        # Nothing of the killed job's unfinished saves is left, in either tier.
        assert report["left"] == [], report
        # Each read its own part through tinax's engine, not Orbax.
        assert report["orbax"] == [], report
    # With the last process's directory gone, from the bucket, through the engine too.
    for i in range(2):
        report = resume.result(i, "new host")
        assert report["from"].startswith(killed["durable"]) and report["exact"], report
        assert report["orbax"] == [] and report["next"] == pod_worker.batches_after(
            report["restored"], i, 2
        )
    # Nothing half-committed is left in the bucket: every step there is complete.
    listed = ex.list_checkpoints(killed["durable"])
    assert set(listed["status"]) <= {words.COMPLETE}
