"""The metrics a save logged, as its commit record holds them: read with the record.

A tinax training save records the numeric 0-d values of its auxiliary state under
``names.METRICS_RECORD`` in the commit record's ``custom_metadata``, as
``{"checkpointable": name, "values": {dotted key: number}}`` (JSON has no NaN or
infinity: those are the strings ``"nan"``, ``"inf"`` and ``"-inf"``); Orbax's V1
``training.Checkpointer`` records ``metrics`` at the record's top level. Reading them
costs nothing beyond the record a listing reads anyway; a NaN among them makes the
checkpoint ``diverged`` before its data is read (``integrity.health``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tinax._format.metadata.commit_record import CheckpointRecord
from tinax._format.naming import names

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def recorded(custom_metadata: object, checkpointable: str | None) -> dict[str, float] | None:
    """The metrics recorded for ``checkpointable`` (``None``: whichever it is) in a
    commit record's ``custom_metadata``; ``None`` where there is no such record (a save
    by Orbax, or by another checkpointable's name), or it is not one."""
    if not isinstance(custom_metadata, Mapping):
        return None
    found = custom_metadata.get(names.METRICS_RECORD)
    if not isinstance(found, Mapping) or (
        checkpointable is not None and found.get("checkpointable") != checkpointable
    ):
        return None
    values = found.get("values")
    if not isinstance(values, Mapping):
        return None
    out: dict[str, float] = {}
    for key, value in values.items():
        if not isinstance(key, str):
            return None
        if isinstance(value, str):
            if value not in _NONFINITE:
                return None
            out[key] = _NONFINITE[value]
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = float(value)
        else:
            return None
    return out


def logged(record: CheckpointRecord | None) -> dict[str, float]:
    """The metrics a commit record holds: those a tinax training save recorded, and the
    numbers Orbax records as ``metrics`` (V1 ``training.Checkpointer``); NaN and
    infinities included. Empty for no record."""
    found: dict[str, float] = {}
    if record is None:
        return found
    for key, value in record.metrics.items():
        if isinstance(key, str) and isinstance(value, int | float) and not isinstance(value, bool):
            found[key] = float(value)
    tinax = recorded(record.custom_metadata, None)
    if tinax:
        found.update(tinax)
    return found


def own_health(record: CheckpointRecord | None) -> dict[str, Any] | None:
    """The health a checkpoint's writer recorded in its commit record, having read every
    value it holds (``names.HEALTH_RECORD``: a derived or averaged checkpoint's)."""
    found = None if record is None else record.custom_metadata.get(names.HEALTH_RECORD)
    return dict(found) if isinstance(found, Mapping) else None
