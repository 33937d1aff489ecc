"""A training run's record: its policy, each step's metric, why each checkpoint is kept.

``tinax.checkpointing.TrainingRun`` writes it (``names.RUN_RECORD`` at the run's root,
replaced atomically); ``tinax.explore`` reads it. JSON only, size-bounded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tinax._format.naming import names
from tinax._format.storage import files
from tinax._format.storage.location import Entry, Location

# A record holds a number per kept step and a few words per kept checkpoint.
MAX_RECORD_BYTES = 16 << 20


def read_run_record(root: Location) -> dict[str, Any] | None:
    """The run record at ``root``; ``None`` if there is none or it is not a run record."""
    where = root / names.RUN_RECORD
    if not where.is_file():
        return None
    return files.read_record(
        where, what="tinax run record", format=names.RUN_RECORD_FORMAT, max_bytes=MAX_RECORD_BYTES
    )


# The record of a checkpoint found corrupt holds one reason and a time.
MAX_CORRUPT_RECORD_BYTES = 1 << 20


def found_corrupt(checkpoint: Location, entries: Mapping[str, Entry] | None = None) -> str | None:
    """Why a run's restore refused ``checkpoint`` (``names.CORRUPT_RECORD``), or ``None``.
    ``entries`` are its entries, if the caller has listed them already.

    A record that cannot be read still marks the checkpoint: its reason is then that.
    """
    where = checkpoint / names.CORRUPT_RECORD
    present = names.CORRUPT_RECORD in entries if entries is not None else where.exists()
    if not present:
        return None
    try:
        record = files.read_json(
            where, what="tinax found-corrupt record", max_bytes=MAX_CORRUPT_RECORD_BYTES
        )
    except (ValueError, OSError) as e:
        return f"(its record is unreadable: {e})"
    reason = record.get("reason") if isinstance(record, dict) else None
    return reason if isinstance(reason, str) else "(its record gives no reason)"


def abandoned_from(checkpoint: Location) -> int | None:
    """The step the run went on from when it set ``checkpoint`` aside as of the branch
    it left (``names.ABANDONED_RECORD``), or ``None`` where it did not (``-1``: a
    record that does not say)."""
    where = checkpoint / names.ABANDONED_RECORD
    if not where.exists():
        return None
    try:
        record = files.read_json(
            where, what="tinax abandoned-branch record", max_bytes=MAX_CORRUPT_RECORD_BYTES
        )
    except (ValueError, OSError):
        return -1
    step = record.get("went_on_from") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else -1


def recorded_health(
    checkpoint: Location, records: dict[str, dict[str, Any] | None] | None = None
) -> object:
    """What the run holding ``checkpoint`` recorded of its health when it read its data
    (``health.record_entry``), or ``None``: no run record beside it, none for its
    step, or one that does not read. ``records``: the run records read so far, by
    run directory, filled here, so that checkpoints of one run read its record once."""
    step = names.step_from_name(checkpoint.name)
    if step is None:
        return None
    run = checkpoint.parent
    if records is not None and run.path in records:
        return recorded_health_of(records[run.path], step)
    try:
        record = read_run_record(run)
    except (ValueError, OSError):
        record = None
    if records is not None:
        records[run.path] = record
    return recorded_health_of(record, step)


def recorded_health_of(record: dict[str, Any] | None, step: int) -> object:
    """The entry for ``step`` under ``names.RUN_RECORD_HEALTH`` of a run ``record``."""
    found = None if record is None else record.get(names.RUN_RECORD_HEALTH)
    return found.get(str(step)) if isinstance(found, dict) else None
