"""bench/accelerator.py's smoke run: the same workload as on an accelerator, at its
smallest size on this machine's CPU, with Orbax beside tinax."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parent.parent / "bench" / "accelerator.py"


def _smoke(tmp_path: Path, *args: str) -> str:
    """The benchmark's output at its smallest size on this machine's CPU, writing
    under ``tmp_path``; it must exit 0."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    done = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--dir", str(tmp_path), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_the_smoke_run_restores_bit_identical_refuses_a_flipped_byte_and_prints_both(
    tmp_path: Path,
) -> None:
    out = _smoke(
        tmp_path,
        # zstd is tinax's default on an accelerator: its flipped byte is checked too.
        "--systems",
        # One variant beside tinax's default (each system is a save, loads and a fresh
        # process): the storage settings themselves are tests/test_storage_settings.py's.
        "orbax,tinax,tinax zstd -1",
        "--diagnose",
    )
    # Each tinax system checks a save and a flipped byte in its first round.
    assert out.count("flipped byte refused") == 2 and "all goals met" in out
    assert "the slowest steps over 0.3 s, as the kernel saw them" in out
    rows = {row.split()[0]: row.split()[1:] for row in out.splitlines() if row.strip()}
    for figure in ("blocking_s", "slowest_step_s", "save_mb_s", "load_mb_s"):
        orbax, tinax = (float(v) for v in rows[figure][:2])
        assert orbax > 0 and tinax > 0, figure
    assert "rss_peak_mb" in rows
    # The variants tried on the accelerator run beside them, each saved and loaded.
    for variant in ("tinax zstd -1",):
        line = next(row for row in out.splitlines() if row.startswith(f"{variant}: "))
        assert float(line.split("load_mb_s ")[1].split(",")[0]) > 0, line
    assert "floors: device_get_mb_s" in out and "device_put_mb_s" in out
    for floor in ("cat", "dd_64m", "dd_8_parallel", "readinto_reused", "read_fresh"):
        assert f"{floor}_mb_s" in out, floor
    assert "fresh-process load (medians of 1): orbax" in out
    # Nothing is left behind where it wrote.
    assert list(tmp_path.iterdir()) == []


def test_the_donated_loop_reports_where_it_waited_and_resumes_after_a_kill_mid_save(
    tmp_path: Path,
) -> None:
    out = _smoke(
        tmp_path, "--donated", "--kill-check", "--fresh-rounds", "0", "--no-floors", "--diagnose"
    )
    # The killed job resumed from its newest committed checkpoint, the next step's loss
    # bit for bit the killed job's.
    assert "resumed from step" in out and "the newest committed" in out, out
    assert "bit-identical to the killed job's" in out and "FAILED" not in out
    assert "the third configuration (NNX states, donated)" in out
    rows = {row.split()[0]: row.split()[1:] for row in out.splitlines() if row.strip()}
    # The headline and where the loop waited, for both systems.
    for figure in ("step_lost_s", "dispatch_lost_s", "wait_lost_s", "step_s", "cores_busy"):
        assert figure in rows and float(rows[figure][0]) >= 0, figure
    assert float(rows["step_s"][1]) > 0
    assert "where the loop waited while each system's save ran" in out
    assert "tinax: " in out and "s dispatching (the GIL or a core)" in out
    assert "flipped byte refused" in out
    assert list(tmp_path.iterdir()) == []
