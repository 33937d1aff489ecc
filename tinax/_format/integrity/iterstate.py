"""What a Grain iterator's saved state may hold, checked before Grain reads it.

A load checks each state file with these rules before the caller's iterator is
touched, and ``tinax.explore.verify`` and ``diff_table`` check with the same rules,
so that none of them calls a state sound that the load refuses. A state that its
checksum record vouches for (a rewrite of both, say) is still refused when Grain
could not resume from it: an index that is negative, not an integer or beyond 64
bits, or a number JSON does not have (``NaN``, ``Infinity``).
"""

from __future__ import annotations

import math
from typing import Any

from tinax._format.metadata import jsonitems
from tinax._format.metadata.layout import StoredCheckpointable
from tinax._format.naming.keys import format_key

# Grain keeps positions in 64-bit integers.
_MIN_INT = -(2**63)
_MAX_INT = 2**63 - 1
# Keys whose value is a position in the dataset: a non-negative integer.
INDEX_KEYS = frozenset({"next_index", "global_next_index"})


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "null" if value is None else type(value).__name__


def state_problems(state: Any) -> list[str]:
    """What is wrong with one saved Grain iterator state (empty when nothing is)."""
    if not isinstance(state, dict):
        return [f"the state is a JSON {_json_kind(state)}, not an object"]
    problems: list[str] = []
    pending: list[tuple[tuple[str | int, ...], Any]] = [((), state)]
    while pending:
        path, value = pending.pop()
        where = format_key(path) or "the state"
        if isinstance(value, dict):
            for key, item in value.items():
                part = (*path, str(key))
                if key in INDEX_KEYS and not _is_index(item):
                    problems.append(
                        f"{format_key(part)} is {item!r}: a position in the dataset is a "
                        f"non-negative integer of at most {_MAX_INT}"
                    )
                    continue
                pending.append((part, item))
        elif isinstance(value, list):
            pending.extend(((*path, i), item) for i, item in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{where} is {value!r}, a number JSON does not have")
        elif (
            isinstance(value, int)
            and not isinstance(value, bool)
            and not _MIN_INT <= value <= _MAX_INT
        ):
            problems.append(f"{where} is {value}, beyond a 64-bit integer")
    return sorted(problems)


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_INT


def check_states(item: StoredCheckpointable, only: str | None = None) -> None:
    """Refuses an iterator checkpointable whose saved states Grain could not resume from.

    Args:
      item: The iterator checkpointable of an opened checkpoint.
      only: The one state file to check (the one this process's load reads: on a
        bucket, each process of a large job would otherwise read every process's);
        every state file if ``None``.

    Raises:
      ValueError: Naming the state file and what is wrong in it, or if a state
        file is missing or not JSON.
    """
    for stem, state in jsonitems.read_iterator_states(item, only).items():
        problems = state_problems(state)
        if problems:
            raise ValueError(
                f"{str(item.directory / (stem + '.json'))!r} is not a Grain iterator state a "
                f"load can resume from: {'; '.join(problems)}"
            )
