"""Two-tier runs: what a local tier costs the training loop, and what a promotion and a
resume take, side by side in one run.

1. **Blocking.** The time a ``run.save`` call blocks the loop: a two-tier run
   (``TrainingRun(BUCKET, local=LOCAL_DIR, local_every=10, save_every=20)``, promoting
   every other save in the background) beside a plain local save
   (``TrainingRun(DIR, save_every=10)`` on the same disk), each saving in blocks of
   its own with ``--train-s`` seconds of training before each save (2 by default:
   about what a promotion of 64 MiB to the emulator takes on a shared 2-core
   machine), the blocks taking turns, each run advancing an iterator of its own as a
   loop does. Goal: at most 1.1 times the plain save's median. A third run, the
   two-tier one again waiting for its promotions before each timed save, shows the
   save path alone (reported): what is left between the two is a promotion's work
   going on beside the save, on a machine that also runs the bucket (section 3 says
   how much processor time a promotion takes on each side).
2. **Loop overhead.** A training loop of jitted steps, saving with the two-tier run at
   every step (it saves locally every 10 and promotes every 50), beside the same loop
   without checkpoints and with a run of one tier saving to the bucket every 10 steps:
   the overhead of the local tier on the loop's own time (reported).
3. **Promotion.** A committed local checkpoint promoted to ``gs://`` (the tests'
   fake-gcs-server behind its proxy, holding every request ``--latency`` seconds, 30 ms
   by default) beside gcsfs's ``put`` of the same files: MB/s. Goal: at least 0.8 times
   ``put``'s speed. The processor seconds a promotion takes, in this process and in
   the emulator with its proxy, are reported.
4. **Resume.** The time from a SIGKILL of a two-tier job to the first step of the job
   started after it: with the local tier there, and on a new machine (the local tier
   gone: from the bucket); a fresh interpreter each time (imports included), and the
   restore alone.

Usage: python bench/two_tier.py [--mib 64] [--rounds 5] [--latency 0.03] [--train-s 2]
                             [--loop-steps 100] [--dir DIR]

Exits non-zero when a goal is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import _campaign

MIB = 1 << 20
BLOCKING_GOAL = 1.1
# Saves timed in a row by one run before the other takes its turn.
_BLOCK = 4
PROMOTION_GOAL = 0.8
# The two-tier run that waits for its promotions before each timed save.
SETTLED = "two-tier, promotions ended"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _training_step(size: int = 512) -> Any:
    """A jitted step that keeps the CPU busy as a small model's step would."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def step(x: Any) -> Any:
        for _ in range(4):
            x = jnp.tanh(x @ x.T) / size
        return x

    x = jnp.ones((size, size), jnp.float32)
    step(x).block_until_ready()
    return lambda: step(x).block_until_ready()


def _train_for(seconds: float, step: Any) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        step()


# -- 1. blocking ------------------------------------------------------------------------------


def blocking(
    scratch: Path, bucket: str, nbytes: int, rounds: int, train_s: float
) -> dict[str, float]:
    from tinax.checkpointing import TrainingRun

    step = _training_step()
    state = _campaign.live_state(1, nbytes)
    plain = TrainingRun(scratch / "plain", save_every=10, keep=2, handle_sigterm=False)

    def two_tier(name: str) -> Any:
        return TrainingRun(
            f"gs://{bucket}/{name}-{uuid.uuid4().hex[:8]}",
            save_every=20,
            keep=2,
            local=scratch / f"{name}-local",
            local_every=10,
            local_keep=2,
            handle_sigterm=False,
        )

    runs = {"plain": plain, "two-tier": two_tier("blocking"), SETTLED: two_tier("settled")}
    times: dict[str, list[float]] = {name: [] for name in runs}
    # Each run saves in blocks of its own (``train_s`` of training before each save, in
    # which its last save and promotion go on), and each block ends with all of its
    # background work done: one run's promotions never slow another's saves. The
    # blocks take turns; the first save of each run is not timed. The third run is the
    # two-tier one again, but waits for its promotions before each timed save: the
    # save path alone, without a promotion's work beside it on the machine.
    # Each run has its iterator, as a training loop does, and takes a batch from it
    # before each save: the save call is timed, not the making of an iterator.
    saved = dict.fromkeys(runs, 0)
    iterators = {name: _campaign.iterator_at(0) for name in runs}
    for i in range(rounds):
        order = list(runs.items())
        order = order[i % len(order) :] + order[: i % len(order)]
        for name, run in order:
            for _ in range(_BLOCK):
                _train_for(train_s, step)
                next(iterators[name])
                if name == SETTLED:
                    run.wait()
                saved[name] += 1
                started = time.perf_counter()
                run.save(
                    10 * saved[name],
                    state["model"],
                    state["optimizer"],
                    state["rng"],
                    state["auxiliary"],
                    iterators[name],
                )
                if saved[name] > 1:
                    times[name].append(time.perf_counter() - started)
            run.wait()
    for run in runs.values():
        run.close()
    assert runs["two-tier"].durable_steps, "the two-tier run promoted nothing"
    _log("save call blocks: " + json.dumps({k: [round(t, 3) for t in v] for k, v in times.items()}))
    return {name: statistics.median(values) for name, values in times.items()}


