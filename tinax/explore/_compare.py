"""A checkpoint against restore targets, leaf by leaf, before a restore."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import pandas as pd

from tinax import _paths
from tinax._format.metadata import fit
from tinax._format.metadata.layout import Checkpoint
from tinax._format.naming import words
from tinax.explore import _live
from tinax.explore._leaf_rows import frame

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
    "lossy",
)


def _shown(leaf: Any, spec: fit.Spec) -> fit.Spec:
    """The target as the caller wrote it: a typed PRNG key with its key dtype, say."""
    if spec.kind in words.ARRAY_KINDS:
        return fit.Spec(spec.kind, tuple(int(d) for d in leaf.shape), str(leaf.dtype))
    return spec


def _sides(v: fit.LeafVerdict, shown: dict[tuple[str, Any], fit.Spec]) -> list[Any]:
    target = shown.get((v.checkpointable, v.path), v.target)
    cells: list[Any] = []
    for field in ("kind", "shape", "dtype"):
        cells += [getattr(v.stored, field, None), getattr(target, field, None)]
    return cells


def compare_table(
    path: str | os.PathLike[str] | Checkpoint, targets: Mapping[str, Any]
) -> pd.DataFrame:
    """Every difference between a checkpoint and restore targets, named, leaf by leaf.

    The same verdict ``load_checkpointables`` reaches before it reads anything,
    from metadata alone; it compares leaves as Orbax stores them (a typed PRNG key
    as its key data) and shows the target as given. ``jax.Array`` and ``np.ndarray`` count as the same kind,
    since Orbax restores a stored array as whichever the target asks for; ``None``
    and containers without leaves (optax's ``EmptyState()``) are ``empty``.

    Args:
      path: A checkpoint directory (see ``checkpoint_table``).
      targets: A mapping of checkpointable name to restore target (concrete or
        abstract, see ``state_table``); Orbax's placeholder ``...`` marks a leaf
        that is not to be restored.

    Returns:
      A DataFrame with columns ``checkpointable``, ``key``, ``status`` (``ok``,
      ``shape differs``, ``dtype cast``, ``dtype differs``, ``kind differs``,
      ``missing from checkpoint``, ``not in target``, ``left out``), ``kind``,
      ``shape`` and ``dtype`` of each side, suffixed ``_checkpoint`` and
      ``_target``, and ``lossy`` (for a ``dtype cast``: whether some stored values
      would not survive it; a load refuses those unless
      ``tinax.checkpointing.allow_lossy_casts()`` allows them). Rows follow the
      checkpoint's order, with target leaves the checkpoint lacks after their
      checkpointable's stored leaves.

    Raises:
      TypeError: If ``targets`` is not a mapping with string keys, or ``path``
        is not a path.
      FileNotFoundError: If ``path`` does not exist.
      ValueError: If ``path`` is not a readable checkpoint.
    """
    targets = _live.check_mapping(targets)
    checkpoint = _paths.open_checkpoint(path)
    stored = fit.stored_specs(checkpoint)
    from tinax._targets import target_leaves, target_spec

    wanted: dict[str, list[tuple[Any, fit.Spec]]] = {}
    shown = {}
    for name, tree in targets.items():
        wanted[name] = []
        for key_path, leaf in target_leaves(tree):
            spec = target_spec(leaf)
            wanted[name].append((key_path, spec))
            shown[(name, key_path)] = _shown(leaf, spec)
    return frame(
        COMPARE_COLUMNS,
        (
            (v.checkpointable, v.key, v.status, *_sides(v, shown), v.lossy)
            for v in fit.judge(stored, wanted)
        ),
    )
