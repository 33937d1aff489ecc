"""Which checkpoint a directory is, and which checkpointables it holds, in which layout.

Recognised: Orbax V1 ``save_checkpointables`` output and ``training.Checkpointer`` steps,
Orbax V0 ``CheckpointManager`` steps (``Composite`` items, grain's ``CheckpointSave``),
flat V0 single-item checkpoints, and tinax's own records of leafless pytrees.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from tinax._format.metadata.commit_record import CheckpointRecord, read_checkpoint_record
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


_T = TypeVar("_T")
# A JSON file up to this size keeps its bytes beside its parsed document (an iterator's
# state is both parsed and checked against its checksum); a larger one only its document.
_KEPT_BYTES = 1 << 20


class _Kept:
    """What has been read of one opened checkpoint, each thing once, on any thread.

    A refusal (``ValueError``: a file that is missing, too large or garbled) is kept
    too, and raised again to whoever asks next, without reading the file again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[Hashable, Any] = {}
        self._reading: dict[Hashable, threading.Lock] = {}

    def get(self, key: Hashable, read: Callable[[], _T]) -> _T:
        with self._lock:
            if key in self._values:
                return self._kept(key)
            reading = self._reading.setdefault(key, threading.Lock())
        with reading:  # another thread reading the same thing: wait for its result
            with self._lock:
                if key in self._values:
                    return self._kept(key)
            try:
                value: Any = read()
            except ValueError as e:
                value = e
            with self._lock:
                self._values[key] = value
                self._reading.pop(key, None)
        return self._kept(key)

    def holds(self, key: Hashable) -> bool:
        """Whether ``key`` has been read (or refused) already."""
        with self._lock:
            return key in self._values

    def _kept(self, key: Hashable) -> Any:
        value = self._values[key]
        if isinstance(value, ValueError):
            raise value
        return value


