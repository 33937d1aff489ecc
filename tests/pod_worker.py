"""One process of a job of several hosts, each with a local directory of its own.

Started N times by ``cluster.launch`` (see tests/test_pod.py)::

    python pod_worker.py PHASE ROOT DURABLE

``ROOT/host<i>`` is process i's local directory (as on a host of its own); DURABLE
is the durable tier (a path, or a ``gs://`` URL).

Phases:
  parts    every process saves its part of a training checkpoint of step 7 to its
           own local directory, the parts are promoted to DURABLE/step_000007, and
           every process loads it back (through tinax's engine) and then its own part
           (from its own directory alone); each reports what it read and which loads
           went through Orbax.

The state is ``run_cluster_worker``'s: a small model sharded over the processes, a
replicated RNG key, a NumPy leaf, a Python scalar and a string, and one Grain
iterator per process at a position of its own.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import cluster
import jax
import numpy as np
from multiprocess_worker import count_orbax_loads, dataset, expected, iterator_at, orbax_loads
from run_cluster_worker import model, rng

from tinax import _paths
from tinax.checkpointing import (
    TrainingCheckpoint,
    TrainingCheckpointNames,
    _host_parts,
    _processes,
    abstract_restore_target,
    load_training_checkpoint,
)
from tinax.checkpointing._promotion import Promotion

STEP = 7


def _position() -> int:
    return 3 + jax.process_index()


def _state() -> TrainingCheckpoint:
    return TrainingCheckpoint(
        STEP,
        model(STEP),
        {"count": np.arange(3) + STEP},
        rng(STEP),
        {"loss": 0.5, "tag": "parts"},
        iterator_at(_position()),
    )


def _load(path: str) -> dict[str, Any]:
    """Loads ``path`` into fresh targets: whether every shard and value is the saved
    one, the next batch, and what went through Orbax's load."""
    del orbax_loads[:]
    saved = _state()
    found = load_training_checkpoint(
        path,
        abstract_restore_target(model(0)),
        {"count": np.zeros(3, int)},
        abstract_restore_target(rng(0)),
        {"loss": 0.0, "tag": ""},
        iter(dataset()),
    )
    exact = all(
        np.array_equal(np.asarray(shard.data), expected(name, shape, STEP)[shard.index])
        for name, shape in (("w", (8, 16)), ("b", (16,)))
        for shard in found.model[name].addressable_shards
    )
    exact = exact and np.array_equal(found.optimizer["count"], saved.optimizer["count"])
    exact = exact and np.array_equal(
        np.asarray(found.rng.addressable_data(0)), np.asarray(saved.rng.addressable_data(0))
    )
    return {
        "exact": bool(exact),
        "auxiliary": found.auxiliary,
        "next": np.asarray(next(found.iterator)).tolist(),
        "orbax": list(orbax_loads),
    }


def parts(root: Path, durable: str) -> None:
    local = root / f"host{jax.process_index()}"
    local.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0 and not durable.startswith("gs://"):
        Path(durable).mkdir(exist_ok=True)  # as TrainingRun makes it
    source = _paths.location(str(local / "step_000007"))
    _host_parts.start_save(
        source, _state(), names=TrainingCheckpointNames(), after_commit=None
    ).result()
    meeting = _processes.Meeting(f"test-parts/{STEP}", 30)
    Promotion(
        STEP,
        source,
        _paths.location(f"{durable}/step_000007"),
        after=lambda error: None,
        previous=None,
        copy=functools.partial(_host_parts.promote_parts, meeting=meeting, step=STEP),
    ).result()
    cluster.report("durable", **_load(f"{durable}/step_000007"))
    with _host_parts.own_storage():
        cluster.report("own part", **_load(str(source)))
    cluster.report("want", next=np.asarray(next(iterator_at(_position()))).tolist())


if __name__ == "__main__":
    phase = sys.argv[1]

    def body() -> None:
        cluster.join()
        count_orbax_loads()
        {"parts": parts}[phase](Path(sys.argv[2]), sys.argv[3])

    cluster.main(body)
