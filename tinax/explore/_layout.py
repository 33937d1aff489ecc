"""Which checkpoint a directory is, and which checkpointables it holds, in which layout.

Recognised: Orbax V1 ``save_checkpointables`` output and ``training.Checkpointer`` steps,
Orbax V0 ``CheckpointManager`` steps (``Composite`` items, grain's ``CheckpointSave``),
flat V0 single-item checkpoints, and tinax's own records of leafless pytrees.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from pathlib import Path, PurePath

from tinax._paths import TEMPORARY_PATTERN, is_temporary_name, text_path
from tinax.explore import _files

CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"
PYTREE_METADATA = "_METADATA"
# tinax.checkpointing writes pytrees without leaves as this JSON record.
EMPTY_PYTREE_FILE = "empty_pytree.json"
# Orbax V1 JsonHandler / MetricsHandler file names.
JSON_FILES = ("data.json", "metrics", "metadata")
ITERATOR_FILE = re.compile(r"^process_(\d+)-of-(\d+)\.json$")
# Files only Orbax writes at a checkpoint's root.
_MARKERS = (CHECKPOINT_METADATA, "commit_success.txt", "orbax.checkpoint", PYTREE_METADATA)

# Step directories: `<step>` or `<prefix>_<step>` as Orbax names them (zero padding
# allowed), or `<prefix>-<step>`.
_STEP = re.compile(r"^(?:.*[_-])?(\d+)$")

PYTREE = "pytree"
ITERATOR = "iterator"
JSON = "json"
EMPTY = "empty"
UNKNOWN = "unknown"


def step_from_name(name: str) -> int | None:
    """The step a checkpoint directory's name carries, if any (also for temporaries)."""
    match = _STEP.match(TEMPORARY_PATTERN.sub("", name))
    return int(match.group(1)) if match else None


