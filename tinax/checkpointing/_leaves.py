"""Checks that every leaf of a checkpointable can be stored, before any write."""

from __future__ import annotations

from typing import Any

import jax
from orbax.checkpoint.experimental.v1 import handlers as ocp_handlers

from tinax._format.keys import format_key, key_parts
from tinax.checkpointing._orbax import has_standard_leaf_handler
from tinax.checkpointing._targets import NumpyTarget, is_leafless


def is_stateful(value: Any) -> bool:
    """True for objects that save themselves (a Grain ``DatasetIterator``)."""
    return isinstance(value, ocp_handlers.StatefulCheckpointable)


def _hint(leaf: Any) -> str:
    module = type(leaf).__module__
    if module == "numpy":
        return " (a NumPy scalar: store it as np.asarray(x) or a Python number)"
    if callable(leaf):
        return " (a callable: only data can be checkpointed)"
    return ""


def check_storable(name: str, value: Any) -> None:
    """Refuses a checkpointable with a leaf Orbax cannot store.

    Orbax alone reports only that no handler fits the whole checkpointable; this
    names the exact leaf.

    Args:
      name: The checkpointable's name, for the message.
      value: The checkpointable.

    Raises:
      ValueError: If ``value`` is ``None``.
      TypeError: If a leaf has a type no Orbax leaf handler stores, naming the
        checkpointable and the leaf's key path.
    """
    if value is None:
        raise ValueError(f"checkpointable {name!r} is None; there is nothing to save")
    if is_stateful(value) or is_leafless(value):
        return
    for key_path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
        where = format_key(key_parts(key_path)) or "<root>"
        if isinstance(leaf, NumpyTarget):
            raise TypeError(
                f"checkpointable {name!r} leaf {where} is an abstract restore target, not a value"
            )
        if not has_standard_leaf_handler(type(leaf)):
            raise TypeError(
                f"checkpointable {name!r} leaf {where} has type "
                f"{type(leaf).__module__}.{type(leaf).__qualname__}, which Orbax cannot "
                f"store{_hint(leaf)}"
            )
