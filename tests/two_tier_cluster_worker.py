"""One process of a multi-process training loop with a two-tier ``TrainingRun``.

Started N times by ``cluster.launch`` (see tests/test_two_tier_run.py)::

    python two_tier_cluster_worker.py PHASE DIRECTORY LOCAL

Phases:
  loop     train steps 1.. with ``save_every=10, local_every=5, keep=2``, every process
           sharing the local directory; at step 25 process 1 sends itself SIGTERM
           (JAX's preemption notifier tells every process); every process reports the
           step it saved for the preemption and each tier's steps.
  resume   restore in fresh processes and report the step, whether every shard holds
           that step's values, and the next batch of each iterator; then, the local
           directory removed (a new machine), the same again.
  refused  processes 0 and 1 name one local directory (``LOCAL/shared``) and every
           other process one of its own (``LOCAL/<index>``): every process reports
           the refusal.

The state is ``run_cluster_worker``'s: a small model sharded over the processes, a
replicated RNG key and one Grain iterator per process, each a fixed function of the step.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import cluster
import jax
from run_cluster_worker import restored, train

from tinax.checkpointing import TrainingRun


def open_run(directory: Path, local: Path) -> TrainingRun:
    return TrainingRun(directory, save_every=10, keep=2, local=local, local_every=5)


def loop(directory: Path, local: Path) -> None:
    run = open_run(directory, local)
    # The durable commit is in before the loop ends, on every process.
    saved_for_preemption = train(
        run,
        lambda step: cluster.report("preempted", at=step, durable=run.durable_steps),
    )
    run.close()
    cluster.report(
        "loop", preempted_at=saved_for_preemption, durable=run.durable_steps, local=run.local_steps
    )


def _restore(directory: Path, local: Path) -> dict[str, Any]:
    run = open_run(directory, local)
    report = restored(run)
    run.close()
    return report


def resume(directory: Path, local: Path) -> None:
    from jax.experimental import multihost_utils

    cluster.report("resume", **_restore(directory, local))
    multihost_utils.sync_global_devices("tinax-test: restored")
    if jax.process_index() == 0:
        shutil.rmtree(local)
    multihost_utils.sync_global_devices("tinax-test: a new machine")
    cluster.report("new machine", **_restore(directory, local))


def refused(directory: Path, local: Path) -> None:
    me = jax.process_index()
    own = local / ("shared" if me < 2 else str(me))
    own.mkdir(parents=True, exist_ok=True)
    try:
        open_run(directory, own).close()
        cluster.report("refused", error=None)
    except ValueError as e:
        cluster.report("refused", error=str(e))


if __name__ == "__main__":
    phase = sys.argv[1]

    def body() -> None:
        cluster.join()
        where, local = Path(sys.argv[2]), Path(sys.argv[3])
        {"loop": loop, "resume": resume, "refused": refused}[phase](where, local)

    cluster.main(body)
