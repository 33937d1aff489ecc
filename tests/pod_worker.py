"""One process of a job of several hosts, each with a local directory of its own.

Started N times by ``cluster.launch`` (see tests/test_pod.py)::

    python pod_worker.py PHASE ROOT DURABLE [OPTIONS_JSON]

``ROOT/host<i>`` is process i's local directory (as on a host of its own); DURABLE
is the durable tier (a path, or a ``gs://`` URL).

Phases:
  loop     a ``TrainingRun`` (``save_every=10, keep=2, local_every=5, local_keep=2``)
           resumes and trains, saving at every step, until it is preempted or
           killed; OPTIONS may say ``{"sigterm": [processes], "at": step}`` (those
           processes send themselves SIGTERM at that step: JAX's notifier tells every
           process) or ``{"kill": [processes], "at": step}`` (SIGKILL; ``"where":
           "promotion"`` kills them when their promotion of that step, or of the
           next one promoted, starts), ``"after": n`` instead of ``"at"`` (n steps
           after the one restored), and ``"timeout"`` (the run's). Each reports the step its preemption save
           committed, each tier's steps, or the error that ended it.
  resume   restores three times in one job: as it finds things; after process 1
           flipped a byte of its part of the newest local step; after process
           ``N - 1``'s local directory was deleted (a replaced host). Each time every
           process reports the step, the checkpoint it loaded, whether every value is
           the step's, the next two batches of its iterator, and what went through
           Orbax's load.

The state is ``run_cluster_worker``'s: a small model sharded over the processes, a
replicated RNG key, a NumPy leaf, a Python scalar and a string, and one Grain
iterator per process, every value a fixed function of the step.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import cluster
import grain
import jax
import numpy as np
from damage import file_holding, flip_bits
from jax.experimental import multihost_utils
from jax.sharding import PartitionSpec as P
from multiprocess_worker import count_orbax_loads, expected, global_array, orbax_loads
from run_cluster_worker import rng

from tinax import _paths
from tinax._format.naming import names
from tinax._format.storage.location import FILE
from tinax.checkpointing import (
    ProcessTimeoutError,
    TrainingRun,
    _host_parts,
    _run_files,
    abstract_restore_target,
)
from tinax.checkpointing._run import DEFAULT_TIMEOUT

# The model's arrays: big enough that OCDBT keeps their chunks in data files, not
# inline in its B+tree.
SHAPES = {"w": (8, 256), "b": (256,)}


def dataset(index: int | None = None, count: int | None = None) -> Any:
    """Process ``index``'s shard of the data (this process's by default): long enough
    for a campaign's thousands of steps."""
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    return grain.MapDataset.range(1_000_000)[index::count].batch(4).to_iter_dataset()


def iterator_at(batches: int, index: int | None = None, count: int | None = None) -> Any:
    """Process ``index``'s iterator after ``batches`` batches."""
    iterator = iter(dataset(index, count))
    for _ in range(batches):
        next(iterator)
    return iterator


def batches_after(step: int, index: int, count: int) -> list[list[int]]:
    """The two batches process ``index`` of an uninterrupted run reads after ``step``."""
    iterator = iterator_at(step, index, count)
    return [np.asarray(next(iterator)).tolist() for _ in range(2)]


def model(step: int) -> dict[str, Any]:
    return {
        "w": global_array(expected("w", SHAPES["w"], step), P("data", "model")),
        "b": global_array(expected("b", SHAPES["b"], step), P("model")),
    }


# -- a training run -----------------------------------------------------------------


def _state_at(step: int) -> tuple[Any, Any, Any, Any]:
    return model(step), {"count": np.arange(3) + step}, rng(step), {"loss": float(step)}


def open_run(root: Path, durable: str, options: dict[str, Any]) -> TrainingRun:
    return TrainingRun(
        durable,
        save_every=10,
        keep=2,
        local=root / f"host{jax.process_index()}",
        local_every=5,
        local_keep=2,
        timeout=options.get("timeout", DEFAULT_TIMEOUT),
    )


def _loaded_paths() -> list[str]:
    """Records the checkpoints each of the run's loads reads (``loaded``)."""
    from tinax.checkpointing import _run_restore

    real = _run_restore.restore_training

    def recorded(path: Any, *args: Any, **kwargs: Any) -> Any:
        loaded.append(str(path))
        return real(path, *args, **kwargs)

    _run_restore.restore_training = recorded
    return loaded


loaded: list[str] = []


def unfinished(directory: str | Path) -> list[str]:
    """What killed saves and promotions left in a tier's directory: each directory
    named for a step of the run that holds no committed checkpoint."""
    where = _paths.location(directory)
    if where.is_local and not Path(directory).is_dir():
        return []
    complete = {c.name for c in _run_files.complete_checkpoints(where).values()}
    return sorted(
        name
        for name, entry in where.snapshot().entries().items()
        if entry.kind != FILE
        and names.RUN_CHECKPOINT.match(names.final_name(name))
        and name not in complete
    )


