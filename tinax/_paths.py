"""Path arguments, checked once for every layer. Imports nothing heavier than tinax._format.

Every public function and widget that takes a path turns it into a ``Location``
here, so that a path is refused for the same reasons, with the same words,
wherever it is given. One that reads a checkpoint opens it here once: with
``open_checkpoint``, the one public way to open a checkpoint (``tinax.explore`` and
``tinax.checkpointing`` export this same function), or, for a load, with
``checkpoint_to_load``, which also refuses what a load must not take. Every such
function takes an opened checkpoint in place of a path, as it is, and hands it down.
"""

from __future__ import annotations

import contextlib
import os

from tinax._format.integrity import preflight
from tinax._format.metadata import layout
from tinax._format.naming import names
from tinax._format.records import runrecord
from tinax._format.storage import locate
from tinax._format.storage.location import DIRECTORY, LINK, Location


def text_path(path: object, *, what: str = "path") -> str:
    """The text of a path argument.

    Raises:
      TypeError: If ``path`` is not a ``str`` or an ``os.PathLike`` of text.
      ValueError: If ``path`` is empty.
    """
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"{what} must be a str or os.PathLike, got {type(path).__name__}")
    raw = os.fspath(path)
    if not isinstance(raw, str):
        raise TypeError(f"{what} must be a text path, got {type(raw).__name__}")
    if not raw:
        raise ValueError(f"{what} must not be empty")
    return raw


def location(path: object, *, what: str = "path") -> Location:
    """Where ``path`` points: a ``gs://bucket/key`` URL, or a local path made absolute;
    ``..`` resolved either way.

    Raises:
      TypeError, ValueError: As for ``text_path``; ``ValueError`` also for a
        ``gs://`` URL without a bucket.
    """
    raw = text_path(path, what=what)
    try:
        return locate.location(raw)
    except ValueError as e:
        raise ValueError(f"{what} {raw!r}: {e}") from None


def checkpoint_location(path: object, *, what: str = "path") -> Location:
    """``location``, refusing a path whose final component is Orbax's temporary name.

    Raises:
      TypeError: As for ``text_path``.
      ValueError: If ``path`` is empty or its final component uses the temporary
        suffix (also behind trailing ``/`` or ``/.``).
    """
    raw = text_path(path, what=what)
    where = location(raw, what=what)
    if names.is_temporary_name(where.name):
        raise ValueError(
            f"{what} {raw!r} uses Orbax's reserved temporary suffix {names.TEMPORARY_SUFFIX!r}"
        )
    return where


def _followed_kind(where: Location) -> str | None:
    """The kind of what is at ``where``, following a link the caller named."""
    entry = where.entry()
    if entry is not None and entry.kind == LINK and entry.link_target:
        target = where.storage.entry(entry.link_target)
        return None if target is None else target.kind
    return None if entry is None else entry.kind


def existing_directory(path: object, *, what: str = "path") -> Location:
    """An existing directory named by the caller (a link to one is followed).

    Raises:
      TypeError: As for ``text_path``.
      FileNotFoundError: If nothing exists at ``path``.
      ValueError: If ``path`` is empty or not a directory.
    """
    where = location(path, what=what)
    kind = _followed_kind(where)
    if kind is None and not where.exists():
        raise FileNotFoundError(f"{what} {str(where)!r} does not exist")
    if kind != DIRECTORY:
        raise ValueError(f"{what} {str(where)!r} is not a directory")
    return where


def save_directory(path: object, *, what: str = "directory") -> Location:
    """A directory checkpoints are saved in: an existing local directory, or any
    ``gs://`` prefix in an existing bucket (object stores have no empty directories).

    Raises:
      TypeError: As for ``text_path``.
      FileNotFoundError: If it does not exist (on ``gs://``: its bucket does not).
      ValueError: If ``path`` is empty or not a directory.
    """
    where = location(path, what=what)
    if where.storage.implicit_directories:
        found = where.entry()  # raises FileNotFoundError naming a missing bucket
        if found is not None and found.kind != DIRECTORY:
            raise ValueError(f"{what} {str(where)!r} is not a directory")
        return where
    return existing_directory(path, what=what)


def temporary_siblings(dest: Location) -> list[Location]:
    """Orbax temporary directories that belong to a save destined for ``dest``."""
    prefix = dest.name + names.TEMPORARY_SUFFIX
    return [
        dest.parent / name
        for name in sorted(dest.parent.entries())
        if name.startswith(prefix) and names.is_temporary_name(name)
    ]