@dataclasses.dataclass(frozen=True)
class StoredCheckpointable:
    """One checkpointable as stored.

    Attributes:
      name: Its name; ``""`` for the single item of a flat V0 checkpoint.
      directory: The directory holding it.
      layout: ``pytree``, ``iterator``, ``json``, ``empty`` or ``unknown``.
    """

    name: str
    directory: Path
    layout: str


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A checkpoint directory that has been checked and whose layout is known.

    Attributes:
      path: The checkpoint directory, as the caller named it.
      checkpointables: What it holds, in stored order.
      committed_nsecs: Commit time from ``_CHECKPOINT_METADATA``, if recorded.
      scan: Size and fingerprint of everything under ``path``.
    """

    path: Path
    checkpointables: tuple[StoredCheckpointable, ...]
    committed_nsecs: int | None
    scan: _files.Scan

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


def as_path(path: object) -> Path:
    """Converts a user's path argument, refusing other types.

    Raises:
      TypeError: If ``path`` is not a ``str`` or ``os.PathLike[str]``.
      ValueError: If ``path`` is empty.
    """
    raw = text_path(path)
    # Absolute and free of ".." from here on: tensorstore refuses paths with ".."
    # components, and the symlink checks compare absolute locations.
    return Path(os.path.abspath(raw))


def existing_directory(path: object) -> Path:
    """An existing directory named by the caller.

    Raises:
      TypeError: As for ``as_path``.
      FileNotFoundError: If nothing exists at ``path``.
      ValueError: If ``path`` is empty or not a directory.
    """
    p = as_path(path)
    if not os.path.lexists(p):
        raise FileNotFoundError(f"{str(p)!r} does not exist")
    if not p.is_dir():
        raise ValueError(f"{str(p)!r} is not a directory")
    return p


def _entries(directory: Path) -> dict[str, int]:
    """Names and ``st_mode`` of the entries of ``directory``, not following links."""
    try:
        with os.scandir(directory) as it:
            return {e.name: e.stat(follow_symlinks=False).st_mode for e in it}
    except OSError:
        return {}


def classify(directory: Path) -> str | None:
    """The layout of a checkpointable directory, or ``None`` if it holds none."""
    entries = _entries(directory)
    if PYTREE_METADATA in entries:
        return PYTREE
    if any(ITERATOR_FILE.match(name) for name in entries):
        return ITERATOR
    if EMPTY_PYTREE_FILE in entries:
        return EMPTY
    if any(stat.S_ISREG(entries.get(name, 0)) for name in JSON_FILES):
        return JSON
    return None


def _checkpointable_dirs(directory: Path) -> list[str]:
    """Subdirectories that hold a checkpointable (and are not checkpoints themselves)."""
    return sorted(
        name
        for name, mode in _entries(directory).items()
        if stat.S_ISDIR(mode)
        and classify(directory / name) is not None
        and not os.path.lexists(directory / name / CHECKPOINT_METADATA)
    )


def looks_like_checkpoint(directory: Path) -> bool:
    """Whether ``directory`` is meant to be a checkpoint (readable or not)."""
    entries = _entries(directory)
    return any(marker in entries for marker in _MARKERS) or bool(_checkpointable_dirs(directory))


def _check_component(name: str, meta_file: Path) -> None:
    if not name or name in (".", "..") or PurePath(name).name != name or "\\" in name:
        raise ValueError(
            f"{str(meta_file)!r} names checkpointable {name!r}, which is not a plain directory name"
        )


def _from_handlers(path: Path, handlers: dict[object, object], meta_file: Path) -> list[str]:
    names = []
    for name in handlers:
        if not isinstance(name, str):
            raise ValueError(f"{str(meta_file)!r} has a non-string checkpointable name")
        _check_component(name, meta_file)
        if not (path / name).is_dir():
            raise ValueError(
                f"checkpoint {str(path)!r} lists checkpointable {name!r} in "
                f"{CHECKPOINT_METADATA} but has no directory for it"
            )
        names.append(name)
    return names


def open_checkpoint(path: object) -> Checkpoint:
    """Checks a checkpoint directory and finds what it holds, reading metadata only.

    Args:
      path: The checkpoint directory.

    Returns:
      The checkpoint's layout.

    Raises:
      TypeError: If ``path`` is not a path.
      FileNotFoundError: If nothing exists at ``path``.
      ValueError: If ``path`` is an Orbax temporary directory, not a checkpoint,
        holds a link out of itself, or its ``_CHECKPOINT_METADATA`` is unreadable;
        the message names the path and what is wrong.
    """
    p = existing_directory(path)
    if is_temporary_name(p.name):
        raise ValueError(
            f"{str(p)!r} is an Orbax temporary directory: a save in progress or one "
            "that failed, not a checkpoint"
        )
    found = _files.scan(p)
    meta_file = p / CHECKPOINT_METADATA
    committed: int | None = None
    handlers: object = None
    has_meta = os.path.lexists(meta_file)
    if has_meta:
        meta = _files.read_json_object(meta_file, what="Orbax checkpoint metadata", max_depth=None)
        handlers = meta.get("item_handlers")
        stamp = meta.get("commit_timestamp_nsecs")
        if isinstance(stamp, int) and not isinstance(stamp, bool) and stamp > 0:
            committed = stamp

    if isinstance(handlers, dict):
        names = _from_handlers(p, handlers, meta_file)
    elif handlers is not None and not isinstance(handlers, str):
        raise ValueError(
            f"{str(meta_file)!r} has item_handlers of type {type(handlers).__name__}; "
            "expected an object or a string"
        )
    elif classify(p) is not None or isinstance(handlers, str):
        # A flat checkpoint: the directory itself is the one, unnamed item.
        return Checkpoint(
            p, (StoredCheckpointable("", p, classify(p) or UNKNOWN),), committed, found
        )
    else:
        names = _checkpointable_dirs(p)

    if not names:
        children = [
            name
            for name, mode in _entries(p).items()
            if stat.S_ISDIR(mode) and looks_like_checkpoint(p / name)
        ]
        if children:
            raise ValueError(
                f"{str(p)!r} is a directory of {len(children)} checkpoint(s), not a "
                "checkpoint; pass one of them, or list them with list_checkpoints"
            )
        if has_meta:
            raise ValueError(f"checkpoint {str(p)!r} holds no checkpointables")
        raise ValueError(
            f"{str(p)!r} is not an Orbax checkpoint: it has no {CHECKPOINT_METADATA} "
            "and no checkpointable directories"
        )
    items = tuple(StoredCheckpointable(n, p / n, classify(p / n) or UNKNOWN) for n in names)
    return Checkpoint(p, items, committed, found)
