"""diff_table and verify(data=True) hold a bounded amount of memory, measured as the process's RSS.

Each side is larger than the bound asserted, so reading whole leaves (or whole
checkpoints) would break it.

The probe runs with glibc's mmap threshold fixed at 1 MiB. By default glibc raises
that threshold after a large block is freed, so later 4 MiB buffers come from its
per-thread arenas and stay resident after they are freed. How much stays then depends
on which of tensorstore's threads ran which read: the same verify grew by 17-56 MiB
from run to run here, and by 65 MiB once in CI. With the threshold fixed, a freed
buffer goes back to the system, and the growth is what the reads hold (30-38 MiB
here, idle or with every core busy).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from orbax.checkpoint import v1 as ocp

MIB = 1 << 20
LEAF_MIB = 128
LEAVES = 2

# Run in a fresh process: resident memory before, then the high-water mark after.
_PROBE = r"""
import json, sys
import tinax.explore as ex

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)

what, a, b = sys.argv[1:4]
def run():
    if what == "diff":
        table = ex.diff_table(a, b)
        assert (table["status"] == "changed").all(), table
    else:
        result = ex.verify(a, data=True)
        assert result.ok and result.leaves["read"].all(), result.findings

# Imports and first-use set-up (threads and their allocator arenas, caches of
# metadata: 50-60 MiB kept for the life of the process) are not the reads' memory:
# the second call is measured.
run()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS
before = status("VmRSS")
run()
print(json.dumps({"growth": status("VmHWM") - before}))
"""


def _save(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    tree = {
        f"layer_{i}": rng.standard_normal(LEAF_MIB * MIB // 4, dtype=np.float32).reshape(-1, 1024)
        for i in range(LEAVES)
    }
    ctx = ocp.Context()
    # Orbax's own option: each leaf stored as 4 MiB chunks, as a sharded leaf would be.
    ctx.array.saving.storage_options.chunk_byte_size = 4 * MIB
    with ctx:
        ocp.save_checkpointables(path, {"model": tree})
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("memory")
    return _save(root / "a", 1), _save(root / "b", 2)


def _growth(what: str, a: Path, b: Path) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, what, str(a), str(b)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MIB)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return int(json.loads(done.stdout.strip().splitlines()[-1])["growth"])


@pytest.mark.timeout(600)
def test_diff_memory_is_bounded(checkpoints):
    growth = _growth("diff", *checkpoints)
    # 512 MiB of arrays decoded and compared (measured: 36-38 MiB); one leaf held
    # whole would be 128 MiB.
    assert growth < 64 * MIB, f"{growth / MIB:.0f} MiB"


@pytest.mark.timeout(600)
def test_verify_data_memory_is_bounded(checkpoints):
    growth = _growth("verify", *checkpoints)
    # 256 MiB read (measured: 30-36 MiB); one leaf held whole would be 128 MiB.
    assert growth < 64 * MIB, f"{growth / MIB:.0f} MiB"
