"""Abstract restore targets built from live state."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np


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


def _abstract_leaf(leaf: Any) -> Any:
    if isinstance(leaf, jax.Array):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
    if isinstance(leaf, np.ndarray):
        return NumpyTarget(leaf.shape, leaf.dtype)
    return leaf


def abstract_restore_target(state: Any) -> Any:
    """Replace JAX and NumPy arrays with shape/dtype targets.

    JAX sharding and static leaves are preserved, so Python ``int``, ``float``,
    ``bool``, ``str`` and ``None`` come back from a restore with their own type.

    Args:
      state: Arbitrary pytree of restore targets. JAX arrays become
        ``jax.ShapeDtypeStruct`` (retaining sharding); NumPy arrays become an
        internal shape/dtype target; other leaves are returned unchanged.

    Returns:
      A pytree matching ``state`` with concrete arrays replaced by abstract
      shape/dtype restore targets.
    """
    return jax.tree.map(_abstract_leaf, state)