# -- 2. loop overhead -------------------------------------------------------------------------


def overhead(scratch: Path, bucket: str, nbytes: int, steps: int) -> dict[str, float]:
    """Seconds a loop of ``steps`` takes: without checkpoints, with the two-tier run, and
    with a run of one tier saving to the bucket as often as the local tier does. The
    time is the loop's own: the background work still in flight when it ends (waited
    for by ``close``) is not counted."""
    from tinax.checkpointing import TrainingRun

    step = _training_step(1024)
    state = _campaign.live_state(2, nbytes)
    iterator = _campaign.iterator_at(0)

    def loop(run: Any) -> float:
        started = time.perf_counter()
        for i in range(1, steps + 1):
            step()
            next(iterator)
            if run is not None:
                run.save(
                    i,
                    state["model"],
                    state["optimizer"],
                    state["rng"],
                    state["auxiliary"],
                    iterator,
                )
        took = time.perf_counter() - started
        if run is not None:
            run.close()
        return took

    loop(None)  # compiled and warm
    found = {"none": loop(None)}
    found["two-tier"] = loop(
        TrainingRun(
            f"gs://{bucket}/loop-{uuid.uuid4().hex[:8]}",
            save_every=50,
            keep=2,
            local=scratch / "loop-local",
            local_every=10,
            local_keep=2,
            handle_sigterm=False,
        )
    )
    found["bucket every 10"] = loop(
        TrainingRun(
            f"gs://{bucket}/loop-{uuid.uuid4().hex[:8]}",
            save_every=10,
            keep=2,
            handle_sigterm=False,
        )
    )
    return found


# -- 3. promotion -------------------------------------------------------------------------------


def promotion(
    scratch: Path, bucket: str, nbytes: int, rounds: int, emulator: Any
) -> dict[str, float]:
    """MB/s of a promotion and of gcsfs's ``put`` of the same files; and the processor
    seconds a promotion takes, in this process and in the emulator with its proxy."""
    from tinax._format.storage import gcs
    from tinax._format.storage import location as storage
    from tinax._paths import location
    from tinax.checkpointing import _promotion, save_training_checkpoint

    state = _campaign.live_state(3, nbytes)
    source = scratch / "promoted" / "step_000003"
    source.parent.mkdir()
    save_training_checkpoint(
        source,
        3,
        state["model"],
        state["optimizer"],
        state["rng"],
        state["auxiliary"],
        state["iterator"],
    ).result()
    size = storage.tree_bytes(storage.local(source))
    fs = gcs.GCS.filesystem()
    times: dict[str, list[float]] = {"tinax": [], "put": []}
    cpu: dict[str, list[float]] = {"client": [], "bucket": []}
    for i in range(rounds + 1):
        order = ["tinax", "put"] if i % 2 == 0 else ["put", "tinax"]
        for name in order:
            target = f"{bucket}/{name}-{i}/step_000003"
            used = (time.process_time(), emulator.cpu_seconds())
            started = time.perf_counter()
            if name == "tinax":
                _promotion.promote(storage.local(source), location(f"gs://{target}"))
            else:
                fs.put(str(source) + "/", target, recursive=True)
            if i:  # the first round warms both up
                times[name].append(time.perf_counter() - started)
                if name == "tinax":
                    cpu["client"].append(time.process_time() - used[0])
                    cpu["bucket"].append(emulator.cpu_seconds() - used[1])
    speeds = {name: size / statistics.median(values) / 1e6 for name, values in times.items()}
    speeds.update({f"cpu_{name}_s": statistics.median(values) for name, values in cpu.items()})
    return speeds


