"""Peak memory of a training loop that saves back to back, and what the collector pause buys.

A save pauses Python's cycle collector while tinax and Orbax do their synchronous
work (building tens of objects per leaf), and only then: the training loop keeps
allocating while the save writes in the background, and its cyclic garbage must
still be collected. This bench checks both halves.

Peak RSS: one fresh process per side runs the same loop for ``--seconds``: each
step makes a few MiB of cyclic garbage (objects that refer to each other, as a
model's Python-side bookkeeping does) and a little jitted work; a save of the
state (``--leaves`` arrays) starts as soon as the previous one has committed.

  none        the loop alone, no saves;
  orbax       saves through Orbax V1 alone (``save_checkpointables_async``);
  tinax       saves through ``tinax.checkpointing.save_checkpointables``;
  tinax-held  the same, with the collector held off until each save ends (as a
              pause covering the whole background write would).

Save time: a checkpoint of ``--small-leaves`` small arrays saved with the pause as
it is (while the call runs), held until the save commits, and with no pause at all
(the collector left on), best of ``--rounds``.

Goal (exit status 1 if missed): tinax's peak RSS within 10% of Orbax alone's.

Usage: python bench/rss.py [--seconds 20] [--leaves 200] [--small-leaves 10000]
       [--rounds 3] [--dir DIR]
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
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

SIDES = ("none", "orbax", "tinax", "tinax-held")
GOAL = 1.10


class _Node:
    """One object of a cycle: garbage only the cycle collector can free."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.partner: _Node | None = None


def _cyclic_garbage(mib: float) -> None:
    count = int(mib * 1024 * 1024 / 1024)
    for _ in range(count // 2):
        a, b = _Node(bytes(512)), _Node(bytes(512))
        a.partner, b.partner = b, a


def _state(leaves: int) -> dict[str, Any]:
    import jax.numpy as jnp

    return {f"w{i:04d}": jnp.full((256, 64), float(i), jnp.float32) for i in range(leaves)}


def _loop(side: str, directory: Path, seconds: float, leaves: int) -> dict[str, float]:
    """Runs one side's training loop in this process; returns its figures."""
    import jax
    import jax.numpy as jnp

    state = _state(leaves)
    step_fn = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())
    x = jnp.ones((128, 128), jnp.float32)
    save = _saver(side)
    pending: Any = None
    saves = steps = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        _cyclic_garbage(4)
        step_fn(x).block_until_ready()
        steps += 1
        if save is not None and (pending is None or pending_done(pending)):
            if pending is not None:
                pending.result()
            pending = save(directory / f"step_{steps:07d}", state)
            saves += 1
    if pending is not None:
        pending.result()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_mib": peak_kib / 1024, "saves": saves, "steps": steps}


def pending_done(response: Any) -> bool:
    # tinax's SaveResponse and Orbax's AsyncResponse both end in a future or a thread;
    # a zero timeout asks without waiting.
    try:
        response.result(timeout=0)
    except TimeoutError:
        return False
    return True


def _saver(side: str) -> Any:
    if side == "none":
        return None
    if side == "orbax":
        from orbax.checkpoint import v1 as ocp

        return lambda path, state: ocp.save_checkpointables_async(path, {"params": state})
    from tinax._format.storage import files
    from tinax.checkpointing import save_checkpointables

    if side == "tinax":
        return lambda path, state: save_checkpointables(path, {"params": state})

    class Held:
        """The collector off from the start of a save until it ends."""

        def __init__(self, path: Path, state: Any) -> None:
            files.pause_gc()
            try:
                self.inner = save_checkpointables(path, {"params": state})
            except BaseException:
                files.resume_gc()
                raise
            self.held = True

        def result(self, timeout: float | None = None) -> None:
            self.inner.result(timeout)
            if self.held:
                self.held = False
                files.resume_gc()

    return Held


def _save_time(directory: Path, leaves: int, rounds: int, pause: str) -> float:
    import numpy as np

    from tinax._format.storage import files
    from tinax.checkpointing import save_checkpointables

    if pause == "none":
        files.pause_gc = lambda: None  # type: ignore[assignment]
        files.resume_gc = lambda: None  # type: ignore[assignment]
    state = {f"w{i:05d}": np.full((4,), i, np.float32) for i in range(leaves)}
    best = float("inf")
    for i in range(rounds):
        path = directory / f"small_{i}"
        started = time.perf_counter()
        if pause == "whole":
            with files.paused_gc():
                save_checkpointables(path, {"params": state}).result()
        else:
            save_checkpointables(path, {"params": state}).result()
        best = min(best, time.perf_counter() - started)
        shutil.rmtree(path)
    return best


def _child(args: argparse.Namespace) -> None:
    directory = Path(args.dir)
    if args.child == "save-time":
        figures = {"seconds": _save_time(directory, args.small_leaves, args.rounds, args.pause)}
    else:
        figures = _loop(args.child, directory, args.seconds, args.leaves)
    print(json.dumps(figures))


def _run_child(side: str, args: argparse.Namespace, directory: Path, *extra: str) -> dict:
    directory.mkdir(parents=True)
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            side,
            "--dir",
            str(directory),
            "--seconds",
            str(args.seconds),
            "--leaves",
            str(args.leaves),
            "--small-leaves",
            str(args.small_leaves),
            "--rounds",
            str(args.rounds),
            *extra,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"{side} failed:\n{done.stderr[-3000:]}")
    shutil.rmtree(directory, ignore_errors=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--leaves", type=int, default=200)
    parser.add_argument("--small-leaves", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--child", choices=[*SIDES, "save-time"], help=argparse.SUPPRESS)
    parser.add_argument("--pause", default="sync", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return 0

    base = Path(args.dir or tempfile.mkdtemp(prefix="tinax-rss-"))
    peaks = {side: _run_child(side, args, base / side) for side in SIDES}
    for side, figures in peaks.items():
        print(
            f"{side:>10}: peak RSS {figures['peak_mib']:7.1f} MiB, "
            f"{figures['saves']:4.0f} saves in {figures['steps']:5.0f} steps"
        )
    times = {
        pause: _run_child("save-time", args, base / pause, "--pause", pause)["seconds"]
        for pause in ("sync", "whole", "none")
    }
    ratio = peaks["tinax"]["peak_mib"] / peaks["orbax"]["peak_mib"]
    held = peaks["tinax-held"]["peak_mib"] / peaks["orbax"]["peak_mib"]
    print(
        f"peak RSS tinax/orbax {ratio:.2f} (goal <= {GOAL:.2f}), with the collector held "
        f"through each save {held:.2f}; save of {args.small_leaves} leaves "
        f"{times['sync']:.2f} s paused while the call runs, {times['whole']:.2f} s paused "
        f"until it commits, {times['none']:.2f} s without a pause"
    )
    if args.dir is None:
        shutil.rmtree(base, ignore_errors=True)
    return 0 if ratio <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
