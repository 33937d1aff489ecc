"""Path rules shared by every layer. Imports nothing beyond the standard library.

``tinax.explore`` must not load JAX or Orbax just to read a checkpoint from a
terminal, so these rules live here rather than in ``tinax.checkpointing``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# Orbax writes a checkpoint under `<name>.orbax-checkpoint-tmp[-<digits>]` and renames
# it when the save commits; such a path is never a finished checkpoint.
TEMPORARY_SUFFIX = ".orbax-checkpoint-tmp"
TEMPORARY_PATTERN = re.compile(re.escape(TEMPORARY_SUFFIX) + r"(-\d+)?$")


def is_temporary_name(name: str) -> bool:
    """Whether a path component carries Orbax's temporary suffix."""
    return bool(TEMPORARY_PATTERN.search(name))


def temporary_siblings(dest: Path) -> list[Path]:
    """Orbax temporary directories that belong to a save destined for ``dest``."""
    parent = dest.absolute().parent
    prefix = dest.name + TEMPORARY_SUFFIX
    try:
        entries = list(parent.iterdir())
    except OSError:
        return []
    return [p for p in entries if p.name.startswith(prefix) and is_temporary_name(p.name)]


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
