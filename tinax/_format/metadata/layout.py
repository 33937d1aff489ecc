"""Which checkpoint a directory is, and which checkpointables it holds, in which layout.

Recognised: Orbax V1 ``save_checkpointables`` output and ``training.Checkpointer`` steps,
Orbax V0 ``CheckpointManager`` steps (``Composite`` items, grain's ``CheckpointSave``),
flat V0 single-item checkpoints, and tinax's own records of leafless pytrees.
"""

from __future__ import annotations

import dataclasses
import posixpath
from typing import Any

from tinax._format.naming import names
from tinax._format.storage import files
from tinax._format.storage.location import DIRECTORY, FILE, Entry, Location

# How a checkpointable is stored.
PYTREE = "pytree"
ITERATOR = "iterator"
JSON = "json"
EMPTY = "empty"
UNKNOWN = "unknown"

# Files only Orbax writes at a checkpoint's root.
_MARKERS = (
    names.CHECKPOINT_METADATA,
    names.COMMIT_SUCCESS,
    names.ORBAX_MARKER,
    names.PYTREE_METADATA,
)


@dataclasses.dataclass(frozen=True)
class CheckpointRecord:
    """What ``_CHECKPOINT_METADATA`` says.

    Attributes:
      item_handlers: Checkpointable name → handler type name (``None`` where it is
        not a string), a single handler name for a flat checkpoint, or ``None``
        when the record names none.
      committed_nsecs: Commit time in nanoseconds since the epoch, if recorded.
      checksummed: Whether the save recorded that every pytree and iterator
        checkpointable carries tinax checksums (``names.CHECKSUMS_PROMISE``).
      pipelines: The input pipeline each iterator checkpointable was saved from
        (``names.PIPELINES``, read by ``pipeline.saved_pipelines``); empty when
        the save recorded none (Orbax's, an older tinax's).
    """

    item_handlers: dict[str, str | None] | str | None
    committed_nsecs: int | None
    checksummed: bool = False
    pipelines: dict[str, Any] = dataclasses.field(default_factory=dict)


def read_checkpoint_record(path: Location) -> CheckpointRecord:
    """Reads the checkpoint's ``_CHECKPOINT_METADATA``.

    Raises:
      ValueError: If the file is missing, not JSON, or not Orbax's record; the
        message names the file and what is wrong.
    """
    meta_file = path / names.CHECKPOINT_METADATA
    meta = files.read_json_object(meta_file, what="Orbax checkpoint metadata")
    handlers: Any = meta.get("item_handlers")
    if isinstance(handlers, dict):
        for name in handlers:
            check_checkpointable_name(name, meta_file)
        handlers = {k: v if isinstance(v, str) else None for k, v in handlers.items()}
    elif handlers is not None and not isinstance(handlers, str):
        raise ValueError(
            f"{str(meta_file)!r} has item_handlers of type {type(handlers).__name__}; "
            "expected an object or a string"
        )
    stamp = meta.get("commit_timestamp_nsecs")
    committed = None
    # Later than any plausible date (year 2262) is not a time pandas can show.
    if isinstance(stamp, int) and not isinstance(stamp, bool) and 0 < stamp < 2**63:
        committed = stamp
    custom = meta.get("custom_metadata")
    promise = custom.get(names.CHECKSUMS_PROMISE) if isinstance(custom, dict) else None
    checksummed = isinstance(promise, dict) and promise.get("checksums") is True
    pipelines = custom.get(names.PIPELINES) if isinstance(custom, dict) else None
    return CheckpointRecord(
        item_handlers=handlers,
        committed_nsecs=committed,
        checksummed=checksummed,
        pipelines=pipelines if isinstance(pipelines, dict) else {},
    )


def check_checkpointable_name(name: object, meta_file: Location) -> str:
    """A checkpointable name read from metadata, refused unless it is a plain directory name.

    Raises:
      ValueError: Naming ``meta_file``, if ``name`` is not a string or would climb
        out of the checkpoint.
    """
    if not isinstance(name, str):
        raise ValueError(f"{str(meta_file)!r} has a non-string checkpointable name")
    if not name or name in (".", "..") or posixpath.basename(name) != name or "\\" in name:
        raise ValueError(
            f"{str(meta_file)!r} names checkpointable {name!r}, which is not a plain directory name"
        )
    return name


