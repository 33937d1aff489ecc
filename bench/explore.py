"""tinax.explore against Orbax and ``cat``, side by side: table speed, size independence,
leaf memory, and the throughput and memory of ``diff_table`` and ``verify(data=True)``.

Run with ``.venv/bin/python bench/explore.py`` (``make bench`` runs it too). It writes
checkpoints with Orbax (10,000 leaves; the same 256-leaf tree at 1 GiB and at 1 KiB;
1,024 leaves of 4 MiB, 4 GiB in all; a second 1 GiB tree of other values), measures,
prints the ratios against their goals, and exits 1 if a goal is missed. Writing takes
most of the few minutes it runs; ``--workdir DIR`` keeps the checkpoints there and
reuses them next time.

``diff_table`` of the two 1 GiB checkpoints (every leaf changed, so every chunk is
decoded and compared) and ``verify(data=True)`` of one are timed against ``cat`` of
the same files to ``/dev/null``, each in a fresh process, in the same run: first with
the files evicted from the page cache (``posix_fadvise(DONTNEED)``), as a checkpoint
is read after training wrote it long ago or on another host, which is the measure
held to its goal, then with the files cached, shown for information.

The ``gs://`` lines run against a fake-gcs-server started on a free local port (the
tests' emulator, ``tests/gcs.py``, behind its counting proxy): ``list_checkpoints`` of
a 200-checkpoint run with the requests it made (first listing, then a refresh), and
``checkpoint_table`` of the 10,000-leaf checkpoint against Orbax's
``checkpointables_metadata`` on the same ``gs://`` checkpoint. ``--gcs-only`` runs
just those (a minute or two); ``--no-gcs`` leaves them out.
"""

from __future__ import annotations

import argparse
import json
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

import numpy as np

MIB = 1 << 20
GIB = 1 << 30

# Measured in a fresh process: resident memory before, then the high-water mark
# after read_leaf. tracemalloc would miss tensorstore's C++ allocations.
_MEMORY_PROBE = r"""
import json, sys, time
import numpy as np
import tinax.explore as ex
from tinax.explore import toolkit

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)

path, checkpointable, key = sys.argv[1:4]
try:
    # Resets VmHWM to the current resident size, so the peak below is this read's.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    reset = True
except OSError:
    reset = False
before = status("VmRSS")
start = time.perf_counter()
value = ex.read_leaf(path, checkpointable, key)
seconds = time.perf_counter() - start
peak = status("VmHWM")
print(json.dumps({"before": before, "peak": peak, "seconds": seconds, "reset": reset,
                  "nbytes": int(value.nbytes), "shape": list(value.shape)}))
"""


# A fresh process reads once: resident memory before, the high-water mark after, and
# the seconds taken (imports and first-use set-up excluded).
_READ_PROBE = r"""
import json, sys, time
import tinax.explore as ex

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)

what, a, b = sys.argv[1:4]
ex.checkpoint_table(b)
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
except OSError:
    pass
before = status("VmRSS")
start = time.perf_counter()
if what == "diff":
    table = ex.diff_table(a, b)
    decoded = int(table["decoded"].fillna(False).sum())
else:
    result = ex.verify(a, data=True)
    assert result.ok, result.findings
    decoded = len(result.leaves)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "growth": status("VmHWM") - before, "decoded": decoded}))
"""


