"""Save and load throughput: tinax defaults against raw Orbax V1 defaults against ``dd``.

Two workloads of the same total size (1 GiB by default) of float32 arrays drawn from
a normal distribution:

  (a) 16 big arrays, where the bytes dominate;
  (b) 10,000 small arrays, where the cost per leaf dominates;
  (c) 100,000 tiny arrays (50 MiB), tinax against raw Orbax alone: whether a save
      and a load of a very wide tree finish, and what each costs per leaf.

For each workload every side writes its own checkpoints (rounds alternate which side
goes first) and then loads its own checkpoint back into abstract targets, so each
side is measured on the format it writes. The sides: "tinax" (its defaults: arrays
uncompressed, big ones in chunks of at most 8 MiB, checksums), "no-sums" (the same
without checksums), "zstd" (tinax with ``compression()`` on) and "orbax" (raw Orbax
V1 defaults: zstd, one chunk per array). Every timed operation starts after
``os.sync()``, so write-back of an earlier round is not charged to it; loads read from the page cache on every side alike. Reported per side:
save and load throughput (best, median and the range over rounds) and size on disk.

Also measured: ``dd`` writing the same number of bytes with ``conv=fsync`` (the
disk's limit), how long ``save_training_checkpoint`` blocks its caller before the
rest of the save goes on in the background, the fixed cost per call on a tiny
checkpoint, and what zstd saves on trained weights (the demo run's model and
optimizer, re-saved both ways).

Goals, checked at the end (exit status 1 if one is missed):

  (a) tinax save and load >= 1.5x raw Orbax defaults (medians); tinax save >= 0.8x dd;
  (b), (c) tinax save and load no slower than raw Orbax defaults (medians, 5% allowed
      for run-to-run noise on a shared machine);
  checksums: tinax save and load >= 0.95x tinax without checksums (side "no-sums"),
      on (a) and (b);
  the load preflight takes < 2% of the load of (b)'s 10,000-leaf checkpoint.

Usage: python bench/save_load.py [--gib 1.0] [--rounds 5] [--small-rounds 2]
       [--small-arrays 10000] [--dir DIR] [--demo-run DIR] [--skip-small]
       [--many-arrays 100000] [--many-mib 50] [--many-rounds 1] [--skip-many]
       [--only-many]

Workload (c) costs several minutes a round on each side; its figure of record is
``--only-many --many-rounds 5`` (about 45 minutes on a 2-core machine), run alone.

On a shared virtual disk single rounds vary by tens of percent; use more rounds
(e.g. --rounds 9) for a tighter figure.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import grain
import jax
import jax.numpy as jnp
import numpy as np
from orbax.checkpoint import v1 as ocp

from tinax._format.integrity import checksums, preflight
from tinax._format.storage.location import local, tree_bytes
from tinax.checkpointing import (
    abstract_restore_target,
    compression,
    load_checkpointables,
    save_checkpointables,
    save_training_checkpoint,
)
from tinax.checkpointing._context import without_checksums

logging.getLogger("absl").setLevel(logging.ERROR)
MIB = 1 << 20
GIB = 1 << 30
REPO = Path(__file__).resolve().parents[1]

# A side saves ``state`` to a new path and loads a path into ``target``.
Save = Callable[[str, Any], None]
Load = Callable[[str, Any], Any]


@dataclasses.dataclass(frozen=True)
class Side:
    """One way of saving and loading, measured against the others."""

    name: str
    save: Save
    load: Load


def tinax_side(
    name: str = "tinax", within: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
) -> Side:
    """tinax's save and load; ``within`` sets what its saves run inside.

    The sides measured: "tinax" (its defaults), "no-sums" (``without_checksums``: what
    checksums cost is measured against it) and "zstd" (``compression``, its one
    storage switch: zstd as raw Orbax writes it, in tinax's chunks).
    """

    def save(path: str, state: Any) -> None:
        with within() if within is not None else contextlib.nullcontext():
            save_checkpointables(path, {"params": state}).result()

    def load(path: str, target: Any) -> Any:
        return jax.block_until_ready(load_checkpointables(path, {"params": target}))

    return Side(name, save, load)


def orbax_side() -> Side:
    def save(path: str, state: Any) -> None:
        ocp.save_checkpointables(path, {"params": state})

    def load(path: str, target: Any) -> Any:
        return jax.block_until_ready(ocp.load_checkpointables(path, {"params": target}))

    return Side("orbax", save, load)


@dataclasses.dataclass
class Measured:
    """Seconds per round and bytes on disk, per side."""

    nbytes: int
    saves: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    loads: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    sizes: dict[str, int] = dataclasses.field(default_factory=dict)
    # Seconds per run of the load preflight on tinax's checkpoint.
    preflight: list[float] = dataclasses.field(default_factory=list)
    # Seconds of the checksums' own work, measured on its own: recording them for a
    # save of the state, and checking a load of tinax's checkpoint against them.
    record: list[float] = dataclasses.field(default_factory=list)
    verify: list[float] = dataclasses.field(default_factory=list)

    def rate(self, seconds: float) -> float:
        """MiB per second."""
        return self.nbytes / seconds / MIB


def make_state(total_bytes: int, n_arrays: int) -> dict[str, jax.Array]:
    """``n_arrays`` float32 arrays of normal samples, ``total_bytes`` in all."""
    per = max(1, total_bytes // n_arrays // 4)
    width = len(str(n_arrays - 1))
    if n_arrays >= 1_000:
        # Drawn on the host at once and moved to the device in one batched call: one
        # random draw per leaf takes minutes for 100,000 leaves.
        host = np.random.default_rng(0).standard_normal((n_arrays, per), dtype=np.float32)
        arrays = jax.device_put(list(host))
        del host
        return jax.block_until_ready(
            {f"layer_{i:0{width}d}": array for i, array in enumerate(arrays)}
        )
    key = jax.random.key(0)
    state = {
        f"layer_{i:0{width}d}": jax.random.normal(jax.random.fold_in(key, i), (per,), jnp.float32)
        for i in range(n_arrays)
    }
    return jax.block_until_ready(state)


def timed(fn: Callable[[], Any]) -> float:
    """Seconds ``fn`` takes, after flushing earlier rounds' dirty pages."""
    os.sync()
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternating(sides: list[Side], round_index: int) -> list[Side]:
    """``sides`` in an order that rotates with the round, so no side always goes first."""
    k = round_index % len(sides)
    return sides[k:] + sides[:k]


def checksum_work(
    state: Any, path: str, target: Any, rounds: int
) -> tuple[list[float], list[float]]:
    """Seconds to record the checksums of ``state``, and to check a load of ``path``.

    Measured apart from the save and the load they belong to, which vary by more
    from round to round (tens of percent) than checksums cost (a few percent), so a
    ratio of two medians cannot tell them apart. Recording is timed as the digest of
    every array's host bytes, one after another, though in a save it runs on the
    digest threads, from the host copies Orbax writes, while Orbax writes.
    """
    verify_loaded = _verify_loaded()
    records, checks = [], []
    directory = os.path.join(path, "params")
    arrays = jax.tree_util.tree_leaves(state)
    for _ in range(rounds):
        records.append(timed(lambda: [checksums.digest(np.asarray(a)) for a in arrays]))
        with without_checksums():
            loaded = jax.block_until_ready(load_checkpointables(path, {"params": target}))
        checks.append(timed(lambda loaded=loaded: verify_loaded(directory, loaded["params"])))
        del loaded
    return records, checks


def _verify_loaded() -> Callable[..., None]:
    """tinax's check of a loaded pytree against its saved checksums.

    Its module was ``_checksums`` in earlier revisions, which ``bench/against.py``
    runs this script against too.
    """
    for name in ("_checksummed_handler", "_checksums"):
        with contextlib.suppress(ModuleNotFoundError):
            module = importlib.import_module(f"tinax.checkpointing.{name}")
            check: Callable[..., None] = module.verify_loaded
            return check
    raise ModuleNotFoundError("tinax.checkpointing has no verify_loaded")


def measure_workload(
    sides: list[Side],
    state: Any,
    rounds: int,
    scratch: str,
    label: str,
    load_rounds: int,
    *,
    warm_up: bool = True,
    extras: bool = True,
) -> Measured:
    """Save and load throughput and size on disk of every side on one workload.

    Loads take a second or so and vary more than saves, so there are ``load_rounds``
    of them against ``rounds`` of saves. ``warm_up`` saves and loads once on each
    side first, untimed; ``extras`` times the preflight and the checksums' own work.
    """
    target = abstract_restore_target(state)
    measured = Measured(nbytes=sum(x.nbytes for x in jax.tree.leaves(state)))
    kept: dict[str, str] = {}
    for side in sides:
        if warm_up:
            # A warm-up of each, so compilation and first-use costs are not measured.
            warm = os.path.join(scratch, f"{label}-warm-{side.name}")
            side.save(warm, state)
            side.load(warm, target)
            shutil.rmtree(warm)
        measured.saves[side.name] = []
        measured.loads[side.name] = []
    for r in range(rounds):
        for side in alternating(sides, r):
            path = os.path.join(scratch, f"{label}-{side.name}-{r}")
            measured.saves[side.name].append(timed(lambda s=side, p=path: s.save(p, state)))
            if side.name in kept:
                shutil.rmtree(path)
            else:
                kept[side.name] = path
    for side in sides:
        measured.sizes[side.name] = tree_bytes(local(kept[side.name]))
    for r in range(load_rounds):
        for side in alternating(sides, r):
            measured.loads[side.name].append(timed(lambda s=side: s.load(kept[s.name], target)))
    if "tinax" in kept and extras:
        for _ in range(max(5, rounds)):
            measured.preflight.append(timed(lambda: preflight.check(local(kept["tinax"]))))
        measured.record, measured.verify = checksum_work(
            state, kept["tinax"], target, max(5, rounds)
        )
    for path in kept.values():
        shutil.rmtree(path)
    return measured


def dd_write(scratch: str, nbytes: int, rounds: int) -> list[float]:
    """Seconds for ``dd`` to write ``nbytes`` of random data with ``conv=fsync``, per round.

    The source is a file of random bytes in memory (``/dev/shm`` when there is one),
    so a disk that compresses or skips zeros gets no help.
    """
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else scratch
    block = 16 * MIB
    count = max(1, nbytes // block)
    fd, source = tempfile.mkstemp(prefix="tinax-bench-dd-", dir=shm)
    try:
        rng = np.random.default_rng(0)
        with os.fdopen(fd, "wb") as f:
            for _ in range(count):
                f.write(rng.bytes(block))
        dest = os.path.join(scratch, "dd.bin")
        seconds = []
        for _ in range(rounds):
            command = ["dd", f"if={source}", f"of={dest}", f"bs={block}", "conv=fsync"]
            seconds.append(
                timed(lambda c=command: subprocess.run(c, check=True, capture_output=True))
            )
            os.remove(dest)
        return seconds
    finally:
        os.remove(source)


def blocking_time(state: Any, scratch: str, rounds: int) -> tuple[list[float], list[float]]:
    """Seconds until ``save_training_checkpoint`` returns, and until its save commits."""
    iterator = iter(grain.MapDataset.range(1_000).batch(8).to_iter_dataset())
    next(iterator)
    rng = jax.random.key_data(jax.random.key(0))
    returned, committed = [], []
    for r in range(rounds + 1):
        path = os.path.join(scratch, f"blocking-{r}")
        os.sync()
        start = time.perf_counter()
        response = save_training_checkpoint(path, r, state, {}, rng, {}, iterator)
        back = time.perf_counter() - start
        response.result()
        done = time.perf_counter() - start
        shutil.rmtree(path)
        if r:  # the first is a warm-up
            returned.append(back)
            committed.append(done)
    return returned, committed


def call_overhead(scratch: str, calls: int = 30) -> dict[str, tuple[float, float]]:
    """Median seconds per save and per load of a tiny checkpoint, by side.

    With almost no bytes to move, what is left is each library's fixed cost per
    call, which the disk does not blur.
    """
    state = {f"w{i}": jnp.full((8,), float(i)) for i in range(16)}
    target = abstract_restore_target(state)
    out = {}
    for side in (tinax_side(), orbax_side()):
        saves, loads = [], []
        for i in range(calls):
            path = os.path.join(scratch, f"small-{side.name}-{i}")
            saves.append(timed(lambda s=side, p=path: s.save(p, state)))
            loads.append(timed(lambda s=side, p=path: s.load(p, target)))
            shutil.rmtree(path)
        out[side.name] = (statistics.median(saves), statistics.median(loads))
    return out


def trained_weights_sizes(run_dir: Path, scratch: str) -> tuple[int, int, int] | None:
    """Array bytes of the demo run's last model and optimizer: raw, stored plain, with zstd.

    Returns ``None`` when there is no demo run to read.
    """
    sys.path.insert(0, str(REPO / "demo"))
    from make_run import ensure_run

    import tinax.explore as ex

    try:
        meta = ensure_run(run_dir)
    except (OSError, RuntimeError) as e:
        print(f"no demo run at {run_dir}: {e}")
        return None
    last = run_dir / meta["checkpoints"][-1]
    table = ex.checkpoint_table(last)
    arrays = table[table["kind"].isin(["jax.Array", "np.ndarray"])]
    state = {
        f"{row.checkpointable}{row.key}": np.asarray(
            ex.read_leaf(last, row.checkpointable, row.key)
        )
        for row in arrays.itertuples()
    }
    raw = sum(x.nbytes for x in state.values())
    sizes = []
    for compress in (False, True):
        path = os.path.join(scratch, f"trained-{compress}")
        with compression(compress):
            save_checkpointables(path, {"weights": state}).result()
        sizes.append(_array_store_bytes(Path(path) / "weights"))
        shutil.rmtree(path)
    return raw, sizes[0], sizes[1]


def _array_store_bytes(directory: Path) -> int:
    """Bytes of the OCDBT data files, where array chunks are stored."""
    return sum(
        p.stat().st_size for p in directory.rglob("*") if p.is_file() and p.parent.name == "d"
    )


# -- report ---------------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    return f"{min(values):7.0f}-{max(values):<7.0f}"


def print_checksum_work(measured: Measured) -> None:
    med = statistics.median
    record, verify = med(measured.record), med(measured.verify)
    save, load = med(measured.saves["tinax"]), med(measured.loads["tinax"])
    print(
        f"checksums' own work, timed apart (median of {len(measured.record)}): recording "
        f"{record * 1e3:.0f} ms ({record / save * 100:.1f}% of tinax's median save, and it "
        f"runs while Orbax writes), checking {verify * 1e3:.0f} ms "
        f"({verify / load * 100:.1f}% of its median load)"
    )


def print_workload(title: str, measured: Measured, sides: list[Side]) -> None:
    print(f"\n{title}: {measured.nbytes / MIB:.0f} MiB of float32")
    print(
        f"{'side':8}{'op':6}{'best MiB/s':>12}{'median MiB/s':>14}  {'range MiB/s':<16}"
        f"{'size MiB':>10}"
    )
    for side in sides:
        for op, table in (("save", measured.saves), ("load", measured.loads)):
            rates = [measured.rate(s) for s in table[side.name]]
            size = f"{measured.sizes[side.name] / MIB:10.1f}" if op == "save" else ""
            print(
                f"{side.name:8}{op:6}{max(rates):12.0f}{statistics.median(rates):14.0f}  "
                f"{spread(rates):<16}{size}"
            )


def median_rate(measured: Measured, table: dict[str, list[float]], name: str) -> float:
    return measured.rate(statistics.median(table[name]))


@dataclasses.dataclass
class Goal:
    label: str
    value: float
    bound: float
    # A ceiling rather than a floor.
    at_most: bool = False

    @property
    def met(self) -> bool:
        return self.value <= self.bound if self.at_most else self.value >= self.bound


def workload_goals(
    label: str, measured: Measured, minimum: float, against: str = "orbax"
) -> list[Goal]:
    """tinax's save and load throughput over ``against``'s, both at least ``minimum``."""
    return [
        Goal(
            f"{label} tinax/{against} {op}",
            median_rate(measured, table, "tinax") / median_rate(measured, table, against),
            minimum,
        )
        for op, table in (("save", measured.saves), ("load", measured.loads))
    ]


def _size_change(size: float, reference: float) -> str:
    """``size`` against ``reference`` in words: "7.5% smaller" or "19.5% larger"."""
    change = (size / reference - 1) * 100
    return f"{-change:.1f}% smaller" if change <= 0 else f"{change:.1f}% larger"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of each workload in GiB")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of workload (a)")
    parser.add_argument("--small-rounds", type=int, default=2, help="rounds of workload (b)")
    parser.add_argument("--small-arrays", type=int, default=10_000, help="arrays in (b)")
    parser.add_argument("--skip-small", action="store_true", help="skip workload (b)")
    parser.add_argument("--many-arrays", type=int, default=100_000, help="arrays in (c)")
    parser.add_argument("--many-mib", type=float, default=50.0, help="size of (c) in MiB")
    parser.add_argument("--many-rounds", type=int, default=1, help="rounds of workload (c)")
    parser.add_argument("--skip-many", action="store_true", help="skip workload (c)")
    parser.add_argument("--only-many", action="store_true", help="run workload (c) alone")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument(
        "--demo-run",
        default=str(REPO / "demo_run"),
        help="the demo run whose trained weights are re-saved (built if missing)",
    )
    args = parser.parse_args()

    if args.only_many:
        return many_only(args)
    nbytes = int(args.gib * GIB)
    scratch = tempfile.mkdtemp(prefix="tinax-bench-", dir=args.dir)
    sides = [
        tinax_side(),
        tinax_side("no-sums", without_checksums),
        tinax_side("zstd", compression),
        orbax_side(),
    ]
    try:
        big = make_state(nbytes, 16)
        a = measure_workload(sides, big, args.rounds, scratch, "a", 3 * args.rounds)
        dd = dd_write(scratch, a.nbytes, args.rounds)
        returned, committed = blocking_time(big, scratch, args.rounds)
        del big
        b = None
        if not args.skip_small:
            small = make_state(nbytes, args.small_arrays)
            b = measure_workload(
                sides, small, args.small_rounds, scratch, "b", 2 * args.small_rounds
            )
            del small
        c = None
        if not args.skip_many:
            c = measure_many(args, scratch)
        overhead = call_overhead(scratch)
        trained = trained_weights_sizes(Path(args.demo_run), scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print("tinax defaults (arrays uncompressed) against raw Orbax V1 defaults (zstd level 3)")
    print_workload("(a) 16 arrays", a, sides)
    print_checksum_work(a)
    dd_rates = [a.nbytes / s / MIB for s in dd]
    print(
        f"dd, conv=fsync, same bytes: best {max(dd_rates):.0f} MiB/s, median "
        f"{statistics.median(dd_rates):.0f} MiB/s, range {spread(dd_rates).strip()}"
    )
    if b is not None:
        print_workload(f"(b) {args.small_arrays} arrays", b, sides)
        print_checksum_work(b)
    if c is not None:
        print_many(c, args.many_arrays)
    med = statistics.median
    print(
        f"\nsave_training_checkpoint with (a) as the model: returns after {med(returned) * 1e3:.0f} ms "
        f"(range {min(returned) * 1e3:.0f}-{max(returned) * 1e3:.0f}); committed after "
        f"{med(committed) * 1e3:.0f} ms (median of {len(returned)})"
    )
    (ts_, tl), (os_, ol) = overhead["tinax"], overhead["orbax"]
    print(
        f"fixed cost per call (16 tiny arrays, median of 30): save {ts_ * 1e3:.1f} ms vs "
        f"{os_ * 1e3:.1f} ms, load {tl * 1e3:.1f} ms vs {ol * 1e3:.1f} ms (tinax vs orbax)"
    )
    if trained is not None:
        raw, plain, zstd = trained
        print(
            f"trained weights (demo run model + optimizer, {raw / 1024:.0f} KiB of arrays): "
            f"stored {plain / 1024:.0f} KiB uncompressed, {zstd / 1024:.0f} KiB with zstd "
            f"({_size_change(zstd, plain)})"
        )

    # Multi-process saves: measured in their own module, with JAX jobs of their own.
    from _two_process import two_process_lines

    print("\n".join(two_process_lines(args.gib, args.rounds, args.dir)))

    goals = [
        *workload_goals("(a)", a, 1.5),
        Goal("(a) tinax save / dd", median_rate(a, a.saves, "tinax") / med(dd_rates), 0.8),
    ]
    goals += workload_goals("(a)", a, 0.95, against="no-sums")
    if b is not None:
        goals += workload_goals("(b)", b, 0.95)
        goals += workload_goals("(b)", b, 0.95, against="no-sums")
        share = med(b.preflight) / med(b.loads["tinax"])
        print(
            f"load preflight on (b)'s {args.small_arrays}-leaf checkpoint: "
            f"{med(b.preflight) * 1e3:.0f} ms, {share * 100:.2f}% of its load"
        )
        goals.append(Goal("(b) preflight / load (%)", share * 100, 2.0, at_most=True))
    if c is not None:
        goals += workload_goals("(c)", c, 0.95)
    return print_goals(goals)


def print_goals(goals: list[Goal]) -> int:
    print("\ngoals (medians):")
    for goal in goals:
        mark = "ok" if goal.met else "MISSED"
        sign = "<=" if goal.at_most else ">="
        print(f"  {goal.label:28} {goal.value:6.2f}  ({sign} {goal.bound})  {mark}")
    return 0 if all(goal.met for goal in goals) else 1


def measure_many(args: argparse.Namespace, scratch: str) -> Measured:
    """Workload (c): tinax beside raw Orbax alone. Each save or load takes a minute
    or more, so there is no warm-up ((b) warmed both up, or one tiny save does) and
    no other side."""
    many = make_state(int(args.many_mib * MIB), args.many_arrays)
    return measure_workload(
        [tinax_side(), orbax_side()],
        many,
        args.many_rounds,
        scratch,
        "c",
        args.many_rounds,
        warm_up=False,
        extras=False,
    )


def print_many(c: Measured, n_arrays: int) -> None:
    for op, table in (("save", c.saves), ("load", c.loads)):
        rounds = ", ".join(
            f"{t:.1f}/{o:.1f}" for t, o in zip(table["tinax"], table["orbax"], strict=True)
        )
        print(
            f"(c) {n_arrays:,} arrays, {op} seconds (median of {len(table['tinax'])}): "
            f"tinax {statistics.median(table['tinax']):.1f}, orbax "
            f"{statistics.median(table['orbax']):.1f}  (rounds, tinax/orbax: {rounds})"
        )


def many_only(args: argparse.Namespace) -> int:
    """``--only-many``: workload (c) alone, after one tiny warm-up save and load."""
    scratch = tempfile.mkdtemp(prefix="tinax-bench-", dir=args.dir)
    try:
        tiny = make_state(1 << 20, 16)
        measure_workload([tinax_side(), orbax_side()], tiny, 1, scratch, "w", 1, extras=False)
        c = measure_many(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"tinax defaults against raw Orbax V1 defaults, {args.many_rounds} rounds")
    print_many(c, args.many_arrays)
    return print_goals(workload_goals("(c)", c, 0.95))


if __name__ == "__main__":
    sys.exit(main())
