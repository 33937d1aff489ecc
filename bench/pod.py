"""A job of several processes, as on a pod slice: tinax beside raw Orbax, in one run.

A real ``jax.distributed`` job on localhost (tests/cluster.py): ``--processes``
processes (4) with ``--devices`` CPU devices each (2), holding a flax NNX model and
its adamw state (optax), every array sharded over all the job's devices along its
largest dimension (a fully sharded state of ``--mb`` MB, 300 by default). Each round,
in alternating order, tinax and raw Orbax (V1, its defaults) each save the state and
load it back onto the same sharding; tinax also loads its checkpoint onto another
mesh (processes x devices, each array's second dimension split too, as tensor
parallelism would split it). Each system first saves and loads once untimed (what a
process pays once, at its first save, is not what each save of a run costs). Every
process times each call after a barrier; a round's time is its slowest process's,
and the figures are medians over ``--rounds`` rounds:

- a save call's blocking time (until it returns; the commit is waited for apart).
  The two systems' saves alternate (tinax, Orbax; Orbax, tinax; ...), and each
  round's ratio is taken between its two saves, a second or so apart: on a shared
  machine whose load comes and goes, the median of these paired ratios is what the
  goal is judged on (the ratio of the two medians is printed beside it, with every
  round's ratio, the same figures for each round's middle process rather than its
  slowest, and the machine's load average before and after);
- a load's time, every process loading at once;
- the bytes each process read (``rchar`` of ``/proc/self/io``, every read of every
  thread) over the checkpoint's bytes on disk: a process of a fully sharded state
  needs its share, 1/processes, and no more.

Then the no-hang figure: a job of ``TrainingRun`` processes with a local directory
each (tests/pod_worker.py), saving at every step, in which process 1 is SIGKILLed at
step 23; the time from the kill to the exit of every other process, each with one
error naming the process that did not arrive and the step (``--deadline`` seconds is
the run's ``timeout``; JAX's own heartbeat is set beyond it).

Goals (the exit status is 1 if one is missed): bytes read per process ÷ checkpoint
bytes ≤ 0.3; tinax's load ≥ 2× as fast as raw Orbax's; tinax's save blocking ≤ 1.1×
raw Orbax's (the median of the rounds' paired ratios); every other process gone
within the deadline + 15 s of the kill (``--no-kill`` leaves that part out).

Run: python bench/pod.py [--mb 300] [--rounds 3] [--processes 4] [--devices 2]
       [--deadline 20] [--no-kill] [--dir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import cluster
import pod_worker

MB = 1_000_000
WIDTH = 1024

# -- inside a worker -------------------------------------------------------------------


def _read_chars() -> int:
    """Bytes this process has read so far, by any thread (``rchar``)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


