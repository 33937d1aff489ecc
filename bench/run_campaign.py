"""Training-run campaign: kill a loop that saves and prunes at random moments, then resume.

Each trial starts a training job in a child process. The job resumes the run as a
restarted job would (tinax: ``TrainingRun.restore``; Orbax alone:
``ocp.training.Checkpointer``'s latest checkpoint), then saves at every step while the
run prunes: it keeps the newest two checkpoints plus the best one by a score that
jumps about (so the best is often an old step, and pruning removes checkpoints in the
middle of the run). The job is killed with SIGKILL at a random moment: uniformly within
the time it takes to save three steps, measured first. After each kill the parent
lists the run and loads every checkpoint listed ``complete``, bit for bit.

Counted, for tinax and for Orbax alone side by side: resumes refused (the job could
not restore), partial or half-pruned checkpoints listed ``complete`` (listed complete
but not loadable bit for bit), and resumes not from the newest sound step (the newest
checkpoint that loads bit for bit when the job started).

Usage: python bench/run_campaign.py [--kills 30] [--mib 32] [--sides tinax,orbax]
                                    [--dir DIR] [--seed 0] [--child-platforms tpu]
                                    [--write-batch-mib 4]

Exits non-zero when tinax misses a goal: no resume refused, nothing partial or
half-pruned listed complete, every resume from the newest sound step.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _campaign

import tinax.explore as ex
from tinax._format.naming import words

KEEP, KEEP_BEST = 2, 1


def score(seed: int) -> int:
    """The metric a checkpoint is ranked by (lower is better): a fixed jumble of the step."""
    return (seed * 37) % 11


@dataclasses.dataclass
class Counts:
    """What one side's trials found."""

    kills: int = 0
    step_seconds: float = 0.0
    saves_committed: int = 0
    resumes: int = 0
    refused: int = 0
    listed_complete: int = 0
    partial_listed_complete: int = 0
    not_from_newest: int = 0
    refusals: list[str] = dataclasses.field(default_factory=list)
    misses: list[str] = dataclasses.field(default_factory=list)


def _start(side: str, root: Path, mib: float, steps: int | None) -> subprocess.Popen[str]:
    argv = [sys.executable, __file__, "--child", side, str(root), str(mib), str(steps or 0)]
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_campaign.child_env(),
    )


def _resumed(child: subprocess.Popen[str]) -> tuple[int | None, str | None]:
    """The step the job resumed from (0: a fresh start), or why it could not."""
    assert child.stdout is not None
    line = child.stdout.readline()
    if line.startswith("resumed "):
        return int(line.split()[1]), None
    child.wait(timeout=60)
    return None, line.strip() or f"the job exited with {child.returncode}"


def _sound_steps(side: str, root: Path, mib: float, counts: Counts) -> list[int]:
    """Steps listed complete that load bit for bit; counts the ones that do not."""
    if not root.exists():
        return []
    listing = ex.list_checkpoints(root, cache=None)
    sound = []
    for row in listing.itertuples(index=False):
        if row.status != words.COMPLETE or row.step is None:
            continue
        counts.listed_complete += 1
        try:
            loaded = _campaign.load(side, Path(row.path), nbytes(mib))
            exact = _campaign.exact(loaded, int(row.step), nbytes(mib))
        except Exception:
            exact = False
        if exact:
            sound.append(int(row.step))
        else:
            counts.partial_listed_complete += 1
            counts.misses.append(f"{row.name} listed complete but does not load bit for bit")
    return sound


def nbytes(mib: float) -> int:
    return int(mib * _campaign.MIB)


def campaign(side: str, root: Path, kills: int, mib: float, rng: random.Random) -> Counts:
    counts = Counts()
    # A job that saves three steps unkilled times the window kills land in.
    started = time.monotonic()
    child = _start(side, root, mib, 3)
    _, problem = _resumed(child)
    assert problem is None, problem
    child.wait(timeout=600)
    assert child.returncode == 0, f"the timing job exited with {child.returncode}"
    counts.step_seconds = (time.monotonic() - started) / 3
    for _ in range(kills):
        sound = _sound_steps(side, root, mib, counts)
        newest = max(sound, default=0)
        child = _start(side, root, mib, None)
        try:
            resumed, problem = _resumed(child)
            counts.resumes += 1
            if problem is not None:
                counts.refused += 1
                counts.refusals.append(problem[:300])
            elif resumed != newest:
                counts.not_from_newest += 1
                counts.misses.append(f"resumed from {resumed}, newest sound {newest}")
            if problem is None:
                time.sleep(rng.uniform(0.0, 3 * counts.step_seconds))
        finally:
            child.kill()
            child.wait(timeout=60)
        counts.kills += 1
    counts.saves_committed = len(_sound_steps(side, root, mib, Counts()))
    return counts


