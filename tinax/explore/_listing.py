"""A run directory as a table of its checkpoints."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections import OrderedDict

import pandas as pd

from tinax import _claims, _paths
from tinax._format import files, layout, names, preflight, words
from tinax._format.storage import DIRECTORY, Location
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
# Checkpoints read at once by a listing.
_READERS = 16
# The last two columns are times (nanoseconds), turned into pandas types at the end.
_TIME_COLUMNS = 2


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
        self._verdicts: OrderedDict[tuple[str, str], str | None] = OrderedDict()
        self._checked: OrderedDict[tuple[str, str], layout.Checkpoint] = OrderedDict()
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
        while len(self._verdicts) > self._max_entries:
            self._verdicts.popitem(last=False)
        while len(self._checked) > self._max_entries:
            self._checked.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._verdicts)

    def clear(self) -> None:
        """Forgets every verdict."""
        with self._lock:
            self._verdicts.clear()
            self._checked.clear()

    def checked(self, path: Location) -> layout.Checkpoint:
        """``preflight.check(path)``, kept while nothing under ``path`` changes.

        Raises:
          ValueError: As ``preflight.check`` does (refusals are not kept).
        """
        key = (str(path), files.scan(path).fingerprint)
        with self._lock:
            if key in self._checked:
                self._checked.move_to_end(key)
                return self._checked[key]
        checkpoint = preflight.check(path)
        with self._lock:
            self._checked[key] = checkpoint
            self._trim()
        return checkpoint

    def verdict(self, checkpoint: layout.Checkpoint) -> str | None:
        """``None`` if every checkpointable's metadata reads, else what is wrong."""
        key = (str(checkpoint.path), checkpoint.scan.fingerprint)
        with self._lock:
            if key in self._verdicts:
                self._verdicts.move_to_end(key)
                return self._verdicts[key]
        problem = _problem(checkpoint)
        with self._lock:
            self._verdicts[key] = problem
            self._trim()
        return problem


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


def _candidates(root: Location) -> list[Location]:
    if layout.looks_like_checkpoint(root):
        return [root]
    found = []
    for name, entry in sorted(root.entries().items()):
        # Links are not followed: a run's checkpoints are its own directories.
        if entry.kind != DIRECTORY:
            continue
        path = root / name
        if names.is_temporary_name(name) or name.isdigit() or layout.looks_like_checkpoint(path):
            found.append(path)
    return found


def _subdirectories(path: Location) -> tuple[str, ...]:
    return tuple(sorted(n for n, e in path.entries().items() if e.kind == DIRECTORY))


def _row(
    path: Location, errors: dict[str, str], cache: ListingCache | None, now_ns: int
) -> tuple[object, ...] | None:
    """The listing row of ``path``; ``None`` if it vanished (renamed or deleted) meanwhile.

    The last two fields are the commit time and the age, in nanoseconds. Whatever
    is wrong with ``path`` makes it an ``invalid`` row; nothing in it makes the
    listing fail.
    """
    name, step = path.name, names.step_from_name(path.name)
    try:
        return _read_row(path, name, step, errors, cache, now_ns)
    except Exception as e:
        if not path.exists():
            return None
        errors[str(path)] = f"{type(e).__name__}: {e}"
        return (name, str(path), step, words.INVALID, (), None, None, None)


def _read_row(
    path: Location,
    name: str,
    step: int | None,
    errors: dict[str, str],
    cache: ListingCache | None,
    now_ns: int,
) -> tuple[object, ...] | None:
    if not files.is_utf8(name):
        errors[str(path)] = f"{str(path)!r} has a name that is not UTF-8"
        return (name, str(path), step, words.INVALID, (), None, None, None)
    # On object stores a save writes in place: one that never committed is judged
    # like a temporary directory.
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
    try:
        checkpoint = preflight.check(path) if cache is None else cache.checked(path)
    except (ValueError, OSError) as e:
        if not path.exists():
            return None
        errors[str(path)] = str(e)
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


def list_checkpoints(
    root: str | os.PathLike[str], *, cache: ListingCache | None = listing_cache
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
      TypeError: If ``root`` is not a path, or ``cache`` not a ``ListingCache``.
      FileNotFoundError: If ``root`` does not exist.
      ValueError: If ``root`` is not a directory.
    """
    if cache is not None and not isinstance(cache, ListingCache):
        raise TypeError(f"cache must be a ListingCache or None, got {type(cache).__name__}")
    # One listing of the whole run (on an object store, a request per thousand objects).
    directory = _paths.existing_directory(root).snapshot()
    errors: dict[str, str] = {}
    now_ns = time.time_ns()
    # Checkpoints are read side by side: on an object store each read is a round trip.
    with concurrent.futures.ThreadPoolExecutor(_READERS) as pool:
        found = pool.map(lambda path: _row(path, errors, cache, now_ns), _candidates(directory))
        rows = [row for row in found if row is not None]
    table = frame(LISTING_COLUMNS[:-_TIME_COLUMNS], (row[:-_TIME_COLUMNS] for row in rows))
    table["committed"] = pd.to_datetime(
        pd.Series([row[-2] for row in rows], dtype="Int64"), unit="ns", utc=True
    )
    table["age"] = pd.to_timedelta(pd.Series([row[-1] for row in rows], dtype="Int64"), unit="ns")
    table = table.sort_values(["step", "name"], na_position="last", kind="stable")
    table = table.reset_index(drop=True)
    table.attrs["errors"] = errors
    return table
