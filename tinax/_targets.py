"""Restore targets leaf by leaf: what a live pytree asks a restore for. Imports JAX, never
Orbax or Grain.

Loads (``tinax.checkpointing``) judge their targets with these functions before
reading, and ``tinax.explore.compare_table`` and ``state_table`` show the same
judgement, so they live below both layers: comparing live state with a checkpoint
needs JAX to walk the pytree but none of Orbax's machinery.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np

from tinax._format.metadata.fit import PLACEHOLDER as PLACEHOLDER_KIND
from tinax._format.metadata.fit import Spec
from tinax._format.naming import words
from tinax._format.naming.keys import ROOT, KeyPath, format_key, key_parts


@dataclasses.dataclass(frozen=True)
class NumpyTarget:
    """Shape and dtype of a NumPy array to restore as a NumPy array.

    It satisfies Orbax's ``AbstractArray`` protocol, so Orbax restores the leaf as an
    ``np.ndarray`` of exactly this dtype (never as a ``jax.Array``).

    Attributes:
      shape: Array shape.
      dtype: Array dtype.
    """

    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


# Public as tinax.checkpointing.NumpyTarget (set after the class is made: a dataclass
# looks its module up while it is being made).
NumpyTarget.__module__ = "tinax.checkpointing"


def _abstract_leaf(leaf: Any) -> Any:
    if isinstance(leaf, jax.Array):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
    if isinstance(leaf, np.ndarray):
        return NumpyTarget(leaf.shape, leaf.dtype)
    if isinstance(leaf, np.generic) and not isinstance(leaf, np.str_ | np.bytes_):
        # Saved as a 0-d array (see tinax.checkpointing's save), restored as one.
        return NumpyTarget((), leaf.dtype)
    return leaf


def abstract_restore_target(state: Any) -> Any:
    """Replace JAX and NumPy arrays with shape/dtype targets.

    JAX sharding and static leaves are preserved, so Python ``int``, ``float``,
    ``bool``, ``str`` and ``None`` come back from a restore with their own type.
    A NumPy scalar (``np.float32(1.5)``) becomes a 0-d NumPy target: tinax saves
    it as a 0-d array, and it comes back as one.

    Args:
      state: Arbitrary pytree of restore targets. JAX arrays become
        ``jax.ShapeDtypeStruct`` (retaining sharding); NumPy arrays become an
        internal shape/dtype target; other leaves are returned unchanged.

    Returns:
      A pytree matching ``state`` with concrete arrays replaced by abstract
      shape/dtype restore targets.
    """
    return jax.tree.map(_abstract_leaf, state)


# -- restore targets leaf by leaf, as the verdict compares them ---------------------------

# Orbax's placeholder: a target leaf that is not to be restored.
PLACEHOLDER = ...


def is_leafless(value: Any) -> bool:
    """True for a pytree container with no leaves at all: ``{}``, ``()``, ``[]``."""
    leaves, treedef = jax.tree_util.tree_flatten(value)
    return not leaves and value is not None and treedef.num_nodes > 0  # type: ignore[attr-defined]


def is_iterator(value: object) -> bool:
    """Whether ``value`` saves itself through ``get_state`` (a Grain iterator)."""
    return callable(getattr(value, "get_state", None)) and callable(
        getattr(value, "set_state", None)
    )


def is_empty(value: object) -> bool:
    """``None`` or a container without elements (optax's ``EmptyState()`` and ``MaskedNode()``)."""
    return value is None or (isinstance(value, dict | list | tuple) and len(value) == 0)


def _is_whole_leaf(value: object) -> bool:
    return is_empty(value) or is_iterator(value) or value is PLACEHOLDER


def target_leaves(tree: Any) -> list[tuple[KeyPath, Any]]:
    """Every leaf of one checkpointable's target with its key path, as Orbax stores them.

    ``None`` and empty containers are leaves of their own (Orbax records them), a
    Grain iterator or a pytree without any leaves is one leaf at the root (they
    are stored whole).
    """
    if is_iterator(tree) or is_leafless(tree):
        return [(ROOT, tree)]
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_whole_leaf)
    return [(key_parts(path), leaf) for path, leaf in flat]


def storage_spec(shape: tuple[int, ...], dtype: Any) -> tuple[tuple[int, ...], str]:
    """Shape and dtype of an array as Orbax stores it.

    Typed PRNG keys are stored as their key data: unsigned integers with the key
    implementation's trailing dimensions.
    """
    shape = tuple(int(d) for d in shape)
    name = _plain_dtype_name(dtype)
    if name is None:
        data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(shape, dtype))
        return tuple(data.shape), np.dtype(data.dtype).name
    return shape, name


