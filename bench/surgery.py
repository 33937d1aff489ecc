"""Checkpoints derived and averaged, beside ``cat`` of their sources: MB/s and peak memory.

Run with ``.venv/bin/python bench/surgery.py``. It writes, with tinax (checksums, 8 MiB
chunks, uncompressed), three checkpoints of ``--size-mib`` (512 by default) in
``--leaves`` float32 arrays each (8 by default: 64 MiB leaves), and one more with raw
Orbax's defaults (each array one zstd chunk), then times, each in a fresh process:

- ``copy``: ``derive_checkpoint(src, dst)``, the whole checkpoint (its data files,
  kept whole, are hard-linked once every chunk is read and checked);
- ``copy without links``: the same, every stored chunk written again (as onto
  another file system), beside ``cp`` of the same files, each synced;
- ``bfloat16``: ``derive_checkpoint(src, dst, cast="bfloat16")``;
- ``average``: ``average_checkpoints([a, b, c], dst)``;
- ``copy, orbax zstd source``: the copy of Orbax's checkpoint, whose arrays can only
  be decoded whole (memory only: its reads are zstd's, not the disk's).

Each is timed with its sources evicted from the page cache (``posix_fadvise``), beside
``cat`` of the same files evicted too, and with them cached; the CPU seconds of each
side are printed too (on a machine shared with other work they tell more than the
clock), and the floor of the writes: ``dd`` of as many bytes with ``conv=fsync`` (a
new checkpoint is synced before it commits, as Orbax's are). Beside the copy without
links, ``cp`` of the same files, evicted, each synced once written: the system's own
durable copy on a disk where the reads and the writes share the device. Goals: the evicted rate at
least half of ``cat``'s (``ratio``, bytes of the sources read per second), and the peak
memory above the level before the call (``VmHWM`` after ``clear_refs``, glibc's mmap
threshold fixed at 1 MiB as in ``tests/test_explore_memory.py``) within 2 leaves +
256 MiB for a derive and (sources + 1) leaves + 256 MiB for an average. Each figure is
the best of ``--rounds`` (3). Exits 1 when a goal is missed. ``--workdir DIR`` keeps
the sources there and reuses them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MIB = 1 << 20
GOAL_RATIO = 0.5
SLACK_BYTES = 256 * MIB

_OPERATION = r"""
import json, os, sys, time
import tinax.checkpointing as tc

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)

operation, out, warm, *sources = sys.argv[1:]
# Threads, pools and imports are set up by a first, tiny call; the second is measured.
tc.derive_checkpoint(warm, out + ".warm")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS
before = status("VmRSS")
import resource
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu = usage.ru_utime + usage.ru_stime
started = time.perf_counter()
if operation == "average":
    tc.average_checkpoints(sources, out)
elif operation == "bfloat16":
    tc.derive_checkpoint(sources[0], out, cast="bfloat16")
else:
    if operation == "copy without links":
        from tinax._format.writing import stored_copy

        stored_copy.LINK_FILES = False
    tc.derive_checkpoint(sources[0], out)
seconds = time.perf_counter() - started
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu = usage.ru_utime + usage.ru_stime - cpu
print(json.dumps({"seconds": seconds, "cpu": cpu, "growth": status("VmHWM") - before}))
"""


def _write_sources(work: Path, size_mib: int, leaves: int) -> None:
    """Three tinax checkpoints and one of raw Orbax's defaults, written once."""
    import jax

    jax.config.update("jax_platforms", "cpu")
    from orbax.checkpoint import v1 as ocp

    from tinax.checkpointing import save_checkpointables

    rows = size_mib * MIB // leaves // 4 // 2048
    rng = np.random.default_rng(0)
    for name in ("a", "b", "c", "orbax"):
        if (work / name).is_dir():
            continue
        tree = {
            f"layer_{i:02d}": rng.standard_normal((rows, 2048), dtype=np.float32)
            for i in range(leaves)
        }
        staging = work / f"{name}.staging"
        shutil.rmtree(staging, ignore_errors=True)
        if name == "orbax":
            ocp.save_checkpointables(staging, {"model": tree})
        else:
            save_checkpointables(staging, {"model": tree}).result()
        staging.rename(work / name)
    warm = work / "warm"
    if not warm.is_dir():
        save_checkpointables(warm, {"model": {"w": np.ones((4, 4), np.float32)}}).result()


def _files(checkpoint: Path) -> list[Path]:
    return [p for p in checkpoint.rglob("*") if p.is_file()]


def _evict(files: list[Path]) -> None:
    """Drops ``files`` from the page cache (dirty pages of earlier outputs synced first)."""
    os.sync()
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _cat_seconds(files: list[Path]) -> tuple[float, float]:
    """Wall and CPU seconds of ``cat`` of ``files`` to ``/dev/null``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def _dd_seconds(work: Path, nbytes: int) -> float:
    """Seconds ``dd`` takes to write ``nbytes`` durably (``conv=fsync``): the disk's floor
    for writing a new checkpoint."""
    target = work / "dd.out"
    started = time.perf_counter()
    subprocess.run(
        [
            "dd",
            "if=/dev/zero",
            f"of={target}",
            "bs=8M",
            f"count={nbytes // (8 * MIB)}",
            "conv=fsync",
        ],
        capture_output=True,
        check=True,
    )
    seconds = time.perf_counter() - started
    target.unlink()
    return seconds


def _cp_seconds(sources: list[Path], target: Path) -> float:
    """Seconds for ``cp`` to copy ``sources`` under ``target`` and for every file it
    wrote to be synced: what the system's own copy takes to make a durable copy of the
    same files on this disk, where reading and writing share it."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    started = time.perf_counter()
    subprocess.run(["cp", "-r", *map(str, sources), str(target)], check=True)
    for path in _files(target):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    seconds = time.perf_counter() - started
    shutil.rmtree(target)
    return seconds


