"""Checkpointables stored as small JSON files: Grain iterator states, Orbax JSON items,
and tinax's records of pytrees without leaves, read through their opened checkpoint
(each file once, kept on it)."""

from __future__ import annotations

from typing import Any

from tinax._format.metadata.layout import StoredCheckpointable
from tinax._format.naming import names
from tinax._format.storage import files
from tinax._format.storage.location import FILE, Location


def iterator_files(item: StoredCheckpointable) -> list[tuple[int, int, str]]:
    """``(process index, process count, file name)`` of each iterator state file, in
    order, as its checkpoint's walk found them."""
    found = []
    for name in item.entries():
        match = names.ITERATOR_FILE.match(name)
        if match:
            found.append((int(match.group(1)), int(match.group(2)), name))
    return sorted(found)


def read_iterator_states(item: StoredCheckpointable, only: str | None = None) -> dict[str, Any]:
    """Each process's saved Grain iterator state, by file name without ``.json``
    (``only`` that file's, if it is there). Do not modify them: they are kept.

    Raises:
      ValueError: If there is no state file, or one is not JSON (naming it).
    """
    states = {
        name.removesuffix(".json"): item.checkpoint.read_json(
            item.directory / name, what="Grain iterator state"
        )
        for _, _, name in iterator_files(item)
        if only is None or name == only
    }
    if not states:
        raise ValueError(f"{str(item.directory)!r} holds no Grain iterator state file")
    return states


def read_json_item(item: StoredCheckpointable) -> Any:
    """The value of an Orbax JSON checkpointable.

    Raises:
      ValueError: If it has no JSON file, or the file is unreadable.
    """
    entries = item.entries()
    for name in names.JSON_FILES:
        if name in entries and entries[name].kind == FILE:
            return item.checkpoint.read_json(item.directory / name, what="a JSON checkpointable")
    raise ValueError(f"{str(item.directory)!r} holds no JSON checkpointable file")


_EMPTY_WHAT = "tinax's record of a pytree without leaves"


def read_empty_record(item: StoredCheckpointable) -> Any:
    """The structure tinax recorded for a pytree without leaves.

    Raises:
      ValueError: If the record is missing or is not tinax's record.
    """
    path = item.directory / names.EMPTY_PYTREE
    return _structure(path, item.checkpoint.read_json_object(path, what=_EMPTY_WHAT))


def read_empty_record_at(directory: Location) -> Any:
    """``read_empty_record`` of a checkpointable no opened checkpoint holds (one Orbax's
    handler loads from a path it was given).

    Raises:
      ValueError: As ``read_empty_record``.
    """
    path = directory / names.EMPTY_PYTREE
    return _structure(path, files.read_json_object(path, what=_EMPTY_WHAT))


def _structure(path: Location, record: dict[str, Any]) -> Any:
    if "structure" not in record:
        raise ValueError(f"{str(path)!r} has no structure; it is not a tinax empty-pytree record")
    return record["structure"]
