"""One process of a multi-process training job that saves and loads tinax checkpoints.

Started N times by ``cluster.launch`` (see tests/test_multiprocess.py)::

    python multiprocess_worker.py PHASE DIRECTORY

The training state: a model of two dense layers sharded over a 2-D device mesh
(``data`` across processes, ``model`` within one), optax's Adam state sharded like
it, a replicated RNG key, auxiliary values, and a Grain iterator per process over
that process's shard of the data, each at a different position. Every array's value
is a fixed function of its key path, so any set of processes on any topology knows
what each shard must hold.

Phases:
  save       save ``ck``; then refusals every process must agree on: ``ck`` again
             (exists), ``held`` (claimed by the launching process), ``bad`` (process
             1 has a leaf Orbax cannot store); then ``after``, which must work.
  load       load ``ck`` in fresh processes and check every shard and iterator;
             plan a resharded restore of it, and refuse a load over one process's
             budget.
  kill       save ``killed``; process 1 kills itself (SIGKILL) inside the save,
             after the arrays are written and before the commit.
  recover    save ``killed`` again (the interrupted save is cleared) and load it
             back; load ``one`` (saved by one process) onto this topology.
  one-save   (one process, one device) save ``one``.
  one-load   (one process, one device) load ``ck``, saved by two processes.
  absent     process 1 never calls the save that the others make.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import cluster
import grain
import jax
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tinax.checkpointing import (
    abstract_restore_target,
    load_checkpointables,
    load_training_checkpoint,
    save_training_checkpoint,
)

# Key path → (global shape, partition spec over ("data", "model")).
MODEL = {
    "dense1": {"kernel": ((16, 32), P("data", "model")), "bias": ((32,), P("model"))},
    "dense2": {"kernel": ((32, 8), P("model", None)), "bias": ((8,), P())},
    # 24 MiB: on two devices its 12 MiB shards are each stored in more than one chunk.
    "embed": {"table": ((1024, 6144), P(None, "model"))},
}
AUXILIARY = {"loss": 0.125, "tag": "two-d"}
STEP = 7


def mesh() -> Any:
    devices = jax.device_count()
    model_axis = 2 if devices % 2 == 0 else 1
    return jax.make_mesh((devices // model_axis, model_axis), ("data", "model"))


@functools.cache
def expected(name: str, shape: tuple[int, ...], salt: int) -> np.ndarray:
    """The global value of the array at ``name`` (a fixed function of it), read-only.

    Made once per process: a worker asks for each array several times (for its state,
    its target and its checks), and drawing the 24 MiB table each time was a third of
    a worker's CPU."""
    rng = np.random.default_rng(zlib.crc32(name.encode()) + salt)
    value = rng.standard_normal(shape, dtype=np.float32)
    value.flags.writeable = False
    return value


def global_array(value: np.ndarray, spec: Any) -> Any:
    sharding = NamedSharding(mesh(), spec)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def _layers(part: str, salt: int) -> dict[str, Any]:
    """A tree shaped like ``MODEL`` of (global value, partition spec) pairs."""
    return {
        layer: {
            name: (expected(f"{part}/{layer}/{name}", shape, salt), spec)
            for name, (shape, spec) in leaves.items()
        }
        for layer, leaves in MODEL.items()
    }


def _values(salt: int) -> dict[str, Any]:
    """Every checkpointed array as (global value, partition spec), by checkpointable."""
    count = (np.asarray(STEP + salt, np.int32), P())
    key = (np.asarray(jax.random.key_data(jax.random.key(42 + salt))), P())
    adam = optax.ScaleByAdamState(count=count, mu=_layers("mu", salt), nu=_layers("nu", salt))
    return {
        "model": _layers("model", salt),
        "optimizer": (adam, optax.EmptyState()),
        "rng": key,
    }


def _is_pair(x: Any) -> bool:
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], np.ndarray)


def state(name: str, salt: int) -> Any:
    """The live (sharded) value of one checkpointable."""
    return jax.tree.map(lambda pair: global_array(*pair), _values(salt)[name], is_leaf=_is_pair)


def model_state(salt: int) -> Any:
    return state("model", salt)


def optimizer_state(salt: int) -> Any:
    """Adam's state as optax builds it, with every moment a distinct sharded array."""
    built = state("optimizer", salt)
    real = jax.eval_shape(optax.adam(1e-3).init, model_state(salt))
    assert jax.tree.structure(real) == jax.tree.structure(built)
    return built