@dataclasses.dataclass(frozen=True)
class StoredCheckpointable:
    """One checkpointable as stored.

    Attributes:
      name: Its name; ``""`` for the single item of a flat V0 checkpoint.
      directory: The directory holding it.
      layout: ``pytree``, ``iterator``, ``json``, ``empty`` or ``unknown``.
    """

    name: str
    directory: Location
    layout: str


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A checkpoint opened: listed once, checked, its layout and commit record read.

    What ``open_checkpoint`` (``tinax.explore``'s and ``tinax.checkpointing``'s, one
    function) gives, and what every load, table, ``verify``, diff and export takes in place of a
    path: none of them lists the checkpoint or reads its metadata again. On an object
    store (``gs://``) it holds the listing of every file under the checkpoint and
    the metadata files read so far (fetched side by side when it was opened), so a
    checkpoint opened once costs its round trips once. Opened again, it is read
    afresh: a checkpoint that changed since is seen as it is now.

    Attributes:
      path: The checkpoint directory.
      checkpointables: What it holds, in stored order.
      committed_nsecs: Commit time from ``_CHECKPOINT_METADATA``, if recorded.
      scan: Size and fingerprint of everything under ``path``.
      checksummed: Whether its save promised tinax checksums for every pytree
        and iterator checkpointable (their absence is then damage).
      pipelines: The record of the input pipelines its iterators were saved from
        (``CheckpointRecord.pipelines``).
    """

    path: Location
    checkpointables: tuple[StoredCheckpointable, ...]
    committed_nsecs: int | None
    scan: files.Scan
    checksummed: bool = False
    pipelines: dict[str, Any] = dataclasses.field(default_factory=dict)

    def get(self, name: object) -> StoredCheckpointable:
        """The checkpointable called ``name``.

        Raises:
          TypeError: If ``name`` is not a string.
          ValueError: If the checkpoint holds no such checkpointable.
        """
        if not isinstance(name, str):
            raise TypeError(f"checkpointable must be a str, got {type(name).__name__}")
        for item in self.checkpointables:
            if item.name == name:
                return item
        raise ValueError(
            f"checkpoint {str(self.path)!r} has no checkpointable {name!r}; it holds "
            f"{[c.name for c in self.checkpointables]}"
        )


def classify(directory: Location, entries: dict[str, Entry] | None = None) -> str | None:
    """The layout of a checkpointable directory, or ``None`` if it holds none.

    ``entries`` are its entries, if the caller has listed them already.
    """
    entries = directory.entries() if entries is None else entries
    if names.PYTREE_METADATA in entries:
        return PYTREE
    if any(names.ITERATOR_FILE.match(name) for name in entries):
        return ITERATOR
    if names.EMPTY_PYTREE in entries:
        return EMPTY
    if any(entries[name].kind == FILE for name in names.JSON_FILES if name in entries):
        return JSON
    return None


def _checkpointable_dirs(directory: Location) -> list[str]:
    """Subdirectories that hold a checkpointable (and are not checkpoints themselves)."""
    return sorted(
        name
        for name, entry in directory.entries().items()
        if entry.kind == DIRECTORY
        and classify(directory / name) is not None
        and not (directory / name / names.CHECKPOINT_METADATA).exists()
    )


def is_uncommitted(directory: Location) -> bool:
    """Whether ``directory`` is a save that has not committed, on storage without renames.

    Where Orbax cannot rename (object stores) it writes a checkpoint into its final
    directory and commits by writing ``commit_success.txt`` last, after
    ``_CHECKPOINT_METADATA``: Orbax's own rule takes a directory with neither for
    unfinished. A checkpoint copied without its marker still has its metadata, and
    counts as committed. On local disk a save commits by renaming, so a directory
    with the final name is never an unfinished save.
    """
    if directory.storage.commits_by_rename or not directory.is_dir():
        return False
    entries = directory.entries()
    return names.COMMIT_SUCCESS not in entries and names.CHECKPOINT_METADATA not in entries


def lacks_commit_marker(directory: Location, entries: dict[str, Entry] | None = None) -> bool:
    """Whether ``directory``, on storage without renames, holds its commit record but
    not Orbax's commit marker (``commit_success.txt``), which Orbax's loader wants.

    Such a directory is a save or a copy cut short between its last two files (a
    promotion of a two-tier run killed there, which the resumed run finishes), or a
    checkpoint copied without its marker: it is no unfinished save
    (``is_uncommitted``), but Orbax does not load it as it is. ``entries`` are its
    entries, if the caller has listed them already.
    """
    if directory.storage.commits_by_rename:
        return False
    entries = directory.entries() if entries is None else entries
    return names.CHECKPOINT_METADATA in entries and names.COMMIT_SUCCESS not in entries


def looks_like_checkpoint(directory: Location, entries: dict[str, Entry] | None = None) -> bool:
    """Whether ``directory`` is meant to be a checkpoint (readable or not).

    ``entries`` are its entries, if the caller has listed them already.
    """
    entries = directory.entries() if entries is None else entries
    return has_marker(entries) or bool(_checkpointable_dirs(directory))


def has_marker(entries: dict[str, Entry]) -> bool:
    """Whether a directory with these entries holds a file only Orbax writes at a
    checkpoint's root."""
    return any(marker in entries for marker in _MARKERS)


def identify(path: Location, scan: files.Scan | None = None) -> Checkpoint:
    """Which checkpoint the directory ``path`` is, and what it holds, from its commit
    record and its listing (the rest of its metadata is the preflight's to read).

    Args:
      path: An existing checkpoint directory.
      scan: ``files.scan(path)``, if the caller has just made it.

    Returns:
      The checkpoint's layout.

    Raises:
      ValueError: If ``path`` is an Orbax temporary directory, not a checkpoint,
        holds a link out of itself, or its ``_CHECKPOINT_METADATA`` is unreadable;
        the message names the path and what is wrong.
    """
    if names.is_temporary_name(path.name):
        raise ValueError(
            f"{str(path)!r} is an Orbax temporary directory: a save in progress or one "
            "that failed, not a checkpoint"
        )
    marked = (
        (path / names.DELETION_MARKER).exists()
        if scan is None
        else names.DELETION_MARKER in scan.listing().get(path.path, {})
    )
    if marked:
        raise ValueError(
            f"{str(path)!r} is being removed (it holds {names.DELETION_MARKER}): "
            "not a checkpoint any more"
        )
    if is_uncommitted(path) and not any(
        entry.kind == DIRECTORY and looks_like_checkpoint(path / name)
        for name, entry in path.entries().items()
    ):
        raise ValueError(
            f"{str(path)!r} is a save that has not committed (it has no "
            f"{names.COMMIT_SUCCESS} and no {names.CHECKPOINT_METADATA}): one in progress "
            "or one that was interrupted, not a checkpoint"
        )
    found = files.scan(path) if scan is None else scan
    # What the walk listed, so that nothing under ``path`` is listed twice.
    listed = found.listing()
    top = listed.get(path.path, {})
    has_record = names.CHECKPOINT_METADATA in top
    record = read_checkpoint_record(path) if has_record else CheckpointRecord(None, None)
    handlers = record.item_handlers

    if isinstance(handlers, dict):
        for name in handlers:
            if name not in top or top[name].kind != DIRECTORY:
                raise ValueError(
                    f"checkpoint {str(path)!r} lists checkpointable {name!r} in "
                    f"{names.CHECKPOINT_METADATA} but has no directory for it"
                )
        item_names = list(handlers)
    elif classify(path, top) is not None or isinstance(handlers, str):
        # A flat checkpoint: the directory itself is the one, unnamed item.
        item = StoredCheckpointable("", path, classify(path, top) or UNKNOWN)
        return Checkpoint(
            path, (item,), record.committed_nsecs, found, record.checksummed, record.pipelines
        )
    else:
        item_names = _checkpointable_dirs(path)

    if not item_names:
        children = [
            name
            for name, entry in path.entries().items()
            if entry.kind == DIRECTORY and looks_like_checkpoint(path / name)
        ]
        if children:
            raise ValueError(
                f"{str(path)!r} is a directory of {len(children)} checkpoint(s), not a "
                "checkpoint; pass one of them, or list them with list_checkpoints"
            )
        if has_record:
            raise ValueError(f"checkpoint {str(path)!r} holds no checkpointables")
        raise ValueError(
            f"{str(path)!r} is not an Orbax checkpoint: it has no "
            f"{names.CHECKPOINT_METADATA} and no checkpointable directories"
        )
    items = tuple(
        StoredCheckpointable(
            n, path / n, classify(path / n, listed.get((path / n).path, {})) or UNKNOWN
        )
        for n in item_names
    )
    if isinstance(handlers, dict):
        for item in items:
            _check_handler_layout(path, item, handlers.get(item.name))
    return Checkpoint(
        path, items, record.committed_nsecs, found, record.checksummed, record.pipelines
    )


# What a checkpointable written by a known handler must hold, by the end of its name.
_HANDLER_LAYOUTS = {
    "PyTreeHandler": (PYTREE, names.PYTREE_METADATA),
    "StatefulCheckpointableHandler": (ITERATOR, "a Grain iterator state file"),
    "EmptyPyTreeHandler": (EMPTY, names.EMPTY_PYTREE),
}


def _check_handler_layout(path: Location, item: StoredCheckpointable, handler: str | None) -> None:
    """Refuses a checkpointable whose files are not what its recorded handler writes."""
    if handler is None:
        return
    expected = _HANDLER_LAYOUTS.get(handler.rsplit(".", 1)[-1])
    if expected is not None and item.layout != expected[0]:
        raise ValueError(
            f"checkpoint {str(path)!r}: checkpointable {item.name!r} was written by "
            f"{handler.rsplit('.', 1)[-1]} but has no {expected[1]}"
        )


def checkpointable_names(path: Location) -> list[str]:
    """The names of the checkpointables stored at ``path``, from metadata only.

    Without a handler record (older checkpoints), every subdirectory counts.

    Raises:
      ValueError: If ``path`` is not a readable Orbax checkpoint, naming the path
        and what is wrong.
    """
    if not (path / names.CHECKPOINT_METADATA).exists():
        raise ValueError(
            f"{str(path)!r} is not an Orbax checkpoint: it has no {names.CHECKPOINT_METADATA} file"
        )
    handlers = read_checkpoint_record(path).item_handlers
    if isinstance(handlers, dict):
        return list(handlers)
    return sorted(name for name, e in path.entries().items() if e.kind == DIRECTORY)
