"""A checkpoint's leaf table in two steps, for views that show keys at once and
shapes and sizes when read: ``open_leaves(path).keys()``, then ``.table()``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pandas as pd

from tinax import _paths
from tinax._format.metadata.layout import Checkpoint
from tinax._format.storage import files
from tinax.explore import _checkpoint


class StagedLeaves:
    """A checkpoint opened (checked, its layout known) whose leaf table is read in
    two steps. Made by ``open_leaves``."""

    def __init__(self, path: object) -> None:
        self._checkpoint = _paths.open_checkpoint(path)

    @property
    def checkpoint(self) -> Checkpoint:
        """The checkpoint as opened: every table, ``verify`` and ``diff_table`` take it
        in place of its path, and read nothing of it again."""
        return self._checkpoint

    def keys(self) -> pd.DataFrame:
        """The rows of ``checkpoint_table`` as far as the metadata already parsed tells:
        ``checkpointable``, ``key`` and ``kind`` of every leaf; the other columns of
        pytree leaves are missing. Quick for any size of checkpoint.

        Raises:
          ValueError: If a checkpointable's metadata is unreadable.
        """
        return _checkpoint.key_table(self._checkpoint).reset_index(drop=True)

    def table(self) -> pd.DataFrame:
        """``checkpoint_table`` of the checkpoint: every column, array data never read.

        Raises:
          ValueError: If any checkpointable's metadata is missing or unreadable.
        """
        return _checkpoint.leaf_table(self._checkpoint).reset_index(drop=True)


def open_leaves(path: object) -> StagedLeaves:
    """The checkpoint at ``path``, checked and opened for its leaf table in two steps.

    Raises:
      TypeError: If ``path`` is not a path.
      FileNotFoundError: If nothing exists at ``path``.
      ValueError: If ``path`` is not a readable checkpoint.
    """
    return StagedLeaves(path)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pauses Python's cycle collector while a large checkpoint's metadata becomes
    objects (millions of allocations would set it off again and again); it runs
    again when the last pause of any thread ends."""
    with files.paused_gc():
        yield
