"""A run directory as a table of its checkpoints."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

import pandas as pd

from tinax import _claims, _paths
from tinax._format import files, layout, names, preflight, words
from tinax._format.storage import DIRECTORY, Entry, Location
from tinax.explore import _checkpoint
from tinax.explore._leaves import frame

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
_TIME_COLUMNS = 2
_T = TypeVar("_T")
# Checkpoints read at once by a listing of an object store, where each read is a round trip.
_READERS = 16


class ListingCache:
    """What ``list_checkpoints`` learnt about each checkpoint, for as long as it holds.

    Reading every checkpointable's metadata is what tells a readable checkpoint
    from a damaged one; a committed checkpoint does not change, so the verdict is
    kept for as long as nothing under its directory changes (the safety scan's
    fingerprint covers every entry's size, identity and modification time).
    Thread-safe; the least recently used verdicts go first once ``max_entries``
    are kept.

    Attributes:
      max_entries: How many verdicts are kept at most (``0`` keeps none).
    """

    def __init__(self, max_entries: int = 1024) -> None:
        self._lock = threading.Lock()
        # Each verdict, and whether it is the preflight check's refusal (whose rows
        # show nothing of the checkpoint) rather than a problem found past it.
        self._verdicts: OrderedDict[tuple[str, str], tuple[str | None, bool]] = OrderedDict()
        self._checked: OrderedDict[tuple[str, str], layout.Checkpoint] = OrderedDict()
        self._records: OrderedDict[tuple[str, str], layout.CheckpointRecord] = OrderedDict()
        self.max_entries = max_entries

    @property
    def max_entries(self) -> int:
        return self._max_entries

    @max_entries.setter
    def max_entries(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"max_entries must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"max_entries must be non-negative, got {value}")
        with self._lock:
            self._max_entries = value
            self._trim()

    def _trim(self) -> None:
        for store in (self._verdicts, self._checked, self._records):
            while len(store) > self._max_entries:
                store.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._verdicts)

    def clear(self) -> None:
        """Forgets every verdict."""
        with self._lock:
            for store in (self._verdicts, self._checked, self._records):
                store.clear()

    def _kept(
        self, store: OrderedDict[tuple[str, str], _T], key: tuple[str, str], read: Callable[[], _T]
    ) -> _T:
        """What ``store`` keeps under ``key``, else what ``read`` returns, kept there
        (``read`` runs outside the lock; what it raises is not kept)."""
        with self._lock:
            if key in store:
                store.move_to_end(key)
                return store[key]
        value = read()
        with self._lock:
            store[key] = value
            self._trim()
        return value

    def record(self, path: Location, fingerprint: str) -> layout.CheckpointRecord:
        """``path``'s commit record, kept while nothing under ``path`` changes.

        Raises:
          ValueError: As ``layout.read_checkpoint_record`` does (refusals are not kept).
        """
        return self._kept(
            self._records, (str(path), fingerprint), lambda: layout.read_checkpoint_record(path)
        )

    def checked(self, path: Location) -> layout.Checkpoint:
        """``preflight.check(path)``, kept while nothing under ``path`` changes.

        Raises:
          ValueError: As ``preflight.check`` does (refusals are not kept).
        """
        key = (str(path), files.scan(path).fingerprint)
        return self._kept(self._checked, key, lambda: preflight.check(path))

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
        with self._lock:
            key = (path, fingerprint)
            if key in self._verdicts:
                self._verdicts.move_to_end(key)
                return self._verdicts[key]
        return None

    def store(
        self, path: str, fingerprint: str, problem: str | None, *, refused: bool = False
    ) -> None:
        """Keeps the verdict on ``path`` as ``fingerprint`` found it."""
        with self._lock:
            self._verdicts[(path, fingerprint)] = (problem, refused)
            self._trim()


def _problem(checkpoint: layout.Checkpoint) -> str | None:
    """Why ``checkpoint`` is not complete: a checkpointable whose metadata or array store
    manifest cannot be found or read. ``None`` if every one can."""
    try:
        _checkpoint.checkpoint_leaves(checkpoint)
    except ValueError as e:
        return str(e)
    except Exception as e:
        # Tensorstore reports some damage (undecodable names, broken stores) as
        # other errors; one damaged checkpoint must not fail the listing.
        return f"{type(e).__name__}: {e}"
    return None


# The cache list_checkpoints uses unless told otherwise.
listing_cache = ListingCache()


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


def _row(
    path: Location, state: _Listing, top: dict[str, Entry] | None = None
) -> tuple[object, ...] | None:
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


def _read_row(
    path: Location,
    name: str,
    step: int | None,
    state: _Listing,
    top: dict[str, Entry] | None,
) -> tuple[object, ...] | None:
    errors, now_ns = state.errors, state.now_ns
    if not files.is_utf8(name):
        errors[str(path)] = f"{str(path)!r} has a name that is not UTF-8"
        return (name, str(path), step, words.INVALID, (), None, None, None)
    # On object stores a save writes in place: one that never committed is judged
    # like a temporary directory.
    if names.DELETION_MARKER in (path.entries() if top is None else top):
        # Its removal began (and may have been cut short): it is no checkpoint any more.
        return (name, str(path), step, words.BEING_REMOVED, _subdirectories(path), None, None, None)
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
    quick = _quick_look(path, top, state.cache)
    if quick is None:
        return _checked_row(path, name, step, state)
    scan, record, item_names = quick
    kept = None if state.cache is None else state.cache.lookup(str(path), scan.fingerprint)
    problem = None
    if kept is None:
        if state.deep:
            # Read afresh: the verdict and the row come from the same look at the files.
            return _checked_row(path, name, step, state)
        state.unchecked.append(str(path))
    else:
        problem, refused = kept
    if problem is not None:
        errors[str(path)] = problem
        if refused:
            return (name, str(path), step, words.INVALID, (), None, None, None)
    committed = record.committed_nsecs
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


def _quick_look(
    path: Location, top: dict[str, Entry] | None, cache: ListingCache | None
) -> tuple[files.Scan, layout.CheckpointRecord, tuple[str, ...]] | None:
    """The walk, the commit record and the checkpointables of ``path``, without parsing
    any other metadata; ``None`` where only the full check tells (no record naming
    its checkpointables, or one that does not read)."""
    if top is not None and names.CHECKPOINT_METADATA not in top:
        return None
    try:
        # The walk comes first: it is what tells whether a kept record still holds.
        scan = files.scan(path, None if top is None else top.values())
        if cache is None:
            record = layout.read_checkpoint_record(path)
        else:
            record = cache.record(path, scan.fingerprint)
    except ValueError:
        return None  # The full check says what is wrong, in its own words.
    if not isinstance(record.item_handlers, dict):
        return None
    return scan, record, tuple(record.item_handlers)


def _checked_row(
    path: Location, name: str, step: int | None, state: _Listing
) -> tuple[object, ...] | None:
    """The row of ``path`` after the full check: every metadata file read."""
    errors, cache, now_ns = state.errors, state.cache, state.now_ns
    try:
        checkpoint = preflight.check(path) if cache is None else cache.checked(path)
    except (ValueError, OSError) as e:
        if not path.exists():
            return None
        errors[str(path)] = str(e)
        if cache is not None:
            _remember_refusal(cache, path, str(e))
        return (name, str(path), step, words.INVALID, (), None, None, None)
    item_names = tuple(item.name for item in checkpoint.checkpointables)
    problem = _problem(checkpoint) if cache is None else cache.verdict(checkpoint)
    if problem is not None:
        errors[str(path)] = problem
    committed = checkpoint.committed_nsecs
    return (
        name,
        str(path),
        step,
        words.COMPLETE if problem is None else words.INVALID,
        item_names,
        checkpoint.scan.nbytes,
        committed,
        None if committed is None else max(0, now_ns - committed),
    )


def _remember_refusal(cache: ListingCache, path: Location, problem: str) -> None:
    """Keeps the check's refusal of ``path``, for as long as its files stay as they are."""
    try:
        fingerprint = files.scan(path).fingerprint
    except ValueError:
        return  # Refused by the walk itself: a quick listing walks it too, and says so.
    cache.store(str(path), fingerprint, problem, refused=True)


def list_checkpoints(
    root: str | os.PathLike[str],
    *,
    cache: ListingCache | None = listing_cache,
    deep: bool = True,
) -> pd.DataFrame:
    """One row per checkpoint under ``root``, or for ``root`` itself if it is one.

    A directory counts when it looks like a checkpoint: Orbax's marker files, a
    checkpointable directory, a step number as its name, or Orbax's temporary
    suffix. Each is read as ``checkpoint_table`` reads it (metadata only) to
    tell whether it is readable. Symbolic links under ``root`` are not followed.

    Args:
      root: A run directory (Orbax V1 ``training.Checkpointer``, V0
        ``CheckpointManager``, or any directory of checkpoints) or a checkpoint.
      cache: Where verdicts on unchanged checkpoints are remembered between
        calls: by default the module's ``listing_cache``; ``None`` reads every
        checkpoint afresh.
      deep: Whether checkpoints without a remembered verdict are read (metadata
        only) to tell whether they are readable. ``False`` lists a run as fast as
        its files can be walked: a checkpoint whose commit record names its
        checkpointables and reads is listed ``complete`` without its other
        metadata being parsed, and its path is added to
        ``DataFrame.attrs["unchecked"]``; a deep listing later tells (and
        remembers) whether it really is.

    Returns:
      A DataFrame with columns ``name``, ``path``, ``step`` (``Int64``, from the
      name), ``status``, ``checkpointables`` (tuple of names), ``nbytes`` (size of
      its files), ``committed`` (UTC commit time, or ``NaT``) and ``age`` (a
      ``Timedelta``: since the commit, or for a save not yet committed, since it
      started; ``NaT`` where unknown), sorted by step, then name. ``status`` is
      ``complete``; ``in progress`` for an Orbax temporary directory whose save
      is running (a live process holds its claim); ``interrupted`` for one whose
      writer is gone, which is never loadable and which a new save to the same
      checkpoint removes; or ``invalid`` for a directory that cannot be read. On
      ``gs://``, where a save writes in place, a checkpoint directory with neither
      ``commit_success.txt`` nor ``_CHECKPOINT_METADATA`` is ``in progress`` or
      ``interrupted`` in the same way. Why each invalid checkpoint cannot be read
      is in ``DataFrame.attrs["errors"]``, a dict of path to message.

    Raises:
      TypeError: If ``root`` is not a path, ``cache`` not a ``ListingCache`` or
        ``deep`` not a bool.
      FileNotFoundError: If ``root`` does not exist.
      ValueError: If ``root`` is not a directory.
    """
    if cache is not None and not isinstance(cache, ListingCache):
        raise TypeError(f"cache must be a ListingCache or None, got {type(cache).__name__}")
    if not isinstance(deep, bool):
        raise TypeError(f"deep must be a bool, got {type(deep).__name__}")
    # One listing of the whole run (on an object store, a request per thousand objects).
    directory = _paths.existing_directory(root).snapshot()
    state = _Listing(cache, deep)
    candidates = _candidates(directory)
    if not directory.storage.parallel_reads:
        found = [_row(path, state, top) for path, top in candidates]
    else:
        # Checkpoints are read side by side: each read is a round trip.
        with concurrent.futures.ThreadPoolExecutor(_READERS) as pool:
            found = list(pool.map(lambda item: _row(item[0], state, item[1]), candidates))
    rows = [row for row in found if row is not None]
    table = frame(LISTING_COLUMNS[:-_TIME_COLUMNS], (row[:-_TIME_COLUMNS] for row in rows))
    table["committed"] = pd.to_datetime(
        pd.Series([row[-2] for row in rows], dtype="Int64"), unit="ns", utc=True
    )
    table["age"] = pd.to_timedelta(pd.Series([row[-1] for row in rows], dtype="Int64"), unit="ns")
    table = table.sort_values(["step", "name"], na_position="last", kind="stable")
    table = table.reset_index(drop=True)
    table.attrs["errors"] = state.errors
    table.attrs["unchecked"] = sorted(state.unchecked)
    return table