def _cat_beside_dd_seconds(files: list[Path], work: Path, nbytes: int) -> float:
    """Seconds for ``cat`` of ``files`` and, at the same time, ``dd`` writing ``nbytes``
    durably: the disk's own floor for anything that reads those files and writes that
    much (a cast to a type of half the width), reads and writes sharing the device."""
    target = work / "dd.out"
    started = time.perf_counter()
    count = f"count={nbytes // (8 * MIB)}"
    writer = subprocess.Popen(
        ["dd", "if=/dev/zero", f"of={target}", "bs=8M", count, "conv=fsync"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    if writer.wait() != 0:
        raise RuntimeError("dd failed")
    seconds = time.perf_counter() - started
    target.unlink()
    return seconds


def _run(operation: str, out: Path, warm: Path, sources: list[Path]) -> dict[str, float]:
    for path in (out, Path(f"{out}.warm")):
        shutil.rmtree(path, ignore_errors=True)
    done = subprocess.run(
        [sys.executable, "-c", _OPERATION, operation, str(out), str(warm), *map(str, sources)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MIB), "JAX_PLATFORMS": "cpu"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"{operation} failed:\n{done.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--leaves", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tinax-bench-surgery-"))
    work.mkdir(parents=True, exist_ok=True)
    _write_sources(work, args.size_mib, args.leaves)
    leaf = args.size_mib * MIB // args.leaves
    operations = [
        ("copy", [work / "a"], 2 * leaf, True),
        ("copy without links", [work / "a"], 2 * leaf, False),
        ("bfloat16", [work / "a"], 2 * leaf, True),
        ("average", [work / "a", work / "b", work / "c"], 4 * leaf, True),
        ("copy, orbax zstd source", [work / "orbax"], 2 * leaf, False),
    ]
    everything = [f for name in ("a", "b", "c", "orbax") for f in _files(work / name)]
    dd_s = min(_dd_seconds(work, args.size_mib * MIB) for _ in range(args.rounds))
    print(
        f"floor of writes: dd of {args.size_mib} MiB with conv=fsync, "
        f"{args.size_mib / dd_s:.0f} MiB/s"
    )
    missed = []
    report = {}
    for name, sources, leaves_bound, rated in operations:
        operation = name.split(",")[0]
        files = [f for s in sources for f in _files(s)]
        nbytes = sum(f.stat().st_size for f in files)
        bound = leaves_bound + SLACK_BYTES
        out = work / "out"
        line = {}
        cps: list[float] = []
        both: list[float] = []
        for cached in (False, True):
            cats, runs = [], []
            for _ in range(args.rounds if not cached else 1):
                shutil.rmtree(out, ignore_errors=True)
                if not cached:
                    _evict(everything)
                cats.append(_cat_seconds(files))
                if not cached:
                    _evict(everything)
                runs.append(_run(operation, out, work / "warm", sources))
                if name == "copy without links" and not cached:
                    _evict(everything)
                    cps.append(_cp_seconds(sources, work / "cp"))
                if name == "bfloat16" and not cached:
                    _evict(everything)
                    both.append(_cat_beside_dd_seconds(files, work, nbytes // 2))
            cat_s = min(c[0] for c in cats)
            cat_cpu = min(c[1] for c in cats)
            run_s = min(r["seconds"] for r in runs)
            run_cpu = min(r["cpu"] for r in runs)
            growth = min(r["growth"] for r in runs)
            ratio = cat_s / run_s
            key = "cached" if cached else "evicted"
            line[key] = {
                "ratio": ratio,
                "mib_s": nbytes / MIB / run_s,
                "cpu_s": run_cpu,
                "cat_cpu_s": cat_cpu,
                "growth_mib": growth / MIB,
            }
            goal = rated and not cached
            print(
                f"{name}: {nbytes / MIB:.0f} MiB read, sources {key}: {run_s:.2f} s, "
                f"{nbytes / MIB / run_s:.0f} MiB/s; cat {nbytes / MIB / cat_s:.0f} MiB/s; "
                f"ratio {ratio:.2f}{f' (goal >= {GOAL_RATIO})' if goal else ''}; CPU "
                f"{run_cpu:.2f} s (cat {cat_cpu:.2f} s); peak memory "
                f"+{growth / MIB:.0f} MiB (bound {bound / MIB:.0f} MiB)"
            )
            # The disk's own floors measured beside the operation: field, what was
            # timed, its seconds, and who is compared with it.
            floors = []
            if cps:
                synced = (
                    f"cp of the same files with each synced: {nbytes / MIB / min(cps):.0f} MiB/s"
                )
                floors.append(("cp_ratio", synced, min(cps), "the copy", "cp's speed"))
            if both:
                written = f"{nbytes / MIB / 2:.0f} MiB with fsync: {min(both):.2f} s"
                floors.append(
                    (
                        "cat_beside_dd_ratio",
                        f"cat of the sources while dd writes {written}",
                        min(both),
                        "the cast",
                        "their speed",
                    )
                )
            for field, timed, floor_s, who, whose in [] if cached else floors:
                print(
                    f"  beside it, {timed}, {cat_s / floor_s:.2f} of cat; "
                    f"{who} {floor_s / run_s:.2f}x {whose}"
                )
                line[key][field] = cat_s / floor_s
            if goal and ratio < GOAL_RATIO:
                missed.append(f"{name} throughput")
            if growth > bound:
                missed.append(f"{name} memory")
        report[name] = line
    print(json.dumps(report))
    shutil.rmtree(work / "out", ignore_errors=True)
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    if missed:
        print("missed goals: " + ", ".join(sorted(set(missed))), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
