"""Saving and loading named checkpointables in one atomic Orbax V1 checkpoint."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
from orbax.checkpoint import v1 as ocp

from tinax.checkpointing import _orbax
from tinax.checkpointing._leaves import check_storable
from tinax.checkpointing._names import validate_distinct_names
from tinax.checkpointing._paths import destination_path, source_path
from tinax.checkpointing._response import SaveResponse, remove_temporaries
from tinax.checkpointing._targets import NumpyTarget

CHECKPOINT_METADATA_FILE = "_CHECKPOINT_METADATA"
# Refuse metadata files far larger than Orbax ever writes rather than parse them.
_MAX_METADATA_BYTES = 16 * 1024 * 1024


def _check_mapping(value: object, *, what: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} must be a mapping of name to value, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    validate_distinct_names(value.keys(), what=what)
    return value


def save_checkpointables(
    path: str | os.PathLike[str],
    checkpointables: Mapping[str, Any],
) -> SaveResponse[None]:
    """Start one immutable atomic V1 save on every process's main thread.

    Everything is checked before anything is written: the destination must not
    exist, and every leaf must be storable. The returned response removes the
    Orbax temporary directory if the save fails.

    Args:
      path: Destination checkpoint directory. Must not use Orbax's reserved
        temporary suffix.
      checkpointables: Non-empty mapping of checkpointable name to value. Names
        must be portable and distinct.

    Returns:
      An Orbax ``AsyncResponse``; call ``.result()`` to await completion before
      loading from or deleting the destination.

    Raises:
      TypeError: If ``checkpointables`` is not a mapping or a name is not a
        string, or a leaf cannot be stored (naming the checkpointable and the
        leaf's key path).
      ValueError: If ``checkpointables`` is empty, a name is invalid or not
        distinct, or ``path`` uses the reserved temporary suffix.
      FileExistsError: If ``path`` already exists.
      FileNotFoundError: If the parent directory of ``path`` does not exist.
    """
    _check_mapping(checkpointables, what="checkpointables")
    dest = destination_path(path)
    for name, value in checkpointables.items():
        check_storable(name, value)
    try:
        with _orbax.context():
            # Orbax requires absolute paths.
            inner = ocp.save_checkpointables_async(dest.absolute(), dict(checkpointables))
    except BaseException:
        remove_temporaries(dest)
        raise
    return SaveResponse(inner, dest)


def read_item_handlers(path: Path) -> dict[str, str | None]:
    """Names of the checkpointables stored at ``path`` and their handler type strings.

    Raises:
      ValueError: If ``path`` is not a readable Orbax checkpoint, naming the path
        and what is wrong.
    """
    meta_file = path / CHECKPOINT_METADATA_FILE
    if not meta_file.is_file():
        raise ValueError(
            f"{str(path)!r} is not an Orbax checkpoint: it has no {CHECKPOINT_METADATA_FILE} file"
        )
    if meta_file.stat().st_size > _MAX_METADATA_BYTES:
        raise ValueError(f"{str(meta_file)!r} is implausibly large; refusing to read it")
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError) as e:
        raise ValueError(f"{str(meta_file)!r} is not valid JSON: {e}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{str(meta_file)!r} does not hold a JSON object")
    handlers = meta.get("item_handlers")
    if isinstance(handlers, dict):
        return {str(k): v if isinstance(v, str) else None for k, v in handlers.items()}
    # Checkpoints without a handler record: every subdirectory is a checkpointable.
    return {p.name: None for p in sorted(path.iterdir()) if p.is_dir()}


def _leaf_spec(leaf: Any) -> tuple[tuple[int, ...], Any] | None:
    # dtypes are compared as they are, not through np.dtype: typed PRNG keys have
    # extended dtypes (key<fry>) that NumPy cannot interpret.
    if isinstance(leaf, jax.ShapeDtypeStruct | NumpyTarget | jax.Array | np.ndarray):
        return tuple(leaf.shape), leaf.dtype
    return None


def _check_restored(path: Path, name: str, target: Any, restored: Any) -> None:
    """Raises unless ``restored`` has the structure, shapes and dtypes of ``target``."""
    target_leaves, target_def = jax.tree_util.tree_flatten_with_path(target)
    restored_leaves, restored_def = jax.tree_util.tree_flatten_with_path(restored)
    if str(target_def) != str(restored_def):
        raise ValueError(
            f"checkpoint {str(path)!r}: checkpointable {name!r}: stored structure does not match the restore target "
            f"(target {target_def}, stored {restored_def})"
        )
    for (key_path, want), (_, got) in zip(target_leaves, restored_leaves, strict=True):
        want_spec, got_spec = _leaf_spec(want), _leaf_spec(got)
        if want_spec is not None and got_spec != want_spec:
            raise ValueError(
                f"checkpoint {str(path)!r}: checkpointable {name!r} leaf "
                f"{jax.tree_util.keystr(key_path)}: target "
                f"{want_spec[0]} {want_spec[1]} but checkpoint restored "
                f"{got_spec and got_spec[0]} {got_spec and got_spec[1]}"
            )


def load_checkpointables(
    path: str | os.PathLike[str], targets: Mapping[str, Any]
) -> dict[str, Any]:
    """Load all named V1 targets together on every process's main thread.

    Args:
      path: Source checkpoint directory.
      targets: Non-empty mapping of checkpointable name to an explicit
        non-``None`` restore target. Names must be portable and distinct.

    Returns:
      A dict mapping each requested name to its restored value.

    Raises:
      TypeError: If ``targets`` is not a mapping or a name is not a string.
      ValueError: If ``targets`` is empty, a name is invalid or not distinct, a
        target is ``None``, ``path`` uses the reserved temporary suffix, ``path``
        is not a checkpoint, or it lacks a requested checkpointable.
      FileNotFoundError: If ``path`` does not exist.
    """
    _check_mapping(targets, what="targets")
    check_targets_given(targets)
    src = source_path(path)
    stored = read_item_handlers(src)
    missing = [name for name in targets if name not in stored]
    if missing:
        raise ValueError(
            f"checkpoint {str(src)!r} has no checkpointable(s) {missing}; it holds {sorted(stored)}"
        )
    return restore_checkpointables(src, targets)


def check_targets_given(targets: Mapping[str, Any]) -> None:
    """Raises ``ValueError`` for a restore target that is ``None``."""
    for name, target in targets.items():
        if target is None:
            raise ValueError(f"restore target for {name!r} is None; pass an explicit target")


def restore_checkpointables(src: Path, targets: Mapping[str, Any]) -> dict[str, Any]:
    """Restores ``targets`` from the checkpoint ``src`` and checks them against their targets.

    The caller has already checked ``src``, the names and that the checkpoint holds
    every requested checkpointable.

    Raises:
      ValueError: If a target does not fit what is stored.
    """
    try:
        with _orbax.context():
            restored = ocp.load_checkpointables(src.absolute(), dict(targets))
    except (TypeError, ValueError, KeyError, LookupError) as e:
        # Orbax reports a target that does not fit the stored tree as a missing
        # handler; say which checkpoint and which targets were involved.
        raise ValueError(
            f"checkpoint {str(src)!r}: could not restore {sorted(targets)} into the given "
            f"targets (a shape, structure or type differs from what is stored; "
            f"tinax.explore.compare_table shows each difference): {e}"
        ) from e
    # Orbax restores a NumPy leaf with its stored shape whatever the target says;
    # a restore that does not match its target is an error, not a surprise later.
    for name, target in targets.items():
        _check_restored(src, name, target, restored[name])
    return {name: restored[name] for name in targets}