def _state(megabytes: float) -> tuple[dict[str, Any], Any]:
    """The NNX model's state and its adamw state (``model``, ``optimizer``), every
    array sharded over all devices along its largest dimension; and a function giving
    abstract targets of that layout (``"saved"``) or of another (``"other"``)."""
    import jax
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    # Parameters a third of the state, moments (adamw's mu and nu) the rest.
    layers = max(1, round(megabytes * MB / 3 / 4 / (WIDTH * WIDTH)))

    class Model(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.layers = nnx.List([nnx.Linear(WIDTH, WIDTH, rngs=rngs) for _ in range(layers)])

        def __call__(self, x: Any) -> Any:
            for layer in self.layers:
                x = nnx.relu(layer(x))
            return x

    def build() -> dict[str, Any]:
        model = Model(nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
        return {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}

    abstract = nnx.eval_shape(build)

    def spec(leaf: Any, mesh: Any) -> Any:
        """Each array split along its largest dimension over the mesh's first axis
        (every device, when the mesh is one-dimensional), and its second over the
        second axis where there is one."""
        shape = tuple(leaf.shape)
        if not shape:
            return P()
        axis = max(range(len(shape)), key=lambda d: (shape[d], -d))
        names: list[Any] = [None] * len(shape)
        first, *rest = mesh.axis_names
        if shape[axis] % mesh.shape[first] == 0:
            names[axis] = first
        others = [d for d in range(len(shape)) if d != axis]
        if rest and others and shape[others[0]] % mesh.shape[rest[0]] == 0:
            names[others[0]] = rest[0]
        return P(*names)

    def targets(layout: str) -> Any:
        """``"saved"``: sharded over all devices along one dimension (a fully sharded
        state); ``"other"``: onto a mesh of processes x devices of a process (the
        second split as tensor parallelism would)."""
        if layout == "saved":
            mesh = jax.make_mesh((jax.device_count(),), ("all",))
        else:
            local = jax.local_device_count()
            mesh = jax.make_mesh((jax.device_count() // local, local), ("data", "model"))
        return jax.tree.map(
            lambda leaf: jax.ShapeDtypeStruct(
                leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec(leaf, mesh))
            ),
            abstract,
        )

    def value(path: Any, leaf: Any) -> Any:
        seed = _seed(jax.tree_util.keystr(path))
        return jax.make_array_from_callback(
            leaf.shape,
            leaf.sharding,
            lambda index: values_at(seed, leaf.shape, index).astype(leaf.dtype),
        )

    concrete = jax.tree_util.tree_map_with_path(value, targets("saved"))
    jax.block_until_ready(concrete)
    return concrete, targets


def _seed(key: str) -> int:
    import zlib

    return zlib.crc32(key.encode())


def values_at(seed: int, shape: tuple[int, ...], index: tuple[slice, ...]) -> Any:
    """The values of an array's box ``index``: a fixed function of the position, so
    that any process can tell what any part of any array must hold."""
    import numpy as np

    if not shape:
        return np.asarray(seed % 1000, np.float32)
    grids = np.ogrid[tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape, strict=True))]
    flat = sum(g * math.prod(shape[d + 1 :]) for d, g in enumerate(grids))
    return (((flat + seed) * 2654435761) % 1000003).astype(np.float32) / 1000003


def _timed(label: str, call: Any, *args: Any) -> Any:
    """``call(*args)`` once every process is there, timed, with the bytes it read."""
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(f"tinax-bench:{label}")
    before = _read_chars()
    start = time.perf_counter()
    result = call(*args)
    seconds = time.perf_counter() - start
    cluster.report(label, seconds=seconds, read=_read_chars() - before)
    return result


def _disk_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _io_worker(directory: str, megabytes: float, rounds: int) -> None:
    jax = cluster.join()
    import numpy as np
    from jax.experimental import multihost_utils
    from orbax.checkpoint import v1 as ocp

    from tinax.checkpointing import load_checkpointables, save_checkpointables

    state, targets = _state(megabytes)
    want, moved = targets("saved"), targets("other")
    nbytes = sum(int(x.nbytes) for x in jax.tree.leaves(state))
    cluster.report("state", nbytes=nbytes, devices=jax.device_count())

    def check(loaded: Any, target: Any) -> None:
        """Every shard of every array holds its values, on the target's sharding."""
        found = jax.tree_util.tree_leaves_with_path(loaded)
        for (path, got), aim in zip(found, jax.tree.leaves(target), strict=True):
            assert got.sharding == aim.sharding, jax.tree_util.keystr(path)
            seed = _seed(jax.tree_util.keystr(path))
            for shard in got.addressable_shards:
                expect = values_at(seed, aim.shape, shard.index).astype(aim.dtype)
                assert np.array_equal(np.asarray(shard.data), expect), jax.tree_util.keystr(path)

    saves = {"tinax": save_checkpointables, "orbax": ocp.save_checkpointables_async}
    loads = {"tinax": load_checkpointables, "orbax": ocp.load_checkpointables}
    for system in ("tinax", "orbax"):
        path = f"{directory}/{system}-warm-up"
        saves[system](path, state).result()
        multihost_utils.sync_global_devices(f"tinax-bench:warm {system}")
        jax.block_until_ready(loads[system](path, want))
        multihost_utils.sync_global_devices(f"tinax-bench:warm {system} loaded")
        if jax.process_index() == 0:
            shutil.rmtree(path, ignore_errors=True)
    for r in range(rounds):
        order = ["tinax", "orbax"] if r % 2 == 0 else ["orbax", "tinax"]
        for system in order:
            path = f"{directory}/{system}-{r}"
            _timed(f"save {system} {r}", saves[system], path, state).result()
            multihost_utils.sync_global_devices(f"tinax-bench:committed {system} {r}")
            if jax.process_index() == 0:
                cluster.report(f"size {system} {r}", nbytes=_disk_bytes(path))
        for system in order:
            loaded = _timed(f"load {system} {r}", loads[system], f"{directory}/{system}-{r}", want)
            jax.block_until_ready(loaded)
            check(loaded, want)
            del loaded
        other = f"load tinax other mesh {r}"
        loaded = _timed(other, load_checkpointables, f"{directory}/tinax-{r}", moved)
        jax.block_until_ready(loaded)
        check(loaded, moved)
        del loaded
        multihost_utils.sync_global_devices(f"tinax-bench:round {r}")
        if jax.process_index() == 0:
            for system in ("tinax", "orbax"):
                shutil.rmtree(f"{directory}/{system}-{r}", ignore_errors=True)


# -- the launching side ----------------------------------------------------------------


def _slowest(outcome: cluster.Outcome, label: str, processes: int) -> dict[str, float]:
    found = [outcome.result(i, label) for i in range(processes)]
    return {
        "seconds": max(r["seconds"] for r in found),
        "read": max(r["read"] for r in found),
        # The middle process's: a process's own cost, less the luck of the slowest.
        "typical": statistics.median(r["seconds"] for r in found),
    }


def measure_io(
    megabytes: float, rounds: int, processes: int, devices: int, directory: str | None
) -> dict[str, Any]:
    """Each system's figures by round (see the module docstring)."""
    scratch = tempfile.mkdtemp(prefix="tinax-bench-pod-", dir=directory)
    try:
        outcome = cluster.launch(
            __file__,
            "--io-worker",
            scratch,
            megabytes,
            rounds,
            processes=processes,
            devices=devices,
            timeout=3600,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not outcome.ok:
        raise RuntimeError(f"the job failed:\n{outcome}")
    found: dict[str, Any] = {"state bytes": outcome.result(0, "state")["nbytes"]}
    for r in range(rounds):
        for system in ("tinax", "orbax"):
            for what in ("save", "load"):
                found.setdefault(f"{what} {system}", []).append(
                    _slowest(outcome, f"{what} {system} {r}", processes)
                )
            found.setdefault(f"size {system}", []).append(
                outcome.result(0, f"size {system} {r}")["nbytes"]
            )
        found.setdefault("load tinax other mesh", []).append(
            _slowest(outcome, f"load tinax other mesh {r}", processes)
        )
    return found


def io_lines(found: dict[str, Any], processes: int, devices: int) -> tuple[list[str], list[str]]:
    """The report's lines and the goals missed."""

    def median(key: str, field: str) -> float:
        return statistics.median(r[field] for r in found[key])

    size = {s: statistics.median(found[f"size {s}"]) for s in ("tinax", "orbax")}
    lines = [
        f"{processes} processes x {devices} CPU devices, an NNX model + adamw state of "
        f"{found['state bytes'] / MB:.0f} MB sharded over all {processes * devices} devices; "
        f"medians of {len(found['size tinax'])} rounds, each the slowest process's:",
        f"{'':28}{'tinax':>10}{'orbax':>10}{'ratio':>9}",
    ]
    save_t, save_o = median("save tinax", "seconds"), median("save orbax", "seconds")
    # Each round's two saves ran a moment apart, under the same load.
    paired = [
        t["seconds"] / o["seconds"]
        for t, o in zip(found["save tinax"], found["save orbax"], strict=True)
    ]
    save_ratio = statistics.median(paired)
    typical = statistics.median(
        t["typical"] / o["typical"]
        for t, o in zip(found["save tinax"], found["save orbax"], strict=True)
    )
    load_t, load_o = median("load tinax", "seconds"), median("load orbax", "seconds")
    read_t = median("load tinax", "read") / size["tinax"]
    read_o = median("load orbax", "read") / size["orbax"]
    read_m = median("load tinax other mesh", "read") / size["tinax"]
    lines += [
        f"{'save call blocks (s)':28}{save_t:10.3f}{save_o:10.3f}{save_ratio:9.2f}"
        f"   (ratio of the medians {save_t / save_o:.2f})",
        *(
            f"{f'  {system} each round':28}  "
            + " ".join(f"{r['seconds']:.2f}" for r in found[f"save {system}"])
            for system in ("tinax", "orbax")
        ),
        f"{'  tinax/orbax each round':28}  {' '.join(f'{r:.2f}' for r in paired)}",
        f"{'  the middle process':28}{median('save tinax', 'typical'):10.3f}"
        f"{median('save orbax', 'typical'):10.3f}{typical:9.2f}",
        f"{'load (s)':28}{load_t:10.3f}{load_o:10.3f}{load_o / load_t:8.2f}x",
        f"{'checkpoint on disk (MB)':28}{size['tinax'] / MB:10.1f}{size['orbax'] / MB:10.1f}",
        f"{'read per process / ckpt':28}{read_t:10.3f}{read_o:10.3f}",
        f"{'  onto another mesh':28}{read_m:10.3f}"
        f"   ({median('load tinax other mesh', 'seconds'):.3f} s)",
    ]
    missed = []
    if read_t > 0.3:
        missed.append(f"bytes read per process / checkpoint {read_t:.3f} > 0.3")
    if load_o / load_t < 2:
        missed.append(f"load {load_o / load_t:.2f}x raw Orbax's < 2x")
    if save_ratio > 1.1:
        missed.append(f"save blocking {save_ratio:.2f}x raw Orbax's > 1.1x")
    return lines, missed


def measure_kill(processes: int, deadline: float, directory: str | None) -> dict[str, Any]:
    """Seconds from process 1's SIGKILL to each other process's exit, and their errors."""
    scratch = tempfile.mkdtemp(prefix="tinax-bench-pod-kill-", dir=directory)
    try:
        outcome = pod_worker.launch(
            "loop",
            Path(scratch),
            f"{scratch}/durable",
            processes,
            {"kill": [1], "at": 23, "timeout": deadline},
            timeout=600,
            heartbeat=int(deadline * 10),
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    killed = outcome.result(1, "killed")["time"] - outcome.launched
    others = [i for i in range(processes) if i != 1]
    return {
        "exits": [outcome.ended[i] - killed for i in others],
        "errors": [outcome.result(i, "lost")["message"] for i in others],
        "returncodes": outcome.returncodes,
    }


def kill_lines(found: dict[str, Any], deadline: float) -> tuple[list[str], list[str]]:
    """The report's lines on the kill, and the goals missed."""
    slowest = max(found["exits"])
    lines = [
        f"one process SIGKILLed: every other process gone {slowest:.1f} s after the kill "
        f"(run timeout {deadline:g} s; each: {', '.join(f'{x:.1f}' for x in found['exits'])} s)",
        f"  their error: {found['errors'][0]}",
    ]
    missed = []
    if slowest > deadline + 15:
        missed.append(f"the others exited {slowest:.1f} s after the kill > {deadline:g} + 15 s")
    if len(set(found["errors"])) != 1 or "process 1 of" not in found["errors"][0]:
        missed.append(f"not one error naming process 1: {found['errors']}")
    return lines, missed


def main() -> None:
    if sys.argv[1:2] == ["--io-worker"]:
        cluster.main(lambda: _io_worker(sys.argv[2], float(sys.argv[3]), int(sys.argv[4])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=300.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--deadline", type=float, default=20.0)
    parser.add_argument("--no-kill", action="store_true", help="leave out the SIGKILL measurement")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--json", default=None, help="also write the raw figures here")
    args = parser.parse_args()
    before = os.getloadavg()
    found = measure_io(args.mb, args.rounds, args.processes, args.devices, args.dir)
    found["load average"] = [before, os.getloadavg()]
    lines, missed = io_lines(found, args.processes, args.devices)
    lines.append(
        f"machine: {os.cpu_count()} CPUs, load average (1, 5, 15 min) "
        + " before, ".join(", ".join(f"{x:.1f}" for x in avg) for avg in found["load average"])
        + " after"
    )
    print("\n".join(lines), flush=True)
    if not args.no_kill:
        found["kill"] = measure_kill(args.processes, args.deadline, args.dir)
        more, missed_too = kill_lines(found["kill"], args.deadline)
        print("\n".join(more))
        missed += missed_too
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1))
    for goal in missed:
        print(f"GOAL MISSED: {goal}")
    raise SystemExit(1 if missed else 0)


if __name__ == "__main__":
    main()
