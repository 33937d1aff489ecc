"""Save and load throughput: tinax against raw Orbax V1, side by side in one run.

Writes the same pytree of float32 arrays (1 GiB by default) through
``tinax.checkpointing`` and through ``orbax.checkpoint.v1`` directly, alternating
the two, and keeps the best of several rounds for each. Every timed operation
starts after ``os.sync()``, so write-back of an earlier round is not charged to it. Also measures the disk's
raw sequential write rate (one large file written and fsync'ed) as the physical
limit. Loads read into abstract targets; both read from the page cache equally.

Usage: python bench/save_load.py [--gib 1.0] [--rounds 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
from orbax.checkpoint import v1 as ocp

from tinax.checkpointing import abstract_restore_target, load_checkpointables, save_checkpointables

logging.getLogger("absl").setLevel(logging.ERROR)
MIB = 1 << 20


def make_state(total_bytes: int, n_arrays: int = 16) -> dict[str, jax.Array]:
    per = total_bytes // n_arrays // 4
    key = jax.random.key(0)
    state = {}
    for i in range(n_arrays):
        key, sub = jax.random.split(key)
        state[f"layer_{i:02d}"] = jax.random.normal(sub, (per,), jnp.float32)
    jax.block_until_ready(state)
    return state


def raw_write_rate(directory: str, nbytes: int) -> float:
    """Bytes per second for one sequential write of ``nbytes`` followed by fsync."""
    block = np.random.default_rng(0).bytes(64 * MIB)
    path = os.path.join(directory, "raw.bin")
    start = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        written = 0
        while written < nbytes:
            written += f.write(block[: min(len(block), nbytes - written)])
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - start
    os.remove(path)
    return nbytes / elapsed


def timed(fn) -> float:
    # Flush earlier rounds' dirty pages first, so one side never pays for the
    # other's write-back.
    os.sync()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the pytree in GiB")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per side; best is kept")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args()

    nbytes = int(args.gib * (1 << 30))
    scratch = tempfile.mkdtemp(prefix="tinax-bench-", dir=args.dir)
    try:
        state = make_state(nbytes)
        actual = sum(x.nbytes for x in state.values())
        target = abstract_restore_target(state)
        saves: dict[str, list[float]] = {"tinax": [], "orbax": []}
        loads: dict[str, list[float]] = {"tinax": [], "orbax": []}

        def save_tinax(path: str) -> None:
            save_checkpointables(path, {"params": state}).result()

        def save_orbax(path: str) -> None:
            ocp.save_checkpointables(path, {"params": state})

        def load_tinax(path: str) -> None:
            jax.block_until_ready(load_checkpointables(path, {"params": target}))

        def load_orbax(path: str) -> None:
            jax.block_until_ready(ocp.load_checkpointables(path, {"params": target}))

        # One warm-up of each so compilation and first-use costs are not measured.
        for name, save, load in (
            ("tinax", save_tinax, load_tinax),
            ("orbax", save_orbax, load_orbax),
        ):
            path = os.path.join(scratch, f"warm-{name}")
            save(path)
            load(path)
            shutil.rmtree(path)

        for r in range(args.rounds):
            order = [("tinax", save_tinax, load_tinax), ("orbax", save_orbax, load_orbax)]
            if r % 2:
                order.reverse()
            for name, save, load in order:
                path = os.path.join(scratch, f"{name}-{r}")
                saves[name].append(timed(lambda save=save, path=path: save(path)))
                loads[name].append(timed(lambda load=load, path=path: load(path)))
                shutil.rmtree(path)

        disk = raw_write_rate(scratch, actual)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def rate(times: list[float]) -> float:
        return actual / min(times) / MIB

    print(
        f"pytree: {len(state)} float32 arrays, {actual / MIB:.0f} MiB; best of {args.rounds}, alternating"
    )
    print(f"{'':8}{'tinax MiB/s':>14}{'orbax MiB/s':>14}{'tinax/orbax':>14}")
    for label, table in (("save", saves), ("load", loads)):
        t, o = rate(table["tinax"]), rate(table["orbax"])
        print(f"{label:8}{t:14.0f}{o:14.0f}{t / o:14.3f}")
    print(f"disk raw sequential write (fsync'ed): {disk / MIB:.0f} MiB/s")
    print("goal: tinax/orbax >= 0.97 for save and load")


if __name__ == "__main__":
    main()
