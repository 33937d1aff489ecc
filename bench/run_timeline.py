"""The run view against its floors: ``run_table`` on 300 checkpoints beside an
``os.scandir`` walk, and ``drift_table`` of every consecutive pair beside ``cat`` of the
bytes it reads.

Run with ``.venv/bin/python bench/run_timeline.py``. It writes (with tinax, so every
checkpoint has checksums and save times):

- a run of 300 checkpoints (one real checkpoint of 1,200 small arrays and an auxiliary
  ``{"loss", "learning_rate"}``, copied under 300 steps): ``run_table`` in a fresh
  process, against a fresh process walking the run with ``os.scandir``. Goal: 1 s.
- a run of 8 checkpoints of 16 float32 arrays of 4 MiB each (64 MiB a checkpoint),
  every array changed at every step: ``drift_table`` of the 7 pairs in a fresh
  process, against ``cat`` of the same files (both sides of every pair, in order) to
  ``/dev/null``. As in ``bench/explore.py``, the files are first evicted from the page
  cache (``posix_fadvise(DONTNEED)``), as a run is read long after it was written,
  which is the measure held to its goal (at least half of ``cat``'s rate); then with
  the files cached, for information. A second call in the same process (every pair's
  sums kept) is shown.

It prints the figures and exits 1 if a goal is missed. ``--workdir DIR`` keeps the
runs there and reuses them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MIB = 1 << 20
LONG_RUN = 300
LEAVES = 1200
DRIFT_CHECKPOINTS = 8
DRIFT_ARRAYS = 16
ARRAY_MIB = 4
GOAL_RUN_TABLE_S = 1.0
GOAL_DRIFT_RATIO = 0.5

_RUN_TABLE = r"""
import sys, time
started = time.perf_counter()
from tinax.explore import run_table
imported = time.perf_counter()
table = run_table(sys.argv[1])
done = time.perf_counter()
assert len(table) == int(sys.argv[2]) and table["loss"].notna().all(), table
print(imported - started, done - imported)
"""

_SCANDIR = r"""
import os, sys, time
started = time.perf_counter()
def walk(path):
    n = 0
    with os.scandir(path) as it:
        for e in it:
            if e.is_dir(follow_symlinks=False):
                n += walk(e.path)
            else:
                e.stat(follow_symlinks=False)
                n += 1
    return n
