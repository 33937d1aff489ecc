"""Jobs of several hosts, each with a local directory of its own: real ``jax.distributed``
jobs on localhost (tests/pod_worker.py), one local directory per process standing for
its host's disk, the durable tier a path or a ``gs://`` bucket (the emulator)."""

from __future__ import annotations

import uuid
from pathlib import Path

import cluster
import jax
import numpy as np
import pod_worker
import pytest
from conftest import BUCKET
from jax.sharding import SingleDeviceSharding
from multiprocess_worker import expected
from orbax.checkpoint import v1 as ocp

import tinax.explore as ex
from tinax._format.naming import words

WORKER = Path(pod_worker.__file__)


@pytest.fixture(scope="module", params=["path", "gs"])
def parts(request, tmp_path_factory) -> tuple[cluster.Outcome, Path, str]:
    root = tmp_path_factory.mktemp("parts")
    if request.param == "gs":
        request.getfixturevalue("gcs")
        durable = f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"
    else:
        durable = str(root / "durable")
    outcome = cluster.launch(WORKER, "parts", root, durable, processes=2, devices=2)
    return outcome, root, durable


def test_each_host_keeps_its_own_part_and_loads_it_alone(parts):
    outcome, root, _ = parts
    assert outcome.ok, str(outcome)
    for i in range(2):
        own = outcome.result(i, "own part")
        assert own["exact"] and own["orbax"] == [], own
        assert own["next"] == outcome.result(i, "want")["next"]
        model = root / f"host{i}" / "step_000007" / "model"
        # Its own array store and records only: nothing of the other process's.
        assert {p.name for p in model.iterdir() if p.name.startswith("ocdbt.process_")} == {
            f"ocdbt.process_{i}"
        }
        assert sorted(p.name for p in (model / "tinax_checksums").iterdir()) == [
            f"process_{i}.json"
        ]
        iterator = root / f"host{i}" / "step_000007" / "iterator"
        assert sorted(p.name for p in iterator.glob("process_*.json")) == [f"process_{i}-of-2.json"]


def test_the_parts_promote_to_one_checkpoint_that_loads_everywhere(parts):
    outcome, _, durable = parts
    assert outcome.ok, str(outcome)
    for i in range(2):
        back = outcome.result(i, "durable")
        # Each process read its own shards through tinax's engine, and its own iterator.
        assert back["exact"] and back["orbax"] == [], back
        assert back["auxiliary"] == {"loss": 0.5, "tag": "parts"}
        assert back["next"] == outcome.result(i, "want")["next"]
    checkpoint = f"{durable}/step_000007"
    listed = ex.list_checkpoints(durable)
    assert list(listed["status"]) == [words.COMPLETE]
    assert ex.verify(checkpoint, data=True).ok
    # Raw Orbax on one process loads it as a checkpoint like any other.
    one = SingleDeviceSharding(jax.devices()[0])
    loaded = ocp.load_checkpointables(
        checkpoint,
        {
            "model": {
                "w": jax.ShapeDtypeStruct((8, 16), np.float32, sharding=one),
                "b": jax.ShapeDtypeStruct((16,), np.float32, sharding=one),
            }
        },
    )
    assert np.array_equal(np.asarray(loaded["model"]["w"]), expected("w", (8, 16), 7))
    assert np.array_equal(np.asarray(loaded["model"]["b"]), expected("b", (16,), 7))
