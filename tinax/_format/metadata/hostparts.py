"""Host parts: what one process of a job saves of a checkpoint on its own host, and
which files of each part make the whole checkpoint.

A job of several processes on several hosts keeps a local tier on each host: every
process saves what it owns into a directory of its own host (Orbax's
``primary_host=None`` over that process alone): each distinct shard its devices
hold, once, whatever its replica; its Grain iterator's state; its checksums; and
the files every process writes alike (``_METADATA``, ``_sharding``, the commit
record). Such a checkpoint is a *host part*: Orbax's layout, whose arrays hold this
process's chunks only, and whose ``_METADATA`` says so
(``store_array_data_equal_to_fill_value`` false: not every chunk is stored; readers
then expect none to be).

The parts of every process make one ordinary checkpoint, as a save of the whole job
to one directory would have made it: each process's own files from its part (its
OCDBT store ``ocdbt.process_<i>/``, its ``array_metadatas/process_<i>``, its
checksums, its iterator state), the files shared by every part from process 0's,
each pytree's OCDBT root merged from the processes' stores (as Orbax's finalize
merges them; the parts' own roots are not sent), its ``_METADATA`` saying again that
every chunk is stored, and the commit record last.
"""

from __future__ import annotations

import json

from tinax._format.naming import names
from tinax._format.storage import files, removal
from tinax._format.storage.copied_files import SourceFile
from tinax._format.storage.location import Location

# The key of Orbax's ``_METADATA`` that says every chunk was written.
ALL_CHUNKS_STORED = "store_array_data_equal_to_fill_value"
# The files a whole checkpoint's commit writes: its record, and (on object stores) the
# marker that it is whole. Neither is sent with the parts.
COMMIT_FILES = frozenset({names.CHECKPOINT_METADATA, names.COMMIT_SUCCESS})


def owner(relative: tuple[str, ...]) -> int | None:
    """The process whose own file of a part ``relative`` is (its path components below
    the checkpoint), or ``None`` for a file every part holds alike."""
    if len(relative) < 2:
        return None
    inner = relative[1:]
    first = inner[0]
    if first.startswith(names.OCDBT_PROCESS_PREFIX) and len(inner) > 1:
        number = first[len(names.OCDBT_PROCESS_PREFIX) :]
        return int(number) if number.isdigit() else None
    if len(inner) == 2 and first in (names.ARRAY_METADATAS, names.CHECKSUMS_DIR):
        found = names.CHECKSUM_FILE.match(inner[1]) or names.ARRAY_METADATA_FILE.match(inner[1])
        return int(found.group(1)) if found else None
    if len(inner) == 1 and (found := names.ITERATOR_FILE.match(first)):
        return int(found.group(1))
    return None


def is_store_root(relative: tuple[str, ...]) -> bool:
    """Whether ``relative`` is a file of a pytree's OCDBT root (its manifest, or a node
    of its B+tree), which the merge of the processes' stores makes anew."""
    return len(relative) >= 2 and (
        relative[1:] == (names.OCDBT_MANIFEST,) or relative[1] == names.OCDBT_DATA
    )


def sent_by(files_of_part: list[SourceFile], process: int) -> list[SourceFile]:
    """The files process ``process`` sends of its part: its own, and (process 0) the ones
    every part shares; never a store's root, nor the commit files."""
    return [
        f
        for f in files_of_part
        if f.relative not in {(name,) for name in COMMIT_FILES}
        and not is_store_root(f.relative)
        and (owner(f.relative) == process or (process == 0 and owner(f.relative) is None))
    ]


def stores(files_of_part: list[SourceFile]) -> list[str]:
    """The pytree checkpointables whose arrays are in an OCDBT store (their roots are
    merged from the processes' stores)."""
    return sorted({f.relative[0] for f in files_of_part if is_store_root(f.relative)})


def mark_chunks(directory: Location, stored: bool) -> None:
    """Rewrites a pytree's ``_METADATA`` to say whether every chunk is stored.

    Raises:
      ValueError: If the file is missing or not Orbax's pytree metadata.
    """
    where = directory / names.PYTREE_METADATA
    found = files.read_json_object(where, what="Orbax pytree metadata")
    if ALL_CHUNKS_STORED not in found and "tree_metadata" not in found:
        raise ValueError(f"{str(where)!r} is not Orbax's pytree metadata")
    found[ALL_CHUNKS_STORED] = stored
    removal.replace_file(where, json.dumps(found).encode("utf-8"))
