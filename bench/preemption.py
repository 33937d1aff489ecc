"""Preemption campaign: kill a training job at random moments of its save, then resume.

Each trial starts a training job in a child process that saves the next training
checkpoint (model, Adam state, RNG, auxiliary state and a Grain iterator; ``--mib``
MiB in all) and is killed with SIGKILL at a random moment of that save: uniformly
within 1.3 times the duration of a save by the same kind of job, measured first.
The parent then resumes as a restarted job would: it lists the run, loads the
newest checkpoint listed ``complete``, and saves the following step; when the kill
landed mid-write, that is the very step the killed job left half-written.

Counted, for tinax and for Orbax alone side by side: resumes refused; checkpoints
listed ``complete`` that do not load bit for bit (each is loaded and checked once);
partial checkpoints listed ``complete``; and killed saves not listed as
``interrupted``.

Usage: python bench/preemption.py [--kills 30] [--mib 256] [--sides tinax,orbax]
                                  [--dir DIR] [--seed 0] [--child-platforms tpu]
                                  [--write-batch-mib 16]

A save from an accelerator writes its arrays in batches while later ones are still
being copied to the host. ``--child-platforms tpu`` has the killed jobs save from a
TPU (the parent's checks and resumes stay on the CPU); ``--write-batch-mib`` has
them write in batches of that size on a CPU too.

Exits non-zero when tinax misses a goal: no resume refused, everything listed
complete loads bit-exactly, nothing partial listed complete.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import _campaign

import tinax.explore as ex
from tinax._format.naming import names, words


@dataclasses.dataclass
class Counts:
    """What one side's trials found."""

    kills: int = 0
    save_seconds: float = 0.0
    write_batches: int = 0
    before_write: int = 0
    mid_write: int = 0
    after_commit: int = 0
    refused: int = 0
    listed_complete: int = 0
    not_exact: int = 0
    partial_listed_complete: int = 0
    interrupted_not_listed: int = 0
    refusals: list[str] = dataclasses.field(default_factory=list)


def step_name(step: int) -> str:
    return f"step_{step:04d}"


