"""``verify(data=True)``, ``diff_table`` and ``read_leaf`` against ``cat`` of the same bytes.

Run with ``.venv/bin/python bench/reads.py`` (``make bench`` runs it too). It writes a
checkpoint of 16 float32 arrays of 64 MiB (1 GiB) with tinax, and a copy of it with
half the arrays changed, reads them once so that the page cache is warm, then in
each of ``--rounds`` rounds (median shown) times, side by side:

- ``cat`` of the checkpoint's files to ``/dev/null`` (the floor: the bytes alone);
- ``verify(path, data=True)``: every chunk decoded, checksummed and NaN/Inf counted;
- ``diff_table(a, b)`` of the two: the unchanged half decided by their saved
  checksums without reading them, the changed half decoded and compared, against
  ``cat`` of the bytes it had to read (the changed arrays of both sides);
- ``read_leaf`` of every array in turn, against ``cat`` of the same 1 GiB;
- ``diff_table`` of the checkpoint against live state (the changed copy's arrays,
  held in memory as NumPy arrays): every array decoded, for information.

It also times ``read_leaf`` of one small leaf after another of a checkpoint of
``--wide`` arrays (10,000 by default), side by side: from the checkpoint opened once
(its store's walk kept from one call to the next), and from its path, opened for that
one leaf each call (only that leaf's checksum record decoded, its array's keys looked
up in the store; the figure keeps its name "walking" so that earlier revisions, which
walked the store each call, compare with it in ``bench/against.py``).

``read_leaf`` returns new memory, which the kernel zeroes as it is first written:
the bench times that too, writing 16 fresh arrays of 64 MiB (kept alive, as the
results of ``read_leaf`` are). In a virtual machine whose host takes back memory the
guest has freed (free page reporting), memory freed a few seconds earlier costs
several seconds a GiB to touch again, whoever touches it: that is the host's cost,
not the read's, so just before each round of ``read_leaf`` the bench writes and frees
1 GiB (untimed), and it prints the cost after a pause apart, for information.

Each line prints the throughput as a fraction of ``cat``'s and its goal (0.5); the
script exits 1 when a goal is missed. The machine's other work makes single runs
noisy: the ratios are measured in the same run, a few seconds apart.
``--workdir DIR`` keeps the checkpoints there and reuses them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

MIB = 1 << 20
ARRAYS = 16
ARRAY_MIB = 64
GOAL = 0.5


def _state(seed: int, changed: set[int]) -> dict[str, np.ndarray]:
    out = {}
    for i in range(ARRAYS):
        rng = np.random.default_rng(1000 + i + (seed if i in changed else 0))
        out[f"w{i:02d}"] = rng.standard_normal(ARRAY_MIB * MIB // 4, dtype=np.float32).reshape(
            -1, 1024
        )
    return out


def _write(workdir: Path) -> tuple[Path, Path]:
    from tinax.checkpointing import save_checkpointables

    a, b = workdir / "a", workdir / "b"
    if not (a.exists() and b.exists()):
        for path in (a, b):
            shutil.rmtree(path, ignore_errors=True)
        save_checkpointables(a, {"model": _state(0, set())}).result()
        save_checkpointables(b, {"model": _state(1, set(range(0, ARRAYS, 2)))}).result()
    return a, b


def _files(path: Path) -> list[str]:
    return [str(p) for p in sorted(path.rglob("*")) if p.is_file()]


def _cat(files: list[str]) -> float:
    start = time.perf_counter()
    for i in range(0, len(files), 256):
        subprocess.run(["cat", *files[i : i + 256]], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _fresh_memory() -> None:
    """Allocates and writes arrays of read_leaf's results' sizes, keeping them all."""
    kept = []
    for _ in range(ARRAYS):
        out = np.empty(ARRAY_MIB * MIB // 4, np.float32)
        out.fill(1.0)
        kept.append(out)


def _recycle() -> None:
    """Writes and frees as much memory as read_leaf's results take (see the docstring)."""
    _fresh_memory()


def _changed_files(a: Path, b: Path) -> list[str]:
    """The data files holding the arrays diff_table has to read: those that differ."""
    out = []
    for side in (a, b):
        other = b if side == a else a
        for f in _files(side):
            twin = other / Path(f).relative_to(side)
            same = twin.exists() and twin.stat().st_size == os.path.getsize(f)
            if not same or Path(f).read_bytes() != twin.read_bytes():
                out.append(f)
    return out


