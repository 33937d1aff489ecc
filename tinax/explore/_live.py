"""Live state in the notebook (concrete or abstract) as the same leaf rows as a checkpoint.

JAX and tinax.checkpointing are imported on first use: whoever passes live state has
them loaded already, and reading a checkpoint from a terminal needs neither.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from tinax._format import words
from tinax._format.keys import ROOT_KEY, format_key, key_parts
from tinax.explore._leaves import (
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


def is_iterator(value: object) -> bool:
    """Whether ``value`` saves itself through ``get_state`` (a Grain iterator)."""
    return callable(getattr(value, "get_state", None)) and callable(
        getattr(value, "set_state", None)
    )


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


def _is_empty_container(value: object) -> bool:
    return isinstance(value, dict | list | tuple) and len(value) == 0


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


def storage_spec(shape: tuple[int, ...], dtype: Any) -> tuple[tuple[int, ...], str]:
    """Shape and dtype of an array as Orbax stores it.

    Typed PRNG keys are stored as their key data: unsigned integers with the key
    implementation's trailing dimensions.
    """
    import jax

    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(shape, dtype))
        return tuple(data.shape), np.dtype(data.dtype).name
    return shape, np.dtype(dtype).name


def _array_leaf(name: str, key: str, kind: str, leaf: Any, sharding: str | None) -> Leaf:
    shape = tuple(int(d) for d in leaf.shape)
    stored_shape, stored_dtype = storage_spec(shape, leaf.dtype)
    size = math.prod(shape)
    itemsize = np.dtype(stored_dtype).itemsize
    return Leaf(
        checkpointable=name,
        key=key,
        kind=kind,
        shape=shape,
        dtype=str(leaf.dtype),
        size=size,
        nbytes=math.prod(stored_shape) * itemsize,
        sharding=sharding,
    )


def live_leaf(name: str, key: str, leaf: Any) -> Leaf:
    """The row of one live leaf."""
    import jax

    from tinax.checkpointing import NumpyTarget

    if leaf is None:
        return Leaf(name, key, words.NONE)
    if isinstance(leaf, jax.Array | jax.ShapeDtypeStruct):
        return _array_leaf(name, key, words.JAX_ARRAY, leaf, _sharding(leaf.sharding))
    if isinstance(leaf, np.ndarray | NumpyTarget):
        return _array_leaf(name, key, words.NUMPY_ARRAY, leaf, None)
    if isinstance(leaf, bool | int | float | complex | np.number | np.bool_):
        dtype = np.asarray(leaf).dtype
        value = leaf.item() if isinstance(leaf, np.generic) else leaf
        return Leaf(name, key, words.SCALAR, (), dtype.name, 1, dtype.itemsize, value)
    if isinstance(leaf, str):
        return Leaf(name, key, words.STRING, value=leaf)
    if _is_empty_container(leaf):
        return Leaf(name, key, words.EMPTY)
    if is_iterator(leaf):
        return Leaf(name, key, words.ITERATOR, value=iterator_state(leaf))
    return Leaf(name, key, f"{type(leaf).__module__}.{type(leaf).__qualname__}")


def _check_mapping(checkpointables: object) -> Mapping[str, Any]:
    if not isinstance(checkpointables, Mapping):
        raise TypeError(
            "checkpointables must be a mapping of name to pytree, got "
            f"{type(checkpointables).__name__}"
        )
    for name in checkpointables:
        if not isinstance(name, str):
            raise TypeError(f"checkpointable names must be str, got {type(name).__name__}")
    return checkpointables


def live_leaves(checkpointables: object) -> list[tuple[Leaf, Any]]:
    """Every live leaf's row, with the leaf itself."""
    import jax

    from tinax.checkpointing._leaves import is_leafless

    out = []
    for name, tree in _check_mapping(checkpointables).items():
        if is_iterator(tree):
            out.append((live_leaf(name, ROOT_KEY, tree), tree))
            continue
        if is_leafless(tree):
            # tinax stores a pytree without leaves as one record.
            out.append((Leaf(name, ROOT_KEY, words.EMPTY), tree))
            continue
        flat, _ = jax.tree_util.tree_flatten_with_path(
            tree,
            is_leaf=lambda x: x is None or _is_empty_container(x) or is_iterator(x),
        )
        out.extend((live_leaf(name, leaf_key(path), leaf), leaf) for path, leaf in flat)
    return out


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
