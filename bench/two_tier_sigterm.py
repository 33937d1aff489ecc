"""Two-tier SIGTERM campaign: preempt a training job with a local and a durable tier at
random moments, and check that the preemption step is durable whenever the job says so.

Each trial starts a training job in a child process: a two-tier ``TrainingRun``
(``save_every`` far beyond the run, so only a preemption promotes; a local save at
every step) on a Grain iterator, its loop ending ``if run.preempted: break``, as a
user's script is written. Once the job says it trains, the parent sends it SIGTERM
after a random delay (uniform over ``--window`` seconds: the signal lands in local
saves, in the wait for the one before, in promotions and between steps), with
``logging.basicConfig(level=logging.DEBUG)`` in every other job (its log calls once
moved the moment enough to lose the save). The durable tier is the fake-gcs-server
(``--latency`` seconds a request) in every other trial, a directory in the rest.

After the job has exited the parent lists the durable tier and loads the step the job
said it was preempted at, bit for bit, with the batch after it.

Counted: jobs that did not exit 0; jobs that never said preempted; jobs preempted at a
step the durable tier does not hold as complete; preemption steps that do not load bit
for bit.

Usage: python bench/two_tier_sigterm.py [--trials 40] [--mib 4] [--window 0.3 3.0]
                                        [--latency 0.03] [--seed 0]

Exits non-zero when a goal is missed: every job exits 0 preempted, with its step
durable and loading bit for bit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _campaign
import numpy as np

_BATCH = 32
_TIMEOUT_S = 300.0


def _exact(loaded: Any, step: int, nbytes: int) -> bool:
    host = _campaign.host_state(step, nbytes)
    adam = loaded.optimizer[0]
    same = _campaign._same_bits
    return (
        loaded.step == step
        and all(same(loaded.model[k], v) for k, v in host["model"].items())
        and all(same(adam.mu[k], v) for k, v in host["mu"].items())
        and same(loaded.rng, host["rng"])
        and int(np.asarray(next(loaded.iterator))[0]) == step * _BATCH
    )


def _child(durable: str, local: str, mib: str, debug: str) -> None:
    """The training job: a two-tier run saving locally at every step until preempted."""
    if debug == "1":
        logging.basicConfig(level=logging.DEBUG)
    else:
        _campaign.quiet_logs()
    from tinax.checkpointing import TrainingRun

    nbytes = int(float(mib) * _campaign.MIB)
    iterator = iter(_campaign.dataset())
    with TrainingRun(
        durable, save_every=100_000, keep=2, local=local, local_every=1, local_keep=2
    ) as run:
        print("training", flush=True)
        step = 0
        while True:
            step += 1
            next(iterator)
            state = _campaign.live_state(step, nbytes)
            run.save(
                step, state["model"], state["optimizer"], state["rng"], state["auxiliary"], iterator
            )
            if run.preempted:
                print(json.dumps({"preempted": step}), flush=True)
                break


def _trial(root: Path, durable: str, mib: float, delay: float, debug: bool) -> dict[str, Any]:
    child = subprocess.Popen(
        [
            *(sys.executable, __file__, "--child", durable, str(root / "local")),
            *(str(mib), "1" if debug else "0"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_campaign.child_env(),
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    if line.strip() != "training":
        child.kill()
        return {"code": child.wait(), "said": line, "stderr": child.stderr.read()[-2000:]}  # type: ignore[union-attr]
    time.sleep(delay)
    child.send_signal(signal.SIGTERM)
    try:
        out, err = child.communicate(timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
    said = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    return {
        "code": child.returncode,
        "preempted": said[-1]["preempted"] if said else None,
        "stderr": err[-2000:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--mib", type=float, default=4.0)
    parser.add_argument("--window", type=float, nargs=2, default=(0.3, 3.0))
    parser.add_argument("--latency", type=float, default=0.03)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--durable", choices=("both", "gs", "path"), default="both")
    options = parser.parse_args()
    rng = random.Random(options.seed)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    emulator = None
    if options.durable != "path":
        from gcs import Emulator

        emulator = Emulator(latency_s=options.latency)
        emulator.start()
        os.environ.update(emulator.environment())
        emulator.create_bucket("tinax-sigterm")
    from tinax.checkpointing import abstract_restore_target, load_training_checkpoint
    from tinax.explore import list_checkpoints

    counts = {
        "trials": 0,
        "debug logging": 0,
        "on gs://": 0,
        "exited 0": 0,
        "not exit 0": 0,
        "never said preempted": 0,
        "preemption step not durable": 0,
        "preemption step not bit for bit": 0,
    }
    misses: list[str] = []
    started = time.monotonic()
    shapes = _campaign.live_state(0, int(options.mib * _campaign.MIB))
    targets = [abstract_restore_target(shapes[k]) for k in ("model", "optimizer", "rng")]
    try:
        with tempfile.TemporaryDirectory(prefix="tinax-sigterm-") as scratch:
            for trial in range(options.trials):
                root = Path(scratch, f"t{trial}")
                root.mkdir()
                on_gs = options.durable == "gs" or (options.durable == "both" and trial % 2)
                durable = (
                    f"gs://tinax-sigterm/{uuid.uuid4().hex[:12]}" if on_gs else str(root / "d")
                )
                debug = trial % 4 in (2, 3)
                delay = rng.uniform(*options.window)
                result = _trial(root, durable, options.mib, delay, debug)
                counts["trials"] += 1
                counts["debug logging"] += debug
                counts["on gs://"] += bool(on_gs)
                what = f"trial {trial} ({durable}, SIGTERM after {delay:.2f} s)"
                if result["code"] != 0:
                    counts["not exit 0"] += 1
                    misses.append(f"{what}: exit {result['code']}: {result['stderr']}")
                    continue
                counts["exited 0"] += 1
                step = result.get("preempted")
                if step is None:
                    counts["never said preempted"] += 1
                    misses.append(f"{what}: exited 0 without saying preempted")
                    continue
                table = list_checkpoints(durable, cache=None)
                complete = {int(s) for s in table.loc[table["status"] == "complete", "step"]}
                if step not in complete:
                    counts["preemption step not durable"] += 1
                    misses.append(f"{what}: preempted at {step}, durable holds {sorted(complete)}")
                    continue
                path = table.loc[table["step"] == step, "path"].iloc[0]
                loaded = load_training_checkpoint(
                    path, *targets, {"seed": 0, "loss": 0.0}, iter(_campaign.dataset())
                )
                if not _exact(loaded, step, int(options.mib * _campaign.MIB)):
                    counts["preemption step not bit for bit"] += 1
                    misses.append(f"{what}: step {step} loads other values")
    finally:
        if emulator is not None:
            emulator.stop()
    print(
        f"two-tier SIGTERM campaign: {counts['trials']} jobs preempted at random moments "
        f"({time.monotonic() - started:.0f} s)"
    )
    for key, value in counts.items():
        print(f"  {key:<34} {value}")
    for miss in misses:
        print("MISS", miss)
    print("RESULT " + json.dumps({"tinax": counts}))
    failed = sum(
        counts[k]
        for k in (
            "not exit 0",
            "never said preempted",
            "preemption step not durable",
            "preemption step not bit for bit",
        )
    )
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if sys.argv[1:2] == ["--child"]:
        _child(*sys.argv[2:6])
        sys.exit(0)
    sys.exit(main())
