"""bench/load_stages.py at its smallest size on this machine's CPU: every stage and
every variant of the load engine timed, the load bit-identical, nothing left behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parent.parent / "bench" / "load_stages.py"


def test_the_smoke_run_times_each_stage_and_each_engine_variant(tmp_path: Path) -> None:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    done = subprocess.run(
        [sys.executable, str(BENCH), "--size", "smoke", "--rounds", "1", "--quick"],
        env={**env, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "(zstd level 3)" in out.splitlines()[0]
    timed = {
        m.group(1).strip(): float(m.group(2))
        for m in re.finditer(r"^(\S.*?)\s+([0-9.]+) s  state", out, re.M)
    }
    for stage in (
        "device_put of the host copy",
        "device_put from pinned_host arrays",
        "read + decode + digest + put, 8 thread(s)",
        "read + decode into a 256 MiB ring, 8 threads",
        "tinax load (load_checkpointables)",
        "engine alone",
        "engine, neither",
        "engine, its host buffer new",
        "copy of the state's bytes in memory, 8 threads",
        "engine, transfers waited for on the readers",
        "engine, 256 MiB host buffer",
    ):
        assert timed.get(stage, 0) > 0, stage
    assert "256 MiB of fresh memory, the same memory touched again, 8 threads" in out
    assert re.search(r"a load moves at least [0-9.]+ GB through memory", out)
    # A CPU has no memory to register for DMA: the run says so rather than failing.
    assert "device_put from host memory registered for DMA: not possible here (" in out
    ceiling = re.search(
        r"no faster than its slowest stage: the host's ([0-9.]+) s .*, the link's ([0-9.]+) s: "
        r"at best ([0-9.]+) of 8 parallel dd",
        out,
    )
    assert ceiling and float(ceiling.group(3)) > 0, out
    assert float(ceiling.group(2)) <= timed["device_put of the host copy"]
    assert "every leaf of a load bit-identical on its device and sharding" in out
    # The goal: the load against the slower of the host's stage and the link.
    goal = re.search(r"tinax's load took ([0-9.]+) s: ([0-9.]+)x its slowest stage", out)
    assert goal and float(goal.group(2)) > 0, out
    assert re.search(r"tinax load at its best: [0-9.]+ of 8 parallel dd", out)
    assert list(tmp_path.iterdir()) == []