def _restored(run: TrainingRun, root: Path, durable: str) -> dict[str, Any]:
    """Restores ``run``: the step, which checkpoint loaded, whether every value is the
    step's, the next two batches of this process's iterator, and what a killed job
    before it left (``left``): unfinished saves in the durable tier once the run has
    opened (on process 0, before the restore resumes promotions there), and in this
    process's local directory unfinished saves and parts of steps after the one
    restored, once it has restored."""
    me = jax.process_index()
    left = [f"durable/{name}" for name in unfinished(durable)] if me == 0 else []
    del loaded[:], orbax_loads[:]
    iterator = iter(dataset())
    model_target, optimizer_target, rng_target, auxiliary_target = _state_at(0)
    found = run.restore(
        abstract_restore_target(model_target),
        {"count": np.zeros(3, int)},
        abstract_restore_target(rng_target),
        auxiliary_target,
        iterator,
    )
    local = root / f"host{me}"
    left += [f"host{me}/{name}" for name in unfinished(local)]
    if found is None:
        return {"restored": None, "left": left}
    if local.is_dir():
        # Parts of steps after the one restored: the job saves those steps again.
        complete = _run_files.complete_checkpoints(_paths.location(local))
        left += [f"host{me}/{c.name}" for step, c in complete.items() if step > found.step]
    want = _state_at(found.step)
    exact = all(
        np.array_equal(np.asarray(shard.data), expected(name, shape, found.step)[shard.index])
        for name, shape in SHAPES.items()
        for shard in found.model[name].addressable_shards
    )
    exact = exact and np.array_equal(found.optimizer["count"], want[1]["count"])
    exact = exact and np.array_equal(
        np.asarray(found.rng.addressable_data(0)), np.asarray(want[2].addressable_data(0))
    )
    exact = exact and found.auxiliary == want[3]
    return {
        "restored": found.step,
        "from": loaded[-1],
        "exact": bool(exact),
        "next": [np.asarray(next(iterator)).tolist() for _ in range(2)],
        "orbax": list(orbax_loads),
        "left": left,
    }


def _act(options: dict[str, Any], step: int) -> None:
    """What OPTIONS say this process does at ``step``."""
    me = jax.process_index()
    if step != options.get("at"):
        return
    if me in options.get("sigterm", ()):
        os.kill(os.getpid(), signal.SIGTERM)
    if me in options.get("kill", ()) and options.get("where") != "promotion":
        cluster.report("killed", at=step, time=time.time())
        os.kill(os.getpid(), signal.SIGKILL)


def _kill_in_promotion(options: dict[str, Any]) -> None:
    """Kills this process when its first promotion of a step from ``at`` on starts
    sending its part."""
    real = _host_parts._send_part

    def send(source: Any, target: Any, process: int) -> None:
        if int(source.name.removeprefix("step_")) >= options["at"]:
            cluster.report("killed", at=options["at"], time=time.time())
            os.kill(os.getpid(), signal.SIGKILL)
        real(source, target, process)

    _host_parts._send_part = send


def loop(root: Path, durable: str, options: dict[str, Any]) -> None:
    run = open_run(root, durable, options)
    restored = _restored(run, root, durable)
    cluster.report("started", **restored)
    start = 1 if restored["restored"] is None else restored["restored"] + 1
    if "after" in options:
        options["at"] = start - 1 + options["after"]
    if jax.process_index() in options.get("kill", ()) and options.get("where") == "promotion":
        _kill_in_promotion(options)
    iterator = iterator_at(start - 1)
    for step in range(start, 100_000):
        next(iterator)
        _act(options, step)
        try:
            run.save(step, *_state_at(step), iterator)
        except ProcessTimeoutError as e:
            cluster.report(
                "lost", at=step, message=str(e), missing=list(e.missing), time=time.time()
            )
            raise
        if run.preempted:
            cluster.report("preempted", at=step, durable=run.durable_steps, local=run.local_steps)
            break
    run.close()


def resume(root: Path, durable: str, options: dict[str, Any]) -> None:
    me, count = jax.process_index(), jax.process_count()
    run = open_run(root, durable, options)
    first = _restored(run, root, durable)
    cluster.report("resume", **first)
    newest = first["restored"]
    run.close()
    multihost_utils.sync_global_devices("tinax-test: restored")
    if me == 1:
        part = root / "host1" / f"step_{newest:06d}" / "model"
        # A byte of the first row of ``w`` this process holds, where it is stored.
        index = model(newest)["w"].addressable_shards[0].index
        row = expected("w", SHAPES["w"], newest)[index][0].tobytes()
        path, at = file_holding(part, row)
        flip_bits(path, at + 5)
    multihost_utils.sync_global_devices("tinax-test: a part corrupt")
    run = open_run(root, durable, options)
    cluster.report("corrupt part", **_restored(run, root, durable), local=run.local_steps)
    run.close()
    multihost_utils.sync_global_devices("tinax-test: restored again")
    if me == count - 1:
        shutil.rmtree(root / f"host{me}")
    multihost_utils.sync_global_devices("tinax-test: a new host")
    run = open_run(root, durable, options)
    cluster.report("new host", **_restored(run, root, durable))
    run.close()


def launch(
    phase: str,
    root: Path,
    durable: str,
    processes: int,
    options: dict[str, Any],
    *,
    timeout: float = 420,
    heartbeat: int = 120,
) -> cluster.Outcome:
    """Runs ``phase`` as a job of ``processes`` processes of two CPU devices each (the
    launching side). No process is killed for another's end: each must end on its own
    (JAX's heartbeat, ``heartbeat`` seconds, is set beyond the runs' timeouts)."""
    return cluster.launch(
        __file__,
        phase,
        root,
        durable,
        json.dumps(options),
        processes=processes,
        devices=2,
        timeout=timeout,
        grace=timeout,
        heartbeat=heartbeat,
    )


if __name__ == "__main__":
    phase = sys.argv[1]

    def body() -> None:
        cluster.join()
        count_orbax_loads()
        _loaded_paths()
        options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
        root, durable = Path(sys.argv[2]), sys.argv[3]
        {"loop": loop, "resume": resume}[phase](root, durable, options)

    cluster.main(body)
