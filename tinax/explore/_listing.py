"""A run directory as a table of its checkpoints.

(Over 500 lines: the listing cache, the quick and the deep listing and the one bulk
read of every checkpoint's array store share their rows and verdicts; the format's
own checks live in ``tinax._format``.)
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from tinax import _claims, _paths
from tinax._format.integrity import preflight
from tinax._format.lru import LruCache, check_bound
from tinax._format.metadata import arrays, commit_record, layout, logged, pytree
from tinax._format.metadata.layout import Checkpoint
from tinax._format.naming import names, words
from tinax._format.records import lineage, runrecord, tiers
from tinax._format.storage import files
from tinax._format.storage.location import DIRECTORY, Entry, Location
from tinax.explore import _health, _listed, _tiers
from tinax.explore._listed import ListingRows

if TYPE_CHECKING:
    import pandas as pd
    import tensorstore as ts

LISTING_COLUMNS = (
    "name",
    "path",
    "step",
    "status",
    "checkpointables",
    "nbytes",
    "committed",
    "age",
)
# The last two columns are times (nanoseconds), turned into pandas types at the end.
_TIMES = ("committed", "age")
# Checkpoints read at once by a listing of an object store, where each read is a round trip.
_READERS = 16
# Checkpoints whose array stores a listing of an object store reads together, on a
# thread of their own while it reads the next checkpoints.
_BATCH = 128


class ListingCache:
    """What ``list_checkpoints`` learnt about each checkpoint, for a caller that lists
    the same run again and again (a view that refreshes), for as long as it holds.

    Nothing keeps one unless the caller makes it and hands it to each listing: a
    listing reads what it shows afresh otherwise. Reading every checkpointable's
    metadata is what tells a readable checkpoint from a damaged one; a committed
    checkpoint does not change, so a deep listing's verdict is kept for as long as
    nothing under its directory changes (the safety scan's fingerprint covers every
    entry's size, identity and modification time), and what a quick listing read of
    it (its commit record and size) for as long as those two files are the ones it
    listed. Thread-safe; bounded: the least recently used go first once
    ``max_entries`` checkpoints are kept.

    Attributes:
      max_entries: How many verdicts are kept at most (``0`` keeps none).
    """

    def __init__(self, max_entries: int = 1024) -> None:
        check_bound("max_entries", max_entries)
        self._max_entries = max_entries
        # Each verdict, and whether it is the preflight check's refusal (whose rows
        # show nothing of the checkpoint) rather than a problem found past it.
        self._verdicts: LruCache[tuple[str, str], tuple[str | None, bool]] = LruCache(max_entries)
        self._checked: LruCache[tuple[str, str], layout.Checkpoint] = LruCache(max_entries)
        self._records: LruCache[tuple[str, str], commit_record.CheckpointRecord] = LruCache(
            max_entries
        )
        self._quick: LruCache[tuple[str, str, str], _listed.Listed | None] = LruCache(max_entries)
        # The paths something was kept of (as a fingerprint) at some time: a listing
        # fingerprints only those, never a checkpoint this cache has not seen.
        self._paths: LruCache[str, bool] = LruCache(3 * max_entries)

    @property
    def max_entries(self) -> int:
        return self._max_entries

    @max_entries.setter
    def max_entries(self, value: int) -> None:
        check_bound("max_entries", value)
        self._max_entries = value
        for store in self._stores():
            store.max_entries = 3 * value if store is self._paths else value

    def _stores(self) -> tuple[LruCache[Any, Any], ...]:
        return (self._verdicts, self._checked, self._records, self._quick, self._paths)

    def __len__(self) -> int:
        return len(self._verdicts)

    def clear(self) -> None:
        """Forgets every verdict."""
        for store in self._stores():
            store.clear()

    def record(self, path: Location, fingerprint: str) -> commit_record.CheckpointRecord:
        """``path``'s commit record, kept while nothing under ``path`` changes.

        Raises:
          ValueError: As ``commit_record.read_checkpoint_record`` does (refusals are not kept).
        """
        self._paths.put(str(path), True)
        return self._records.get_or_compute(
            (str(path), fingerprint), lambda: commit_record.read_checkpoint_record(path)
        )

    def listed(self, path: Location, entries: dict[str, Entry]) -> _listed.Listed | None:
        """``_listed.read_listed(path, entries)``, kept while the commit record and save
        record ``entries`` list are the same files, unchanged."""
        record, save = entries.get(names.CHECKPOINT_METADATA), entries.get(names.SAVE_TIMES)
        key = (
            str(path),
            "" if record is None else record.stamp,
            "" if save is None else save.stamp,
        )
        if not key[1]:
            return _listed.read_listed(path, entries)
        self._paths.put(key[0], True)
        return self._quick.get_or_compute(key, lambda: _listed.read_listed(path, entries))

    def checked(self, path: Location, scan: files.Scan | None = None) -> layout.Checkpoint:
        """``preflight.check(path)``, kept while nothing under ``path`` changes.

        ``scan`` is ``files.scan(path)``, if the caller has just made it.

        Raises:
          ValueError: As ``preflight.check`` does (refusals are not kept).
        """
        scan = files.scan(path) if scan is None else scan
        key = (str(path), scan.fingerprint)
        self._paths.put(key[0], True)
        return self._checked.get_or_compute(key, lambda: preflight.check(path, scan))

    def opened(self, path: object) -> layout.Checkpoint | None:
        """The checkpoint at ``path`` (local) as a deep listing with this cache opened and
        checked it, while nothing under ``path`` has changed since (the walk's
        fingerprint, made now, says): opened so, nothing of it is read again. ``None``
        where none is kept, the walk fails, or ``path`` is on an object store (a walk
        there costs requests; it is opened as any other).

        It is handed over: this cache keeps it no longer (its verdict it keeps), so
        what its reader goes on to read of it (a store's walk, its leaves) goes when the
        reader lets it go, and the cache never grows by it.
        """
        where = _paths.location(path)
        if where.storage.parallel_reads or not self.may_hold(str(where)):
            return None
        try:
            scan = files.scan(where)
        except (ValueError, OSError):
            return None
        return self._checked.pop((str(where), scan.fingerprint))

    def may_hold(self, path: str) -> bool:
        """Whether anything may be kept of ``path``, whatever its fingerprint."""
        return path in self._paths

    def _holds_check(self, path: str, fingerprint: str) -> bool:
        return (path, fingerprint) in self._checked

    def _holds_record(self, path: str, fingerprint: str) -> bool:
        key = (path, fingerprint)
        return key in self._checked or key in self._records

    def verdict(self, checkpoint: layout.Checkpoint) -> str | None:
        """``None`` if every checkpointable's metadata reads, else what is wrong."""
        key = (str(checkpoint.path), checkpoint.scan.fingerprint)
        kept = self.lookup(*key)
        if kept is not None:
            return kept[0]
        problem = _problem(checkpoint)
        self.store(*key, problem)
        return problem

    def lookup(self, path: str, fingerprint: str) -> tuple[str | None, bool] | None:
        """The verdict kept on ``path`` as ``fingerprint`` found it, if any, and
        whether it was a refusal by the check every read passes first."""
        return self._verdicts.get((path, fingerprint))

    def store(
        self, path: str, fingerprint: str, problem: str | None, *, refused: bool = False
    ) -> None:
        """Keeps the verdict on ``path`` as ``fingerprint`` found it."""
        self._paths.put(path, True)
        self._verdicts.put((path, fingerprint), (problem, refused))


def _problem(checkpoint: layout.Checkpoint) -> str | None:
    """Why ``checkpoint`` is not complete: a checkpointable whose metadata or array
    metadata cannot be found or read. ``None`` if every one can."""
    problem, trees = _metadata_problem(checkpoint)
    if problem is not None or not trees:
        return problem
    return _array_problem(trees, _read_array_metadata(trees))


# A pytree checkpointable whose array metadata is still to be read, and its leaves
# in the array store.
_Tree = tuple[pytree.PyTreeLayout, list[pytree.StoredLeaf]]
# What was read of one tree's array metadata: its values, or the store's refusal.
_Stored = dict[str, bytes] | ValueError


def _metadata_problem(checkpoint: layout.Checkpoint) -> tuple[str | None, list[_Tree]]:
    """What is wrong with the metadata files of ``checkpoint``'s checkpointables
    (``None`` if nothing), and the pytrees whose array metadata is left to read.

    What the listing reads of a checkpoint beyond the preflight check: what tells
    whether its leaves can be tabled (every file of their metadata, the array
    store's record of every stored array), never a value.
    """
    trees: list[_Tree] = []
    listed = checkpoint.scan.listing()
    try:
        for item in checkpoint.checkpointables:
            if item.layout != layout.PYTREE:
                from tinax.explore import _checkpoint  # pandas: a deep listing's only

                _checkpoint.checkpointable_leaves(item, None, values=False)
                continue
            tree = pytree.read_layout(item)
            strings = [leaf.param for leaf in tree.leaves if leaf.kind == words.STRING]
            if strings:
                pytree.read_strings(tree, strings)
            in_store = [
                leaf
                for leaf in tree.leaves
                if leaf.stored and leaf.kind in words.STORED_ARRAY_KINDS
            ]
            if names.SHARDINGS in listed.get(item.directory.path, {}):
                pytree.read_shardings(
                    tree, [leaf.param for leaf in in_store if leaf.kind == words.JAX_ARRAY]
                )
            if in_store:
                trees.append((tree, in_store))
    except Exception as e:
        return _message(e), []
    return None, trees


def _message(error: Exception) -> str:
    if isinstance(error, ValueError):
        return str(error)
    # Tensorstore reports some damage (undecodable names, broken stores) as
    # other errors; one damaged checkpoint must not fail the listing.
    return f"{type(error).__name__}: {error}"


def _read_array_metadata(
    trees: list[_Tree], ctx: ts.Context | None = None
) -> list[dict[str, bytes] | ValueError | None]:
    """The stored array metadata of every tree, read at once (see
    ``arrays.read_values_of_stores``, in ``ctx``, else a fresh context); ``None``
    for all if that fails as a whole."""
    try:
        return list(
            arrays.read_values_of_stores(
                [
                    (tree.directory, pytree.array_metadata_keys(tree, leaves))
                    for tree, leaves in trees
                ],
                ocdbt=[tree.ocdbt for tree, _ in trees],
                ctx=arrays.context() if ctx is None else ctx,
            )
        )
    except Exception:
        # Read one by one below, each failing in its own words.
        return [None] * len(trees)


def _array_problem(
    trees: list[_Tree], stored: list[dict[str, bytes] | ValueError | None]
) -> str | None:
    """What is wrong with the array metadata of ``trees`` (``stored`` as read, or
    ``None`` where it is read now), if anything."""
    for (tree, leaves), values in zip(trees, stored, strict=True):
        try:
            pytree.array_infos(tree, leaves, None, stored=values)
        except Exception as e:
            return _message(e)
    return None


def _candidates(root: Location) -> list[tuple[Location, dict[str, Entry] | None]]:
    """The directories under ``root`` that are meant to be checkpoints (or ``root``
    itself, if it is one), each with its entries as listed on the way.

    Each directory is listed once, whether it turns out to be a checkpoint of the
    run or a checkpointable of ``root`` itself.
    """
    entries = root.entries()
    listed: dict[str, dict[str, Entry]] = {}
    for name, entry in sorted(entries.items()):
        # Links are not followed: a run's checkpoints are its own directories.
        if entry.kind == DIRECTORY:
            listed[name] = (root / name).entries()
    if layout.has_marker(entries) or any(
        names.CHECKPOINT_METADATA not in top and layout.classify(root / name, top) is not None
        for name, top in listed.items()
    ):
        return [(root, None)]
    found: list[tuple[Location, dict[str, Entry] | None]] = []
    for name, entry in sorted(entries.items()):
        if entry.kind != DIRECTORY:
            continue
        path = root / name
        if names.is_temporary_name(name):
            found.append((path, None))  # Changing under the listing: looked at afresh.
        elif name.isdigit() or layout.looks_like_checkpoint(path, listed[name]):
            found.append((path, listed[name]))
    return found


def _subdirectories(path: Location) -> tuple[str, ...]:
    return tuple(sorted(n for n, e in path.entries().items() if e.kind == DIRECTORY))


# A listing row: name, path, step, status, checkpointables, size, commit time and age
# (the last two in nanoseconds).
_Row = tuple[object, ...]


class _Pending:
    """A checked checkpoint whose array metadata is read with every other one's."""

    def __init__(self, row: _Row, checkpoint: layout.Checkpoint, trees: list[_Tree]) -> None:
        self.row = row
        self.checkpoint = checkpoint
        self.trees = trees


def _row(
    path: Location, state: _Listing, top: dict[str, Entry] | None = None
) -> _Row | _Pending | None:
    """The listing row of ``path``; ``None`` if it vanished (renamed or deleted) meanwhile.

    The last two fields are the commit time and the age, in nanoseconds. Whatever
    is wrong with ``path`` makes it an ``invalid`` row; nothing in it makes the
    listing fail.
    """
    name, step = path.name, names.step_from_name(path.name)
    try:
        return _read_row(path, name, step, state, top)
    except Exception as e:
        if not path.exists():
            return None
        state.errors[str(path)] = f"{type(e).__name__}: {e}"
        return (name, str(path), step, words.INVALID, (), None, None, None)


class _Listing:
    """What one ``list_checkpoints`` call shares between its rows."""

    def __init__(self, cache: ListingCache | None, deep: bool) -> None:
        self.cache = cache
        self.deep = deep
        self.errors: dict[str, str] = {}
        self.unchecked: list[str] = []
        self.now_ns = time.time_ns()
        # What a quick listing read of each committed checkpoint, by path.
        self.read: dict[str, _listed.Listed] = {}
        # The metrics each checkpoint's commit record logged, by path, where it was read.
        self.logged: dict[str, dict[str, float]] = {}
        # The health each checkpoint's writer recorded in it, by path, where read.
        self.own: dict[str, object] = {}
        # Checkpoints of a branch their run left (``names.ABANDONED_RECORD``).
        self.abandoned: set[str] = set()


def _read_row(
    path: Location,
    name: str,
    step: int | None,
    state: _Listing,
    top: dict[str, Entry] | None,
) -> _Row | _Pending | None:
    errors, now_ns = state.errors, state.now_ns
    if not files.is_utf8(name):
        errors[str(path)] = f"{str(path)!r} has a name that is not UTF-8"
        return (name, str(path), step, words.INVALID, (), None, None, None)
    # On object stores a save writes in place: one that never committed is judged
    # like a temporary directory.
    inside = path.entries() if top is None else top
    if step is None and names.LINEAGE in inside:
        step = lineage.source_step(path)
    if names.DELETION_MARKER in inside:
        # Its removal began (and may have been cut short): it is no checkpoint any more.
        return (name, str(path), step, words.BEING_REMOVED, _subdirectories(path), None, None, None)
    if names.ABANDONED_RECORD in inside:
        state.abandoned.add(str(path))  # listed as it is, its status said at the end
    if names.CORRUPT_RECORD in inside:
        # A run's restore could not load it and set it aside: kept to be looked at.
        errors[str(path)] = (
            f"found corrupt by a training run's restore: {runrecord.found_corrupt(path)}"
        )
        try:
            found_bytes: int | None = files.scan(path).nbytes
        except (ValueError, OSError):
            found_bytes = None
        return (
            name,
            str(path),
            step,
            words.FOUND_CORRUPT,
            _subdirectories(path),
            found_bytes,
            None,
            None,
        )
    unfinished = (
        None if names.is_temporary_name(name) else _claims.uncommitted_status(path, now_ns=now_ns)
    )
    if names.is_temporary_name(name) or unfinished is not None:
        try:
            nbytes: int | None = files.scan(path).nbytes
        except (ValueError, OSError):
            nbytes = None  # A save in progress changes under the scan.
        if not path.exists():
            return None  # Committed (renamed) or removed while it was looked at.
        found = unfinished or _claims.temporary_status(path, now_ns=now_ns)
        age = None if found.started_ns is None else max(0, now_ns - found.started_ns)
        return (name, str(path), step, found.status, _subdirectories(path), nbytes, None, age)
    if layout.lacks_commit_marker(path, inside):
        # Orbax's loader refuses it: never listed complete, and no unfinished save to remove.
        errors[str(path)] = (
            f"{str(path)!r} has its commit record but not the commit marker "
            f"{names.COMMIT_SUCCESS!r}, without which Orbax does not load it: a save or a "
            "copy cut short before its last file (a two-tier run that resumes finishes "
            "its promotion)"
        )
        return (name, str(path), step, words.INVALID, _subdirectories(path), None, None, None)
    if top is not None and names.CHECKPOINT_METADATA not in top:
        return _checked_row(path, name, step, state, None)
    if not state.deep and not path.storage.parallel_reads:
        return _quick_row(path, name, step, state, inside)
    try:
        # The walk comes first: it is what tells whether a kept verdict still holds.
        scan = files.scan(path, None if top is None else top.values())
    except ValueError:
        return _checked_row(path, name, step, state, None)  # Refused in the check's words.
    kept = None if state.cache is None else state.cache.lookup(str(path), scan.fingerprint)
    if kept is None and state.deep:
        # Read afresh: the verdict and the row come from the same look at the files.
        return _checked_row(path, name, step, state, scan)
    if (
        kept is not None
        and state.cache is not None
        and state.cache._holds_check(str(path), scan.fingerprint)
    ):
        return _checked_row(path, name, step, state, scan)  # All of it kept: no reads.
    if kept is None and top is not None and path.storage.parallel_reads:
        # On an object store the listing says it all: not a request per checkpoint.
        listed = _listed_record(top)
    else:
        record = _quick_record(path, scan, state.cache)
        listed = None
        if record is not None:
            assert isinstance(record.item_handlers, dict)  # as _quick_record gives it
            listed = (tuple(record.item_handlers), record.committed_nsecs)
            state.logged[str(path)] = logged.logged(record)
            state.own[str(path)] = logged.own_health(record)
    if listed is None:
        return _checked_row(path, name, step, state, scan)
    item_names, committed = listed
    problem = None
    if kept is None:
        state.unchecked.append(str(path))
    else:
        problem, refused = kept
    if problem is not None:
        errors[str(path)] = problem
        if refused:
            return (name, str(path), step, words.INVALID, (), None, None, None)
    return (
        name,
        str(path),
        step,
        words.COMPLETE if problem is None else words.INVALID,
        item_names,
        scan.nbytes,
        committed,
        None if committed is None else max(0, now_ns - committed),
    )


def _quick_row(
    path: Location, name: str, step: int | None, state: _Listing, top: dict[str, Entry]
) -> _Row | _Pending | None:
    """The row of a committed checkpoint of a quick listing: from its top listing, its
    commit record and its save's record alone (a walk of it only where its save recorded
    no size); the full check where its record does not name its checkpointables."""
    cache = state.cache
    listed = _listed.read_listed(path, top) if cache is None else cache.listed(path, top)
    if listed is None:
        return _checked_row(path, name, step, state, None)
    state.read[str(path)] = listed
    state.logged[str(path)] = logged.logged(listed.record)
    state.own[str(path)] = logged.own_health(listed.record)
    committed = listed.record.committed_nsecs
    problem = listed.missing()
    if problem is not None:
        state.errors[str(path)] = problem
        return (name, str(path), step, words.INVALID, (), None, None, None)
    state.unchecked.append(str(path))
    return (
        name,
        str(path),
        step,
        words.COMPLETE,
        listed.checkpointables,
        listed.nbytes,
        committed,
        None if committed is None else max(0, state.now_ns - committed),
    )


def _listed_record(top: dict[str, Entry]) -> tuple[tuple[str, ...], int | None] | None:
    """A committed checkpoint's checkpointables and commit time as a listing of its
    top level shows them on an object store: its folders, and the time of the commit
    marker Orbax writes last there; ``None`` where only its commit record tells (no
    marker, or no folder)."""
    marker = top.get(names.COMMIT_SUCCESS)
    folders = tuple(entry.name for entry in top.values() if entry.kind == DIRECTORY)
    if marker is None or not folders:
        return None
    return folders, marker.mtime_ns


_TRAINING_ORDER = {name: i for i, name in enumerate(names.TRAINING_CHECKPOINTABLES)}


def _in_order(checkpointables: tuple[str, ...]) -> tuple[str, ...]:
    """A row's checkpointables in one order however they were found (a commit record,
    a listing): a training save's in the order it saves them, any others after them by
    name."""
    last = len(_TRAINING_ORDER)
    return tuple(sorted(checkpointables, key=lambda n: (_TRAINING_ORDER.get(n, last), n)))


def _quick_record(
    path: Location, scan: files.Scan, cache: ListingCache | None
) -> commit_record.CheckpointRecord | None:
    """The commit record of ``path`` as ``scan`` found it, without parsing any other
    metadata; ``None`` where only the full check tells (no record naming its
    checkpointables, or one that does not read)."""
    try:
        if cache is None:
            record = commit_record.read_checkpoint_record(path)
        else:
            record = cache.record(path, scan.fingerprint)
    except ValueError:
        return None  # The full check says what is wrong, in its own words.
    return record if isinstance(record.item_handlers, dict) else None


def _checked_row(
    path: Location, name: str, step: int | None, state: _Listing, scan: files.Scan | None
) -> _Row | _Pending | None:
    """The row of ``path`` after the full check: every metadata file read (the array
    store's, of pytrees, left pending to be read with every other checkpoint's)."""
    errors, cache = state.errors, state.cache
    try:
        checked = preflight.check if cache is None else cache.checked
        checkpoint = checked(path, scan)
    except (ValueError, OSError) as e:
        if not path.exists():
            return None
        errors[str(path)] = str(e)
        if cache is not None:
            _remember_refusal(cache, path, str(e), scan)
        return (name, str(path), step, words.INVALID, (), None, None, None)
    item_names = tuple(item.name for item in checkpoint.checkpointables)
    state.logged[str(path)] = logged.logged(checkpoint.record)
    state.own[str(path)] = logged.own_health(checkpoint.record)
    key = (str(checkpoint.path), checkpoint.scan.fingerprint)
    kept = None if cache is None else cache.lookup(*key)
    trees: list[_Tree] = []
    if kept is not None:
        problem = kept[0]
    else:
        problem, trees = _metadata_problem(checkpoint)
    committed = checkpoint.committed_nsecs
    row = (
        name,
        str(path),
        step,
        words.COMPLETE,
        item_names,
        checkpoint.scan.nbytes,
        committed,
        None if committed is None else max(0, state.now_ns - committed),
    )
    if trees:
        return _Pending(row, checkpoint, trees)
    if kept is None and cache is not None:
        cache.store(*key, problem)
    return _judged(row, problem, state)


def _judged(row: _Row, problem: str | None, state: _Listing) -> _Row:
    """``row`` with the status ``problem`` gives it."""
    if problem is None:
        return row
    state.errors[str(row[1])] = problem
    return (*row[:3], words.INVALID, *row[4:])


class _ArrayReader:
    """Reads the array metadata of pending checkpoints, in batches.

    Checkpoints are handed over as their rows are made. With ``workers``, each
    batch is read on a thread of its own (tensorstore does the reading outside
    the interpreter lock), so that the array stores of the first checkpoints are
    read while the files of the later ones are still being read; with none, each
    batch is read in the calling thread. Each batch's stores are read together
    (``arrays.read_values_of_stores``).
    """

    def __init__(self, workers: int, batch: int) -> None:
        self._workers = workers
        self._batch_size = batch
        self._batch: list[_Pending] = []
        self._batches: list[
            tuple[list[_Pending], concurrent.futures.Future[list[_Stored | None]]]
        ] = []
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._ctx: ts.Context | None = None
        self._ctx_lock = threading.Lock()

    def add(self, item: _Pending) -> None:
        self._batch.append(item)
        if len(self._batch) >= self._batch_size:
            self._submit()

    def _context(self) -> ts.Context:
        with self._ctx_lock:
            if self._ctx is None:
                self._ctx = arrays.context()
            return self._ctx

    def _read(self, batch: list[_Pending]) -> list[_Stored | None]:
        return _read_array_metadata(
            [tree for item in batch for tree in item.trees], self._context()
        )

    def _submit(self) -> None:
        batch, self._batch = self._batch, []
        if not batch:
            return
        if not self._workers:
            done: concurrent.futures.Future[list[_Stored | None]] = concurrent.futures.Future()
            done.set_result(self._read(batch))
            self._batches.append((batch, done))
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self._workers, thread_name_prefix="tinax-listing"
            )
        self._batches.append((batch, self._pool.submit(self._read, batch)))

    def finish(self, state: _Listing) -> dict[int, _Row]:
        """Every pending checkpoint's row, by the ``id`` of its ``_Pending``."""
        self._submit()
        rows: dict[int, _Row] = {}
        for batch, future in self._batches:
            stored = iter(future.result())
            for item in batch:
                problem = _array_problem(item.trees, [next(stored) for _ in item.trees])
                if state.cache is not None:
                    state.cache.store(
                        str(item.checkpoint.path), item.checkpoint.scan.fingerprint, problem
                    )
                rows[id(item)] = _judged(item.row, problem, state)
        return rows

    def close(self) -> None:
        """Ends the threads, once the batches started are read (the rest are dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _remember_refusal(
    cache: ListingCache, path: Location, problem: str, scan: files.Scan | None
) -> None:
    """Keeps the check's refusal of ``path``, for as long as its files stay as they are."""
    try:
        fingerprint = (files.scan(path) if scan is None else scan).fingerprint
    except ValueError:
        return  # Refused by the walk itself: a quick listing walks it too, and says so.
    cache.store(str(path), fingerprint, problem, refused=True)


def _known(path: Location, cache: ListingCache | None, deep: bool) -> bool:
    """Whether ``cache`` holds what a listing reads of ``path`` as it is now."""
    if cache is None or not cache.may_hold(str(path)):
        # Nothing to fingerprint it for (a walk of its listing: on a large run, most
        # of a first listing's processor time).
        return False
    try:
        fingerprint = files.scan(path).fingerprint
    except ValueError:
        return False
    if deep:
        return cache.lookup(str(path), fingerprint) is not None
    return cache._holds_record(str(path), fingerprint)


def _rows(
    directory: Location, cache: ListingCache | None, deep: bool
) -> tuple[list[_Row], _Listing]:
    """The listing rows of the checkpoints under ``directory``, in no particular order."""
    state = _Listing(cache, deep)
    candidates = _candidates(directory)
    parallel = directory.storage.parallel_reads
    # Object stores: every batch is a few round trips, made side by side and while the
    # checkpoints are read. On a local disk, where tensorstore's reads are no waits, all
    # at the end in this thread: a thread of their own only contends for the interpreter.
    reader = _ArrayReader(_READERS, _BATCH) if parallel else _ArrayReader(0, len(candidates) + 1)
    if parallel:
        # Every metadata file read (deep) fetched side by side at once, rather than a
        # round trip each as the rows are made. A shallow listing reads the commit
        # record only of a checkpoint without the commit marker (``_listed_record``).
        directory.storage.prefetch(
            [
                wanted
                for path, top in candidates
                if not _known(path, cache, deep)
                for wanted in (
                    preflight.metadata_files(path)
                    if deep
                    else [(path / names.CHECKPOINT_METADATA).path]
                    if top is None or names.COMMIT_SUCCESS not in top
                    else []
                )
            ],
            files.MAX_METADATA_BYTES,
        )
    found: list[_Row | _Pending | None] = []
    try:
        if not parallel:
            for path, top in candidates:
                found.append(_row(path, state, top))
                if isinstance(found[-1], _Pending):
                    reader.add(found[-1])
        else:
            # Checkpoints are read side by side: each read is a round trip.
            with concurrent.futures.ThreadPoolExecutor(_READERS) as pool:
                for row in pool.map(lambda item: _row(item[0], state, item[1]), candidates):
                    found.append(row)
                    if isinstance(row, _Pending):
                        reader.add(row)
        finished = reader.finish(state)
    finally:
        reader.close()
    rows = [
        finished[id(row)] if isinstance(row, _Pending) else row for row in found if row is not None
    ]
    return rows, state


def list_checkpoints(
    root: str | os.PathLike[str],
    *,
    cache: ListingCache | None = None,
    deep: bool | None = None,
) -> pd.DataFrame:
    """One row per checkpoint under ``root``, or for ``root`` itself if it is one.

    A directory counts when it looks like a checkpoint: Orbax's marker files, a
    checkpointable directory, a step number as its name, or Orbax's temporary
    suffix. Symbolic links under ``root`` are not followed.

    By default a committed checkpoint is read as little as its row needs: its top
    directory listed, its commit record read (what it holds, when it committed) and
    its save's record (its size, where tinax recorded it; else its files are walked):
    on a local disk two small files and one listing a checkpoint, on an object store
    (``gs://``) nothing beyond the listing of the run (its checkpointables are its
    folders, its commit time the commit marker's, as listed). Whether its metadata
    reads (whether it can be opened) is ``verify``'s, opening it's, or a deep listing's
    to tell: each such row is named in ``DataFrame.attrs["unchecked"]``.

    Args:
      root: A run directory (Orbax V1 ``training.Checkpointer``, V0
        ``CheckpointManager``, or any directory of checkpoints) or a checkpoint.
      cache: A ``ListingCache`` of the caller's own, for one that lists the same run
        again and again: what it read of unchanged checkpoints (verdicts, records,
        sizes) is not read again. ``None`` (the default) reads every checkpoint afresh.
      deep: Whether each checkpoint is also read as ``checkpoint_table`` reads it
        (every metadata file, its array store's record of every array; no array
        data) to tell whether it is readable: a damaged one is then ``invalid``, and
        nothing is ``unchecked``. ``None`` (the default) is ``False``.

    Returns:
      A DataFrame with columns ``name``, ``path``, ``step`` (``Int64``, from the
      name; for a derived or averaged checkpoint whose name has none, its source's
      as its lineage records it), ``status``, ``checkpointables`` (tuple of names: a training save's in
      the order it saves them, then any others by name), ``nbytes`` (size of
      its files), ``committed`` (UTC commit time, or ``NaT``) and ``age`` (a
      ``Timedelta``: since the commit, or for a save not yet committed, since it
      started; ``NaT`` where unknown), sorted by step, then name. ``status`` is
      ``complete``; ``in progress`` for an Orbax temporary directory whose save
      is running (a live process holds its claim); ``interrupted`` for one whose
      writer is gone, which is never loadable and which a new save to the same
      checkpoint removes; or ``invalid`` for a directory that cannot be read. On
      ``gs://``, where a save writes in place, a checkpoint directory with neither
      ``commit_success.txt`` nor ``_CHECKPOINT_METADATA`` is ``in progress`` or
      ``interrupted`` in the same way. ``corrupt (found by restore)`` is a
      checkpoint a ``TrainingRun``'s restore could not load and set aside (renamed
      ``<name>.tinax-corrupt``), kept for inspection and never loaded; ``abandoned``
      one of a branch a ``TrainingRun`` left when it went on from an earlier step
      (renamed ``<name>.tinax-abandoned``), intact, kept for inspection and never
      resumed from. Why each
      invalid or corrupt checkpoint cannot be read is in
      ``DataFrame.attrs["errors"]``, a dict of path to message.

      Then the verdict every view shows (``tinax._format.integrity.health``), without reading
      data: ``integrity`` (``sound`` for a complete checkpoint, ``damaged`` for an
      invalid or corrupt one, ``incomplete`` for a save in progress, interrupted or
      being removed); ``health`` (``diverged`` where a metric its save logged is NaN
      or infinite, or reading its data found NaN or Inf in its model or optimizer
      state; ``healthy`` where its data was read and none was; else ``not yet
      known``); ``health_reason``, why, in the words every view uses; ``nan`` and
      ``inf`` (``Int64``: every leaf's NaN and Inf, counted once, where its data was
      read in this process or by its training run's restore; else ``<NA>``).
      ``DataFrame.attrs["remote"]`` says whether the run is on an object store
      (``gs://``), where each file read is a round trip of its own.

      For a tier of a two-tier run (``TrainingRun(..., local=...)``), from either
      directory, the checkpoints of both tiers, with two more columns: ``tier``
      (``local``, ``durable``, or ``both`` for a step committed in both, whose
      ``path`` is then the local copy) and ``promotion`` (``waiting`` for a local
      checkpoint the run will promote, ``promoting`` while it is being copied).
      The local tier is listed where it is on this machine.

    Raises:
      TypeError: If ``root`` is not a path, ``cache`` not a ``ListingCache`` or
        ``deep`` not a bool.
      FileNotFoundError: If ``root`` does not exist.
      ValueError: If ``root`` is not a directory.
    """
    if cache is not None and not isinstance(cache, ListingCache):
        raise TypeError(f"cache must be a ListingCache or None, got {type(cache).__name__}")
    if deep is not None and not isinstance(deep, bool):
        raise TypeError(f"deep must be a bool or None, got {type(deep).__name__}")
    return listing(_paths.listed_directory(root), cache, deep)


def listing(
    directory: Location, cache: ListingCache | None = None, deep: bool | None = None
) -> pd.DataFrame:
    """``list_checkpoints`` of a run directory listed already (``_paths.listed_directory``):
    its rows' checkpoints are read through that listing (``directory / name``)."""
    return listed_run(directory, cache, deep).table


def listing_table(listed: ListingRows) -> pd.DataFrame:
    """The rows of a listing as ``list_checkpoints``' table."""
    import pandas as pd

    from tinax.explore._leaf_rows import frame

    rows = listed.rows
    columns = [*LISTING_COLUMNS, *_health.HEALTH_COLUMNS]
    if listed.tiers or (rows and "tier" in rows[0]):
        columns += list(_tiers.TIER_COLUMNS)
    plain = [c for c in columns if c not in _TIMES]
    table = frame(plain, ([row[c] for c in plain] for row in rows))
    table["committed"] = pd.to_datetime(
        pd.Series([row["committed"] for row in rows], dtype="Int64"), unit="ns", utc=True
    )
    table["age"] = pd.to_timedelta(
        pd.Series([row["age"] for row in rows], dtype="Int64"), unit="ns"
    )
    for column in ("integrity", "health", "health_reason", *_tiers.TIER_COLUMNS):
        if column in table:
            table[column] = pd.array(list(table[column]), dtype="string")
    table = table[columns]
    table.attrs = dict(listed.attrs)
    return table


@dataclasses.dataclass(frozen=True)
class RunListing:
    """A run directory listed once, and what the listing read, for a reader that goes on
    to read its checkpoints: nothing the listing read is read again.

    Attributes:
      directory: The run directory, as listed (``_paths.listed_directory``).
      table: Its checkpoints, as ``list_checkpoints`` gives them.
      listed: What the listing read of each committed checkpoint (its top listing,
        commit record and save record, ``_listed.Listed``), by path: open one with
        ``_listed.open_listed``.
      record: The run's record (``runrecord.read_run_record``), read once.
      tiers: The two-tier run it is a tier of (its other tier's record read once), if
        any.
    """

    directory: Location
    table: pd.DataFrame
    listed: dict[str, _listed.Listed]
    record: dict[str, Any] | None
    tiers: tiers.TwoTierRun | None

    def where(self, row: Any) -> Location:
        """The checkpoint of a row of ``table``, within the listing
        (``_paths.listed_in``)."""
        return _paths.listed_in(self.directory, row["name"], row["path"])

    def open(self, row: Any) -> Checkpoint:
        """The checkpoint of a row of ``table``, opened (as ``open_checkpoint`` opens it)
        from what the listing read of it.

        Raises:
          ValueError, OSError: As ``open_checkpoint``.
        """
        found = self.listed.get(str(row["path"]))
        if found is None:
            return _paths.open_checkpoint(self.where(row))
        return _listed.open_listed(found)


def run_listing(root: object, cache: ListingCache | None = None) -> RunListing:
    """A run directory listed once, its checkpoints as ``list_checkpoints`` finds them
    (not deep), for a reader that goes on to read each complete one itself, through
    that listing and what it read (``RunListing``).

    Raises:
      TypeError: If ``root`` is not a path.
      FileNotFoundError: If ``root`` does not exist.
      ValueError: If ``root`` is not a directory.
    """
    return listed_run(_paths.listed_directory(root), cache, False)


def listed_run(directory: Location, cache: ListingCache | None, deep: bool | None) -> RunListing:
    """``list_checkpoints`` of a run directory listed already, and what it read: the
    run's record read once, for its tiers and for whoever reads on."""
    found = listed_rows(directory, cache, deep)
    return RunListing(directory, listing_table(found.listing), found.read, found.record, found.run)


class ListedRun(NamedTuple):
    """``listed_run``'s parts before its table is made (``listed_rows``)."""

    listing: ListingRows
    read: dict[str, _listed.Listed]
    record: dict[str, Any] | None
    run: tiers.TwoTierRun | None


def listed_rows(directory: Location, cache: ListingCache | None, deep: bool | None) -> ListedRun:
    """``listed_run`` as rows, not yet a table: what the command line prints a run from
    without pandas."""
    record = runrecord.read_run_record(directory)
    run = None if record is None else tiers.two_tier_run(directory, record)
    found, read = _list_one(directory, cache, deep, record)

    def other_tier(other: Location) -> ListingRows:
        # Each tier's record was read once, by ``two_tier_run``.
        assert run is not None
        durable = tiers.same_directory(other, run.durable)
        other_record = run.durable_record if durable else run.local_record
        other_found, other_read = _list_one(
            _paths.listed_directory(other), cache, deep, other_record
        )
        read.update(other_read)
        return other_found

    # A two-tier run's other tier is listed with it (``_tiers``).
    return ListedRun(_tiers.with_tiers(directory, found, other_tier, run), read, record, run)


def _list_one(
    directory: Location,
    cache: ListingCache | None,
    deep: bool | None,
    record: dict[str, Any] | None,
) -> tuple[ListingRows, dict[str, _listed.Listed]]:
    """The listing of one directory, as listed (``Location.snapshot``), as rows, and what
    it read of each committed checkpoint (``record``: its run's record, read already)."""
    deep = bool(deep)
    # The listing makes objects by the hundred thousand, none in a cycle.
    with files.paused_gc():
        found, state = _rows(directory, cache, deep)
    rows = [dict(zip(LISTING_COLUMNS, row, strict=True)) for row in found]
    for row in rows:
        row["checkpointables"] = _in_order(row["checkpointables"])  # type: ignore[arg-type]
        if row["status"] == words.COMPLETE and row["path"] in state.abandoned:
            row["status"] = words.ABANDONED
    rows.sort(key=_tiers.sort_key)
    healths = _health.add_health(rows, state.logged, directory, record, state.own)
    attrs = {
        "errors": state.errors,
        "unchecked": sorted(state.unchecked),
        "remote": directory.storage.parallel_reads,
        _health.HEALTHS: healths,
    }
    return ListingRows(rows, attrs), state.read
