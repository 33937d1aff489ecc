"""The one check every read of a checkpoint passes before anything in it is read.

Loads (``tinax.checkpointing``), tables and ``read_leaf`` (``tinax.explore``), the
listing and the widgets all call ``check`` first, so a checkpoint is refused for
the same reasons, in the same words, whoever reads it:

- the walk: regular files and directories only (no links, FIFOs, sockets or
  devices, which Orbax would follow or block on), UTF-8 names (``files.scan``);
- Orbax's record of the checkpoint and the layout of every checkpointable
  (``layout.identify``);
- every metadata file a reader parses, tinax's or Orbax's own: size-capped,
  read without following links, and JSON (UTF-8, bounded nesting), nothing else;
- binary bookkeeping (OCDBT manifests) size-capped; array data left to its reader.

A refusal is a ``ValueError`` naming the file. It only reads files; tensorstore is
not involved, so a restore verdict or a table built after it reads a checked tree.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from tinax._format.integrity import checksums
from tinax._format.metadata import commit_record, layout, pytree
from tinax._format.naming import names, words
from tinax._format.storage import files
from tinax._format.storage.location import FILE, Location

# Files parsed as JSON wherever they appear in a checkpoint, with what they hold.
# Orbax's large per-leaf metadata is parsed without a depth walk (tens of thousands of
# entries; the parser itself refuses a nesting bomb, and Orbax reads these documents
# field by field); smaller documents that readers walk are held to files.MAX_JSON_DEPTH.
_FLAT_JSON = frozenset({names.STRINGS, names.SHARDINGS})
# Parsed and checked field by field by their own readers below.
_OWN_READERS = frozenset({names.PYTREE_METADATA})
_JSON_FILES = {
    names.CHECKPOINT_METADATA: "Orbax checkpoint metadata",
    names.ROOT_METADATA: "Orbax root metadata",
    names.PYTREE_METADATA: "Orbax pytree metadata",
    names.STRINGS: "Orbax string leaves",
    names.SHARDINGS: "Orbax array shardings",
    names.ZARR3_METADATA: "zarr array metadata",
    names.ZARR2_METADATA: "zarr array metadata",
    ".zattrs": "zarr array attributes",
    names.EMPTY_PYTREE: "tinax's record of a pytree without leaves",
    "data.json": "a JSON checkpointable",
}
# Directories whose every file is JSON.
_JSON_DIRECTORIES = {names.ARRAY_METADATAS: "Orbax array metadata"}
# Read by their own readers below (checksums.read_checksums checks them field by field).
_CAPPED_DIRECTORIES = {names.CHECKSUMS_DIR: files.MAX_METADATA_BYTES}
# Small files Orbax reads whole that are not JSON.
_CAPPED_FILES = {
    names.OCDBT_MANIFEST: files.MAX_METADATA_BYTES,
    names.COMMIT_SUCCESS: files.MAX_SMALL_JSON_BYTES,
    names.ORBAX_MARKER: files.MAX_SMALL_JSON_BYTES,
}


def _json_kind(name: str, parent: str) -> str | None:
    """What a file called ``name`` in a directory called ``parent`` holds if it is one
    of the JSON files readers parse, else ``None``."""
    if name in _JSON_FILES:
        return _JSON_FILES[name]
    if names.ITERATOR_FILE.match(name):
        return "Grain iterator state"
    return _JSON_DIRECTORIES.get(parent)


def _check_array_metadatas(where: Location, document: Any) -> None:
    """Orbax's per-process array metadata: a list of records with shapes, by param."""
    records = document.get("array_metadatas") if isinstance(document, dict) else None
    if not isinstance(records, list):
        raise ValueError(f"{str(where)!r} (Orbax array metadata) has no array_metadatas list")
    for record in records:
        entry = record.get("array_metadata") if isinstance(record, dict) else None
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("param_name"), str)
            or not isinstance(entry.get("write_shape"), list)
            or not isinstance(entry.get("chunk_shape"), list)
        ):
            raise ValueError(
                f"{str(where)!r} (Orbax array metadata) has a record without a param "
                "name, write shape and chunk shape"
            )


def check_store_files(item: layout.StoredCheckpointable) -> None:
    """The size caps of ``check`` for the bookkeeping of one array store, alone, as its
    checkpoint's walk found its files.

    For readers that go on past a refusal (``verify``): tensorstore reads these
    files whole, so one of them must never be huge.

    Raises:
      ValueError: Naming a file that is too large.
    """
    below = item.directory.path.rstrip("/") + "/"
    for where, entry in item.checkpoint.scan.found:
        if not where.path.startswith(below):
            continue
        cap = _CAPPED_FILES.get(where.name)
        if cap is not None and entry.kind == FILE and entry.size > cap:
            raise ValueError(
                f"{str(where)!r} is {entry.size} bytes, implausibly large for "
                f"{where.name}; refusing to read more than {cap}"
            )


# Small files at a checkpoint's root that readers after the check parse.
_ROOT_RECORDS = frozenset({names.SAVE_TIMES, names.CORRUPT_RECORD, names.ABANDONED_RECORD})


