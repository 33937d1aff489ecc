"""A run's diverged checkpoints set aside, or removed: the documented way to clear a
run's way back to a healthy step (``tinax set-aside RUN``).

A checkpoint diverged when a metric its save logged is NaN or infinite, or its model
or optimizer state holds NaN or Inf (``tinax._format.integrity.health``): known from
its commit record, from what this process or the run's restores read, and with
``data`` from reading every value, checked against its checksums as it is read.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from tinax import _paths
from tinax._format.arraydata import nonfinite, valuecheck
from tinax._format.integrity import checksums, health, preflight
from tinax._format.metadata import layout, logged
from tinax._format.naming import words
from tinax._format.records import runrecord, tiers
from tinax._format.storage.location import Location
from tinax.checkpointing import _run_files
from tinax.checkpointing._nonfinite import LoadCounts
from tinax.checkpointing._resume import known_health


@dataclasses.dataclass(frozen=True)
class SetAside:
    """A diverged checkpoint ``set_aside_diverged`` moved aside or removed.

    Attributes:
      step: Its step.
      path: Where it was.
      tier: ``local`` or ``durable`` for a two-tier run, else ``""``.
      reason: Why it diverged, in the words every view uses.
      now: Where it is now (``<name>.tinax-abandoned``, or its own path on an object
        store, where it stays marked); ``None`` once removed, or where nothing was
        done (``dry_run``, or a live save held it).
    """

    step: int
    path: str
    tier: str
    reason: str
    now: str | None


def set_aside_diverged(
    directory: str | os.PathLike[str],
    *,
    remove: bool = False,
    data: bool = False,
    dry_run: bool = False,
) -> list[SetAside]:
    """Sets a run's diverged checkpoints aside (or removes them), so that a restore, a
    listing and the next saves of their steps find the way clear.

    Each complete checkpoint of the run (of both tiers for a two-tier run, from either
    directory) is judged as every view judges it: diverged when a metric its save
    logged is NaN or infinite, or what was read of its data found NaN or Inf. With
    ``data``, a checkpoint whose health is not yet known is read whole (checked
    against its checksums; NaN and Inf counted once per leaf). A diverged checkpoint
    is renamed ``<name>.tinax-abandoned`` (kept for inspection, listed ``abandoned``,
    never resumed from; on an object store marked in place, removed by the next save
    of its step) or, with ``remove``, removed (crash-safe). Not while a run saves to
    the directory: a checkpoint a live save holds is left as it is.

    Args:
      directory: A run directory (local or ``gs://``), either tier of a two-tier run.
      remove: Remove the diverged checkpoints rather than set them aside.
      data: Read the data of each checkpoint whose health is not yet known.
      dry_run: Judge, and change nothing.

    Returns:
      What was (or, with ``dry_run``, would be) set aside or removed, by step.

    Raises:
      TypeError: If an argument has the wrong type.
      FileNotFoundError: If ``directory`` does not exist.
      ValueError: If ``directory`` is not a directory.
    """
    for flag, value in (("remove", remove), ("data", data), ("dry_run", dry_run)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be a bool, got {type(value).__name__}")
    root = _paths.listed_directory(directory)
    found: list[SetAside] = []
    for tier, where in _tiers(root):
        record = runrecord.read_run_record(where)
        for step, checkpoint in sorted(_run_files.complete_checkpoints(where).items()):
            judged = known_health(checkpoint, record)
            if judged.verdict == words.HEALTH_UNKNOWN and data:
                judged = read_health(checkpoint)
            if judged.verdict != words.DIVERGED:
                continue
            now: str | None = None
            if dry_run:
                pass
            elif remove:
                _run_files.remove_checkpoint(checkpoint)
            else:
                moved = _run_files.set_aside_abandoned(checkpoint, None, judged.reason)
                now = None if moved is None else str(checkpoint.parent / moved)
            found.append(SetAside(step, str(checkpoint), tier, judged.reason, now))
    return found


def _tiers(root: Location) -> list[tuple[str, Location]]:
    """The directories of the run at ``root``: both tiers of a two-tier run."""
    run = tiers.two_tier_run(root)
    if run is None:
        return [("", root)]
    found = [(tiers.DURABLE_TIER, run.durable)]
    if run.local is not None:
        found.insert(0, (tiers.LOCAL_TIER, run.local))
    return found


def read_health(where: Location) -> health.Health:
    """The health of the checkpoint at ``where`` read from its data (remembered by the
    process); not yet known where its values are not what was saved."""
    checkpoint = preflight.check(where)
    counts = LoadCounts()

    def count(name: str, key: str, values: object) -> None:
        if isinstance(values, np.ndarray) and nonfinite.is_floating(values.dtype):
            counts.add(name, key, *nonfinite.count(values))

    if valuecheck.check_values(checkpoint, count):
        return health.judge(metrics=logged.logged(checkpoint.record))
    held = [c.name for c in checkpoint.checkpointables if c.layout == layout.PYTREE]
    # Only what carries checksums is read (what has none, saved by Orbax, is not).
    for item in checksums.checksummed(checkpoint):
        if item.layout == layout.PYTREE and checksums.has_checksums(item):
            counts.counted(item.name)
    found = counts.health(logged.logged(checkpoint.record), held)
    health.remember(checkpoint.path, checkpoint.committed_nsecs, found)
    return found