def _evict(*paths: Path) -> None:
    """Drops the files under ``paths`` from the page cache (clean pages only)."""
    for root in paths:
        for path in root.rglob("*"):
            if path.is_file():
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def _cat_seconds(*paths: Path) -> float:
    files = sorted(str(p) for root in paths for p in root.rglob("*") if p.is_file())
    start = time.perf_counter()
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def _read_probe(what: str, a: Path, b: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _READ_PROBE, what, str(a), str(b)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _throughput(what: str, a: Path, b: Path, *, cold: bool, repeats: int) -> dict[str, Any]:
    """Best-of-``repeats`` seconds of ``what`` and of ``cat`` over the same files."""
    paths = (a, b) if what == "diff" else (a,)
    ours, cats, growth = [], [], []
    for _ in range(repeats):  # Interleaved, so drift hits both alike.
        if cold:
            os.sync()
            _evict(*paths)
        cats.append(_cat_seconds(*paths))
        if cold:
            _evict(*paths)
        probe = _read_probe(what, a, b)
        ours.append(probe["seconds"])
        growth.append(probe["growth"])
    nbytes = sum(_disk_bytes(p) for p in paths)
    return {
        "nbytes": nbytes,
        "ours": min(ours),
        "ours_all": ours,
        "cat": min(cats),
        "cat_all": cats,
        "growth": max(growth),
    }


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _random_array(rng: np.random.Generator, nbytes: int) -> np.ndarray:
    """Incompressible, finite float32s: random bits with the top exponent bit cleared."""
    bits = rng.integers(0, 1 << 32, nbytes // 4, dtype=np.uint32)
    bits &= np.uint32(0xBFFFFFFF)
    return bits.view(np.float32)


def _save(path: Path, make: Callable[[], dict[str, Any]]) -> Path:
    """Writes ``{"model": make()}`` with Orbax V1 unless ``path`` already holds it."""
    from orbax.checkpoint import v1 as ocp

    if (path / "_CHECKPOINT_METADATA").is_file():
        _log(f"  reusing {path}")
        return path
    shutil.rmtree(path, ignore_errors=True)
    start = time.perf_counter()
    tree = make()
    ocp.save_checkpointables(path, {"model": tree})
    del tree
    _log(f"  wrote {path} in {time.perf_counter() - start:.1f} s")
    return path


def _many_leaves(count: int) -> dict[str, Any]:
    import jax.numpy as jnp

    half = count // 2
    tree: dict[str, Any] = {
        f"layer_{i:05d}": {"w": np.full((4, 4), i, np.float32)} for i in range(half)
    }
    tree.update(
        {f"block_{i:05d}": {"b": jnp.full((8,), i, jnp.float32)} for i in range(count - half)}
    )
    return tree


def _same_tree(leaves: int, leaf_bytes: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {f"layer_{i:04d}": {"w": _random_array(rng, leaf_bytes)} for i in range(leaves)}


def _median_seconds(call: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _gcs_results(args: argparse.Namespace) -> list[tuple[str, str, str, str, str, bool]]:
    """The gs:// lines: a 200-checkpoint listing and the many-leaf table, on the emulator."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from gcs import Emulator, is_listing

    emulator = Emulator()
    emulator.start()
    os.environ.update(emulator.environment())
    try:
        emulator.create_bucket("tinax-bench")
        import gcsfs
        from orbax.checkpoint import v1 as ocp

        import tinax.explore as ex
        from tinax.checkpointing import save_checkpointables
        from tinax.explore import toolkit

        run = "gs://tinax-bench/run"
        _log(f"writing a {args.gcs_checkpoints}-checkpoint run to {run}")
        start = time.perf_counter()
        save_checkpointables(
            f"{run}/0", {"model": _same_tree(8, 4096, seed=5), "opt": {"count": 0}}
        ).result()
        fs = gcsfs.GCSFileSystem(use_listings_cache=False)
        for step in range(1, args.gcs_checkpoints):
            fs.copy("tinax-bench/run/0", f"tinax-bench/run/{step}", recursive=True)
        _log(f"  wrote it in {time.perf_counter() - start:.1f} s")
        # What the explorer shows first: the run's listing and each commit record.
        with emulator.counting() as quick:
            start = time.perf_counter()
            listed = ex.list_checkpoints(run, cache=toolkit.ListingCache(), deep=False)
            quick_s = time.perf_counter() - start
        assert (listed["status"] == "complete").all() and len(listed) == args.gcs_checkpoints
        cache = toolkit.ListingCache()
        with emulator.counting() as first:
            start = time.perf_counter()
            listed = ex.list_checkpoints(run, cache=cache)
            first_s = time.perf_counter() - start
        assert (listed["status"] == "complete").all() and len(listed) == args.gcs_checkpoints
        with emulator.counting() as again:
            start = time.perf_counter()
            ex.list_checkpoints(run, cache=cache)
            again_s = time.perf_counter() - start

        many = "gs://tinax-bench/many"
        _log(f"writing {args.leaves:,} leaves to {many}")
        start = time.perf_counter()
        ocp.save_checkpointables(many, {"model": _many_leaves(args.leaves)})
        _log(f"  wrote it in {time.perf_counter() - start:.1f} s")
        _log("timing tables on gs://")
        with emulator.counting() as table_requests:
            rows = len(ex.checkpoint_table(many))
        with emulator.counting() as orbax_requests:
            ocp.checkpointables_metadata(many)

        def first_table() -> None:
            # Opened from its path: nothing of it kept from before.
            ex.checkpoint_table(many)

        ours = _median_seconds(first_table, args.gcs_repeats)
        orbax = _median_seconds(lambda: ocp.checkpointables_metadata(many), args.orbax_repeats)
    finally:
        emulator.stop()

    def listings(made: list[tuple[str, str, int]]) -> str:
        return f"{len(made)} requests, {sum(map(is_listing, made))} listings"

    n = args.gcs_checkpoints
    speedup = orbax / ours
    return [
        (
            f"gs:// list_checkpoints of {n} checkpoints, first listing ({listings(first)})",
            f"{first_s * 1e3:.0f} ms",
            f"{len(first) / n:.1f} req/ckpt",
            f"{sum(map(is_listing, first))} listing(s)",
            f"<= 1 + {n} listings",
            sum(map(is_listing, first)) <= 1 + n,
        ),
        (
            f"gs:// list_checkpoints(deep=False) of {n} checkpoints ({listings(quick)})",
            f"{quick_s * 1e3:.0f} ms",
            f"{(len(quick) - sum(map(is_listing, quick))) / n:.1f} reads/ckpt",
            f"{len(quick)} requests",
            # Telling the run is a directory costs one object lookup (and a short listing).
            "paged listing + 1 lookup + <= 1 read/ckpt",
            len(quick) - sum(map(is_listing, quick)) <= n + 1,
        ),
        (
            f"gs:// list_checkpoints of {n} checkpoints, refresh ({listings(again)})",
            f"{again_s * 1e3:.0f} ms",
            f"{len(again)} requests",
            f"{len(again)} requests",
            f"<= 1 + {n} requests",
            len(again) <= 1 + n,
        ),
        (
            f"gs:// checkpoint_table vs Orbax checkpointables_metadata, {rows:,} leaves "
            f"({len(table_requests)} vs {len(orbax_requests)} requests)",
            f"{ours * 1e3:.0f} ms",
            f"{orbax * 1e3:.0f} ms (Orbax)",
            f"{speedup:.1f}x faster",
            ">= 10x",
            speedup >= 10,
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--leaves", type=int, default=10_000, help="leaves of the many-leaf checkpoint"
    )
    parser.add_argument(
        "--tree-leaves", type=int, default=256, help="leaves of the 1 GiB / 1 KiB pair"
    )
    parser.add_argument(
        "--big-gib", type=float, default=1.0, help="size of the big one of the pair"
    )
    parser.add_argument(
        "--leaf-mib", type=float, default=4.0, help="size of the leaf read_leaf reads"
    )
    parser.add_argument(
        "--huge-gib", type=float, default=4.0, help="size of the checkpoint it reads from"
    )
    parser.add_argument("--orbax-repeats", type=int, default=2)
    parser.add_argument(
        "--read-repeats", type=int, default=3, help="runs of each diff/verify/cat timing"
    )
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--workdir", type=Path, help="keep (and reuse) the checkpoints here")
    parser.add_argument("--gcs-checkpoints", type=int, default=200)
    parser.add_argument("--gcs-repeats", type=int, default=5)
    parser.add_argument("--gcs-only", action="store_true", help="run the gs:// lines alone")
    parser.add_argument("--no-gcs", action="store_true", help="leave the gs:// lines out")
    args = parser.parse_args()
    if args.gcs_only:
        return _report(_gcs_results(args), reset=True)

    from orbax.checkpoint import v1 as ocp

    import tinax.explore as ex

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tinax-bench-explore-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        _log(f"writing checkpoints under {workdir}")
        many = _save(workdir / f"many_{args.leaves}", lambda: _many_leaves(args.leaves))
        small_leaf = 4  # one float32
        big_leaf = int(args.big_gib * GIB) // args.tree_leaves
        big = _save(
            workdir / f"same_tree_big_{args.tree_leaves}x{big_leaf}",
            lambda: _same_tree(args.tree_leaves, big_leaf, seed=1),
        )
        small = _save(
            workdir / f"same_tree_small_{args.tree_leaves}x{small_leaf}",
            lambda: _same_tree(args.tree_leaves, small_leaf, seed=2),
        )
        leaf_bytes = int(args.leaf_mib * MIB)
        huge_leaves = int(args.huge_gib * GIB) // leaf_bytes
        huge = _save(
            workdir / f"huge_{huge_leaves}x{leaf_bytes}",
            lambda: _same_tree(huge_leaves, leaf_bytes, seed=3),
        )

        _log("timing tables")
        ours_many = _median_seconds(lambda: ex.checkpoint_table(many), args.repeats)
        orbax_many = _median_seconds(lambda: ocp.checkpointables_metadata(many), args.orbax_repeats)
        rows = len(ex.checkpoint_table(many))
        t_big, t_small = [], []
        for _ in range(args.repeats):  # Interleaved, so drift hits both alike.
            t_big.append(_median_seconds(lambda: ex.checkpoint_table(big), 1))
            t_small.append(_median_seconds(lambda: ex.checkpoint_table(small), 1))
        big_s, small_s = statistics.median(t_big), statistics.median(t_small)

        _log("reading one leaf in a fresh process")
        key = f"['layer_{huge_leaves // 2:04d}']['w']"
        probe = subprocess.run(
            [sys.executable, "-c", _MEMORY_PROBE, str(huge), "model", key],
            capture_output=True,
            text=True,
            check=True,
        )
        memory = json.loads(probe.stdout.strip().splitlines()[-1])
        growth = memory["peak"] - memory["before"]
        limit = 3 * memory["nbytes"] + 100 * MIB
        big_other = _save(
            workdir / f"same_tree_big_other_{args.tree_leaves}x{big_leaf}",
            lambda: _same_tree(args.tree_leaves, big_leaf, seed=4),
        )
        reads = {}
        for what in ("diff", "verify"):
            for cold in (True, False):
                _log(f"timing {what} against cat ({'cold' if cold else 'cached'} files)")
                reads[(what, cold)] = _throughput(
                    what, big, big_other, cold=cold, repeats=args.read_repeats
                )
        on_disk = {path: _disk_bytes(path) for path in (big, small, huge)}
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    speedup = orbax_many / ours_many
    size_ratio = big_s / small_s
    results = [
        (
            f"checkpoint_table vs Orbax checkpointables_metadata, {rows:,} leaves",
            f"{ours_many * 1e3:.0f} ms",
            f"{orbax_many * 1e3:.0f} ms (Orbax)",
            f"{speedup:.1f}x faster",
            ">= 10x",
            speedup >= 10,
        ),
        (
            f"checkpoint_table, {_fmt_bytes(args.tree_leaves * big_leaf)} vs "
            f"{_fmt_bytes(args.tree_leaves * small_leaf)} of arrays "
            f"({_fmt_bytes(on_disk[big])} vs {_fmt_bytes(on_disk[small])} on disk), "
            f"{args.tree_leaves} leaves each",
            f"{big_s * 1e3:.1f} ms",
            f"{small_s * 1e3:.1f} ms",
            f"{size_ratio:.2f}",
            "<= 1.5",
            size_ratio <= 1.5,
        ),
        (
            f"read_leaf peak memory growth, {_fmt_bytes(memory['nbytes'])} leaf of "
            f"{_fmt_bytes(on_disk[huge])} ({memory['seconds'] * 1e3:.0f} ms)",
            _fmt_bytes(growth),
            f"{_fmt_bytes(limit)} limit",
            f"{growth / memory['nbytes']:.2f}x leaf",
            "< 3x leaf + 100 MiB",
            growth < limit,
        ),
    ]
    for what, label in (("diff", "diff_table of two"), ("verify", "verify(data=True) of one")):
        for cold in (True, False):
            r = reads[(what, cold)]
            ours_rate, cat_rate = r["nbytes"] / r["ours"], r["nbytes"] / r["cat"]
            ratio = ours_rate / cat_rate
            spread = f"{min(r['ours_all']):.2f}-{max(r['ours_all']):.2f} s"
            results.append(
                (
                    f"{label} {_fmt_bytes(on_disk[big])} checkpoint"
                    f"{'s' if what == 'diff' else ''}, "
                    f"{'cold' if cold else 'cached'} files, vs cat ({spread})",
                    f"{_fmt_bytes(ours_rate)}/s",
                    f"{_fmt_bytes(cat_rate)}/s (cat)",
                    f"{ratio:.2f} of cat",
                    ">= 0.5" if cold else "(information)",
                    ratio >= 0.5 if cold else True,
                )
            )
        growth = max(reads[(what, cold)]["growth"] for cold in (True, False))
        results.append(
            (
                f"{label} 1 GiB checkpoint{'s' if what == 'diff' else ''}: peak RSS growth",
                _fmt_bytes(growth),
                "256 MiB limit",
                f"{growth / MIB:.0f} MiB",
                "<= 256 MiB",
                growth <= 256 * MIB,
            )
        )
    if not args.no_gcs:
        results.extend(_gcs_results(args))
    return _report(results, reset=memory["reset"])


def _report(results: list[tuple[str, str, str, str, str, bool]], *, reset: bool) -> int:
    """Prints the results as a table; 1 if a goal was missed."""
    if not reset:
        _log("note: /proc/self/clear_refs was not writable; the peak includes start-up")
    width = max(len(r[0]) for r in results)
    print(f"{'measure':<{width}}  {'tinax.explore':>14}  {'reference':>20}  {'ratio':>14}  goal")
    for name, ours, ref, ratio, goal, met in results:
        verdict = "met" if met else "MISSED"
        print(f"{name:<{width}}  {ours:>14}  {ref:>20}  {ratio:>14}  {goal} {verdict}")
    return 0 if all(r[-1] for r in results) else 1


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
