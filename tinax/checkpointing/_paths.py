"""Checkpoint paths: argument checks shared by every save and load."""

from __future__ import annotations

import os
from pathlib import Path, PurePath

from tinax._paths import TEMPORARY_SUFFIX, is_temporary_name, temporary_siblings, text_path

__all__ = [
    "TEMPORARY_SUFFIX",
    "as_path",
    "destination_path",
    "is_temporary_name",
    "source_path",
    "temporary_siblings",
]


def as_path(path: object, *, what: str = "path") -> Path:
    """Converts ``path`` to a ``Path``, refusing Orbax's temporary suffix.

    Raises:
      TypeError: If ``path`` is not a ``str`` or ``os.PathLike[str]``.
      ValueError: If ``path`` is empty or its final component uses the temporary
        suffix (also behind trailing ``/`` or ``/.``).
    """
    raw = text_path(path, what=what)
    # PurePath drops trailing separators and "." components, so "x.orbax-checkpoint-tmp/."
    # is caught as well.
    final = PurePath(raw).name
    if is_temporary_name(final):
        raise ValueError(
            f"{what} {raw!r} uses Orbax's reserved temporary suffix {TEMPORARY_SUFFIX!r}"
        )
    return Path(raw)


def destination_path(path: object) -> Path:
    """Checks a save destination: new, and with a directory to land in.

    Raises:
      TypeError, ValueError: As for ``as_path``.
      FileExistsError: If anything already exists at ``path``, or a save to it
        is in progress (its Orbax temporary directory exists).
      FileNotFoundError: If the parent directory does not exist.
    """
    dest = as_path(path)
    if os.path.lexists(dest):
        raise FileExistsError(
            f"checkpoint destination {str(dest)!r} already exists; saves never overwrite"
        )
    parent = dest.absolute().parent
    if not parent.is_dir():
        raise FileNotFoundError(
            f"parent directory of {str(dest)!r} does not exist: {str(parent)!r}"
        )
    pending = temporary_siblings(dest)
    if pending:
        raise FileExistsError(
            f"a save to {str(dest)!r} is in progress or was interrupted: "
            f"{str(pending[0])!r} exists (delete it if no save is running)"
        )
    return dest


def source_path(path: object) -> Path:
    """Checks a load source: an existing directory.

    Raises:
      TypeError, ValueError: As for ``as_path``; ``ValueError`` also when ``path`` is
        not a directory.
      FileNotFoundError: If nothing exists at ``path``.
    """
    src = as_path(path)
    if not src.exists():
        raise FileNotFoundError(f"checkpoint {str(src)!r} does not exist")
    if not src.is_dir():
        raise ValueError(f"checkpoint {str(src)!r} is not a directory")
    return src