def save_destination(path: object) -> Location:
    """Checks a save destination: new, and with a directory to land in.

    A leftover temporary directory, or (on object stores) a destination holding a
    save that never committed, is not judged here: whether its save still runs is
    for the claim on the destination to tell (``tinax._claims``).

    Raises:
      TypeError, ValueError: As for ``checkpoint_location``.
      FileExistsError: If anything already exists at ``path``.
      FileNotFoundError: If the parent directory does not exist.
    """
    dest = checkpoint_location(path)
    # A save that never committed in place (object stores) is for the claim to judge.
    if dest.exists() and not layout.is_uncommitted(dest):
        raise FileExistsError(
            f"checkpoint destination {str(dest)!r} already exists; saves never overwrite"
        )
    if dest.storage.implicit_directories:
        # Any path in an existing bucket can be written; ``entry`` raises
        # FileNotFoundError naming the bucket if there is none.
        dest.parent.entry()
    elif _followed_kind(dest.parent) != DIRECTORY:
        raise FileNotFoundError(
            f"parent directory of {str(dest)!r} does not exist: {str(dest.parent)!r}"
        )
    return dest


def listed_directory(path: object, *, what: str = "path") -> Location:
    """``existing_directory``, listed whole at once where listing is a round trip.

    On an object store the whole tree under ``path`` is listed in one request per
    thousand objects (``Location.snapshot``), and that listing says whether the
    directory is there: nothing else is asked of the store, unless it is not. A
    ``Location`` within such a listing (a checkpoint of a listed run) is taken as it
    is, without a request.

    Raises:
      As ``existing_directory``.
    """
    if isinstance(path, layout.Checkpoint):
        return path.path  # opened, so listed already
    if isinstance(path, Location):
        # Listed already by whoever found it (a run's listing): within that listing.
        return path.snapshot()
    where = location(path, what=what)
    if where.storage.implicit_directories:
        try:
            listed = where.snapshot()
        except FileNotFoundError:
            listed = None  # no bucket: said below, naming it
        if listed is not None and listed.entry() is not None:
            return listed
    return existing_directory(path, what=what).snapshot()


def listed_in(directory: Location, name: object, path: object) -> Location:
    """The checkpoint of a row of ``directory``'s listing (its ``name`` and ``path``),
    within that listing where it is there: ``directory`` itself (a checkpoint listed
    alone) or ``directory / name``. A row from elsewhere (a two-tier run's other tier)
    is its own ``path``."""
    text = str(path)
    if text == str(directory):
        return directory
    inside = directory / str(name)
    if text == str(inside):
        return inside
    return location(text)


def open_checkpoint(
    path: object, *, what: str = "path", every_record: bool = True
) -> layout.Checkpoint:
    """The checkpoint at ``path``, opened: listed once, checked by the preflight every
    read passes first (``tinax._format.integrity.preflight``), its layout and commit
    record read.

    What every load, table, ``verify``, diff, export and widget takes in place of a
    path; what it reads of the checkpoint beyond that is read once and kept on it.
    A checkpoint a training run's restore set aside as corrupt opens (to be looked
    at); the loads refuse it (``checkpoint_to_load``). A ``layout.Checkpoint`` (what
    this returns) is returned as it is: opened again from its path, a checkpoint is
    read afresh. ``every_record=False`` leaves each leaf's checksum record undecoded
    until a reader of that leaf asks (``preflight.check``).

    Raises:
      TypeError: If ``path`` is not a path or an opened checkpoint.
      FileNotFoundError: If nothing exists at ``path``.
      ValueError: If ``path`` is not a directory or not a readable checkpoint, the
        message naming the path (or the file) and what is wrong.
    """
    if isinstance(path, layout.Checkpoint):
        return path
    return preflight.check(listed_directory(path, what=what), every_record=every_record)


def checkpoint_to_load(path: object) -> layout.Checkpoint:
    """The source of a load, opened as ``open_checkpoint`` opens it, refusing Orbax's
    temporary name and a checkpoint a training run's restore set aside as corrupt.

    Every load starts here, before anything in the checkpoint is read.

    Raises:
      TypeError, ValueError: As for ``checkpoint_location``; ``ValueError`` also when
        ``path`` is not a directory or the preflight refuses it (naming the file).
      FileNotFoundError: If nothing exists at ``path``.
    """
    if isinstance(path, layout.Checkpoint):
        _refuse_found_corrupt(path.path)
        return path
    src = checkpoint_location(path)
    listed = src
    if src.storage.implicit_directories:
        with contextlib.suppress(FileNotFoundError):  # no bucket: said below, naming it
            listed = src.snapshot()
    kind = DIRECTORY if listed.is_dir() else _followed_kind(src)
    if kind is None:
        raise FileNotFoundError(f"checkpoint {str(src)!r} does not exist")
    if kind != DIRECTORY:
        raise ValueError(f"checkpoint {str(src)!r} is not a directory")
    _refuse_found_corrupt(listed)
    return preflight.check(listed)


def _refuse_found_corrupt(src: Location) -> None:
    reason = runrecord.found_corrupt(src)
    if reason is not None:
        raise ValueError(
            f"checkpoint {str(src)!r} was found corrupt by a training run's restore and set "
            f"aside ({reason}); it is kept for inspection with tinax.explore, not for loading"
        )
