"""Deriving and averaging hold a bounded amount of memory, measured as the process's RSS:
at most 2 leaves + 256 MiB for a derive, (sources + 1) leaves + 256 MiB for an average,
on sources larger than those bounds (holding them whole would break them);
``bench/surgery.py`` holds 512 MiB checkpoints to the same bounds.

Measured as in ``test_explore_memory.py``: in a fresh process, glibc's mmap threshold
fixed at 1 MiB, the high-water mark reset before each call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinax.checkpointing import save_checkpointables

MIB = 1 << 20
SLACK = 256 * MIB

_PROBE = r"""
import json, sys
import tinax.checkpointing as tc

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)

big, a, b, small, out = sys.argv[1:]
# Threads and pools set up first, by a call on a small checkpoint.
tc.derive_checkpoint(small, out + "_warm")
growth = {}
for name, call in (
    ("derive", lambda: tc.derive_checkpoint(big, out + "_derive", cast="bfloat16")),
    ("average", lambda: tc.average_checkpoints([a, b], out + "_average")),
):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = status("VmRSS")
    call()
    growth[name] = status("VmHWM") - before
print(json.dumps(growth))
"""


def _save(path: Path, leaves: int, leaf_mib: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    rows = leaf_mib * MIB // 4 // 1024
    tree = {
        f"layer_{i}": rng.standard_normal((rows, 1024), dtype=np.float32) for i in range(leaves)
    }
    save_checkpointables(path, {"model": tree}).result()
    return path


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_derive_and_average_memory_stays_within_the_bounds(tmp_path):
    big = _save(tmp_path / "big", 8, 48, 0)  # 384 MiB in leaves of 48 MiB
    a = _save(tmp_path / "a", 8, 24, 1)  # 2 x 192 MiB in leaves of 24 MiB
    b = _save(tmp_path / "b", 8, 24, 2)
    small = _save(tmp_path / "small", 1, 1, 3)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(big), str(a), str(b), str(small), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=500,
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MIB)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    growth = json.loads(done.stdout.strip().splitlines()[-1])
    # 384 MiB read: a derive may hold 2 leaves + 256 MiB = 352 MiB (measured: about 100).
    assert growth["derive"] < 2 * 48 * MIB + SLACK, growth
    # 384 MiB read: an average of 2 may hold 3 leaves + 256 MiB = 328 MiB (about 150).
    assert growth["average"] < 3 * 24 * MIB + SLACK, growth
    assert (tmp_path / "out_derive").is_dir() and (tmp_path / "out_average").is_dir()
