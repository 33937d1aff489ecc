"""Pod campaign: a job of several processes, each with a local directory of its own
(as on the hosts of a pod slice), killed at random moments, of one process or of all,
then resumed.

Each trial launches the job (tests/pod_worker.py, phase ``loop``: a ``TrainingRun``
with ``local=`` a directory per process, saving every step locally, every 10th
promoted to the durable tier, a path or the emulator's ``gs://``). The job resumes,
reports what it restored, trains, and is killed ``after`` 1-30 steps past the step it
restored: every process, or one random process (alternately, every process first),
SIGKILLed at that step
or when its promotion of the next promoted step starts sending its part (at random).
When one process is killed, every other must end on its own with one error naming it
(``ProcessTimeoutError``), within the run's timeout of its next save; except when it
is process 0, whose death takes JAX's coordination service with it: JAX then ends
every other process at once (SIGABRT, its log naming the leader). The launcher kills
nothing unless a job outlives ``HANG`` seconds.

Between trials the launcher finds, from the directories alone, the newest step every
process holds intact (in every local directory, or in the durable tier), and loads
every checkpoint the durable tier lists complete on one process, checking it bit for
bit. The next trial's job must restore that newest step on every process, bit for
bit, with the batch after it of each process's stream.

Counted: kills (of one, of all, in a promotion); survivors that ended with the one
error naming the killed process (or, process 0 killed, ended by JAX), and the slowest
survivor's exit after the kill; jobs that hung; resumes refused; resumes not of the
same step everywhere, not of the newest step every process holds, not bit for bit, or
whose next batch is not the stream's; kills that left something unfinished (a
directory named for a step that holds no committed checkpoint: a save's or a
promotion's), and restarted jobs in which any such thing was still there (in the
durable tier once the run had opened, in a local directory once it had restored);
checkpoints listed complete in the durable tier that do not load bit for bit.

Usage: python bench/pod_campaign.py [--kills 50] [--processes 2] [--durable path|gs]
                                    [--timeout 10] [--dir DIR] [--seed 0]

Prints ``RESULT {json}`` and exits non-zero when a goal is missed: every survivor ends
with one error naming the killed process, no job hangs, no resume is refused, every
resume restores the newest step every process holds, bit for bit, with the stream's
next batch, leaving nothing the killed job left, and every durable checkpoint listed
complete loads bit for bit.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import pod_worker

# Seconds a job may live before the launcher calls it hung.
HANG = 300


def _complete(directory: str) -> dict[int, Any]:
    """The complete, sound checkpoints of one tier's directory (a path or ``gs://``),
    by step: that directory's alone, not the other tier's."""
    from tinax._format.integrity import preflight
    from tinax._paths import location
    from tinax.checkpointing import _run_files

    where = location(directory)
    if where.is_local and not Path(directory).is_dir():
        return {}
    found = {}
    for step, checkpoint in _run_files.complete_checkpoints(where).items():
        try:
            preflight.check(checkpoint)
        except (ValueError, OSError):
            continue
        found[step] = checkpoint
    return found


def newest_shared(root: Path, durable: str, processes: int) -> int | None:
    """The newest step every process holds intact: in every local directory, or in the
    durable tier."""
    local = set.intersection(*(set(_complete(str(root / f"host{i}"))) for i in range(processes)))
    return max(local | set(_complete(durable)), default=None)


def durable_exact(durable: str) -> tuple[int, int]:
    """How many checkpoints the durable tier holds complete, and how many of them do not
    load bit for bit on this process."""
    import jax
    import numpy as np

    from tinax.checkpointing import load_checkpointables

    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    targets = {
        k: jax.ShapeDtypeStruct(v, np.float32, sharding=one) for k, v in pod_worker.SHAPES.items()
    }
    complete = sorted(_complete(durable).items())
    wrong = 0
    for step, path in complete:
        try:
            model = load_checkpointables(str(path), {"model": targets})["model"]
        except (ValueError, OSError):
            wrong += 1
            continue
        wrong += not all(
            np.array_equal(np.asarray(model[k]), pod_worker.expected(k, v, step))
            for k, v in pod_worker.SHAPES.items()
        )
    return len(complete), wrong


def campaign(
    kills: int, processes: int, durable_kind: str, timeout: float, directory: str | None, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix="tinax-pod-campaign-", dir=directory))
    emulator = None
    if durable_kind == "gs":
        import os

        from gcs import Emulator

        emulator = Emulator()
        emulator.start()
        os.environ.update(emulator.environment())
        emulator.create_bucket("tinax-pod-campaign")
        durable = f"gs://tinax-pod-campaign/{uuid.uuid4().hex[:8]}"
    else:
        durable = str(root / "durable")
    counts: collections.Counter[str] = collections.Counter()
    slowest_exit = 0.0
    try:
        for trial in range(kills + 1):
            expected = newest_shared(root, durable, processes) if trial else None
            options: dict[str, Any] = {"timeout": timeout}
            last = trial == kills
            if not last:
                everyone = trial % 2 == 0
                killed = list(range(processes)) if everyone else [rng.randrange(processes)]
                options |= {"kill": killed, "after": rng.randint(1, 30)}
                if rng.random() < 0.5:
                    options["where"] = "promotion"
            job = pod_worker.launch(
                "loop" if not last else "resume",
                root,
                durable,
                processes,
                options,
                timeout=HANG,
                heartbeat=HANG,
            )
            if job.timed_out:
                counts["hung"] += 1
                continue
            found = [
                [r for r in job.results(i) if r["step"] in ("started", "resume")]
                for i in range(processes)
            ]
            if not all(found):
                counts["refused"] += 1
                print(job, file=sys.stderr)
                continue
            starts = [reports[0] for reports in found]
            counts["resumes"] += trial > 0
            steps = {s["restored"] for s in starts}
            if len(steps) != 1:
                counts["not_same_step"] += 1
            elif trial and steps != {expected}:
                counts["not_newest"] += 1
                print(f"trial {trial}: resumed {steps}, expected {expected}", file=sys.stderr)
            if any(s["restored"] is not None and not s["exact"] for s in starts):
                counts["not_exact"] += 1
            left = [name for s in starts for name in s["left"]]
            if trial and left:
                counts["left_after_restart"] += 1
                print(f"trial {trial}: the restarted job left {left}", file=sys.stderr)
            for i, s in enumerate(starts):
                if s["restored"] is not None and s["next"] != pod_worker.batches_after(
                    s["restored"], i, processes
                ):
                    counts["wrong_next_batch"] += 1
            if last:
                break
            counts["kills"] += 1
            counts["kills_of_all" if len(killed) == processes else "kills_of_one"] += 1
            kill_reports = [r for i in killed for r in job.results(i) if r["step"] == "killed"]
            if not kill_reports:
                counts["ended_before_kill"] += 1  # preempted or finished: nothing was killed
                print(f"trial {trial}: nothing killed:\n{job}", file=sys.stderr)
                continue
            counts["in_promotion"] += options.get("where") == "promotion"
            dirs = [durable, *(root / f"host{i}" for i in range(processes))]
            counts["kills_leaving_unfinished"] += any(pod_worker.unfinished(d) for d in dirs)
            if len(killed) == 1:
                kill_time = min(r["time"] for r in kill_reports) - job.launched
                for i in range(processes):
                    if i in killed:
                        continue
                    lost = [r for r in job.results(i) if r["step"] == "lost"]
                    if killed == [0] and job.returncodes[i] == -6:
                        # The coordination service lives in process 0: with it gone,
                        # JAX ends every other process at once, naming the leader.
                        counts["survivors_ended_by_jax"] += 1
                    elif (
                        job.returncodes[i] == 1
                        and len(lost) == 1
                        and lost[0]["missing"] == killed
                        and lost[0]["message"].startswith(f"process {killed[0]} of {processes}")
                    ):
                        counts["survivors_named_it"] += 1
                    else:
                        counts["survivors_otherwise"] += 1
                        print(
                            f"trial {trial}: process {i} ended otherwise:\n{job}", file=sys.stderr
                        )
                    slowest_exit = max(slowest_exit, job.ended[i] - kill_time)
            listed, wrong = durable_exact(durable)
            counts["durable_listed_complete"] += listed
            counts["durable_not_exact"] += wrong
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if emulator is not None:
            emulator.stop()
    return {**counts, "slowest_survivor_exit_s": round(slowest_exit, 1), "timeout_s": timeout}


def missed(found: dict[str, Any]) -> list[str]:
    goals = []
    for key in (
        "hung",
        "refused",
        "survivors_otherwise",
        "not_same_step",
        "not_newest",
        "not_exact",
        "wrong_next_batch",
        "left_after_restart",
        "durable_not_exact",
    ):
        if found.get(key):
            goals.append(f"{key}: {found[key]}")
    return goals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--durable", choices=("path", "gs"), default="path")
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    found = campaign(args.kills, args.processes, args.durable, args.timeout, args.dir, args.seed)
    print("RESULT " + json.dumps(found, sort_keys=True))
    goals = missed(found)
    for goal in goals:
        print(f"GOAL MISSED: {goal}")
    raise SystemExit(1 if goals else 0)


if __name__ == "__main__":
    main()
