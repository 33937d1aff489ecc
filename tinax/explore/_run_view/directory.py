"""Paths and names in a run directory, for code that saves into one or watches a save:
where a path points, the next checkpoint's name in the run's own pattern, whether a
name is free, and how many bytes a save has written so far.

Each takes a local path or a ``gs://`` URL and returns plain strings and ints.
"""

from __future__ import annotations

import os
import re

from tinax import _paths
from tinax._claims import temporary_status, uncommitted_status
from tinax._format.metadata.layout import looks_like_checkpoint
from tinax._format.naming.names import (
    TEMPORARY_SUFFIX,
    final_name,
    is_temporary_name,
    step_from_name,
)
from tinax._format.naming.words import IN_PROGRESS
from tinax._format.storage.location import DIRECTORY, Location, tree_bytes

PathLike = str | os.PathLike[str]
_TRAILING_DIGITS = re.compile(r"\d+$")


def resolve_path(path: object, *, what: str = "path") -> str:
    """Where ``path`` points, as one string: a ``gs://`` URL, or an absolute local path.

    Raises:
      TypeError: If ``path`` is not a string or path.
      ValueError: If it is empty or a ``gs://`` URL without a bucket.
    """
    return str(_paths.location(path, what=what))


def existing_directory(path: PathLike, *, what: str = "directory") -> str:
    """``path`` resolved, checked to be an existing directory (a link to one is followed).

    Raises:
      TypeError: If ``path`` is not a string or path.
      FileNotFoundError: If nothing exists there.
      ValueError: If it is empty or not a directory.
    """
    return str(_paths.existing_directory(path, what=what))


def save_directory(path: PathLike, *, what: str = "directory") -> str:
    """``path`` resolved, checked to be a place checkpoints can be saved in: an existing
    local directory, or any ``gs://`` prefix in an existing bucket.

    Raises:
      TypeError: If ``path`` is not a string or path.
      FileNotFoundError: If it does not exist (on ``gs://``: its bucket does not).
      ValueError: If it is empty or not a directory.
    """
    return str(_paths.save_directory(path, what=what))


def bytes_written(destination: PathLike) -> int:
    """Bytes written so far by a save headed for ``destination``.

    Counts Orbax's temporary directories first and the final directory once the
    save has renamed it, so the count keeps growing across the commit.
    """
    where = _paths.location(destination, what="destination")
    return sum(tree_bytes(p) for p in _paths.temporary_siblings(where)) + tree_bytes(where)


def _location(path: PathLike | Location, what: str) -> Location:
    return path if isinstance(path, Location) else _paths.location(path, what=what)


def next_checkpoint_name(directory: PathLike) -> str:
    """The name of the run's next checkpoint, written in the run's own pattern.

    The step is one interval past the highest step among the run's checkpoints
    (the interval is the gap between the two highest steps; 1 when there are
    fewer), written with the prefix and zero padding of the checkpoint that has the
    highest step: ``step_000400`` after ``step_000050 … step_000350``, ``42`` after
    ``41``. Steps are read as the listing reads them (``step_from_name``). Saves
    still in progress and interrupted ones count; other directories (``logs_2026``)
    do not, though no name already taken is proposed. ``step-0`` in an empty run.
    """
    run = _location(directory, "directory")
    entries = run.entries()
    taken = {final_name(name) for name in entries}
    candidates = sorted(
        (
            (step, final_name(name), is_temporary_name(name))
            for name, entry in entries.items()
            if entry.kind == DIRECTORY and (step := step_from_name(name)) is not None
        ),
        reverse=True,
    )
    # From the highest step down, the first two that are checkpoints (or saves of
    # one) are enough: only they decide the pattern and the interval.
    found: list[tuple[int, str]] = []
    for step, name, temporary in candidates:
        if found and step == found[-1][0]:
            continue
        if temporary or looks_like_checkpoint(run / name):
            found.append((step, name))
            if len(found) == 2:
                break
    if not found:
        return "step-0"
    highest, pattern = found[0]
    interval = highest - found[1][0] if len(found) > 1 else 1
    digits = _TRAILING_DIGITS.search(pattern)
    assert digits is not None  # step_from_name found them
    prefix, width = pattern[: digits.start()], len(digits.group())
    padded = digits.group().startswith("0") and width > 1
    step = highest + interval
    while True:
        name = prefix + (str(step).zfill(width) if padded else str(step))
        if name not in taken:
            return name
        step += interval


def check_new_checkpoint_name(directory: PathLike, name: object) -> str:
    """Checks that ``name`` can become a new checkpoint directory under ``directory``.

    Args:
      directory: The run directory the checkpoint is saved in.
      name: The proposed checkpoint directory name.

    Returns:
      ``name``, unchanged.

    Raises:
      TypeError: If ``name`` is not a string.
      ValueError: If ``name`` is not a portable path component, uses Orbax's
        temporary suffix, or is already taken by a checkpoint, a file or a save in
        progress. What an interrupted save left does not take it: the save removes it.
    """
    from tinax.checkpointing import validate_checkpointable_name  # Orbax, only here

    run = _location(directory, "directory")
    if not isinstance(name, str):
        raise TypeError(f"checkpoint name must be a str, got {type(name).__name__}")
    if not name.strip():
        raise ValueError("checkpoint name must not be empty")
    try:
        validate_checkpointable_name(name)
    except ValueError as e:
        # The checkpointable-name rules are exactly the portable path component rules.
        raise ValueError(str(e).replace("checkpointable name", "checkpoint name")) from None
    if TEMPORARY_SUFFIX in name:
        raise ValueError(
            f"checkpoint name {name!r} uses Orbax's reserved temporary marker {TEMPORARY_SUFFIX!r}"
        )
    target = run / name
    if target.exists():
        # On object stores a save writes in place; one that never committed is judged
        # like a temporary directory.
        unfinished = uncommitted_status(target.snapshot())
        if unfinished is None:
            raise ValueError(f"{name!r} is already taken in {str(run)!r}")
        if unfinished.status == IN_PROGRESS:
            raise ValueError(f"a save to {name!r} is already in progress in {str(run)!r}")
    if any(temporary_status(t).status == IN_PROGRESS for t in _paths.temporary_siblings(target)):
        raise ValueError(f"a save to {name!r} is already in progress in {str(run)!r}")
    return name


def path_exists(path: PathLike) -> bool:
    """Whether anything exists at ``path`` (a local path or a ``gs://`` URL)."""
    return _paths.location(path).exists()
