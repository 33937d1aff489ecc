"""One process of a multi-process training loop checkpointed by ``TrainingRun``.

Started N times by ``cluster.launch`` (see tests/test_training_run.py)::

    python run_cluster_worker.py PHASE DIRECTORY

Phases:
  loop     train steps 1.. with ``save_every=10, keep=2, keep_best=1``; at step 25
           process 1 sends itself SIGTERM (JAX's preemption notifier catches it and
           tells every process); every process reports the step at which it saved
           for the preemption and the run's steps.
  resume   restore the run in fresh processes and report the step, whether every
           shard holds that step's values, and the next batch of each iterator.

The state is a small model sharded over the ("data", "model") mesh, a replicated RNG
key and one Grain iterator per process; every value is a fixed function of the step.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cluster
import jax
import numpy as np
from jax.sharding import PartitionSpec as P
from multiprocess_worker import dataset, expected, global_array

from tinax.checkpointing import TrainingRun, abstract_restore_target


def model(step: int) -> dict[str, Any]:
    return {
        "w": global_array(expected("w", (8, 16), step), P("data", "model")),
        "b": global_array(expected("b", (16,), step), P("model")),
    }


def rng(step: int) -> Any:
    return global_array(np.asarray(jax.random.key_data(jax.random.key(step))), P())


def loss(step: int) -> float:
    return float(abs(step - 10))


def open_run(directory: Path) -> TrainingRun:
    return TrainingRun(directory, save_every=10, keep=2, keep_best=1, best_by="loss")


def train(run: TrainingRun, on_preempted: Callable[[int], None] | None = None) -> int | None:
    """Trains ``run`` until it is preempted (process 1 signals itself at step 25);
    returns the step its preemption save committed (``on_preempted`` is told it)."""
    iterator = iter(dataset())
    for step in range(1, 200):
        next(iterator)
        if step == 25 and jax.process_index() == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        run.save(
            step,
            model(step),
            {"count": np.asarray(step)},
            rng(step),
            {"loss": loss(step)},
            iterator,
        )
        if run.preempted:
            if on_preempted is not None:
                on_preempted(step)
            return step
    return None


def loop(directory: Path) -> None:
    run = open_run(directory)
    saved_for_preemption = train(run)
    run.close()
    cluster.report("loop", preempted_at=saved_for_preemption, steps=run.steps)


def restored(run: TrainingRun) -> dict[str, Any]:
    """Restores ``run``: the step, whether every shard holds that step's values, and
    the next batch of this process's iterator."""
    iterator = iter(dataset())
    found = run.restore(
        abstract_restore_target(model(0)),
        {"count": abstract_restore_target(np.asarray(0))},
        abstract_restore_target(rng(0)),
        {"loss": 0.0},
        iterator,
    )
    assert found is not None
    step = found.step
    exact = all(
        np.array_equal(np.asarray(shard.data), expected(name, shape, step)[shard.index])
        for name, shape in (("w", (8, 16)), ("b", (16,)))
        for shard in found.model[name].addressable_shards
    )
    return {"restored": step, "exact": exact, "next": np.asarray(next(iterator)).tolist()}


def resume(directory: Path) -> None:
    run = open_run(directory)
    report = restored(run)
    run.close()
    cluster.report("resume", **report)


if __name__ == "__main__":
    phase = sys.argv[1]

    def body() -> None:
        cluster.join()
        (loop if phase == "loop" else resume)(Path(sys.argv[2]))

    cluster.main(body)