files = walk(sys.argv[1])
print(time.perf_counter() - started, files)
"""

_DRIFT = r"""
import sys, time
from tinax.explore import drift_table
started = time.perf_counter()
table = drift_table(sys.argv[1])
first = time.perf_counter() - started
started = time.perf_counter()
again = drift_table(sys.argv[1])
second = time.perf_counter() - started
assert len(table) == len(again) and table["rel_update"].notna().all()
print(first, second, len(table))
"""


def _python(code: str, *args: str) -> list[float]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=True
    )
    return [float(x) for x in done.stdout.split()]


def _write_long_run(root: Path) -> None:
    from tinax.checkpointing import save_checkpointables

    rng = np.random.default_rng(0)
    one = root.with_name(root.name + ".one")
    shutil.rmtree(one, ignore_errors=True)
    model = {f"layer_{i}": {"w": rng.standard_normal(16).astype(np.float32)} for i in range(LEAVES)}
    save_checkpointables(
        one, {"model": model, "auxiliary": {"loss": 0.5, "learning_rate": 1e-3}}
    ).result()
    staging = root.with_name(root.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for step in range(1, LONG_RUN + 1):
        shutil.copytree(one, staging / f"step_{step:06d}")
    shutil.rmtree(one)
    staging.rename(root)


def _write_drift_run(root: Path) -> None:
    from tinax.checkpointing import save_checkpointables

    rng = np.random.default_rng(1)
    elements = ARRAY_MIB * MIB // 4
    arrays = [rng.standard_normal(elements).astype(np.float32) for _ in range(DRIFT_ARRAYS)]
    staging = root.with_name(root.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for step in range(1, DRIFT_CHECKPOINTS + 1):
        for a in arrays:
            a *= np.float32(1.01)
        model = {f"layers_{i}": {"w": a} for i, a in enumerate(arrays)}
        save_checkpointables(staging / f"step_{step:06d}", {"model": model}).result()
    staging.rename(root)


def _data_files(checkpoint: Path) -> list[Path]:
    return [p for p in (checkpoint / "model").rglob("*") if p.is_file()]


def _evict(files: list[Path]) -> None:
    """Drops ``files`` from the page cache (clean pages only: synced first)."""
    os.sync()
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _cat_seconds(files: list[Path]) -> float:
    started = time.perf_counter()
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tinax-bench-timeline-"))
    work.mkdir(parents=True, exist_ok=True)
    long_run, drift_run = work / "long_run", work / "drift_run"
    if not long_run.is_dir():
        _write_long_run(long_run)
    if not drift_run.is_dir():
        _write_drift_run(drift_run)
    missed = []

    # -- run_table on 300 checkpoints, each side in a fresh process, best of three
    tables = [_python(_RUN_TABLE, str(long_run), str(LONG_RUN)) for _ in range(3)]
    walks = [_python(_SCANDIR, str(long_run)) for _ in range(3)]
    table_s = min(t[1] for t in tables)
    import_s = min(t[0] for t in tables)
    walk_s, files = min(w[0] for w in walks), int(walks[0][1])
    # What a person waits for: the import and the call (a library that defers an import
    # to its first use moves its cost from one to the other).
    both_s = min(t[0] + t[1] for t in tables)
    print(
        f"run_table, {LONG_RUN} checkpoints of {LEAVES} leaves ({files:,} files), "
        f"fresh process: {table_s:.3f} s (import of tinax.explore {import_s:.2f} s apart; "
        f"the two together {both_s:.3f} s); os.scandir walk {walk_s:.3f} s; "
        f"goal {GOAL_RUN_TABLE_S} s"
    )
    if table_s > GOAL_RUN_TABLE_S:
        missed.append("run_table")

    # -- drift of every consecutive pair against cat of the same bytes (cached files)
    checkpoints = sorted(drift_run.glob("step_*"))
    pairs = list(itertools.pairwise(checkpoints))
    files = [f for a, b in pairs for f in (*_data_files(a), *_data_files(b))]
    nbytes = sum(f.stat().st_size for f in files)
    everything = [f for c in checkpoints for f in _data_files(c)]
    figures = {}
    for cached in (False, True):
        cats, drifts = [], []
        for _ in range(3):
            if not cached:
                _evict(everything)
            cats.append(_cat_seconds(files))
            if not cached:
                _evict(everything)
            drifts.append(_python(_DRIFT, str(drift_run)))
        cat_s, drift_s = min(cats), min(d[0] for d in drifts)
        again_s = min(d[1] for d in drifts)
        ratio = cat_s / drift_s
        figures["cached" if cached else "evicted"] = ratio
        print(
            f"drift_table, {len(pairs)} pairs of {DRIFT_ARRAYS} x {ARRAY_MIB} MiB float32 "
            f"({nbytes / MIB:.0f} MiB read), files {'cached' if cached else 'evicted'}: "
            f"{drift_s:.2f} s, {nbytes / MIB / drift_s:.0f} MiB/s; cat {cat_s:.2f} s, "
            f"{nbytes / MIB / cat_s:.0f} MiB/s; ratio {ratio:.2f}"
            + ("" if cached else f" (goal >= {GOAL_DRIFT_RATIO})")
            + f"; second call {again_s * 1000:.0f} ms (nothing read)"
        )
    ratio = figures["evicted"]
    if ratio < GOAL_DRIFT_RATIO:
        missed.append("drift_table")
    print(json.dumps({"run_table_s": table_s, "scandir_s": walk_s, "drift_ratio": figures}))
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    if missed:
        print("missed goals: " + ", ".join(missed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
