"""The one check every read of a checkpoint passes before anything in it is read.

Loads (``tinax.checkpointing``), tables and ``read_leaf`` (``tinax.explore``), the
listing and the widgets all call ``check`` first, so a checkpoint is refused for
the same reasons, in the same words, whoever reads it:

- the walk: regular files and directories only (no links, FIFOs, sockets or
  devices, which Orbax would follow or block on), UTF-8 names (``files.scan``);
- Orbax's record of the checkpoint and the layout of every checkpointable
  (``layout.open_checkpoint``);
- every metadata file a reader parses, tinax's or Orbax's own: size-capped,
  read without following links, and JSON (UTF-8, bounded nesting), nothing else;
- binary bookkeeping (OCDBT manifests) size-capped; array data left to its reader.

A refusal is a ``ValueError`` naming the file. It only reads files; tensorstore is
not involved, so a restore verdict or a table built after it reads a checked tree.
"""

from __future__ import annotations

from tinax._format import files, layout, names
from tinax._format.storage import Location

# Files parsed as JSON wherever they appear in a checkpoint, with what they hold.
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
_JSON_DIRECTORIES = {
    names.ARRAY_METADATAS: "Orbax array metadata",
    names.CHECKSUMS_DIR: "tinax checksums",
}
# Small files Orbax reads whole that are not JSON.
_CAPPED_FILES = {
    names.OCDBT_MANIFEST: files.MAX_METADATA_BYTES,
    names.COMMIT_SUCCESS: files.MAX_SMALL_JSON_BYTES,
    names.ORBAX_MARKER: files.MAX_SMALL_JSON_BYTES,
}


def _json_kind(where: Location) -> str | None:
    """What a file holds if it is one of the JSON files readers parse, else ``None``."""
    name = where.name
    if name in _JSON_FILES:
        return _JSON_FILES[name]
    if names.ITERATOR_FILE.match(name):
        return "Grain iterator state"
    return _JSON_DIRECTORIES.get(where.parent.name)


def check(path: Location) -> layout.Checkpoint:
    """Checks the checkpoint at ``path`` before anything reads it; returns its layout.

    Args:
      path: An existing checkpoint directory.

    Returns:
      The checkpoint's layout, as ``layout.open_checkpoint`` finds it.

    Raises:
      ValueError: If anything under ``path`` is not a plain file or directory,
        a metadata file is too large or not JSON, or ``path`` is not a readable
        checkpoint; the message names the offending file.
    """
    checkpoint = layout.open_checkpoint(path)
    for where, entry in checkpoint.scan.found:
        what = _json_kind(where)
        if what is not None:
            files.read_json(where, what=what, max_bytes=files.MAX_METADATA_BYTES)
            continue
        cap = _CAPPED_FILES.get(where.name)
        if cap is not None and entry.size > cap:
            raise ValueError(
                f"{str(where)!r} is {entry.size} bytes, implausibly large for "
                f"{where.name}; refusing to read more than {cap}"
            )
    return checkpoint