def _plain_dtype_name(dtype: Any) -> str | None:
    """NumPy's name of ``dtype``, or ``None`` for a typed PRNG key's.

    Looked up once per dtype: a target has tens of thousands of leaves of a few.
    """
    try:
        return _cached_dtype_name(dtype)
    except TypeError:  # an unhashable dtype-like: worked out each time
        return _dtype_name(dtype)


def is_key_dtype(dtype: Any) -> bool:
    """Whether ``dtype`` is a typed PRNG key's (looked up once per dtype)."""
    return _plain_dtype_name(dtype) is None


def _dtype_name(dtype: Any) -> str | None:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return None
    return np.dtype(dtype).name


_cached_dtype_name = functools.cache(_dtype_name)


def _key_impl(dtype: Any) -> str:
    """The PRNG implementation of a typed key's dtype (``threefry2x32``, …)."""
    impl = getattr(dtype, "_impl", None)
    return str(getattr(impl, "name", None) or "typed")


def target_spec(leaf: Any) -> Spec:
    """What restoring into ``leaf`` asks for, at the level Orbax stores it."""
    if leaf is PLACEHOLDER:
        return Spec(PLACEHOLDER_KIND)
    if is_empty(leaf) or is_leafless(leaf):
        return Spec(words.EMPTY)
    if isinstance(leaf, jax.Array | jax.ShapeDtypeStruct):
        shape, dtype = storage_spec(leaf.shape, leaf.dtype)
        key = _key_impl(leaf.dtype) if is_key_dtype(leaf.dtype) else ""
        return Spec(words.JAX_ARRAY, shape, dtype, key)
    if isinstance(leaf, np.ndarray | NumpyTarget):
        return Spec(
            words.NUMPY_ARRAY, tuple(int(d) for d in leaf.shape), np.dtype(leaf.dtype).name, ""
        )
    if isinstance(leaf, np.generic) and not isinstance(leaf, np.str_ | np.bytes_):
        return Spec(words.NUMPY_ARRAY, (), leaf.dtype.name, "")
    if isinstance(leaf, bool | int | float | complex):
        return Spec(words.SCALAR, (), np.asarray(leaf).dtype.name)
    if isinstance(leaf, str):
        return Spec(words.STRING)
    if is_iterator(leaf):
        return Spec(words.ITERATOR)
    return Spec(f"{type(leaf).__module__}.{type(leaf).__qualname__}")


# -- flax NNX objects, which are not state --------------------------------------------------


@functools.cache
def _flax_object_kind(kind: type) -> str | None:
    """``"object"`` for a flax NNX object type (``nnx.Module``, ``nnx.Optimizer``,
    ``nnx.Rngs``…), ``"graphdef"`` for ``nnx.GraphDef``, else ``None`` (flax not imported)."""
    for base in kind.__mro__:
        module = getattr(base, "__module__", "") or ""
        if not module.startswith("flax.nnx"):
            continue
        if base.__name__ == "GraphDef":
            return "graphdef"
        if base.__name__ in ("Pytree", "Object", "Module"):
            return "object"
    return None


def flax_object_kind(value: object) -> str | None:
    """Whether ``value`` is a flax NNX object (``"object"``) or ``GraphDef`` (``"graphdef"``)."""
    kind: Any = type(value)
    return _flax_object_kind(kind)


def refuse_flax_objects(tree: Any, *, what: str) -> None:
    """Refuses a flax NNX object or ``GraphDef`` anywhere in ``tree``: only its state
    (``nnx.state(model)``) is saved and restored.

    Raises:
      TypeError: Naming where in ``tree`` it is, and ``nnx.state``.
    """
    flat = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda node: flax_object_kind(node) is not None
    )[0]
    for path, leaf in flat:
        found = flax_object_kind(leaf)
        if found is None:
            continue
        where = format_key(key_parts(path))
        at = f"{what}{where}" if where else what
        name = type(leaf).__qualname__
        if found == "graphdef":
            raise TypeError(
                f"{at} is a flax NNX GraphDef (the static half of nnx.split(model)), which "
                "holds no values: pass the state alone, nnx.state(model) (the second part "
                "of nnx.split), and keep the GraphDef in your code"
            )
        raise TypeError(
            f"{at} is a flax NNX {name} object, not its state: pass nnx.state(model) "
            "(for an optimizer, nnx.state(optimizer)); after a restore, "
            "nnx.update(model, restored) puts the values back into the object"
        )
