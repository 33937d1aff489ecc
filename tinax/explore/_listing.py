"""A run directory as a table of its checkpoints."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

import pandas as pd

from tinax.explore import _checkpoint, _files, _layout
from tinax.explore._leaves import frame

LISTING_COLUMNS = ("name", "path", "step", "status", "checkpointables", "nbytes", "committed")
COMPLETE = "complete"
IN_PROGRESS = "in progress"
INVALID = "invalid"

# Committed checkpoints do not change, so a reading that succeeded or failed is
# remembered for as long as nothing under the directory changes (the scan's
# fingerprint covers every entry's size, inode and modification time).
_MAX_REMEMBERED = 1024
_remembered: OrderedDict[tuple[str, str], str | None] = OrderedDict()
_lock = threading.Lock()


def _readable(checkpoint: _layout.Checkpoint) -> str | None:
    """``None`` if every checkpointable's metadata reads, else what is wrong."""
    memo = (os.path.realpath(checkpoint.path), checkpoint.scan.fingerprint)
    with _lock:
        if memo in _remembered:
            _remembered.move_to_end(memo)
            return _remembered[memo]
    try:
        _checkpoint.checkpoint_leaves(checkpoint)
        problem = None
    except ValueError as e:
        problem = str(e)
    with _lock:
        _remembered[memo] = problem
        while len(_remembered) > _MAX_REMEMBERED:
            _remembered.popitem(last=False)
    return problem


def _candidates(root: Path) -> list[Path]:
    if _layout.looks_like_checkpoint(root):
        return [root]
    found = []
    with os.scandir(root) as entries:
        for entry in entries:
            # Links are not followed: a run's checkpoints are its own directories.
            if not entry.is_dir(follow_symlinks=False):
                continue
            path = Path(entry.path)
            if (
                _layout.is_temporary_name(entry.name)
                or entry.name.isdigit()
                or _layout.looks_like_checkpoint(path)
            ):
                found.append(path)
    return found


def _subdirectories(path: Path) -> tuple[str, ...]:
    try:
        with os.scandir(path) as entries:
            return tuple(sorted(e.name for e in entries if e.is_dir(follow_symlinks=False)))
    except OSError:
        return ()


def _row(path: Path, errors: dict[str, str]) -> tuple[object, ...] | None:
    """The listing row of ``path``; ``None`` if it vanished (renamed or deleted) meanwhile."""
    name, step = path.name, _layout.step_from_name(path.name)
    if _layout.is_temporary_name(name):
        try:
            nbytes: int | None = _files.scan(path).nbytes
        except (ValueError, OSError):
            nbytes = None  # A save in progress changes under the scan.
        return (name, str(path), step, IN_PROGRESS, _subdirectories(path), nbytes, None)
    try:
        checkpoint = _layout.open_checkpoint(path)
    except (ValueError, OSError) as e:
        if not os.path.lexists(path):
            return None
        errors[str(path)] = str(e)
        return (name, str(path), step, INVALID, (), None, None)
    names = tuple(item.name for item in checkpoint.checkpointables)
    problem = _readable(checkpoint)
    if problem is not None:
        errors[str(path)] = problem
    status = COMPLETE if problem is None else INVALID
    return (
        name,
        str(path),
        step,
        status,
        names,
        checkpoint.scan.nbytes,
        checkpoint.committed_nsecs,
    )


def list_checkpoints(root: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per checkpoint under ``root``, or for ``root`` itself if it is one.

    A directory counts when it looks like a checkpoint: Orbax's marker files, a
    checkpointable directory, a step number as its name, or Orbax's temporary
    suffix. Each is read as ``checkpoint_table`` reads it (metadata only) to
    tell whether it is readable; the verdict is remembered until something
    under the directory changes. Symbolic links under ``root`` are not followed.

    Args:
      root: A run directory (Orbax V1 ``training.Checkpointer``, V0
        ``CheckpointManager``, or any directory of checkpoints) or a checkpoint.

    Returns:
      A DataFrame with columns ``name``, ``path``, ``step`` (``Int64``, from the
      name), ``status`` (``complete``; ``in progress`` for an Orbax temporary
      directory; ``invalid`` for one that cannot be read), ``checkpointables``
      (tuple of names), ``nbytes`` (size of its files) and ``committed`` (UTC
      commit time, or ``NaT``), sorted by step, then name. Why each invalid
      checkpoint cannot be read is in ``DataFrame.attrs["errors"]``, a dict of
      path to message.

    Raises:
      TypeError: If ``root`` is not a path.
      FileNotFoundError: If ``root`` does not exist.
      ValueError: If ``root`` is not a directory.
    """
    directory = _layout.existing_directory(root)
    errors: dict[str, str] = {}
    rows = [row for path in _candidates(directory) if (row := _row(path, errors)) is not None]
    table = frame(LISTING_COLUMNS[:-1], (row[:-1] for row in rows))
    table["committed"] = pd.to_datetime(
        pd.Series([row[-1] for row in rows], dtype="Int64"), unit="ns", utc=True
    )
    table = table.sort_values(["step", "name"], na_position="last", kind="stable")
    table = table.reset_index(drop=True)
    table.attrs["errors"] = errors
    return table
