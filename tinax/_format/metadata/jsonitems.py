"""Checkpointables stored as small JSON files: Grain iterator states, Orbax JSON items,
and tinax's records of pytrees without leaves."""

from __future__ import annotations

from typing import Any

from tinax._format.naming import names
from tinax._format.storage import files
from tinax._format.storage.location import Location


def iterator_files(directory: Location) -> list[tuple[int, int, str]]:
    """``(process index, process count, file name)`` of each iterator state file, in order."""
    found = []
    for name in directory.entries():
        match = names.ITERATOR_FILE.match(name)
        if match:
            found.append((int(match.group(1)), int(match.group(2)), name))
    return sorted(found)


def read_iterator_states(directory: Location, only: str | None = None) -> dict[str, Any]:
    """Each process's saved Grain iterator state, by file name without ``.json``
    (``only`` that file's, if it is there).

    Raises:
      ValueError: If there is no state file, or one is not JSON (naming it).
    """
    states = {
        name.removesuffix(".json"): files.read_json(directory / name, what="Grain iterator state")
        for _, _, name in iterator_files(directory)
        if only is None or name == only
    }
    if not states:
        raise ValueError(f"{str(directory)!r} holds no Grain iterator state file")
    return states


def read_json_item(directory: Location) -> Any:
    """The value of an Orbax JSON checkpointable.

    Raises:
      ValueError: If it has no JSON file, or the file is unreadable.
    """
    for name in names.JSON_FILES:
        path = directory / name
        if path.is_file():
            return files.read_json(path, what="a JSON checkpointable")
    raise ValueError(f"{str(directory)!r} holds no JSON checkpointable file")


def read_empty_record(directory: Location) -> Any:
    """The structure tinax recorded for a pytree without leaves.

    Raises:
      ValueError: If the record is missing or is not tinax's record.
    """
    path = directory / names.EMPTY_PYTREE
    record = files.read_json_object(path, what="tinax's record of a pytree without leaves")
    if "structure" not in record:
        raise ValueError(f"{str(path)!r} has no structure; it is not a tinax empty-pytree record")
    return record["structure"]
