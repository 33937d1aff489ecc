"""Racing-writers campaign: two processes save one checkpoint at nearly the same moment.

Two writer processes (each with a training state of its own, ``--mib`` MiB) are told
to save to the same new destination at the same wall-clock moment, each shifted by a
random few milliseconds. Afterwards the destination is listed, loaded and taken
apart: every part (model, each Adam moment, the step count, RNG, auxiliary state,
iterator) names the writer it came from. Each trial ends as one of:

- ``one commit, loser refused``: one writer reported success, every part is its
  own, and the other was refused with ``FileExistsError`` (what should happen);
- ``one commit, loser failed otherwise``: as above, but the loser failed with some
  other error;
- ``mixed``: the committed checkpoint loads but holds parts of both writers (or of
  a writer that reported failure), or a success was reported for what was not
  committed;
- ``unloadable``: something committed that does not load;
- ``both failed``: nothing committed.

tinax and Orbax alone, side by side.

Usage: python bench/racing_writers.py [--trials 50] [--mib 128] [--sides tinax,orbax]
                                      [--spread-ms 20] [--dir DIR] [--seed 0]

Exits non-zero when tinax misses its goal: every trial one commit with the loser
refused, and no mixed checkpoint.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _campaign

import tinax.explore as ex
from tinax._format.naming import words

CLEAN = "one commit, loser refused"
OTHER_FAILURE = "one commit, loser failed otherwise"
MIXED = "mixed"
UNLOADABLE = "unloadable"
BOTH_FAILED = "both failed"
OUTCOMES = (CLEAN, OTHER_FAILURE, MIXED, UNLOADABLE, BOTH_FAILED)
SEEDS = (1, 2)


class Writer:
    """A writer process with its own training state."""

    def __init__(self, side: str, mib: float, seed: int) -> None:
        self.seed = seed
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--writer", side, str(mib), str(seed)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ready(self) -> None:
        line = self.readline()
        if json.loads(line).get("ready") != self.seed:
            raise RuntimeError(f"writer {self.seed} did not start: {line!r}")

    def readline(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"writer {self.seed} exited with {self.process.wait()}")
        return line

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def judge(side: str, path: Path, replies: dict[int, dict[str, Any]], nbytes: int) -> str:
    """How one trial ended (see the module docstring)."""
    winners = [seed for seed, reply in replies.items() if reply["ok"]]
    if not path.exists():
        return MIXED if winners else BOTH_FAILED
    try:
        loaded = _campaign.load(side, path, nbytes)
        found = set(_campaign.sources(loaded, list(SEEDS), nbytes).values())
    except Exception:
        return UNLOADABLE
    if len(found) != 1 or None in found or winners != [next(iter(found))]:
        return MIXED
    listing = ex.list_checkpoints(path, cache=None)
    if list(listing["status"]) != [words.COMPLETE]:
        return MIXED
    (loser,) = [seed for seed in SEEDS if seed not in winners]
    return CLEAN if replies[loser]["error"] == "FileExistsError" else OTHER_FAILURE


def _gist(message: str) -> str:
    """A refusal's message without the trial's path, so alike ones count together."""
    message = re.sub(r"'[^']*trial_\d+[^']*'", "'…'", message)
    return re.sub(r"pid \d+, since [^)]*", "pid …, since …", message)[:160]


def campaign(
    side: str, root: Path, trials: int, mib: float, spread: float, rng: random.Random
) -> tuple[collections.Counter[str], list[str]]:
    root.mkdir(parents=True)
    writers = {seed: Writer(side, mib, seed) for seed in SEEDS}
    outcomes: collections.Counter[str] = collections.Counter()
    refusals: list[str] = []
    try:
        for writer in writers.values():
            writer.ready()
        for trial in range(trials):
            path = root / f"trial_{trial:03d}"
            at = time.time() + 0.3
            for writer in writers.values():
                writer.send({"path": str(path), "at": at + rng.uniform(0, spread)})
            replies = {seed: json.loads(w.readline()) for seed, w in writers.items()}
            outcome = judge(side, path, replies, int(mib * _campaign.MIB))
            outcomes[outcome] += 1
            refusals += [r["message"] for r in replies.values() if r["error"]]
            for leftover in root.iterdir():
                if leftover.is_dir():
                    shutil.rmtree(leftover)
                else:
                    leftover.unlink()
    finally:
        for writer in writers.values():
            writer.close()
    return outcomes, refusals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--mib", type=float, default=128.0, help="size of each writer's save")
    parser.add_argument("--sides", default="tinax,orbax")
    parser.add_argument("--spread-ms", type=float, default=20.0, help="largest start offset")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--writer", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer:
        _campaign.quiet_logs()
        side, mib, seed = args.writer
        _campaign.writer(side, int(float(mib) * _campaign.MIB), int(seed))
        sys.stdout.flush()
        # A save that failed half-way can leave Orbax threads that hold up a normal exit.
        os._exit(0)
    _campaign.quiet_logs()
    sides = [s for s in args.sides.split(",") if s]
    assert set(sides) <= set(_campaign.SIDES), sides
    scratch = Path(tempfile.mkdtemp(prefix="tinax-race-", dir=args.dir))
    results = {}
    started = time.monotonic()
    try:
        for side in sides:
            results[side] = campaign(
                side,
                scratch / side,
                args.trials,
                args.mib,
                args.spread_ms / 1000,
                random.Random(args.seed),
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"racing writers: {args.trials} trials per side, two processes saving one "
        f"{args.mib:g} MiB checkpoint within {args.spread_ms:g} ms of each other "
        f"({time.monotonic() - started:.0f} s)"
    )
    print(f"{'':36}" + "".join(f"{side:>10}" for side in sides))
    for outcome in OUTCOMES:
        print(f"{outcome:36}" + "".join(f"{results[s][0][outcome]:>10}" for s in sides))
    for side in sides:
        told = collections.Counter(_gist(message) for message in results[side][1])
        for gist, times in told.most_common(4):
            print(f"{side} loser was told ({times}x): {gist}")
    print("RESULT " + json.dumps({s: dict(results[s][0]) for s in sides}))
    if "tinax" not in results:
        return 0
    tinax = results["tinax"][0]
    met = tinax[CLEAN] == args.trials and tinax[MIXED] == 0
    print("goals: " + ("all met" if met else "MISSED: every trial one commit, loser refused"))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
