"""What a training run's restore passes over: checkpoints that diverged, and why.

``TrainingRun.restore`` resumes from the newest checkpoint that is intact and healthy
(``tinax._format.health``). A checkpoint known to have diverged before its data is
read (a metric its save logged is NaN or infinite; the run recorded what an earlier
load found) is passed over unread; one whose data turns out to hold NaN or Inf in its
model or optimizer state as it is read is passed over before the iterator is touched.
What each load found is recorded in the run's record (``names.RUN_RECORD_HEALTH``),
so that a listing of the run knows it without reading the data again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tinax._format.integrity import health
from tinax._format.metadata import layout, logged
from tinax._format.naming import names
from tinax._format.records import runrecord
from tinax._format.storage.location import Location

# Why a checkpoint was passed over (``PassedOver.why``).
DIVERGED = "diverged"
DAMAGED = "damaged"


@dataclasses.dataclass(frozen=True)
class PassedOver:
    """A checkpoint ``TrainingRun.restore`` did not resume from, newer than the one it did.

    Attributes:
      step: Its step.
      path: Where it is.
      tier: ``local`` or ``durable`` for a two-tier run, else ``""``.
      why: ``diverged`` (NaN or Inf in its state, or a logged metric) or ``damaged``
        (it does not load; set aside as ``<name>.tinax-corrupt``).
      reason: What was found, in the words every view uses.
    """

    step: int
    path: str
    tier: str
    why: str
    reason: str

    def __str__(self) -> str:
        tier = f" ({self.tier})" if self.tier else ""
        return f"step {self.step}{tier}: {self.why}: {self.reason}"


def known_health(where: Location, record: dict[str, Any] | None) -> health.Health:
    """The health of the checkpoint at ``where`` without reading its data: its logged
    metrics, what this process read of it, what its run's ``record`` holds. Not yet
    known where its commit record does not read (the load then says what is wrong)."""
    try:
        found = layout.read_checkpoint_record(where)
    except (ValueError, OSError):
        return health.judge()
    step = names.step_from_name(where.name)
    recorded = None if step is None else runrecord.recorded_health_of(record, step)
    return health.known(
        where, found.committed_nsecs, logged.logged(found), recorded, logged.own_health(found)
    )


def grouped(passed: Sequence[PassedOver]) -> str:
    """``steps 80, 75, 70 (diverged: its logged loss is NaN); step 60 (local) (…)``:
    the steps passed over for one reason together, newest first."""
    by_reason: dict[tuple[str, str], list[str]] = {}
    for p in passed:
        tier = f" ({p.tier})" if p.tier and p.why == DAMAGED else ""
        steps = by_reason.setdefault((p.why, p.reason), [])
        if f"{p.step}{tier}" not in steps:
            steps.append(f"{p.step}{tier}")
    return "; ".join(
        f"step{'s' * (len(steps) > 1)} {', '.join(steps)} ({why}: {reason})"
        for (why, reason), steps in by_reason.items()
    )


def resumed_message(step: int, where: str, passed: Sequence[PassedOver]) -> str:
    """The line a restore logs when it passed checkpoints over."""
    return (
        f"resumed from step {step} ({where}), the newest checkpoint that is intact and "
        f"healthy; passed over {grouped(passed)}"
    )


def none_healthy_message(directory: str, passed: Sequence[PassedOver]) -> str:
    """Why a restore found nothing to resume from, every checkpoint having diverged."""
    return (
        f"no checkpoint of run {directory!r} is healthy: {grouped(passed)}. "
        "TrainingRun.restore(..., allow_diverged=True) resumes from the newest all the "
        "same, restore(..., step=N, allow_diverged=True) from step N"
    )
