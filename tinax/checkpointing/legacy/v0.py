"""Legacy Orbax V0 checkpoints: PyTrees and Grain iterators.

Warning:
  This namespace is retained only for explicit Orbax V0 compatibility work, such
  as reading runs written by ``orbax.checkpoint.CheckpointManager`` with Grain's
  ``CheckpointSave``. Do not use it for new checkpoints.
"""

from __future__ import annotations

import os
from typing import Any

import grain
import orbax.checkpoint as ocp0

from tinax._paths import checkpoint_to_load
from tinax.checkpointing import _context, _destination
from tinax.checkpointing._checkpointables import orbax_path
from tinax.checkpointing._training import check_iterator

__all__ = [
    "load_legacy_v0_grain_iterator",
    "load_legacy_v0_pytree",
    "save_legacy_v0_grain_iterator",
    "save_legacy_v0_pytree",
]


def _save(path: str | os.PathLike[str], args: Any) -> None:
    # Claimed and checked as V1 saves are.
    dest = _destination.prepare(path, lambda: None, _context.context())
    checkpointer = ocp0.Checkpointer(args_handler_for(args))
    try:
        checkpointer.save(orbax_path(dest.location), args=args)
    except BaseException:
        dest.discard_temporaries()
        raise
    finally:
        dest.release()
        checkpointer.close()


def args_handler_for(args: Any) -> Any:
    if isinstance(args, grain.checkpoint.CheckpointSave | grain.checkpoint.CheckpointRestore):
        return grain.checkpoint.CheckpointHandler()
    return ocp0.PyTreeCheckpointHandler()


def save_legacy_v0_pytree(path: str | os.PathLike[str], state: Any) -> None:
    """Write one immutable legacy V0 PyTree checkpoint synchronously on every process's main thread.

    Args:
      path: Destination checkpoint directory. Must not use Orbax's reserved
        temporary suffix.
      state: PyTree of values to checkpoint.

    Raises:
      ValueError: If ``path`` uses Orbax's reserved temporary suffix.
      FileExistsError: If ``path`` already exists.
    """
    _save(path, ocp0.args.PyTreeSave(state))


def load_legacy_v0_pytree(path: str | os.PathLike[str], target: Any | None = None) -> Any:
    """Read one legacy V0 PyTree checkpoint synchronously on every process's main thread.

    Args:
      path: Source checkpoint directory.
      target: Optional PyTree restore target guiding structure and sharding.
        ``None`` restores the stored structure.

    Returns:
      The restored PyTree.

    Raises:
      ValueError: If ``path`` uses Orbax's reserved temporary suffix.
      FileNotFoundError: If ``path`` does not exist.
    """
    src = checkpoint_to_load(path).path
    checkpointer = ocp0.Checkpointer(ocp0.PyTreeCheckpointHandler())
    try:
        if target is None:
            return checkpointer.restore(orbax_path(src))
        restore_args = ocp0.checkpoint_utils.construct_restore_args(target)
        return checkpointer.restore(
            orbax_path(src), args=ocp0.args.PyTreeRestore(item=target, restore_args=restore_args)
        )
    finally:
        checkpointer.close()


def save_legacy_v0_grain_iterator(
    path: str | os.PathLike[str], iterator: grain.DatasetIterator
) -> None:
    """Write one immutable Grain iterator with its legacy V0 handler on every process's main thread.

    Args:
      path: Destination checkpoint directory.
      iterator: Grain ``DatasetIterator`` whose state is saved.

    Raises:
      TypeError: If ``iterator`` is not a ``grain.DatasetIterator``.
      ValueError: If ``path`` uses Orbax's reserved temporary suffix.
      FileExistsError: If ``path`` already exists.
    """
    check_iterator(iterator)
    _save(path, grain.checkpoint.CheckpointSave(item=iterator))


def load_legacy_v0_grain_iterator(
    path: str | os.PathLike[str], iterator: grain.DatasetIterator
) -> grain.DatasetIterator:
    """Read one Grain iterator with its legacy V0 handler on every process's main thread.

    The iterator is restored in place and its prefetch started, as Grain's
    handler does.

    Args:
      path: Source checkpoint directory.
      iterator: Grain ``DatasetIterator`` to restore in place.

    Returns:
      The restored ``grain.DatasetIterator`` (the object passed in).

    Raises:
      TypeError: If ``iterator`` is not a ``grain.DatasetIterator``, or the
        checkpoint did not restore a ``DatasetIterator``.
      ValueError: If ``path`` uses Orbax's reserved temporary suffix, or the
        stored state is not valid.
      FileNotFoundError: If ``path`` does not exist.
    """
    check_iterator(iterator)
    src = checkpoint_to_load(path).path
    checkpointer = ocp0.Checkpointer(grain.checkpoint.CheckpointHandler())
    try:
        restored = checkpointer.restore(
            orbax_path(src), args=grain.checkpoint.CheckpointRestore(item=iterator)
        )
    finally:
        checkpointer.close()
    if not isinstance(restored, grain.DatasetIterator):
        raise TypeError(
            f"checkpoint {str(src)!r} restored a {type(restored).__name__}, "
            "not a grain.DatasetIterator"
        )
    return restored
