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
  refused  every process names a local directory of its own (``LOCAL/<index>``), as
           if each were on a host of its own; then process 1 says it runs on another
           host: every process reports each refusal.

The state is ``run_cluster_worker``'s: a small model sharded over the processes, a
replicated RNG key and one Grain iterator per process, each a fixed function of the step.
"""

from __future__ import annotations

import shutil
import socket
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
    found = {}
    own = local / str(jax.process_index())
    own.mkdir(parents=True, exist_ok=True)
    for how, where in (("paths", own), ("hosts", local)):
        if how == "hosts" and jax.process_index() == 1:
            socket.gethostname = lambda: "another-host"  # type: ignore[assignment]
        try:
            open_run(directory, where).close()
            found[how] = None
        except ValueError as e:
            found[how] = str(e)
    cluster.report("refused", **found)


if __name__ == "__main__":
    phase = sys.argv[1]

    def body() -> None:
        cluster.join()
        where, local = Path(sys.argv[2]), Path(sys.argv[3])
        {"loop": loop, "resume": resume, "refused": refused}[phase](where, local)

    cluster.main(body)
