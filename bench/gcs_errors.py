"""How fast a wrong gs:// location is reported: the tests check what is raised, this how soon.

Against the fake-gcs-server the tests use (tests/gcs.py), offline:

  wrong bucket   list, table, load and save of a bucket that does not exist;
  denied bucket  list and load of a bucket these credentials may not read;
  no answer      a listing against an endpoint that never answers, with the request
                 deadline set to 2 s (in a fresh interpreter).

Goals (exit status 1 if one is missed): each of the first two within 10 s in all;
the third within 10 s, that is the deadline and not a hang.

Usage: python bench/gcs_errors.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import numpy as np
from gcs import DENIED_BUCKET, Emulator, free_port

GOAL_SECONDS = 10.0


def _timed(calls: list, expected: type[BaseException]) -> float:
    started = time.perf_counter()
    for call in calls:
        try:
            call()
        except expected:
            continue
        raise SystemExit(f"{call} did not raise {expected.__name__}")
    return time.perf_counter() - started


def main() -> int:
    emulator = Emulator()
    emulator.start()
    try:
        os.environ.update(emulator.environment())
        import tinax.explore as ex
        from tinax.checkpointing import load_checkpointables, save_checkpointables

        wrong = "gs://no-such-bucket-here/run"
        denied = f"gs://{DENIED_BUCKET}/run"
        figures = {
            "wrong bucket": _timed(
                [
                    lambda: ex.list_checkpoints(wrong),
                    lambda: ex.checkpoint_table(f"{wrong}/1"),
                    lambda: load_checkpointables(f"{wrong}/1", {"model": {}}),
                    lambda: save_checkpointables(f"{wrong}/1", {"model": {"w": np.ones(2)}}),
                ],
                FileNotFoundError,
            ),
            "denied bucket": _timed(
                [
                    lambda: ex.list_checkpoints(denied),
                    lambda: load_checkpointables(f"{denied}/1", {"model": {}}),
                ],
                PermissionError,
            ),
        }
    finally:
        emulator.stop()
    script = textwrap.dedent(
        """
        import tinax._format.storage.gcs as gcs
        import tinax.explore as ex
        gcs.REQUEST_TIMEOUT = 2.0
        try:
            ex.list_checkpoints("gs://tinax-test/run")
        except TimeoutError:
            pass
        """
    )
    env = {**os.environ, "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{free_port()}"}
    prelude = "import tinax._format.storage.gcs, tinax.explore, gcsfs"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", prelude], env=env, check=True)
    imports = time.perf_counter() - started
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    figures["no answer"] = max(0.0, time.perf_counter() - started - imports)
    missed = []
    for what, seconds in figures.items():
        print(f"{what:>14}: {seconds:5.2f} s (goal < {GOAL_SECONDS:.0f} s)")
        if seconds >= GOAL_SECONDS:
            missed.append(what)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