def rng_state(salt: int) -> Any:
    return state("rng", salt)


def dataset(index: int | None = None, count: int | None = None) -> Any:
    """Process ``index``'s shard of the data (this process's by default)."""
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    return grain.MapDataset.range(1000)[index::count].batch(4).to_iter_dataset()


def position(index: int | None = None) -> int:
    """How many batches process ``index`` has read when it saves."""
    return 3 * ((jax.process_index() if index is None else index) + 1)


def iterator_at(batches: int, index: int | None = None, count: int | None = None) -> Any:
    iterator = iter(dataset(index, count))
    for _ in range(batches):
        next(iterator)
    return iterator


def save(path: Path, *, auxiliary: Any = AUXILIARY) -> None:
    save_training_checkpoint(
        path,
        STEP,
        model_state(0),
        optimizer_state(0),
        rng_state(0),
        auxiliary,
        iterator_at(position()),
    ).result()


def check_arrays(name: str, restored: Any, target: Any) -> int:
    """Checks every addressable shard of ``restored`` exactly; returns how many."""
    values = [pair[0] for pair in jax.tree.leaves(_values(0)[name], is_leaf=_is_pair)]
    got, targets = jax.tree.leaves(restored), jax.tree.leaves(target)
    assert len(got) == len(values) == len(targets), name
    shards = 0
    for value, out, aim in zip(values, got, targets, strict=True):
        assert out.sharding == aim.sharding, (name, out.sharding, aim.sharding)
        assert out.shape == value.shape and out.dtype == value.dtype, name
        for shard in out.addressable_shards:
            assert np.array_equal(np.asarray(shard.data), value[shard.index]), name
            shards += 1
    return shards


def targets() -> tuple[Any, Any, Any]:
    """Restore targets from live state on this topology (values that differ from disk)."""
    live = (model_state(99), optimizer_state(99), rng_state(99))
    return tuple(abstract_restore_target(x) for x in live)  # type: ignore[return-value]


# The checkpointables each load of this process left to Orbax's load.
orbax_loads: list[list[str]] = []


def count_orbax_loads() -> None:
    """Records in ``orbax_loads`` what each load asks Orbax to load."""
    from tinax.checkpointing import _checkpointables

    real = _checkpointables.ocp.load_checkpointables

    def counted(path: Any, targets: Any, *args: Any, **kwargs: Any) -> Any:
        orbax_loads.append(sorted(targets))
        return real(path, targets, *args, **kwargs)

    _checkpointables.ocp.load_checkpointables = counted


def load_training(path: Path) -> None:
    model, optimizer, rng = targets()
    iterator = iter(dataset())
    start = time.monotonic()
    del orbax_loads[:]
    ckpt = load_training_checkpoint(path, model, optimizer, rng, {"loss": 0.0, "tag": ""}, iterator)
    seconds = time.monotonic() - start
    shards = sum(
        check_arrays(name, value, target)
        for name, value, target in (
            ("model", ckpt.model, model),
            ("optimizer", ckpt.optimizer, optimizer),
            ("rng", ckpt.rng, rng),
        )
    )
    assert ckpt.step == STEP and ckpt.auxiliary == AUXILIARY, (ckpt.step, ckpt.auxiliary)
    batch = next(ckpt.iterator)
    assert np.array_equal(batch, next(iterator_at(position()))), batch
    cluster.report(
        "load",
        path=str(path),
        shards=shards,
        batch=batch.tolist(),
        seconds=seconds,
        orbax=list(orbax_loads),
    )


def load_values(path: Path, step: str) -> None:
    """Loads everything but the iterator: what carries over to another process count."""
    model, optimizer, rng = targets()
    out = load_checkpointables(
        path,
        {
            "model": model,
            "optimizer": optimizer,
            "rng": rng,
            "auxiliary": {"step": 0, "state": {"loss": 0.0, "tag": ""}},
        },
    )
    shards = sum(
        check_arrays(name, out[name], target)
        for name, target in (("model", model), ("optimizer", optimizer), ("rng", rng))
    )
    assert out["auxiliary"] == {"step": STEP, "state": AUXILIARY}, out["auxiliary"]
    cluster.report(step, path=str(path), shards=shards, devices=jax.device_count())