def _wide(workdir: Path, n: int, reads: int = 30) -> tuple[list[float], list[float]]:
    """Seconds per ``read_leaf`` of small leaves of an ``n``-array checkpoint, with the
    walk kept (the checkpoint opened once, its walk kept on it) and with it walked each
    call (the checkpoint opened from its path each time), alternating."""
    import tinax.explore as ex
    from tinax.checkpointing import save_checkpointables

    path = workdir / f"wide-{n}"
    if not path.exists():
        state = {f"w{i:06d}": np.full((64,), i, np.float32) for i in range(n)}
        save_checkpointables(path, {"model": state}).result()
    keys = [f"['w{(i * 7919) % n:06d}']" for i in range(reads)]
    opened = ex.open_checkpoint(path)
    ex.read_leaf(opened, "model", keys[0])
    kept: list[float] = []
    walked: list[float] = []
    for key in keys:
        for times, source in ((kept, opened), (walked, path)):
            start = time.perf_counter()
            ex.read_leaf(source, "model", key)
            times.append(time.perf_counter() - start)
    return kept, walked


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--wide", type=int, default=10_000, help="arrays of the wide checkpoint")
    args = parser.parse_args()
    import tinax.explore as ex

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="tinax-reads-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        a, b = _write(workdir)
        files_a = _files(a)
        keys = [f"['w{i:02d}']" for i in range(ARRAYS)]
        # Which bytes diff_table must read: the arrays whose saved checksums differ.
        table = ex.diff_table(a, b, sort=False)
        decoded = table[table["decided_by"] == "data"]
        nbytes = sum(os.path.getsize(f) for f in files_a)
        diff_bytes = 2 * int(decoded["key"].map(lambda _: ARRAY_MIB * MIB).sum())
        _cat(files_a + _files(b))  # warm the page cache
        rows: dict[str, list[float]] = {
            k: [] for k in ("cat", "verify", "diff", "read_leaf", "memory", "live")
        }
        live = {"model": {key[2:-2]: ex.read_leaf(b, "model", key) for key in keys}}
        for _ in range(args.rounds):
            rows["cat"].append(_cat(files_a))
            result = None

            def run_verify() -> None:
                nonlocal result
                result = ex.verify(a, data=True)

            rows["verify"].append(_timed(run_verify))
            assert result is not None and result.ok, result
            rows["diff"].append(_timed(lambda: ex.diff_table(a, b)))
            _recycle()
            rows["read_leaf"].append(
                _timed(lambda: [ex.read_leaf(a, "model", key) for key in keys])
            )
            rows["memory"].append(_timed(_fresh_memory))
            rows["live"].append(_timed(lambda: ex.diff_table(a, live)))
        cat = statistics.median(rows["cat"])
        cat_rate = nbytes / cat
        print(
            f"checkpoint: {nbytes / MIB:.0f} MiB in {ARRAYS} arrays; {args.rounds} rounds, medians"
        )
        print(f"  cat                    {cat:6.3f} s  {cat_rate / MIB:8.0f} MiB/s")
        missed = []
        for name, moved in (("verify", nbytes), ("diff", diff_bytes), ("read_leaf", nbytes)):
            seconds = statistics.median(rows[name])
            ratio = (moved / seconds) / cat_rate
            ok = ratio >= GOAL
            if not ok:
                missed.append(name)
            label = {
                "verify": "verify(data=True)",
                "diff": f"diff_table ({len(decoded)} of {ARRAYS} decoded)",
                "read_leaf": "read_leaf (every array)",
            }[name]
            print(
                f"  {label:34} {seconds:6.3f} s  {moved / seconds / MIB:8.0f} MiB/s  "
                f"{ratio:5.2f} of cat (goal {GOAL})  {'ok' if ok else 'MISSED'}"
            )
        whole = statistics.median(rows["diff"])
        print(
            f"  (diff_table against cat of both whole checkpoints: "
            f"{(2 * nbytes / whole) / cat_rate:.2f} of cat, for information)"
        )
        print(
            f"  (diff_table against live state, all {ARRAYS} arrays decoded: "
            f"{statistics.median(rows['live']):.3f} s, {cat / statistics.median(rows['live']):.2f} "
            f"of cat of the checkpoint; for information)"
        )
        memory = statistics.median(rows["memory"])
        print(
            f"  (read_leaf's results are fresh memory: writing {ARRAYS} new arrays of "
            f"{ARRAY_MIB} MiB, kept as read_leaf's are, takes {memory:.3f} s here; "
            f"read_leaf against cat plus that: "
            f"{(cat + memory) / statistics.median(rows['read_leaf']):.2f}, for information)"
        )
        time.sleep(4)  # past the host's delay for taking freed memory back
        print(
            f"  (the same after a 4 s pause, memory freed and not touched since: "
            f"{_timed(_fresh_memory):.3f} s; for information)"
        )
        by = table["decided_by"].value_counts().to_dict()
        print(f"  diff_table decided_by: {by}")
        kept, walked = _wide(workdir, args.wide)
        print(
            f"  read_leaf of one leaf after another of {args.wide:,} arrays (medians of "
            f"{len(kept)}): {statistics.median(kept) * 1e3:.1f} ms with the walk kept, "
            f"{statistics.median(walked) * 1e3:.1f} ms walking the store each call "
            f"({statistics.median(walked) / statistics.median(kept):.0f}x)"
        )
        return 1 if missed else 0
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
