"""Orbax's per-process records of the arrays each process wrote (``array_metadatas/``).

Orbax V1 writes one per process: each array's name, the shape of the part that
process wrote and the chunk shape it wrote with. ``verify`` holds them against the
array store's own metadata.
"""

from __future__ import annotations

import dataclasses

from tinax._format.metadata.arrays import int_tuple
from tinax._format.metadata.layout import StoredCheckpointable
from tinax._format.naming import names
from tinax._format.storage import files


@dataclasses.dataclass(frozen=True)
class WrittenArray:
    """What one process recorded of an array it wrote (``array_metadatas/process_<i>``).

    Attributes:
      param: Orbax's name for the array.
      write_shape: The shape of the part of the array that process wrote.
      chunk_shape: The chunk shape it wrote with.
    """

    param: str
    write_shape: tuple[int, ...] | None
    chunk_shape: tuple[int, ...] | None


def read_written_arrays(item: StoredCheckpointable) -> dict[str, list[WrittenArray]]:
    """Each process's record of the arrays it wrote, by file name under ``array_metadatas``
    (each file read through the opened checkpoint: once, whoever else reads it).

    Returns an empty dict when the checkpointable has no such records (Orbax V0).

    Raises:
      ValueError: If a record is unreadable or not Orbax's, naming the file.
    """
    folder = item.directory / names.ARRAY_METADATAS
    if names.ARRAY_METADATAS not in item.entries():
        return {}
    out: dict[str, list[WrittenArray]] = {}
    for name in sorted(item.checkpoint.entries(folder)):
        path = folder / name
        record = item.checkpoint.read_json_object(
            path,
            what="Orbax's record of the arrays a process wrote",
            max_bytes=files.MAX_METADATA_BYTES,
            max_depth=None,
        )
        entries = record.get("array_metadatas")
        if not isinstance(entries, list):
            raise ValueError(f"{str(path)!r} has no array_metadatas list")
        written = []
        for entry in entries:
            meta = entry.get("array_metadata") if isinstance(entry, dict) else None
            if not isinstance(meta, dict) or not isinstance(meta.get("param_name"), str):
                raise ValueError(f"{str(path)!r} has an entry without a param_name")
            written.append(
                WrittenArray(
                    param=meta["param_name"],
                    write_shape=int_tuple(meta.get("write_shape")),
                    chunk_shape=int_tuple(meta.get("chunk_shape")),
                )
            )
        out[name] = written
    return out
