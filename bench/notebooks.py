"""How long each notebook takes top to bottom, in a fresh kernel, on the demo run.

The notebooks are meant to run in seconds on a CPU (`make test` checks that they run;
this checks how fast). Each runs in a scratch copy of notebooks/ and demo/ beside a
demo run written first, as a reader's checkout would be.

Goal (exit status 1 if missed): every notebook under ``--budget`` seconds (60).

Usage: python bench/notebooks.py [--budget 60] [--dir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="tinax-notebooks-"))
    shutil.copytree(
        REPO / "notebooks", root / "notebooks", ignore=shutil.ignore_patterns(".ipynb*")
    )
    shutil.copytree(REPO / "demo", root / "demo", ignore=shutil.ignore_patterns("__pycache__"))
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, str(root / "demo" / "make_run.py"), str(root / "demo_run")],
        check=True,
        capture_output=True,
    )
    print(f"demo run written in {time.perf_counter() - started:.1f} s")
    missed = []
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(
            nb,
            timeout=600,
            kernel_name="python3",
            resources={"metadata": {"path": str(root / "notebooks")}},
        )
        started = time.perf_counter()
        client.execute()
        seconds = time.perf_counter() - started
        print(f"{path.name:32} {seconds:6.1f} s (goal < {args.budget:.0f} s)")
        if seconds >= args.budget:
            missed.append(path.name)
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    if missed:
        print("over budget:", ", ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
