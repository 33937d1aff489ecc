"""Two-tier campaign: kill a training job with a local and a durable tier at random
moments (local saves and promotions included), then resume.

Each trial starts a training job in a child process. The job opens a two-tier
``TrainingRun`` (a local directory, and a durable one: a fake-gcs-server bucket
answering each request after ``--latency`` seconds, or a directory with ``--durable
path``), says whether anything a killed promotion left was still in the durable tier
once the run had opened, resumes (``run.restore``), then trains step after step on one
Grain iterator, saving every step to the local tier and promoting every
``SAVE_EVERY``-th. It is killed with SIGKILL at a random moment: uniformly within the
time it takes to train ``2 * SAVE_EVERY`` steps (every other kill), or within the
time a promotion takes from the moment the next one starts (the others), both measured
first: kills land in local saves, in promotions and between them. The job tells the
parent when each promotion starts and ends, so that the kills that landed in a
promotion are counted.

Before each restart the parent lists the run (both tiers, one listing) and loads every
checkpoint listed ``complete``, in each tier where it has a copy, checking it bit for
bit and that its iterator gives the batch after its step. The restarted job must then
resume from the newest of them, and its first batch must be the next one of the
stream.

Counted: resumes refused; checkpoints listed complete that do not load bit for bit;
resumes not from the newest sound step; resumes whose next batch is not the stream's;
runs that opened with a half-copied promotion still in the durable tier, or with a
local checkpoint still waiting for a promotion that the durable tier holds or has gone
past (a kill between a promotion's commit and the run's record of it).

Usage: python bench/two_tier_campaign.py [--kills 100] [--mib 8] [--durable gs|path]
                                         [--latency 0.03] [--dir DIR] [--seed 0]

Exits non-zero when a goal is missed: no resume refused, everything listed complete
loads bit for bit, every resume from the newest sound step with the stream's next
batch, nothing half-copied left in the durable tier once a run has opened.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import _campaign
import numpy as np

import tinax.explore as ex
from tinax._format.naming import words

SAVE_EVERY, KEEP, LOCAL_KEEP = 3, 2, 2
_BATCH = 32
# Seconds a job may take from its start to its resume.
_RESUME_DEADLINE_S = 300.0


@dataclasses.dataclass
class Counts:
    """What the trials found."""

    kills: int = 0
    step_seconds: float = 0.0
    promotion_seconds: float = 0.0
    kills_in_promotion: int = 0
    resumes: int = 0
    resumed_from_local: int = 0
    resumed_from_durable: int = 0
    refused: int = 0
    listed_complete: int = 0
    partial_listed_complete: int = 0
    not_from_newest: int = 0
    wrong_next_batch: int = 0
    half_copied_left: int = 0
    stale_waiting: int = 0
    promotions_finished: int = 0
    refusals: list[str] = dataclasses.field(default_factory=list)
    misses: list[str] = dataclasses.field(default_factory=list)


def _durable(root: Path) -> str:
    """The durable tier of the run under ``root``: a prefix of the bucket, or a directory."""
    named = root / "durable.url"
    if named.exists():
        return named.read_text()
    return str(root / "durable")


def _start(root: Path, mib: float, steps: int) -> subprocess.Popen[str]:
    argv = [sys.executable, __file__, "--child", "tinax", str(root), str(mib), str(steps)]
    # The job's stderr goes to a file beside the run, its last lines quoted if it fails.
    with open(root / "job.stderr", "w") as errors:
        return subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=errors, text=True, env=_campaign.child_env()
        )


def _why(root: Path, child: subprocess.Popen[str]) -> str:
    """Why a job did not resume: its exit status (or that it hung) and the end of its
    stderr, the whole of which is kept in the temporary directory (the run's scratch
    directory goes when the campaign ends)."""
    try:
        child.wait(timeout=30)
        status = f"exit {child.returncode}"
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(timeout=60)
        status = "no resume within the deadline (the job's threads are on its stderr)"
    text = (root / "job.stderr").read_text(errors="replace")
    kept = Path(tempfile.gettempdir()) / f"tinax-two-tier-job-{time.time_ns()}.stderr"
    kept.write_text(text)
    lines = [line for line in text.strip().splitlines() if not line.startswith("I1")]
    return f"{status} [{kept}]: " + " | ".join(lines[-3:])


class _Reader:
    """The job's lines, read on a thread so that the parent can kill it at any moment."""

    def __init__(self, child: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self.times: list[float] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(child,), daemon=True)
        self._thread.start()

    def _read(self, child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            with self._changed:
                self.lines.append(line.strip())
                self.times.append(time.monotonic())
                self._changed.notify_all()
        with self._changed:
            self.ended = True
            self._changed.notify_all()

    ended = False

    def wait_for(self, prefix: str, timeout: float = 300.0, after: int = 0) -> str:
        """The first line from the ``after``-th on starting with ``prefix`` (``""``: the
        job ended first, or ``timeout`` passed)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines[after:]:
                    if line.startswith(prefix):
                        return line
                if self.ended:
                    return ""
                if not self._changed.wait(max(0.0, deadline - time.monotonic())):
                    return ""

    def promotion_seconds(self) -> list[float]:
        """How long each promotion the job ended took."""
        started: dict[str, float] = {}
        took = []
        for line, at in zip(self.lines, self.times, strict=True):
            if line.startswith("promote-start "):
                started[line.split()[1]] = at
            elif line.startswith("promote-end ") and line.split()[1] in started:
                took.append(at - started[line.split()[1]])
        return took

    def finish(self) -> list[str]:
        self._thread.join(timeout=60)
        return list(self.lines)


def _exact(loaded: Any, step: int, nbytes: int) -> bool:
    """Whether ``loaded`` (a ``TrainingCheckpoint``) is the state of ``step``, its
    iterator at the batch after ``step``'s."""
    host = _campaign.host_state(step, nbytes)
    adam = loaded.optimizer[0]
    same = _campaign._same_bits
    return (
        loaded.step == step
        and all(same(loaded.model[k], v) for k, v in host["model"].items())
        and all(same(adam.mu[k], v) for k, v in host["mu"].items())
        and all(same(adam.nu[k], v) for k, v in host["nu"].items())
        and same(loaded.rng, host["rng"])
        and loaded.auxiliary == host["auxiliary"]
        and int(np.asarray(next(loaded.iterator))[0]) == step * _BATCH
    )


def _load(path: str, nbytes: int) -> Any:
    from tinax.checkpointing import abstract_restore_target, load_training_checkpoint

    shapes = _campaign.live_state(0, nbytes)
    targets = [abstract_restore_target(shapes[k]) for k in ("model", "optimizer", "rng")]
    return load_training_checkpoint(
        path, *targets, {"seed": 0, "loss": 0.0}, iter(_campaign.dataset())
    )


def _sound_steps(root: Path, nbytes: int, counts: Counts) -> list[int]:
    """Steps with a copy listed complete that loads bit for bit; counts those that do not."""
    durable = _durable(root)
    local = root / "local"
    if not local.exists():
        return []
    listing = ex.list_checkpoints(local, cache=None)
    sound = []
    for row in listing.itertuples(index=False):
        if row.status != words.COMPLETE or row.step is None:
            continue
        copies = [str(row.path)]
        if row.tier == words.TIER_BOTH:
            copies.append(f"{durable}/{row.name}")
        for path in copies:
            counts.listed_complete += 1
            why = "it loads other values"
            try:
                exact = _exact(_load(path, nbytes), int(row.step), nbytes)
            except Exception as e:
                exact, why = False, f"{type(e).__name__}: {e}"[:300]
            if exact:
                sound.append(int(row.step))
            else:
                counts.partial_listed_complete += 1
                counts.misses.append(f"{path} listed complete but does not load bit for bit: {why}")
    return sound


def campaign(side: str, root: Path, kills: int, mib: float, rng: random.Random) -> Counts:
    counts = Counts()
    nbytes = int(mib * _campaign.MIB)
    root.mkdir(parents=True, exist_ok=True)
    if _bucket is not None:
        (root / "durable.url").write_text(f"gs://{_bucket}/{uuid.uuid4().hex[:12]}")
    # A job that trains 2 * SAVE_EVERY steps unkilled times the window kills land in.
    child = _start(root, mib, 2 * SAVE_EVERY)
    reader = _Reader(child)
    assert reader.wait_for("resumed ").startswith("resumed "), reader.finish()
    started = time.monotonic()
    child.wait(timeout=600)
    assert child.returncode == 0, f"the timing job exited with {child.returncode}"
    counts.step_seconds = (time.monotonic() - started) / (2 * SAVE_EVERY)
    window = 2 * SAVE_EVERY * counts.step_seconds
    reader.finish()
    took = sorted(reader.promotion_seconds())
    counts.promotion_seconds = took[len(took) // 2] if took else 0.0
    for trial in range(kills):
        sound = _sound_steps(root, nbytes, counts)
        newest = max(sound, default=0)
        child = _start(root, mib, 0)
        reader = _Reader(child)
        try:
            left = reader.wait_for("leftovers ", timeout=_RESUME_DEADLINE_S)
            resumed = reader.wait_for("resumed ", timeout=_RESUME_DEADLINE_S)
            counts.resumes += 1
            if not resumed.startswith("resumed "):
                counts.refused += 1
                counts.refusals.append(
                    (reader.wait_for("refused ", timeout=1) or _why(root, child))[:300]
                )
            else:
                _, step, tier, first = resumed.split()
                if int(step) != newest:
                    counts.not_from_newest += 1
                    counts.misses.append(f"resumed from {step}, newest sound {newest}")
                if int(first) != int(step) * _BATCH:
                    counts.wrong_next_batch += 1
                    counts.misses.append(f"resumed at {step}, next batch starts at {first}")
                counts.resumed_from_local += tier == words.TIER_LOCAL
                counts.resumed_from_durable += tier == words.TIER_DURABLE
                if left.split()[1] != "0":
                    counts.half_copied_left += 1
                    counts.misses.append(f"the run opened with {left}")
                if left.split()[2] != "0":
                    counts.stale_waiting += 1
                    counts.misses.append(f"the run opened with {left}")
                if trial % 2:
                    # Half the kills land in a promotion: at a random moment of one.
                    begun = len(reader.lines)
                    reader.wait_for("promote-start ", timeout=2 * window, after=begun)
                    time.sleep(rng.uniform(0.0, counts.promotion_seconds))
                else:
                    time.sleep(rng.uniform(0.0, window))
        finally:
            child.kill()
            child.wait(timeout=60)
        lines = reader.finish()
        started_promotions = sum(line.startswith("promote-start") for line in lines)
        ended = sum(line.startswith("promote-end") for line in lines)
        counts.kills_in_promotion += started_promotions > ended
        counts.promotions_finished += ended
        counts.kills += 1
    _sound_steps(root, nbytes, counts)
    return counts


_said = threading.Lock()


def _say(line: str) -> None:
    """Tells the parent one line. Promotions tell theirs from their own threads: a
    print's text and its newline are two writes, which another thread's line could
    come between, so each line is one write, under a lock."""
    with _said:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _stage(what: str) -> None:
    """Says on stderr what the job is doing (a job that fails to resume shows where)."""
    print(f"job: {what}", file=sys.stderr, flush=True)


def _child(side: str, root: str, mib: str, steps: str) -> None:
    """The training job: open, resume, then train and save every step until ``steps``
    more (0: forever)."""
    _campaign.quiet_logs()
    import faulthandler

    # A job that has not resumed by then says where each of its threads is; one that
    # crashes says where.
    faulthandler.enable()
    faulthandler.dump_traceback_later(_RESUME_DEADLINE_S - 30, exit=False)
    from tinax._format.naming import names
    from tinax.checkpointing import TrainingRun, _promotion, abstract_restore_target

    nbytes = int(float(mib) * _campaign.MIB)
    promote = _promotion.promote

    def told(source: Any, destination: Any) -> None:
        step = names.step_from_name(destination.name)
        _say(f"promote-start {step}")
        promote(source, destination)
        _say(f"promote-end {step}")

    _promotion.promote = told
    durable = _durable(Path(root))
    _stage("opening the run")
    try:
        run = TrainingRun(
            durable,
            save_every=SAVE_EVERY,
            keep=KEEP,
            local=Path(root) / "local",
            local_every=1,
            local_keep=LOCAL_KEEP,
            handle_sigterm=False,
        )
    except Exception as e:
        _say(f"refused {type(e).__name__}: {e}".replace("\n", " "))
        sys.exit(2)
    _stage("listing it")
    # What did not commit in the durable tier once the run has opened (no promotion has
    # started yet): a killed promotion's leftovers, which opening the run removes.
    listing = ex.list_checkpoints(Path(root) / "local", cache=None)
    leftovers = listing[
        (listing["tier"] == words.TIER_DURABLE) & (listing["status"] != words.COMPLETE)
    ]
    # Local checkpoints still recorded as waiting for a promotion that the durable tier
    # holds or has gone past: a resumed run releases them as it opens.
    durable_steps = [int(s) for s in listing.loc[listing["tier"] != words.TIER_LOCAL, "step"]]
    newest_durable = max(durable_steps, default=-1)
    stale = listing[
        (listing["promotion"].astype("string") == words.PROMOTION_WAITING)
        & (listing["step"] <= newest_durable)
    ]
    _say(f"leftovers {len(leftovers)} {len(stale)}")
    shapes = _campaign.live_state(0, nbytes)
    targets = [abstract_restore_target(shapes[k]) for k in ("model", "optimizer", "rng")]
    iterator = iter(_campaign.dataset())
    _stage("restoring")
    # The state's bits are random: NaN among them is no divergence.
    restored = run.restore(*targets, {"seed": 0, "loss": 0.0}, iterator, allow_diverged=True)
    start = 0 if restored is None else restored.step
    local_steps = run.local_steps
    tier = words.TIER_LOCAL if start in local_steps else words.TIER_DURABLE
    batch = next(iterator)
    faulthandler.cancel_dump_traceback_later()
    _say(f"resumed {start} {tier} {int(np.asarray(batch)[0])}")
    last = start + int(steps) if int(steps) else None
    for step in itertools.count(start + 1):
        if last is not None and step > last:
            break
        if step > start + 1:
            batch = next(iterator)
        state = _campaign.live_state(step, nbytes)
        run.save(
            step, state["model"], state["optimizer"], state["rng"], state["auxiliary"], iterator
        )
    run.close()


_bucket: str | None = None


def main() -> int:
    global _bucket
    import argparse

    # The options of this campaign alone; run_kill_campaign reads the rest.
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--durable", choices=("gs", "path"), default="gs")
    own.add_argument("--latency", type=float, default=0.03)
    options, rest = own.parse_known_args()
    sys.argv[1:] = rest
    emulator = None
    if "--child" not in rest and options.durable == "gs":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from gcs import Emulator

        emulator = Emulator(latency_s=options.latency)
        emulator.start()
        os.environ.update(emulator.environment())
        _bucket = "tinax-two-tier"
        emulator.create_bucket(_bucket)
    where = (
        f"gs:// (the emulator, {options.latency:g} s a request)"
        if options.durable == "gs"
        else "a directory"
    )
    try:
        return _campaign.run_kill_campaign(
            description=__doc__.splitlines()[0],
            default_mib=8.0,
            scratch_prefix="tinax-two-tier-campaign-",
            campaign=campaign,
            child=_child,
            title=lambda kills, mib, seconds: (
                f"two-tier campaign: {kills} SIGKILLs at random moments of a loop saving "
                f"{mib:g} MiB to a local tier every step and promoting every {SAVE_EVERY}rd "
                f"to {where}, each followed by a resume ({seconds:.0f} s)"
            ),
            rows=ROWS,
            goals=lambda tinax: (
                ("0 resumes refused", tinax.refused),
                ("nothing partial listed complete", tinax.partial_listed_complete),
                ("every resume from the newest sound step", tinax.not_from_newest),
                ("every resume with the stream's next batch", tinax.wrong_next_batch),
                ("nothing half-copied left once a run has opened", tinax.half_copied_left),
                ("no local step left waiting behind the durable tier", tinax.stale_waiting),
            ),
            notes=("refusals", "misses"),
            default_sides="tinax",
        )
    finally:
        if emulator is not None:
            emulator.stop()


ROWS = (
    ("seconds a step takes (half the kills within 2 promotions)", "step_seconds"),
    ("seconds a promotion takes (the other half within one)", "promotion_seconds"),
    ("SIGKILLs", "kills"),
    ("  of them during a promotion", "kills_in_promotion"),
    ("promotions finished between kills", "promotions_finished"),
    ("resumes", "resumes"),
    ("  from the local tier", "resumed_from_local"),
    ("  from the durable tier", "resumed_from_durable"),
    ("resumes refused", "refused"),
    ("checkpoint copies listed complete (each loaded)", "listed_complete"),
    ("partial listed complete", "partial_listed_complete"),
    ("resumes not from the newest sound step", "not_from_newest"),
    ("resumes with another next batch", "wrong_next_batch"),
    ("runs opened with a half-copied promotion left", "half_copied_left"),
    ("runs opened with a local step waiting behind the durable tier", "stale_waiting"),
)


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.exit(main())