def prefetch_metadata(listed: Location, scan: files.Scan | None = None) -> None:
    """Fetches every metadata file the check and the readers after it parse, side by
    side, into ``listed`` (a snapshot): on an object store the reads that follow then
    cost no round trip each. A listing that cannot be walked is left to the check.
    """
    listed.storage.prefetch(metadata_files(listed, scan), files.MAX_METADATA_BYTES)


def metadata_files(listed: Location, scan: files.Scan | None = None) -> list[str]:
    """The paths of the metadata files under the checkpoint ``listed`` that the check
    and the readers after it parse (none if it cannot be walked)."""
    try:
        found = files.scan(listed) if scan is None else scan
    except ValueError:
        return []
    split = listed.storage.split
    wanted = []
    for where, entry in found.found:
        if entry.kind != FILE:
            continue
        name = entry.name
        parent = split(split(where.path)[0])[1]
        if (
            name in _OWN_READERS
            or name in _ROOT_RECORDS
            or name == names.SHARDINGS
            or _json_kind(name, parent) is not None
            or parent == names.CHECKSUMS_DIR
        ):
            wanted.append(where.path)
    return wanted


def check(
    path: Location,
    scan: files.Scan | None = None,
    record: commit_record.CheckpointRecord | None = None,
    *,
    every_record: bool = True,
) -> layout.Checkpoint:
    """Checks the checkpoint at ``path`` before anything reads it; returns it opened, with
    every metadata file it parsed kept on it (its readers parse none of them again).

    Args:
      path: An existing checkpoint directory.
      scan: ``files.scan(path)``, if the caller has just made it (a listing has).
      record: Its commit record, if the caller has just read it.
      every_record: Whether a pytree's checksum records are decoded and checked
        leaf by leaf now; if not, only their keys are read (a record for every
        stored value is still required), for a reader of one leaf that decodes and
        checks its own (``checksums.read_checksum``).

    Returns:
      The checkpoint's layout, as ``layout.identify`` finds it.

    Raises:
      ValueError: If anything under ``path`` is not a plain file or directory,
        a metadata file is too large or not JSON, or ``path`` is not a readable
        checkpoint; the message names the offending file.
    """
    # Listed once: on an object store, one request instead of one per directory.
    snapshot = path.snapshot()
    if snapshot.storage.parallel_reads:
        prefetch_metadata(snapshot, scan)
    checkpoint = layout.identify(snapshot, scan, record)
    # Read and checked as JSON by layout.identify already.
    record_file = (checkpoint.path / names.CHECKPOINT_METADATA).path
    split = checkpoint.path.storage.split
    for where, entry in checkpoint.scan.found:
        # The walk's names: a run of a thousand checkpoints has ten thousand files.
        name = entry.name
        if name in _OWN_READERS or where.path == record_file:
            continue
        parent = split(split(where.path)[0])[1]
        what = "Orbax array shardings" if name == names.SHARDINGS else _json_kind(name, parent)
        if what is not None:
            flat = name in _FLAT_JSON or parent == names.ARRAY_METADATAS
            # Kept on the checkpoint: its readers after the check parse none of them again.
            document = checkpoint.read_json(
                where,
                what=what,
                max_bytes=files.MAX_METADATA_BYTES,
                max_depth=None if flat else files.MAX_JSON_DEPTH,
            )
            if parent == names.ARRAY_METADATAS:
                _check_array_metadatas(where, document)
            continue
        cap = _CAPPED_FILES.get(name) or _CAPPED_DIRECTORIES.get(parent)
        if cap is not None and entry.size > cap:
            raise ValueError(
                f"{str(where)!r} is {entry.size} bytes, implausibly large for "
                f"{name}; refusing to read more than {cap}"
            )
    checksums.check_promise(checkpoint)
    for item in checkpoint.checkpointables:
        tree = pytree.read_layout(item) if item.layout == layout.PYTREE else None
        if item.layout in checksums.CHECKSUMMED_LAYOUTS:
            records: Collection[str] | None
            if tree is not None and not every_record:
                records = checksums.recorded_keys(item)
            else:
                records = checksums.read_checksums(item)
            if tree is not None and records is not None and checkpoint.checksummed:
                _check_coverage(checkpoint, item.name, tree, records)
    return checkpoint


def _check_coverage(
    checkpoint: layout.Checkpoint,
    name: str,
    tree: pytree.PyTreeLayout,
    records: Collection[str],
) -> None:
    """Every stored value of a checksummed save's pytree has its record."""
    for leaf in tree.leaves:
        if leaf.stored and leaf.kind in _RECORDED_KINDS and leaf.key not in records:
            raise checksums.CorruptDataError(
                f"checkpoint {str(checkpoint.path)!r}: checkpointable {name!r}: leaf "
                f"{leaf.key} has no checksum, though its save recorded one for every value"
            )


_RECORDED_KINDS = frozenset({*words.STORED_ARRAY_KINDS, words.STRING})