def _read_chars() -> int:
    """The bytes this process has read so far (``rchar``)."""
    return int(Path("/proc/self/io").read_text().split("rchar:")[1].split()[0])


def plans(path: Path) -> None:
    """The restore plan in a job of two processes: the embedding (saved in column
    halves, which both processes hold) restored in column quarters, each process
    holding one quarter of each half, so that each reads whole saved chunks and keeps
    half of each; then a budget that only process 1 is under, which refuses the load
    on both."""
    import tinax.checkpointing as tc
    import tinax.explore as ex

    model = targets()[0]
    quarters = NamedSharding(mesh(), P(None, ("model", "data")))
    target = {**model, "embed": {"table": model["embed"]["table"].update(sharding=quarters)}}
    table = ex.restore_plan(path, {"model": target})
    before = _read_chars()
    check_arrays("model", load_checkpointables(path, {"model": target})["model"], target)
    cluster.report(
        "plan",
        rows=[
            [int(row.process), row.device, int(row.read_bytes), int(row.beyond_bytes)]
            for row in table.itertuples()
        ],
        warnings=table.attrs["warnings"],
        read=_read_chars() - before,
    )
    try:
        with tc.memory_budget(64 << 10 if jax.process_index() == 1 else None):
            load_checkpointables(path, {"model": model})
    except Exception as e:
        cluster.report("budget", error=type(e).__name__, message=str(e))
    else:
        cluster.report("budget", error=None, message="")


def refused(step: str, path: Path, **kwargs: Any) -> None:
    """Saves to ``path`` expecting a refusal; reports what was raised and how fast."""
    start = time.monotonic()
    try:
        save(path, **kwargs)
    except Exception as e:
        cluster.report(
            step, error=type(e).__name__, message=str(e), seconds=time.monotonic() - start
        )
        return
    cluster.report(step, error=None, message="", seconds=time.monotonic() - start)


def die_inside_the_save() -> None:
    """SIGKILLs this process at Orbax's barrier after its arrays are written."""
    from orbax.checkpoint._src.futures import signaling_client

    client = signaling_client.JaxDistributedSignalingClient
    wait = client.wait_at_barrier

    def wait_or_die(self: Any, key: str, **kwargs: Any) -> Any:
        if "commit_complete" in key:
            print(f"killing myself at barrier {key}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return wait(self, key, **kwargs)

    client.wait_at_barrier = wait_or_die


def run(phase: str, directory: Path) -> None:
    cluster.join()
    count_orbax_loads()
    cluster.report("started", processes=jax.process_count(), devices=jax.device_count())
    if phase == "save":
        save(directory / "ck")
        cluster.report("saved")
        refused("exists", directory / "ck")
        refused("held", directory / "held")
        bad = {**AUXILIARY, "callback": print} if jax.process_index() == 1 else AUXILIARY
        refused("bad", directory / "bad", auxiliary=bad)
        save(directory / "after")
        cluster.report("after")
    elif phase == "load":
        load_training(directory / "ck")
        plans(directory / "ck")
    elif phase == "kill":
        if jax.process_index() == 1:
            die_inside_the_save()
        save(directory / "killed")
        raise AssertionError("the save committed although a process was killed inside it")
    elif phase == "recover":
        save(directory / "killed")
        cluster.report("recovered")
        load_training(directory / "killed")
        load_values(directory / "one", "from-one")
    elif phase == "one-save":
        save(directory / "one")
        cluster.report("saved")
    elif phase == "one-load":
        load_values(directory / "ck", "from-two")
        model, optimizer, rng = targets()
        try:
            load_training_checkpoint(
                directory / "ck", model, optimizer, rng, {"loss": 0.0, "tag": ""}, iter(dataset())
            )
        except ValueError as e:
            cluster.report("training-load", error=type(e).__name__, message=str(e))
    elif phase == "gcs":
        url = sys.argv[2]  # a gs:// URL, which Path would mangle
        save(f"{url}/ck")  # type: ignore[arg-type]
        cluster.report("saved")
        refused("exists", f"{url}/ck")  # type: ignore[arg-type]
        load_training(f"{url}/ck")  # type: ignore[arg-type]
    elif phase == "absent":
        if jax.process_index() != 1:
            refused("absent", directory / "absent")
    else:
        raise SystemExit(f"unknown phase {phase!r}")


if __name__ == "__main__":
    cluster.main(lambda: run(sys.argv[1], Path(sys.argv[2])))
