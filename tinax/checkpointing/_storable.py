"""Checks that every leaf of a checkpointable can be stored, before any write."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from orbax.checkpoint.experimental.v1 import handlers as ocp_handlers

from tinax._format.naming.keys import format_key, key_parts
from tinax._targets import NumpyTarget, flax_object_kind, is_leafless, refuse_flax_objects
from tinax.checkpointing._orbax import has_standard_leaf_handler


def is_stateful(value: Any) -> bool:
    """True for objects that save themselves (a Grain ``DatasetIterator``)."""
    return isinstance(value, ocp_handlers.StatefulCheckpointable)


def _hint(leaf: Any) -> str:
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
      ValueError: If ``value`` is ``None``, or a string leaf is not Unicode text (a
        lone surrogate), naming the leaf.
      TypeError: If a leaf has a type no Orbax leaf handler stores, naming the
        checkpointable and the leaf's key path, or ``value`` holds a flax NNX
        object (``nnx.Module``, ``nnx.Optimizer``) or ``GraphDef`` rather than
        its state (``nnx.state(model)``).
    """
    if value is None:
        raise ValueError(f"checkpointable {name!r} is None; there is nothing to save")
    if is_stateful(value):
        return
    if flax_object_kind(value) is not None:
        refuse_flax_objects(value, what=f"checkpointable {name!r}")
    if is_leafless(value):
        return
    # One walk finds flax NNX objects (kept whole) and every leaf.
    flat = jax.tree_util.tree_flatten_with_path(value, is_leaf=_is_flax_object)[0]
    check_keys(name, [key_path for key_path, _ in flat])
    for key_path, leaf in flat:
        if _fits(leaf):
            continue
        # Spelt out for the message only: a save call checks every leaf while its
        # caller waits.
        where = _where(key_path)
        if flax_object_kind(leaf) is not None:
            refuse_flax_objects(value, what=f"checkpointable {name!r}")
        if isinstance(leaf, NumpyTarget):
            raise TypeError(
                f"checkpointable {name!r} leaf {where} is an abstract restore target, not a value"
            )
        if isinstance(leaf, jax.Array | np.ndarray) and leaf.size == 0 and leaf.ndim > 0:
            raise ValueError(
                f"checkpointable {name!r} leaf {where} is an array of shape {leaf.shape} "
                "without elements, which Orbax cannot store"
            )
        if isinstance(leaf, str):
            _check_text(name, where, leaf)
        if not has_standard_leaf_handler(type(leaf)):
            raise TypeError(
                f"checkpointable {name!r} leaf {where} has type "
                f"{type(leaf).__module__}.{type(leaf).__qualname__}, which Orbax cannot "
                f"store{_hint(leaf)}"
            )


def _where(key_path: Any) -> str:
    """A leaf's key path as messages name it."""
    return format_key(key_parts(key_path)) or "<root>"


def _fits(leaf: Any) -> bool:
    """True for a leaf every check passes at a glance: a JAX or NumPy array with
    elements (or a scalar one), which Orbax stores; the rest gets every check."""
    if isinstance(leaf, jax.Array):
        return leaf.size > 0 or leaf.ndim == 0
    return False


def _check_text(name: str, where: str, leaf: str) -> None:
    """Refuses a string that is not Unicode text (a lone surrogate, as ``os.fsdecode``
    makes of undecodable bytes): Orbax stores strings as UTF-8, which cannot hold it."""
    try:
        leaf.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"checkpointable {name!r} leaf {where} is a string with a lone surrogate "
            f"({leaf[e.start : e.end]!a} at position {e.start}), which UTF-8, and so Orbax, "
            "cannot store; decode its bytes with errors='replace' or store them as an array"
        ) from None


def _is_flax_object(node: Any) -> bool:
    return flax_object_kind(node) is not None


def _is_numpy_scalar(leaf: Any) -> bool:
    return isinstance(leaf, np.generic) and not isinstance(leaf, np.str_ | np.bytes_)


def numpy_scalars_as_arrays(value: Any) -> Any:
    """``value`` with each NumPy scalar (``np.float32(1.5)``) made a 0-d NumPy array.

    Orbax stores no NumPy scalar; a 0-d array holds the same value and dtype, and a
    restore gives it back as a 0-d array. ``value`` itself is returned when it holds
    none (the common case), and a stateful checkpointable is never rebuilt.
    """
    if is_stateful(value):
        return value
    if _is_numpy_scalar(value):
        return np.asarray(value)
    leaves = jax.tree_util.tree_leaves(value)
    if not any(_is_numpy_scalar(leaf) for leaf in leaves):
        return value
    return jax.tree.map(lambda leaf: np.asarray(leaf) if _is_numpy_scalar(leaf) else leaf, value)


def _stored_name(entry: Any) -> str:
    """The name Orbax gives one key of a leaf's path in its stored array's name."""
    if isinstance(entry, jax.tree_util.DictKey):
        return str(entry.key)
    if isinstance(entry, jax.tree_util.SequenceKey):
        return str(entry.idx)
    if isinstance(entry, jax.tree_util.GetAttrKey):
        return entry.name
    if isinstance(entry, jax.tree_util.FlattenedIndexKey):
        return str(entry.key)
    return str(entry)


def check_keys(name: str, key_paths: list[Any]) -> None:
    """Refuses key paths Orbax would not give back as they were saved.

    Orbax names each stored value by its keys joined with ``.``: two leaves whose
    names come out the same (``{'a.b': x, 'a': {'b': y}}``) would overwrite each
    other. A dict key that is neither a string nor an integer (flax NNX's index
    keys) comes back as its text, if at all, and an empty key as nothing.

    Raises:
      TypeError: If a dict key is neither a string nor an integer, naming the leaf.
      ValueError: If a key is empty or two leaves would be stored under one name,
        naming them.
    """
    seen: dict[str, Any] = {}
    for key_path in key_paths:
        for entry in key_path:
            if isinstance(entry, jax.tree_util.DictKey):
                if isinstance(entry.key, int) and not isinstance(entry.key, bool):
                    # flax NNX keys list items by index; a load gives them back
                    # through its target's structure.
                    pass
                elif not isinstance(entry.key, str):
                    raise TypeError(
                        f"checkpointable {name!r} leaf {_where(key_path)}: dict key {entry.key!r} is a "
                        f"{type(entry.key).__name__}; Orbax stores keys as strings and would "
                        "give it back as one, so only string keys can be saved"
                    )
                if entry.key == "":
                    raise ValueError(
                        f"checkpointable {name!r} leaf {_where(key_path)}: an empty dict key cannot be "
                        "stored (Orbax names each value by its keys)"
                    )
        stored = ".".join(_stored_name(entry) for entry in key_path)
        other = seen.setdefault(stored, key_path)
        if other is not key_path and _where(other) != _where(key_path):
            raise ValueError(
                f"checkpointable {name!r}: leaves {_where(other)} and {_where(key_path)} "
                "would both be stored "
                f"as {stored!r} (Orbax joins keys with '.'); rename one of them"
            )
