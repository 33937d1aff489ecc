"""How a save by tinax went: the record written into the checkpoint after it commits.

``names.SAVE_TIMES`` at the checkpoint's root, JSON: how long the save blocked the
caller (``blocked_s``: until ``save`` returned) and took in all (``total_s``: until
it committed), and, where the saver could walk what it wrote cheaply (a local disk),
the size of the committed checkpoint (``nbytes``: every file but this record), so that
a listing of a run tells each checkpoint's size from this one small file rather than
from a walk of every directory in it. A record of the save, never data: no load
reads it.
"""

from __future__ import annotations

import json
import math
from typing import NamedTuple

from tinax._format.naming import names
from tinax._format.storage import files
from tinax._format.storage.location import FILE, Entry, Location

# A few numbers and a format word.
MAX_SAVE_TIMES_BYTES = 4096


class SaveTimes(NamedTuple):
    """How long a save blocked its caller and took in all, in seconds, and the size of
    what it committed (``None`` where it was not recorded)."""

    blocked_s: float
    total_s: float
    nbytes: int | None = None


def encode(times: SaveTimes) -> bytes:
    """The record's bytes."""
    record: dict[str, object] = {
        "format": names.SAVE_TIMES_FORMAT,
        "blocked_s": round(times.blocked_s, 6),
        "total_s": round(times.total_s, 6),
    }
    if times.nbytes is not None:
        record["nbytes"] = times.nbytes
    return json.dumps(record).encode("utf-8")


def read_save_times(checkpoint: Location, entry: Entry | None) -> SaveTimes | None:
    """The save times recorded in ``checkpoint``, whose listing found ``entry`` for the
    record (``None``: not there); ``None`` where there are none, or the record is not one
    (unreadable, another format, numbers missing or negative)."""
    if entry is None or entry.kind != FILE:
        return None
    where = checkpoint / names.SAVE_TIMES
    try:
        data = files.read_listed_bytes(
            where, entry, what="tinax save times", max_bytes=MAX_SAVE_TIMES_BYTES
        )
        record = files.parse_json(data, path=where, what="tinax save times", max_depth=2)
    except (ValueError, OSError):
        return None
    if not isinstance(record, dict) or record.get("format") != names.SAVE_TIMES_FORMAT:
        return None
    values = [record.get("blocked_s"), record.get("total_s")]
    if not all(_seconds(v) for v in values):
        return None
    size = record.get("nbytes")
    nbytes = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
    return SaveTimes(float(values[0]), float(values[1]), nbytes)  # type: ignore[arg-type]


def _seconds(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def recorded_size(times: SaveTimes | None, entry: Entry | None) -> int | None:
    """The size of a committed checkpoint from its save's record (``entry``: the record's
    own entry, as listed, whose bytes the recorded size leaves out); ``None`` where the
    save recorded none."""
    if times is None or times.nbytes is None or entry is None:
        return None
    return times.nbytes + entry.size