@dataclasses.dataclass(frozen=True)
class StoredCheckpointable:
    """One checkpointable as stored.

    Attributes:
      name: Its name; ``""`` for the single item of a flat V0 checkpoint.
      directory: The directory holding it.
      layout: ``pytree``, ``iterator``, ``json``, ``empty`` or ``unknown``.
      checkpoint: The opened checkpoint it belongs to (set by ``Checkpoint``), which
        keeps what is read of it.
    """

    name: str
    directory: Location
    layout: str
    checkpoint: Checkpoint = dataclasses.field(
        init=False,
        repr=False,
        compare=False,
        hash=False,
        default=None,  # type: ignore[assignment]
    )

    def entries(self) -> dict[str, Entry]:
        """Its directory's entries, as its checkpoint's walk found them."""
        return self.checkpoint.entries(self.directory)


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
      record: Its commit record as read when it was opened (``None`` if it has none).
    """

    path: Location
    checkpointables: tuple[StoredCheckpointable, ...]
    committed_nsecs: int | None
    scan: files.Scan
    checksummed: bool = False
    pipelines: dict[str, Any] = dataclasses.field(default_factory=dict)
    record: CheckpointRecord | None = dataclasses.field(default=None, compare=False)
    # What has been read of it so far (``kept``); a replaced copy starts afresh.
    _kept: _Kept = dataclasses.field(
        default_factory=_Kept, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        # Each checkpointable reaches what is kept of its checkpoint through it.
        items = tuple(dataclasses.replace(item) for item in self.checkpointables)
        for item in items:
            object.__setattr__(item, "checkpoint", self)
        object.__setattr__(self, "checkpointables", items)

    def kept(self, key: Hashable, read: Callable[[], _T]) -> _T:
        """What ``read()`` returns, read the first time it is asked for and kept on
        this checkpoint for every later reader (a ``ValueError`` too, raised again).

        ``key`` names what is read: a tuple starting with the reading module's name.
        Do not modify what is returned: every reader of this checkpoint shares it.
        """
        return self._kept.get(key, read)

    def holds(self, key: Hashable) -> bool:
        """Whether what ``key`` names has been read (or refused) on this checkpoint."""
        return self._kept.holds(key)

    def entries(self, directory: Location) -> dict[str, Entry]:
        """The entries of ``directory`` (this checkpoint's or one below it), as the walk
        made when it was opened found them: nothing is listed again.

        Do not modify the result.
        """
        return self.scan.listing().get(directory.path, {})

    def files_under(self, directory: Location) -> list[tuple[Location, Entry]]:
        """Every regular file under ``directory`` (this checkpoint's or one below it), in
        the walk's order, as the walk made when it was opened found them."""
        below = directory.path.rstrip("/") + "/"
        return [(where, entry) for where, entry in self.scan.found if where.path.startswith(below)]

    def entry(self, where: Location) -> Entry | None:
        """What the walk found at ``where`` (under this checkpoint), if anything."""
        parent, name = where.storage.split(where.path)
        return self.scan.listing().get(parent, {}).get(name)

    def read_bytes(self, where: Location, *, what: str, max_bytes: int) -> bytes:
        """The bytes of the file ``where`` under this checkpoint, read once and kept
        (``files.read_bytes``'s checks, against the walk's entry for it).

        Raises:
          ValueError: As ``files.read_bytes``.
        """
        return self.kept(
            ("bytes", where.path),
            lambda: files.read_listed_bytes(
                where, self.entry(where), what=what, max_bytes=max_bytes
            ),
        )

    def read_json(
        self,
        where: Location,
        *,
        what: str,
        max_bytes: int = files.MAX_SMALL_JSON_BYTES,
        max_depth: int | None = files.MAX_JSON_DEPTH,
    ) -> Any:
        """The JSON document in the file ``where`` under this checkpoint, read and parsed
        once and kept (``files.read_json``); do not modify it.

        Raises:
          ValueError: As ``files.read_json``.
        """

        def parse() -> Any:
            entry = self.entry(where)
            if self._kept.holds(("bytes", where.path)) or (
                entry is not None and entry.size <= _KEPT_BYTES
            ):
                # Small files' bytes are kept too: a checksum of the file reads them.
                data = self.read_bytes(where, what=what, max_bytes=max_bytes)
            else:
                data = files.read_listed_bytes(where, entry, what=what, max_bytes=max_bytes)
            return files.parse_json(data, path=where, what=what, max_depth=max_depth)

        return self.kept(("json", where.path), parse)

    def read_json_object(
        self,
        where: Location,
        *,
        what: str,
        max_bytes: int = files.MAX_SMALL_JSON_BYTES,
        max_depth: int | None = files.MAX_JSON_DEPTH,
    ) -> dict[str, Any]:
        """``read_json`` of a file that must hold a JSON object.

        Raises:
          ValueError: As ``files.read_json_object``.
        """
        value = self.read_json(where, what=what, max_bytes=max_bytes, max_depth=max_depth)
        if not isinstance(value, dict):
            raise ValueError(
                f"{str(where)!r} ({what}) holds a JSON {type(value).__name__}, not an object"
            )
        return value

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


def identify(
    path: Location, scan: files.Scan | None = None, record: CheckpointRecord | None = None
) -> Checkpoint:
    """Which checkpoint the directory ``path`` is, and what it holds, from its commit
    record and its listing (the rest of its metadata is the preflight's to read).

    Args:
      path: An existing checkpoint directory.
      scan: ``files.scan(path)``, if the caller has just made it.
      record: ``read_checkpoint_record(path)``, if the caller has just read it.

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
    if record is None:
        record = read_checkpoint_record(path, top) if has_record else CheckpointRecord(None, None)
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
            path,
            (item,),
            record.committed_nsecs,
            found,
            record.checksummed,
            record.pipelines,
            record if has_record else None,
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
        path,
        items,
        record.committed_nsecs,
        found,
        record.checksummed,
        record.pipelines,
        record if has_record else None,
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
