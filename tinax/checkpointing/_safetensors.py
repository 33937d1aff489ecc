"""Weights from ``.safetensors`` files into live state, through the restore verdict."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tinax import _paths
from tinax._format import safetensors as st
from tinax._format.metadata import fit
from tinax._format.metadata.fit import PLACEHOLDER as PLACEHOLDER_KIND
from tinax._format.metadata.fit import Spec
from tinax._format.naming import words
from tinax._format.naming.keys import KeyPath, key_parts
from tinax._targets import (
    NumpyTarget,
    _is_whole_leaf,
    is_key_dtype,
    target_spec,
)
from tinax.checkpointing._verdict import TargetMismatchError, lossy_casts_allowed

NameFunction = Callable[[KeyPath], str]


def _headers(source: object) -> tuple[str, dict[str, st.Header]]:
    """The files of ``source`` and which file holds each tensor."""
    raw = _paths.text_path(source, what="source")
    if raw.startswith("gs://"):
        raise ValueError(f"source {raw!r}: safetensors are read from a local path")
    where = Path(raw).absolute()
    if not where.exists():
        raise FileNotFoundError(f"source {raw!r} does not exist")
    if where.is_dir():
        if (where / st.INDEX_FILE).is_file():
            return _indexed(where / st.INDEX_FILE)
        files = sorted(p for p in where.iterdir() if p.name.endswith(st.SUFFIX) and p.is_file())
        if not files:
            raise ValueError(f"source {raw!r} holds no {st.SUFFIX} file")
        return raw, _by_tensor([st.read_header(f) for f in files])
    if where.name.endswith(".json"):
        return _indexed(where)
    return raw, _by_tensor([st.read_header(where)])


def _by_tensor(headers: list[st.Header]) -> dict[str, st.Header]:
    found: dict[str, st.Header] = {}
    for header in headers:
        for name in header.tensors:
            if name in found:
                raise ValueError(
                    f"tensor {name!r} is in both {str(found[name].path)!r} and {str(header.path)!r}"
                )
            found[name] = header
    return found


def _indexed(index: Path) -> tuple[str, dict[str, st.Header]]:
    weight_map = st.read_index(index)
    headers = {file: st.read_header(index.parent / file) for file in set(weight_map.values())}
    found: dict[str, st.Header] = {}
    for name, file in weight_map.items():
        header = headers[file]
        if name not in header.tensors:
            raise ValueError(f"{str(index)!r} puts tensor {name!r} in {file!r}, which lacks it")
        found[name] = header
    for file, header in headers.items():
        unlisted = sorted(set(header.tensors) - set(weight_map))
        if unlisted:
            raise ValueError(f"{file!r} holds tensors {str(index)!r} does not list: {unlisted[:5]}")
    return str(index), found


def _stored_spec(entry: st.TensorEntry, target: Spec) -> Spec:
    # A 0-d tensor is what a scalar leaf exports to; an array target sees an array.
    kind = words.SCALAR if target.kind == words.SCALAR and entry.shape == () else words.NUMPY_ARRAY
    return Spec(kind, entry.shape, entry.dtype)


def _value(leaf: Any, spec: Spec, data: np.ndarray) -> Any:
    """The restored leaf: ``data`` (a memory map) as the target asks for it."""
    dtype = st.numpy_dtype(spec.dtype) if spec.dtype is not None else data.dtype
    if isinstance(leaf, jax.Array | jax.ShapeDtypeStruct):
        sharding = getattr(leaf, "sharding", None)
        if is_key_dtype(leaf.dtype):
            impl = leaf.dtype._impl  # type: ignore[union-attr]
            keys = jax.random.wrap_key_data(jnp.asarray(np.array(data, dtype=dtype)), impl=impl)
            return keys if sharding is None else jax.device_put(keys, sharding)
        if sharding is None:
            return jax.device_put(np.array(data, dtype=dtype))
        # Each device (each process's) reads only the part it holds.
        return jax.make_array_from_callback(
            tuple(leaf.shape), sharding, lambda index: np.array(data[index], dtype=dtype)
        )
    if isinstance(leaf, np.ndarray | NumpyTarget):
        return np.array(data, dtype=dtype)
    value = np.array(data, dtype=dtype)
    if isinstance(leaf, np.generic):
        return leaf.dtype.type(value)
    return type(leaf)(value.item())


def load_safetensors(
    source: str | os.PathLike[str], target: Any, *, name: NameFunction | None = None
) -> Any:
    """Weights from ``.safetensors`` files as a pytree shaped like ``target``.

    The same restore verdict as ``load_checkpointables`` runs first, from the files'
    headers alone: a tensor whose shape or dtype does not fit its target leaf, a
    target leaf without a tensor, or a tensor without a target leaf refuses the
    load before any tensor byte is read, one line per leaf. A cast that may lose
    values (``float32`` into ``bfloat16``) needs ``allow_lossy_casts()``.

    Args:
      source: A ``.safetensors`` file, a directory of them (with or without
        ``model.safetensors.index.json``), or an index file.
      target: A pytree (NNX state, Linen params, an optax state): abstract leaves
        (``jax.ShapeDtypeStruct``, as ``abstract_restore_target`` makes) or live
        arrays. ``jax.Array`` leaves come back with the target's sharding (each
        process reading only its own part), NumPy ones as NumPy arrays, Python
        scalars as Python scalars, typed PRNG keys as keys. ``None``, empty
        containers and ``...`` leaves are kept as they are.
      name: ``name(key_path) -> str``, the tensor name of the leaf at
        ``key_path`` (a tuple of ``str`` and ``int`` parts), as given to
        ``tinax.explore.export_safetensors``. By default the parts dotted, NNX's
        trailing ``value`` dropped.

    Returns:
      A pytree of ``target``'s structure holding the files' values.

    Raises:
      TypeError: If an argument has the wrong type.
      FileNotFoundError: If ``source`` does not exist.
      ValueError: If a file is not safetensors (or is truncated), or two leaves
        map to one tensor name.
      TargetMismatchError: If the tensors do not fit ``target`` (see above).
    """
    if name is not None and not callable(name):
        raise TypeError(f"name must be a callable, got {type(name).__name__}")
    label, by_tensor = _headers(source)
    flat, treedef = jax.tree_util.tree_flatten_with_path(target, is_leaf=_is_whole_leaf)
    stored: list[tuple[KeyPath, Spec]] = []
    wanted: list[tuple[KeyPath, Spec]] = []
    tensor_of: dict[int, str] = {}
    used: dict[str, KeyPath] = {}
    tensor: str
    for index, (jax_path, leaf) in enumerate(flat):
        path = key_parts(jax_path)
        spec = target_spec(leaf)
        if spec.kind in (words.EMPTY, PLACEHOLDER_KIND):
            continue
        tensor = (name or st.tensor_name)(path)
        if not isinstance(tensor, str):
            raise TypeError(f"name({path!r}) must give a str, got {type(tensor).__name__}")
        if tensor in used:
            raise ValueError(
                f"target leaves {used[tensor]!r} and {path!r} are both named {tensor!r}"
            )
        used[tensor] = path
        tensor_of[index] = tensor
        wanted.append((path, spec))
        header = by_tensor.get(tensor)
        if header is not None:
            stored.append((path, _stored_spec(header.tensors[tensor], spec)))
    for tensor in by_tensor:
        if tensor not in used:
            stored.append(((tensor,), Spec(words.NUMPY_ARRAY, *_shape_dtype(by_tensor, tensor))))
    judged = fit.judge({"": stored}, {"": wanted})
    refused = fit.refusals(judged, allow_lossy=lossy_casts_allowed())
    if refused:
        lines = [v.line() for v in refused[: fit.MAX_LINES]]
        if len(refused) > fit.MAX_LINES:
            lines.append(f"… and {len(refused) - fit.MAX_LINES} more")
        count = f"{len(refused)} lea{'f' if len(refused) == 1 else 'ves'}"
        raise TargetMismatchError(
            f"safetensors {label!r} do not fit the target ({count}):\n  " + "\n  ".join(lines)
        )
    for header in {id(h): h for h in by_tensor.values()}.values():
        st.check_size(header)
    specs = dict(wanted)
    leaves = []
    for index, (jax_path, leaf) in enumerate(flat):
        if index not in tensor_of:
            leaves.append(leaf)
            continue
        data = st.map_tensor(by_tensor[tensor_of[index]], tensor_of[index])
        leaves.append(_value(leaf, specs[key_parts(jax_path)], data))
        del data
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _shape_dtype(by_tensor: dict[str, st.Header], tensor: str) -> tuple[tuple[int, ...], str]:
    entry = by_tensor[tensor].tensors[tensor]
    return entry.shape, entry.dtype
