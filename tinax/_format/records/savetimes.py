"""How long a save by tinax took: the record written into the checkpoint after it commits.

``names.SAVE_TIMES`` at the checkpoint's root, JSON: how long the save blocked the
caller (``blocked_s``: until ``save`` returned) and took in all (``total_s``: until
it committed). A record of the save, never data: no load reads it.
"""

from __future__ import annotations

import json
import math
from typing import NamedTuple

from tinax._format.naming import names
from tinax._format.storage import files
from tinax._format.storage.location import Location

# Two numbers and a format word.
MAX_SAVE_TIMES_BYTES = 4096


class SaveTimes(NamedTuple):
    """How long a save blocked its caller and took in all, in seconds."""

    blocked_s: float
    total_s: float


def encode(times: SaveTimes) -> bytes:
    """The record's bytes."""
    record = {
        "format": names.SAVE_TIMES_FORMAT,
        "blocked_s": round(times.blocked_s, 6),
        "total_s": round(times.total_s, 6),
    }
    return json.dumps(record).encode("utf-8")


def read_save_times(checkpoint: Location) -> SaveTimes | None:
    """The save times recorded in ``checkpoint``; ``None`` where there are none, or the
    record is not one (unreadable, another format, numbers missing or negative)."""
    where = checkpoint / names.SAVE_TIMES
    record = files.read_record(
        where,
        what="tinax save times",
        format=names.SAVE_TIMES_FORMAT,
        max_bytes=MAX_SAVE_TIMES_BYTES,
    )
    if record is None:
        return None
    values = [record.get("blocked_s"), record.get("total_s")]
    if not all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
        for v in values
    ):
        return None
    return SaveTimes(float(values[0]), float(values[1]))  # type: ignore[arg-type]
