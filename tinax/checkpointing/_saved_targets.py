"""Restore targets made from a checkpoint's metadata alone: every leaf as it was saved,
on the sharding it was saved with, or that sharding's partition laid on a mesh of
other axis sizes (``tinax plan PATH --mesh data=4,model=2`` plans that restore).

A typed PRNG key is taken as its key data (the same bytes); Python scalars and
strings as values of their kind. Iterator and JSON checkpointables hold no arrays
and are left out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from tinax._format.metadata import fit, layout, pytree
from tinax._format.naming import words
from tinax._format.naming.keys import KeyPath, format_key
from tinax._targets import NumpyTarget
from tinax.checkpointing import _orbax

# A stored scalar comes back as the Python value of its dtype's kind.
_SCALARS = {"b": False, "i": 0, "u": 0, "f": 0.0, "c": 0j}


def make_mesh(axes: Mapping[str, int]) -> jax.sharding.Mesh:
    """A mesh of this process's first devices with ``axes`` (name → size, in order).

    Raises:
      ValueError: If an axis size is not positive, or the process has too few devices.
    """
    sizes = list(axes.values())
    if not sizes or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in sizes):
        raise ValueError(f"mesh axis sizes must be positive integers, got {dict(axes)}")
    count = math.prod(sizes)
    devices = jax.devices()
    if len(devices) < count:
        raise ValueError(
            f"a mesh of {dict(axes)} needs {count} devices and this process has "
            f"{len(devices)}: `tinax plan` makes as many CPU devices as it needs"
        )
    return jax.sharding.Mesh(np.array(devices[:count]).reshape(sizes), tuple(axes))


def _spec(record: Mapping[str, Any]) -> jax.sharding.PartitionSpec:
    parts = []
    for entry in record.get("partition_spec") or []:
        parts.append(tuple(entry) if isinstance(entry, list) else entry)
    return jax.sharding.PartitionSpec(*parts)


def _sharding(
    record: str | None, mesh: jax.sharding.Mesh | None, key: str, made: dict[str | None, Any]
) -> Any:
    """The sharding a leaf of ``record`` has on ``mesh`` (``None``: as recorded)."""
    if record in made:
        return made[record]
    parsed = None
    if record is not None:
        try:
            parsed = json.loads(record)
        except (ValueError, RecursionError):
            parsed = None
    first = jax.devices()[0] if mesh is None else mesh.devices.flat[0]
    found: Any = jax.sharding.SingleDeviceSharding(first)
    if isinstance(parsed, dict) and parsed.get("sharding_type") == "NamedSharding":
        if mesh is None:
            found = _orbax.recorded_sharding(record) if record is not None else None
            if found is None:
                raise ValueError(
                    f"leaf {key} was saved sharded over devices this process does not "
                    "have; name a mesh to plan its restore on"
                )
        else:
            spec = _spec(parsed)
            named = {
                a for p in spec if p is not None for a in (p if isinstance(p, tuple) else (p,))
            }
            missing = sorted(named - set(mesh.axis_names))
            if missing:
                raise ValueError(
                    f"leaf {key} was saved sharded over mesh axes {missing}, which the mesh "
                    f"{dict(mesh.shape)} does not have: name the saved axes in the mesh "
                    f"(for example {','.join(f'{a}=N' for a in missing)})"
                )
            found = jax.sharding.NamedSharding(mesh, spec)
    elif mesh is None and record is not None:
        found = _orbax.recorded_sharding(record) or found
    made[record] = found
    return found


def _leaf(spec: fit.Spec, sharding: Any) -> Any:
    if spec.kind == words.SCALAR and spec.dtype is not None:
        return _SCALARS.get(np.dtype(spec.dtype).kind, 0)
    if spec.kind == words.STRING:
        return ""
    if spec.shape is None or spec.dtype is None:
        return None
    if spec.kind == words.NUMPY_ARRAY:
        return NumpyTarget(spec.shape, np.dtype(spec.dtype))
    return jax.ShapeDtypeStruct(spec.shape, np.dtype(spec.dtype), sharding=sharding)


def _nest(leaves: list[tuple[KeyPath, Any]]) -> Any:
    """A tree of dicts holding each leaf at its key path (an integer key path part
    stands where a list index was: both are written ``[0]``)."""
    if len(leaves) == 1 and not leaves[0][0]:
        return leaves[0][1]
    tree: dict[Any, Any] = {}
    for path, value in leaves:
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return tree


def saved_targets(
    checkpoint: layout.Checkpoint, mesh: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """Every pytree checkpointable of ``checkpoint`` as a restore target, each leaf as
    saved (see the module's docstring).

    Args:
      checkpoint: The opened checkpoint.
      mesh: Axis name → size: the saved partition laid on a mesh of these sizes (its
        axes named as the saved mesh's); ``None``: the saved shardings themselves.

    Raises:
      ValueError: If a saved sharding names devices this process lacks (and no mesh
        is given), or axes ``mesh`` does not have.
    """
    laid = None if mesh is None else make_mesh(mesh)
    names = [item.name for item in checkpoint.checkpointables if item.layout == layout.PYTREE]
    stored = fit.stored_specs(checkpoint, names)
    targets: dict[str, Any] = {}
    for name in names:
        tree = pytree.read_layout(checkpoint.get(name))
        records = pytree.sharding_records(tree)
        params = {leaf.key: leaf.param for leaf in tree.leaves}
        made: dict[str | None, Any] = {}
        leaves = []
        for path, spec in stored[name]:
            key = format_key(path)
            record = records.get(params.get(key, ""))
            sharding = (
                _sharding(record, laid, f"{name}{key}", made)
                if spec.kind == words.JAX_ARRAY
                else None
            )
            leaves.append((path, _leaf(spec, sharding)))
        targets[name] = _nest(leaves)
    return targets
