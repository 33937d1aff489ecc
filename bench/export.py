"""``export_safetensors`` against ``cp`` of the same bytes, and against a full load + save.

Run with ``.venv/bin/python bench/export.py`` (``make bench`` runs it too). It saves a
1 GiB checkpoint with tinax (16 float32 arrays of 64 MiB) and a 1 GiB file of the same
bytes, then, for each of ``--rounds`` rounds, side by side in one run:

- ``cp`` of that file (a fresh process, as a person would copy the weights);
- ``tinax.explore.export_safetensors`` of the checkpoint, in a fresh process that
  reports its own time and its peak resident memory (``ru_maxrss``);
- ``load_checkpointables`` of the whole checkpoint then ``safetensors.numpy.save_file``,
  the way conversion scripts do it, likewise in a fresh process.

It prints the medians and exits 1 when a goal is missed: the export at least half as
fast as ``cp`` (ratio ≥ 0.5 of cp's bytes per second), its peak memory at most twice
the largest array plus 200 MiB. The machine's other work makes single rounds noisy;
the ratios of the same round are what to read. ``--workdir DIR`` keeps the checkpoint
there and reuses it next time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MIB = 1 << 20
ARRAYS = 16
SHAPE = (4096, 4096)  # float32: 64 MiB each, 1 GiB in all
LEAF_BYTES = int(np.prod(SHAPE)) * 4
GOAL_SPEED = 0.5
GOAL_RSS = 2 * LEAF_BYTES + 200 * MIB

# Each side runs in a fresh process and reports its own time and peak memory.
_EXPORT = r"""
import json, resource, sys, time
import tinax.explore as ex
ckpt, out = sys.argv[1:3]
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.perf_counter()
files = ex.export_safetensors(ckpt, out)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "baseline": baseline, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""

_LOAD_SAVE = r"""
import json, resource, sys, time
import numpy as np
from safetensors.numpy import save_file
from tinax.checkpointing import NumpyTarget, load_checkpointables
ckpt, out, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
target = {f"w{i:02d}": NumpyTarget((4096, 4096), np.float32) for i in range(count)}
start = time.perf_counter()
state = load_checkpointables(ckpt, {"model": target})["model"]
save_file({k: np.asarray(v) for k, v in state.items()}, out)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def _make(workdir: Path) -> tuple[Path, Path]:
    ckpt, raw = workdir / "ckpt", workdir / "raw.bin"
    if ckpt.is_dir() and raw.is_file():
        return ckpt, raw
    from tinax.checkpointing import save_checkpointables

    shutil.rmtree(ckpt, ignore_errors=True)
    rng = np.random.default_rng(0)
    arrays = {f"w{i:02d}": rng.standard_normal(SHAPE, dtype=np.float32) for i in range(ARRAYS)}
    save_checkpointables(ckpt, {"model": arrays}).result()
    with open(raw, "wb") as f:
        for value in arrays.values():
            f.write(value.tobytes())
    return ckpt, raw


def _child(code: str, *args: Path | int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _cp(src: Path, dst: Path) -> float:
    start = time.perf_counter()
    subprocess.run(["cp", str(src), str(dst)], check=True)
    subprocess.run(["sync", str(dst)], check=False)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, help="keep the checkpoint here")
    args = parser.parse_args()
    keep = args.workdir is not None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tinax-bench-export-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        ckpt, raw = _make(workdir)
        total = raw.stat().st_size
        cp_s, export_s, export_rss, load_s, load_rss, base = [], [], [], [], [], []
        for round_ in range(args.rounds):
            scratch = workdir / f"round{round_}"
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir()
            cp_s.append(_cp(raw, scratch / "copy.bin"))
            (scratch / "copy.bin").unlink()
            result = _child(_EXPORT, ckpt, scratch / "export")
            export_s.append(result["seconds"])
            export_rss.append(result["rss"])
            base.append(result["baseline"])
            shutil.rmtree(scratch / "export")
            result = _child(_LOAD_SAVE, ckpt, scratch / "model.safetensors", ARRAYS)
            load_s.append(result["seconds"])
            load_rss.append(result["rss"])
            shutil.rmtree(scratch)
            print(
                f"round {round_ + 1}: cp {cp_s[-1]:.2f} s, export {export_s[-1]:.2f} s "
                f"({cp_s[-1] / export_s[-1]:.2f} of cp), load+save_file {load_s[-1]:.2f} s",
                flush=True,
            )
        cp, export, load = (statistics.median(x) for x in (cp_s, export_s, load_s))
        rss, load_peak = max(export_rss), max(load_rss)
        gib = total / (1 << 30)
        speed = cp / export
        print(
            f"\n{ARRAYS} float32 arrays of {LEAF_BYTES // MIB} MiB, {gib:.2f} GiB; medians of {args.rounds} rounds"
        )
        print(f"  cp                         {cp:6.2f} s  {gib / cp:6.2f} GiB/s")
        print(
            f"  export_safetensors         {export:6.2f} s  {gib / export:6.2f} GiB/s  "
            f"peak RSS {rss / MIB:7.0f} MiB   {speed:.2f} of cp (goal ≥ {GOAL_SPEED})"
        )
        print(
            f"    (of which {max(base) / MIB:.0f} MiB after importing tinax.explore, before the export)"
        )
        print(
            f"  load + safetensors save    {load:6.2f} s  {gib / load:6.2f} GiB/s  "
            f"peak RSS {load_peak / MIB:7.0f} MiB"
        )
        print(
            f"  export peak RSS goal: ≤ 2 × {LEAF_BYTES // MIB} MiB + 200 MiB = "
            f"{GOAL_RSS / MIB:.0f} MiB"
        )
        missed = []
        if speed < GOAL_SPEED:
            missed.append(f"export at {speed:.2f} of cp (goal {GOAL_SPEED})")
        if rss > GOAL_RSS:
            missed.append(f"export peak RSS {rss / MIB:.0f} MiB (goal {GOAL_RSS / MIB:.0f} MiB)")
        for miss in missed:
            print(f"MISSED: {miss}")
        return 1 if missed else 0
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