# -- 4. from a kill to the first resumed step ---------------------------------------------------


def _job(durable: str, local: Path, nbytes: int, steps: int) -> subprocess.Popen[str]:
    argv = [sys.executable, __file__, "--job", durable, str(local), str(nbytes), str(steps)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _line(job: subprocess.Popen[str], prefix: str) -> str:
    assert job.stdout is not None
    for line in job.stdout:
        if line.startswith(prefix):
            return line
    raise RuntimeError(f"the job ended (status {job.wait()}) before printing {prefix!r}")


def job(durable: str, local: str, nbytes: str, steps: str) -> None:
    """A two-tier training job: restore, then train; with ``steps``, stop after them,
    else after the first step (``first step`` printed) wait to be killed."""
    _campaign.quiet_logs()
    started = time.perf_counter()
    from tinax.checkpointing import TrainingRun, abstract_restore_target

    size = int(nbytes)
    shapes = _campaign.live_state(0, size)
    run = TrainingRun(
        durable, save_every=10, keep=2, local=local, local_every=5, handle_sigterm=False
    )
    targets = [abstract_restore_target(shapes[k]) for k in ("model", "optimizer", "rng")]
    iterator = iter(_campaign.dataset())
    restoring = time.perf_counter()
    # The state's bits are random: NaN among them is no divergence.
    restored = run.restore(*targets, {"seed": 0, "loss": 0.0}, iterator, allow_diverged=True)
    restore_seconds = time.perf_counter() - restoring
    begin = 0 if restored is None else restored.step
    step = _training_step()
    last = begin + int(steps) if int(steps) else begin + 1
    for i in range(begin + 1, last + 1):
        step()
        next(iterator)
        state = _campaign.live_state(i, size)
        run.save(i, state["model"], state["optimizer"], state["rng"], state["auxiliary"], iterator)
        if not int(steps):
            print(
                "first step "
                + json.dumps(
                    {
                        "restored": begin,
                        "restore_s": restore_seconds,
                        "in_process_s": time.perf_counter() - started,
                    }
                ),
                flush=True,
            )
            while True:
                time.sleep(60)
    run.close()
    print("done", flush=True)


def resume(scratch: Path, bucket: str, nbytes: int, rounds: int) -> dict[str, dict[str, float]]:
    durable = f"gs://{bucket}/resume-{uuid.uuid4().hex[:8]}"
    local = scratch / "resume-local"
    prepared = _job(durable, local, nbytes, 20)
    _line(prepared, "done")
    prepared.wait()
    found: dict[str, dict[str, list[float]]] = {}
    running: subprocess.Popen[str] | None = None
    for i in range(rounds):
        for case in ("local", "durable") if i % 2 == 0 else ("durable", "local"):
            where = local
            if case == "durable":
                # A new machine: an empty local directory of its own.
                where = scratch / f"new-machine-{i}"
            if running is not None:
                killed = time.perf_counter()
                running.send_signal(signal.SIGKILL)
                running.wait()
            else:
                killed = time.perf_counter()
            running = _job(durable, where, nbytes, 0)
            report = json.loads(_line(running, "first step ")[len("first step ") :])
            assert report["restored"] == 20, report
            seen = found.setdefault(case, {"total_s": [], "restore_s": []})
            seen["total_s"].append(time.perf_counter() - killed)
            seen["restore_s"].append(report["restore_s"])
    if running is not None:
        running.send_signal(signal.SIGKILL)
        running.wait()
    return {
        case: {k: statistics.median(v) for k, v in values.items()} for case, values in found.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=64.0, help="size of the training state")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency", type=float, default=0.03, help="seconds a request waits")
    parser.add_argument("--loop-steps", type=int, default=100)
    parser.add_argument(
        "--train-s",
        type=float,
        default=2.0,
        help="seconds of training between two saves when timing how long a save blocks",
    )
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--job", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        job(*args.job)
        return 0
    _campaign.quiet_logs()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from gcs import Emulator

    emulator = Emulator(latency_s=args.latency)
    emulator.start()
    os.environ.update(emulator.environment())
    bucket = "tinax-two-tier-bench"
    emulator.create_bucket(bucket)
    scratch = Path(tempfile.mkdtemp(prefix="tinax-two-tier-bench-", dir=args.dir))
    nbytes = int(args.mib * MIB)
    try:
        _log(f"blocking: {args.rounds} saves each")
        blocked = blocking(scratch, bucket, nbytes, args.rounds, args.train_s)
        _log(f"loop overhead: {args.loop_steps} steps")
        loop = overhead(scratch, bucket, nbytes, args.loop_steps)
        _log(f"promotion: {args.rounds} rounds")
        speeds = promotion(scratch, bucket, nbytes, args.rounds, emulator)
        _log(f"resume: {args.rounds} kills each")
        resumed = resume(scratch, bucket, nbytes, args.rounds)
    finally:
        emulator.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    blocking_ratio = blocked["two-tier"] / blocked["plain"]
    promotion_ratio = speeds["tinax"] / speeds["put"]
    print(
        f"two-tier runs: {args.mib:g} MiB of state, gs:// at {args.latency * 1000:g} ms a "
        f"request (fake-gcs-server), medians of {args.rounds} rounds"
    )
    rows = [
        (
            "save call blocks",
            f"{blocked['plain']:.3f} s (plain local save)",
            f"{blocked['two-tier']:.3f} s (local tier)",
            f"{blocking_ratio:.2f}x",
            f"<= {BLOCKING_GOAL}x",
        ),
        (
            "  promotions ended first",
            f"{blocked['plain']:.3f} s (plain local save)",
            f"{blocked[SETTLED]:.3f} s (local tier)",
            f"{blocked[SETTLED] / blocked['plain']:.2f}x",
            "(reported)",
        ),
        (
            f"loop of {args.loop_steps} steps",
            f"{loop['none']:.2f} s (no checkpoints)",
            f"{loop['two-tier']:.2f} s (local every 10)",
            f"+{(loop['two-tier'] / loop['none'] - 1) * 100:.1f}%",
            "(reported)",
        ),
        (
            "",
            f"{loop['bucket every 10']:.2f} s (gs:// every 10)",
            f"{loop['two-tier']:.2f} s (local every 10)",
            f"{loop['two-tier'] / loop['bucket every 10']:.2f}x",
            "(reported)",
        ),
        (
            "promotion to gs://",
            f"{speeds['put']:.0f} MB/s (gcsfs put)",
            f"{speeds['tinax']:.0f} MB/s (tinax)",
            f"{promotion_ratio:.2f}x",
            f">= {PROMOTION_GOAL}x",
        ),
        (
            "  processor a promotion takes",
            f"{speeds['cpu_bucket_s']:.2f} s (emulator, proxy)",
            f"{speeds['cpu_client_s']:.2f} s (this process)",
            "",
            "(reported)",
        ),
        (
            "kill -> first resumed step",
            f"{resumed['durable']['total_s']:.2f} s (durable)",
            f"{resumed['local']['total_s']:.2f} s (local)",
            f"{resumed['local']['total_s'] / resumed['durable']['total_s']:.2f}x",
            "(reported)",
        ),
        (
            "  of it the restore",
            f"{resumed['durable']['restore_s']:.2f} s (durable)",
            f"{resumed['local']['restore_s']:.2f} s (local)",
            f"{resumed['local']['restore_s'] / resumed['durable']['restore_s']:.2f}x",
            "(reported)",
        ),
    ]
    widths = [max(len(row[c]) for row in rows) for c in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(widths[c]) for c, cell in enumerate(row)))
    result = {
        "blocking_s": blocked,
        "loop_s": loop,
        "promotion_mb_s": speeds,
        "resume_s": resumed,
        "blocking_ratio": blocking_ratio,
        "promotion_ratio": promotion_ratio,
    }
    print("RESULT " + json.dumps(result))
    missed = []
    if blocking_ratio > BLOCKING_GOAL:
        missed.append(f"blocking {blocking_ratio:.2f}x > {BLOCKING_GOAL}x")
    if promotion_ratio < PROMOTION_GOAL:
        missed.append(f"promotion {promotion_ratio:.2f}x < {PROMOTION_GOAL}x")
    print("goals: " + ("all met" if not missed else "MISSED: " + "; ".join(missed)))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
