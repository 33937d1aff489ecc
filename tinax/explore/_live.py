"""Live state in the notebook (concrete or abstract) as the same leaf rows as a checkpoint.

JAX (and tinax._targets) are imported on first use: whoever passes live state has
them loaded already, and reading a checkpoint from a terminal needs neither.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from tinax._format.naming import words
from tinax._format.naming.keys import format_key, key_parts
from tinax.explore._leaf_rows import (
    Leaf,
    format_device,
    format_named_sharding,
    leaf_frame,
)


def leaf_key(key_path: tuple[Any, ...]) -> str:
    """The ``key`` a table gives the leaf at a JAX key path.

    It is ``jax.tree_util.keystr`` of the path as Orbax stores it: attribute keys
    (namedtuple and dataclass fields, as in optax states) become dict keys and
    every dict key becomes a string, so that keys of live state and of a
    checkpoint join.

    Args:
      key_path: A key path from ``jax.tree_util.tree_flatten_with_path``.

    Returns:
      The key, e.g. ``"[0]['mu']['dense']['w']"``; ``""`` for the root.

    Raises:
      TypeError: If an entry of ``key_path`` is not a JAX key.
    """
    return format_key(key_parts(key_path))


def iterator_state(value: Any) -> Any:
    """An iterator's state as it is stored: JSON data."""
    state = value.get_state()
    if isinstance(state, bytes | str):
        # DataLoader iterators hand over their JSON state already serialised.
        try:
            return json.loads(state)
        except (ValueError, RecursionError):
            return state.decode("utf-8", "replace") if isinstance(state, bytes) else state
    return state


def _state_bytes(iterator: Any, state: Any) -> int | None:
    """The bytes of an iterator's state as a save writes it (Grain: JSON, indent 4)."""
    raw = iterator.get_state()
    if isinstance(raw, bytes):
        return len(raw)
    if isinstance(raw, str):
        return len(raw.encode("utf-8"))
    try:
        return len(json.dumps(state, indent=4).encode("utf-8"))
    except (TypeError, ValueError):
        return None


def _sharding(sharding: Any) -> str | None:
    if sharding is None:
        return None
    import jax

    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return f"SingleDeviceSharding({format_device(str(next(iter(sharding.device_set))))})"
    if isinstance(sharding, jax.sharding.NamedSharding):
        mesh = sharding.mesh
        return format_named_sharding(
            list(mesh.axis_names), list(mesh.shape.values()), tuple(sharding.spec)
        )
    return type(sharding).__name__


def _array_leaf(name: str, key: str, kind: str, leaf: Any, sharding: str | None) -> Leaf:
    from tinax._targets import storage_spec

    shape = tuple(int(d) for d in leaf.shape)
    stored_shape, stored_dtype = storage_spec(shape, leaf.dtype)
    return Leaf(
        checkpointable=name,
        key=key,
        kind=kind,
        shape=shape,
        dtype=str(leaf.dtype),
        size=math.prod(shape),
        nbytes=math.prod(stored_shape) * np.dtype(stored_dtype).itemsize,
        sharding=sharding,
    )


def live_leaf(name: str, key: str, leaf: Any) -> Leaf:
    """The row of one live leaf: its kind as a restore would see it, its shape and dtype as live."""
    from tinax._targets import target_spec

    kind = target_spec(leaf).kind
    if kind in words.ARRAY_KINDS:
        return _array_leaf(name, key, kind, leaf, _sharding(getattr(leaf, "sharding", None)))
    if kind == words.SCALAR:
        dtype = np.asarray(leaf).dtype
        value = leaf.item() if isinstance(leaf, np.generic) else leaf
        return Leaf(name, key, kind, (), dtype.name, 1, dtype.itemsize, value)
    if kind == words.STRING:
        return Leaf(name, key, kind, value=leaf)
    if kind == words.ITERATOR:
        state = iterator_state(leaf)
        return Leaf(name, key, kind, nbytes=_state_bytes(leaf, state), value=state)
    return Leaf(name, key, kind)


def check_mapping(checkpointables: object) -> Mapping[str, Any]:
    """``checkpointables`` if it is a mapping with string keys.

    Raises:
      TypeError: If it is not.
    """
    if not isinstance(checkpointables, Mapping):
        raise TypeError(
            "checkpointables must be a mapping of name to pytree, got "
            f"{type(checkpointables).__name__}"
        )
    for name in checkpointables:
        if not isinstance(name, str):
            raise TypeError(f"checkpointable names must be strings, got {type(name).__name__}")
    return checkpointables


def live_leaves(checkpointables: object) -> list[tuple[Leaf, Any]]:
    """Every live leaf's row, with the leaf itself."""
    from tinax._targets import target_leaves

    return [
        (live_leaf(name, format_key(path), leaf), leaf)
        for name, tree in check_mapping(checkpointables).items()
        for path, leaf in target_leaves(tree)
    ]


def state_table(checkpointables: Mapping[str, Any]) -> pd.DataFrame:
    """Live state as the same table as ``checkpoint_table``, so the two join.

    Args:
      checkpointables: A mapping of checkpointable name to pytree, of concrete
        values (``jax.Array``, ``np.ndarray``, Python scalars and strings, Grain
        iterators) or abstract restore targets (``jax.ShapeDtypeStruct``,
        ``tinax.checkpointing.NumpyTarget``, as ``abstract_restore_target``
        makes them).

    Returns:
      A DataFrame with the columns of ``checkpoint_table``. Keys are written as
      ``leaf_key`` writes them; ``shape`` and ``dtype`` are the live ones (a
      typed PRNG key shows its key dtype, ``nbytes`` counts its stored key data);
      ``value`` holds scalars, strings and iterator states (``get_state()``);
      ``chunk_shape`` is missing.

    Raises:
      TypeError: If ``checkpointables`` is not a mapping with string keys.
    """
    return leaf_frame(leaf for leaf, _ in live_leaves(checkpointables))