def _job(
    side: str, path: Path, step: int, mib: float, delay: float | None
) -> tuple[float, int] | None:
    """Runs a job that saves ``step``; SIGKILLs it ``delay`` seconds into the save.

    With ``delay`` ``None`` the save is left to commit, and its duration (as the job
    measured it) and the batches it wrote its arrays in are returned.
    """
    child = subprocess.Popen(
        [sys.executable, __file__, "--child", side, str(path), str(step), str(mib)],
        stdout=subprocess.PIPE,
        text=True,
        env=_campaign.child_env(),
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if "saving" not in line:
            raise RuntimeError(f"the training job did not reach its save: {line!r}")
        if delay is None:
            line = child.stdout.readline()
            if not line.startswith("saved "):
                raise RuntimeError(f"the training job's save failed: {line!r}")
            _, seconds, batches = line.split()
            return float(seconds), int(batches)
        time.sleep(delay)
        return None
    finally:
        child.kill()
        child.wait(timeout=60)


def _check_listing(
    side: str, root: Path, mib: float, verified: set[tuple[str, object]], counts: Counts
) -> list[int]:
    """Checks every checkpoint listed complete (once each); returns their steps."""
    listing = ex.list_checkpoints(root, cache=None)
    steps = []
    for row in listing.itertuples(index=False):
        path = Path(row.path)
        if names.is_temporary_name(row.name):
            if row.status == words.COMPLETE:
                counts.partial_listed_complete += 1
            elif row.status != words.INTERRUPTED:
                counts.interrupted_not_listed += 1
            continue
        if row.status != words.COMPLETE:
            continue
        key = (row.path, row.committed)
        if key not in verified:
            verified.add(key)
            counts.listed_complete += 1
            try:
                exact = _campaign.exact(
                    _campaign.load(side, path, nbytes(mib)), row.step, nbytes(mib)
                )
            except Exception:
                exact = False
            if not exact:
                counts.not_exact += 1
                if not (path / names.CHECKPOINT_METADATA).is_file():
                    counts.partial_listed_complete += 1
        steps.append(int(row.step))
    return steps


def nbytes(mib: float) -> int:
    return int(mib * _campaign.MIB)


def campaign(side: str, root: Path, kills: int, mib: float, rng: random.Random) -> Counts:
    """Runs ``kills`` trials for one side in the run directory ``root``."""
    counts = Counts()
    root.mkdir(parents=True)
    # The first save, by a job like the killed ones, times the window kills land in.
    first = _job(side, root / step_name(0), 0, mib, None)
    assert first is not None
    duration, counts.write_batches = first
    counts.save_seconds = duration
    verified: set[tuple[str, object]] = set()
    latest = 0
    for _ in range(kills):
        step = latest + 1
        target = root / step_name(step)
        delay = rng.uniform(0.0, 1.3 * duration)
        _job(side, target, step, mib, delay)
        counts.kills += 1
        temporary = target.with_name(target.name + names.TEMPORARY_SUFFIX)
        if target.exists():
            counts.after_commit += 1
        elif temporary.exists():
            counts.mid_write += 1
        else:
            counts.before_write += 1
        # The restarted job: the newest complete checkpoint, then the next step.
        latest = max(_check_listing(side, root, mib, verified, counts))
        following = latest + 1
        try:
            state = _campaign.live_state(following, nbytes(mib))
            _campaign.save(side, root / step_name(following), following, state)
            latest = following
        except Exception as e:
            counts.refused += 1
            counts.refusals.append(f"{type(e).__name__}: {e}"[:300])
        _check_listing(side, root, mib, verified, counts)
        # Only the newest two are kept, to bound the disk used.
        for old in root.iterdir():
            if old.is_dir() and not names.is_temporary_name(old.name):
                step_of = names.step_from_name(old.name)
                if step_of is not None and step_of < latest - 1:
                    shutil.rmtree(old)
    return counts


def _child(side: str, path: str, step: str, mib: str) -> None:
    state = _campaign.live_state(int(step), nbytes(float(mib)))
    import jax

    jax.block_until_ready(state)
    print("saving", flush=True)
    start = time.perf_counter()
    _campaign.save(side, Path(path), int(step), state)
    print(f"saved {time.perf_counter() - start:.6f} {_campaign.batches_written()}", flush=True)
    time.sleep(600)  # killed long before: a kill after the commit still meets a live job


ROWS = (
    ("seconds a save takes (kills within 1.3x)", "save_seconds"),
    ("  batches its arrays were written in (0: all at once)", "write_batches"),
    ("SIGKILLs", "kills"),
    ("  landed before the temporary existed", "before_write"),
    ("  landed mid-write", "mid_write"),
    ("  landed after the commit", "after_commit"),
    ("resumes refused", "refused"),
    ("checkpoints listed complete (each loaded)", "listed_complete"),
    ("  not bit-exact or not loadable", "not_exact"),
    ("partial checkpoints listed complete", "partial_listed_complete"),
    ("killed saves not listed interrupted", "interrupted_not_listed"),
)


def main() -> int:
    return _campaign.run_kill_campaign(
        description=__doc__.splitlines()[0],
        default_mib=256.0,
        scratch_prefix="tinax-preemption-",
        campaign=campaign,
        child=_child,
        title=lambda kills, mib, seconds: (
            f"preemption campaign: {kills} SIGKILLs per side at random moments of a "
            f"{mib:g} MiB training save, then a resume ({seconds:.0f} s)"
        ),
        rows=ROWS,
        goals=lambda tinax: (
            ("0 resumes refused", tinax.refused),
            ("every checkpoint listed complete loads bit-exactly", tinax.not_exact),
            ("no partial checkpoint listed complete", tinax.partial_listed_complete),
            ("every killed save listed interrupted", tinax.interrupted_not_listed),
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
