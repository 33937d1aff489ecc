"""Save and load throughput: tinax against raw Orbax V1, side by side in one run.

Writes the same pytree of float32 arrays (1 GiB by default) through
``tinax.checkpointing`` and through ``orbax.checkpoint.v1`` directly, alternating
the two, and keeps the best of several rounds for each. Every timed operation
starts after ``os.sync()``, so write-back of an earlier round is not charged to it. Also measures the disk's
raw sequential write rate (one large file written and fsync'ed) as the physical
limit. Loads read into abstract targets; both read from the page cache equally.

Usage: python bench/save_load.py [--gib 1.0] [--rounds 3] [--dir DIR]

On a shared virtual disk single rounds vary by tens of percent; use more rounds
(e.g. --rounds 9) for a tighter figure.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import shutil
import statistics
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


def call_overhead(scratch: str, calls: int = 30) -> tuple[float, float, float, float]:
    """Median seconds per save and per load of a tiny checkpoint, tinax and Orbax.

    With almost no bytes to move, what is left is each library's fixed cost per
    call, which the disk does not blur.
    """
    state = {f"w{i}": jnp.full((8,), float(i)) for i in range(16)}
    target = abstract_restore_target(state)
    save_t, save_o, load_t, load_o = [], [], [], []
    for i in range(calls):
        a, b = os.path.join(scratch, f"small-t-{i}"), os.path.join(scratch, f"small-o-{i}")
        save_t.append(timed(lambda a=a: save_checkpointables(a, {"params": state}).result()))
        save_o.append(timed(lambda b=b: ocp.save_checkpointables(b, {"params": state})))
        load_t.append(timed(lambda a=a: load_checkpointables(a, {"params": target})))
        load_o.append(timed(lambda b=b: ocp.load_checkpointables(b, {"params": target})))
        shutil.rmtree(a)
        shutil.rmtree(b)
    med = statistics.median
    return med(save_t), med(save_o), med(load_t), med(load_o)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the pytree in GiB")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds per side (best and median shown)"
    )
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

        # Saves: each side writes its own new checkpoint, alternating who goes first.
        for r in range(args.rounds):
            order = [("tinax", save_tinax), ("orbax", save_orbax)]
            if r % 2:
                order.reverse()
            for name, save in order:
                path = os.path.join(scratch, f"{name}-{r}")
                saves[name].append(timed(lambda save=save, path=path: save(path)))
                shutil.rmtree(path)

        # Loads: both sides read the same checkpoint, so neither gets a luckier layout
        # on disk or in the page cache.
        shared = os.path.join(scratch, "shared")
        save_orbax(shared)
        for r in range(args.rounds):
            order = [("tinax", load_tinax), ("orbax", load_orbax)]
            if r % 2:
                order.reverse()
            for name, load in order:
                gc.collect()
                loads[name].append(timed(lambda load=load: load(shared)))
        shutil.rmtree(shared)

        disk = raw_write_rate(scratch, actual)
        overhead = call_overhead(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def rate(seconds: float) -> float:
        return actual / seconds / MIB

    print(
        f"pytree: {len(state)} float32 arrays, {actual / MIB:.0f} MiB; {args.rounds} rounds, "
        "alternating; loads read one shared checkpoint"
    )
    print(f"{'':6}{'':8}{'tinax MiB/s':>14}{'orbax MiB/s':>14}{'tinax/orbax':>14}")
    for label, table in (("save", saves), ("load", loads)):
        for stat, pick in (("best", min), ("median", statistics.median)):
            t, o = rate(pick(table["tinax"])), rate(pick(table["orbax"]))
            print(f"{label:6}{stat:8}{t:14.0f}{o:14.0f}{t / o:14.3f}")
    print(f"disk raw sequential write (fsync'ed): {disk / MIB:.0f} MiB/s")
    st, so, lt, lo = (x * 1e3 for x in overhead)
    print(
        f"fixed cost per call (tiny checkpoint, median of 30): save {st:.1f} ms vs {so:.1f} ms, "
        f"load {lt:.1f} ms vs {lo:.1f} ms (tinax vs orbax)"
    )
    print("goal: tinax/orbax >= 0.97 for save and load")

    # Multi-process saves: measured in their own module, with JAX jobs of their own.
    from _two_process import two_process_lines

    print("\n".join(two_process_lines(args.gib, args.rounds, args.dir)))


if __name__ == "__main__":
    main()