def _child(side: str, root: str, mib: str, steps: str) -> None:
    """The training job: resume, then save every step until ``steps`` (0: forever)."""
    _campaign.quiet_logs()
    size = nbytes(float(mib))
    shapes = _campaign.live_state(0, size)
    from tinax.checkpointing import abstract_restore_target

    targets = {
        name: abstract_restore_target(shapes[name]) for name in ("model", "optimizer", "rng")
    }
    last = int(steps) or None
    try:
        if side == "tinax":
            start, save, close = _tinax_job(root, targets)
        else:
            start, save, close = _orbax_job(root, targets)
    except Exception as e:
        print(f"refused {type(e).__name__}: {e}".replace("\n", " "), flush=True)
        sys.exit(2)
    print(f"resumed {start}", flush=True)
    for step in itertools.count(start + 1):
        if last is not None and step > last:
            break
        save(step, _campaign.live_state(step, size))
    close()


def _tinax_job(root: str, targets: dict[str, Any]) -> tuple[int, Any, Any]:
    from tinax.checkpointing import TrainingRun

    run = TrainingRun(
        root,
        save_every=1,
        keep=KEEP,
        keep_best=KEEP_BEST,
        best_by=lambda auxiliary: score(auxiliary["seed"]),
        handle_sigterm=False,
    )
    restored = run.restore(
        targets["model"],
        targets["optimizer"],
        targets["rng"],
        {"seed": 0, "loss": 0.0},
        iter(_campaign.dataset()),
        # The state's bits are random: NaN among them is no divergence.
        allow_diverged=True,
    )

    def save(step: int, state: dict[str, Any]) -> None:
        run.save(
            step,
            state["model"],
            state["optimizer"],
            state["rng"],
            state["auxiliary"],
            state["iterator"],
        )

    return (0 if restored is None else restored.step), save, run.close


def _orbax_job(root: str, targets: dict[str, Any]) -> tuple[int, Any, Any]:
    from orbax.checkpoint import v1 as ocp

    policies = ocp.training.preservation_policies
    checkpointer = ocp.training.Checkpointer(
        root,
        save_decision_policy=ocp.training.save_decision_policies.FixedIntervalPolicy(1),
        preservation_policy=policies.AnyPreservationPolicy(
            [
                policies.LatestN(KEEP),
                policies.BestN(get_metric_fn=lambda m: m["score"], n=KEEP_BEST),
            ]
        ),
    )
    start = 0
    latest = checkpointer.latest
    if latest is not None:
        loaded = checkpointer.load_checkpointables(
            latest.step,
            {
                **targets,
                "auxiliary": {"step": 0, "state": {"seed": 0, "loss": 0.0}},
                "iterator": iter(_campaign.dataset()),
            },
        )
        start = int(loaded["auxiliary"]["step"])

    def save(step: int, state: dict[str, Any]) -> None:
        parts = dict(state, auxiliary={"step": step, "state": state["auxiliary"]})
        checkpointer.save_checkpointables_async(step, parts, metrics={"score": score(step)})

    return start, save, checkpointer.close


ROWS = (
    ("seconds a step takes (kills within 3 steps)", "step_seconds"),
    ("SIGKILLs", "kills"),
    ("resumes", "resumes"),
    ("resumes refused", "refused"),
    ("checkpoints listed complete (each loaded)", "listed_complete"),
    ("partial or half-pruned listed complete", "partial_listed_complete"),
    ("resumes not from the newest sound step", "not_from_newest"),
    ("sound checkpoints at the end", "saves_committed"),
)


def main() -> int:
    return _campaign.run_kill_campaign(
        description=__doc__.splitlines()[0],
        default_mib=32.0,
        scratch_prefix="tinax-run-campaign-",
        campaign=campaign,
        child=_child,
        title=lambda kills, mib, seconds: (
            f"training-run campaign: {kills} SIGKILLs per side at random moments of a loop "
            f"saving {mib:g} MiB every step and keeping the newest {KEEP} plus the best "
            f"{KEEP_BEST}, each followed by a resume ({seconds:.0f} s)"
        ),
        rows=ROWS,
        goals=lambda tinax: (
            ("0 resumes refused", tinax.refused),
            ("nothing partial or half-pruned listed complete", tinax.partial_listed_complete),
            ("every resume from the newest sound step", tinax.not_from_newest),
        ),
        notes=("refusals", "misses"),
    )


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.exit(main())
