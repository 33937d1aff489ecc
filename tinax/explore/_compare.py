"""A checkpoint against restore targets, leaf by leaf, before a restore."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import pandas as pd

from tinax._format import words
from tinax._format.words import (
    DTYPE_DIFFERS,
    KIND_DIFFERS,
    MISSING_FROM_CHECKPOINT,
    NOT_IN_TARGET,
    OK,
    SHAPE_DIFFERS,
)
from tinax.explore import _checkpoint, _live
from tinax.explore._leaves import Leaf, frame

COMPARE_COLUMNS = (
    "checkpointable",
    "key",
    "status",
    "kind_checkpoint",
    "kind_target",
    "shape_checkpoint",
    "shape_target",
    "dtype_checkpoint",
    "dtype_target",
)


def _family(kind: str) -> str:
    # Orbax restores a stored array as whichever array the target asks for.
    return "array" if kind in words.ARRAY_KINDS else kind


def _status(stored: Leaf, target: Leaf, target_leaf: Any) -> str:
    if _family(stored.kind) != _family(target.kind):
        return KIND_DIFFERS
    shape, dtype = target.shape, target.dtype
    if stored.kind in words.ARRAY_KINDS and shape is not None and dtype is not None:
        # Compare with what Orbax stores for the target (PRNG keys as key data).
        shape, dtype = _live.storage_spec(shape, target_leaf.dtype)
    if stored.shape is not None and shape is not None and stored.shape != shape:
        return SHAPE_DIFFERS
    if stored.dtype is not None and dtype is not None and stored.dtype != dtype:
        return DTYPE_DIFFERS
    return OK


def compare_table(path: str | os.PathLike[str], targets: Mapping[str, Any]) -> pd.DataFrame:
    """Every difference between a checkpoint and restore targets, named, leaf by leaf.

    The outer join of ``checkpoint_table(path)`` and ``state_table(targets)`` on
    ``(checkpointable, key)``. ``jax.Array`` and ``np.ndarray`` count as the same
    kind, since Orbax restores a stored array as whichever the target asks for.

    Args:
      path: A checkpoint directory (see ``checkpoint_table``).
      targets: A mapping of checkpointable name to restore target (concrete or
        abstract, see ``state_table``).

    Returns:
      A DataFrame with columns ``checkpointable``, ``key``, ``status`` (``ok``,
      ``shape differs``, ``dtype differs``, ``kind differs``, ``missing from
      checkpoint``, ``not in target``), and ``kind``, ``shape`` and ``dtype``
      of each side, suffixed ``_checkpoint`` and ``_target``. Rows follow the
      checkpoint's order, with target leaves the checkpoint lacks after their
      checkpointable's stored leaves.

    Raises:
      TypeError: If ``targets`` is not a mapping with string keys, or ``path``
        is not a path.
      FileNotFoundError: If ``path`` does not exist.
      ValueError: If ``path`` is not a readable checkpoint.
    """
    live = _live.live_leaves(targets)
    stored = _checkpoint.checkpoint_leaves(_checkpoint.open_checkpoint(path), values=False)
    wanted = {(leaf.checkpointable, leaf.key): (leaf, obj) for leaf, obj in live}
    names = dict.fromkeys([leaf.checkpointable for leaf in stored])
    names.update(dict.fromkeys(leaf.checkpointable for leaf, _ in live))
    records = []
    for name in names:
        for leaf in stored:
            if leaf.checkpointable != name:
                continue
            match = wanted.pop((name, leaf.key), None)
            if match is None:
                records.append(_record(leaf.key, NOT_IN_TARGET, leaf, None, name))
            else:
                records.append(_record(leaf.key, _status(leaf, *match), leaf, match[0], name))
        for key in [key for (t_name, key) in wanted if t_name == name]:
            target, _ = wanted.pop((name, key))
            records.append(_record(key, MISSING_FROM_CHECKPOINT, None, target, name))
    return frame(COMPARE_COLUMNS, records)


def _record(
    key: str, status: str, stored: Leaf | None, target: Leaf | None, name: str
) -> tuple[Any, ...]:
    sides = []
    for field in ("kind", "shape", "dtype"):
        sides += [getattr(stored, field, None), getattr(target, field, None)]
    return (name, key, status, *sides)
