"""Save throughput of a 2-process JAX job against 1 process, the same bytes, one run.

Both sides save one pytree of float32 arrays (``gib`` GiB in all) with
``tinax.checkpointing.save_checkpointables`` from a real ``jax.distributed`` job on
localhost (tests/cluster.py): 2 processes with one CPU device each, every array
split between them, against 1 process with two CPU devices holding the same
sharding. So the one difference is whether one process or two write. Rounds
alternate between the two; each save starts after ``os.sync()`` and a barrier, and
is timed by process 0 until the commit.

Run alone: python bench/_two_process.py [--gib 1.0] [--rounds 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import cluster

MIB = 1 << 20
_ARRAYS = 16


def _worker(path: str, nbytes: int) -> None:
    """One process of the job: builds its shards, saves once, reports the seconds."""
    jax = cluster.join()
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from tinax.checkpointing import save_checkpointables

    sharding = NamedSharding(jax.make_mesh((jax.device_count(),), ("data",)), P("data"))
    rows = nbytes // _ARRAYS // 4 // 1024

    def shard(index: tuple[slice, ...], leaf: int) -> np.ndarray:
        start, stop, _ = index[0].indices(rows)
        bits = np.arange(start * 1024, stop * 1024, dtype=np.uint32) * np.uint32(2654435761)
        bits ^= np.uint32(leaf * 7919 + 1)
        return bits.view(np.float32).reshape(stop - start, 1024)

    state = {
        f"w{leaf:02d}": jax.make_array_from_callback(
            (rows, 1024), sharding, lambda index, leaf=leaf: shard(index, leaf)
        )
        for leaf in range(_ARRAYS)
    }
    jax.block_until_ready(state)
    if jax.process_index() == 0:
        os.sync()
    multihost_utils.sync_global_devices("tinax-bench-start")
    start = time.perf_counter()
    save_checkpointables(path, {"params": state}).result()
    seconds = time.perf_counter() - start
    cluster.report(
        "save",
        seconds=seconds,
        nbytes=sum(int(x.nbytes) for x in state.values()),
        processes=jax.process_count(),
    )


def measure(gib: float, rounds: int, directory: str | None = None) -> dict[str, list[float]]:
    """MiB/s of each round's save, by side (``"1 process"``, ``"2 processes"``)."""
    nbytes = int(gib * (1 << 30))
    scratch = tempfile.mkdtemp(prefix="tinax-bench-2p-", dir=directory)
    rates: dict[str, list[float]] = {"1 process": [], "2 processes": []}
    try:
        for r in range(rounds):
            sides = [("1 process", 1, 2), ("2 processes", 2, 1)]
            if r % 2:
                sides.reverse()
            for label, processes, devices in sides:
                path = os.path.join(scratch, f"{processes}p-{r}")
                outcome = cluster.launch(
                    __file__,
                    "--worker",
                    path,
                    str(nbytes),
                    processes=processes,
                    devices=devices,
                    timeout=600,
                )
                if not outcome.ok:
                    raise RuntimeError(f"the {label} save failed:\n{outcome}")
                report = outcome.result(0, "save")
                rates[label].append(report["nbytes"] / report["seconds"] / MIB)
                shutil.rmtree(path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return rates


def two_process_lines(gib: float, rounds: int, directory: str | None = None) -> list[str]:
    """The benchmark's report: best and median MiB/s of each side and their ratio."""
    rates = measure(gib, rounds, directory)
    one, two = rates["1 process"], rates["2 processes"]
    lines = [
        f"2-process save of {gib:g} GiB (1 device each) vs 1 process (2 devices), "
        f"{rounds} rounds alternating:",
        f"{'':14}{'2 proc MiB/s':>14}{'1 proc MiB/s':>14}{'2 proc/1 proc':>14}",
    ]
    for stat, pick in (("best", max), ("median", statistics.median)):
        lines.append(
            f"{'save ' + stat:14}{pick(two):14.0f}{pick(one):14.0f}{pick(two) / pick(one):14.3f}"
        )
    return lines


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        cluster.main(lambda: _worker(sys.argv[2], int(sys.argv[3])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    print("\n".join(two_process_lines(args.gib, args.rounds, args.dir)))


if __name__ == "__main__":
    main()
