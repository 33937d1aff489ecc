"""What a load engine (``_fast_load``) reads of one checkpointable, planned before a
byte of array data is read: its leaves, where each is stored, its checksums, and the
parts each device needs; or why the checkpointable is left to Orbax.

A Python ``int``, ``float`` or ``bool`` target comes back as the stored 0-d value's
own Python type (``.item()``, as Orbax's scalar handler gives it), when the stored
dtype is of the target's kind. A typed PRNG key target is read as its stored key
data on the host, made a key with the implementation Orbax recorded for it
(``array_metadatas``), which must be the target's, and put on the target's sharding.
A string target comes back as the string stored in ``_strings.json``, read and
checked against its checksum while planning. A leaf left out (Orbax's placeholder
``...``) is not read, and comes back as the placeholder, as Orbax's load gives it.
An array target of another float dtype than the stored one is read as stored and
cast on the host as Orbax's load casts it (``_casts``); any other cast is Orbax's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from tinax._format.arraydata import chunkload, chunks
from tinax._format.arraydata.rawread import Box
from tinax._format.integrity import checksums
from tinax._format.integrity.checksums import Bounds, LeafRecord
from tinax._format.metadata import fit, pytree
from tinax._format.metadata.layout import StoredCheckpointable
from tinax._format.naming import names, words
from tinax._format.naming.keys import format_key, key_parts
from tinax._format.storage.location import Location
from tinax._targets import NumpyTarget, is_key_dtype
from tinax.checkpointing import _casts
from tinax.checkpointing._nonfinite import LoadCounts


@dataclasses.dataclass
class Leaf:
    """One array leaf to load: where it is stored and what its target asks for."""

    key: str
    stored: chunkload.StoredArray
    reader: chunkload.BoxReader
    record: LeafRecord | None
    # For a jax.Array target its sharding, else None (a NumPy array).
    sharding: jax.sharding.Sharding | None
    # Each distinct part to read, with the devices that take values from it.
    parts: list[tuple[Box, list[Any]]]
    values: dict[Any, Any] = dataclasses.field(default_factory=dict)
    # The devices that take less than their whole part, and the window of the part
    # each takes: where a load onto another mesh cuts across the pieces the array
    # was saved (and checksummed) in, a part is read to cover those pieces whole.
    windows: dict[Any, Box] = dataclasses.field(default_factory=dict)
    # What the bytes read on the host become, besides an array: for a Python scalar
    # target its value (``scalar``), for a typed PRNG key target the key its data
    # makes, put where the target's sharding says (``key_target``).
    scalar: bool = False
    key_target: jax.ShapeDtypeStruct | None = None
    # The target's dtype where it is not the stored one: each part is read as stored,
    # checked and counted, then cast on the host (``_casts``).
    cast: np.dtype | None = None


@dataclasses.dataclass
class Plan:
    """One checkpointable to load: its leaves and the target's structure."""

    name: str
    directory: Location
    treedef: Any
    leaves: list[Leaf]
    files: chunkload.Files
    failed: BaseException | None = None
    # String leaves, read while planning: their values by position among the
    # target's leaves (the arrays in ``leaves`` fill the other positions, in order).
    strings: dict[int, str] = dataclasses.field(default_factory=dict)
    # The positions of leaves left out (Orbax's placeholder ``...``): nothing of them
    # is read, and the result holds the placeholder there, as Orbax's does.
    left_out: set[int] = dataclasses.field(default_factory=set)
    # Where the NaN and Inf of its float leaves are counted as they are read, if anywhere.
    counts: LoadCounts | None = None


def _box(index: tuple[slice, ...], shape: tuple[int, ...]) -> Box:
    return tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape, strict=True))


def bounds_of(box: Box) -> Bounds:
    return tuple((s.start, s.stop) for s in box)


def inside(outer: Bounds, inner: Bounds) -> bool:
    return all(o0 <= i0 and i1 <= o1 for (o0, o1), (i0, i1) in zip(outer, inner, strict=True))


def _overlaps(a: Bounds, b: Bounds) -> bool:
    return all(max(a0, b0) < min(a1, b1) for (a0, a1), (b0, b1) in zip(a, b, strict=True))


# A Python scalar target comes back as the stored 0-d value's own Python type: the
# stored dtype's kind must be the target's (a number saved for a bool is Orbax's).
_SCALAR_KINDS = {bool: "b", int: "iu", float: "f"}


def _why_not_target(leaf: Any) -> str | None:
    """Why a target leaf is left to Orbax, or ``None``."""
    if isinstance(leaf, NumpyTarget) or type(leaf) in _SCALAR_KINDS or type(leaf) is str:
        return None
    if not isinstance(leaf, jax.ShapeDtypeStruct):
        return f"a {type(leaf).__name__} leaf"
    sharding = leaf.sharding
    if not isinstance(sharding, jax.sharding.Sharding):
        return "a target without a sharding"
    layout = getattr(getattr(leaf, "format", None), "layout", None)
    if layout is not None:
        return "a target with a layout of its own"
    if sharding.memory_kind not in (None, "device"):
        return f"a target in {sharding.memory_kind} memory"
    return None


def _is_key(leaf: Any) -> bool:
    return isinstance(leaf, jax.ShapeDtypeStruct) and is_key_dtype(leaf.dtype)


def _covering(bounds: Bounds, pieces: Sequence[Bounds]) -> Bounds:
    """The smallest box holding ``bounds`` that cuts across none of ``pieces``: each
    piece it overlaps lies wholly inside it."""
    while True:
        grown = bounds
        for piece in pieces:
            if _overlaps(grown, piece) and not inside(grown, piece):
                grown = tuple(
                    (min(a0, b0), max(a1, b1))
                    for (a0, a1), (b0, b1) in zip(grown, piece, strict=True)
                )
        if grown == bounds:
            return bounds
        bounds = grown


def device_parts(
    sharding: jax.sharding.Sharding,
    shape: tuple[int, ...],
    record: LeafRecord | None,
    indices: Mapping[Any, Any] | None = None,
) -> tuple[list[tuple[Box, list[Any]]], dict[Any, Box]]:
    """The parts this process's devices need of an array (each distinct box read once,
    with the devices that take it), and the windows of those that take less.

    A device's box that cuts across a saved piece is read as the box covering every
    piece it overlaps, so that each piece read is checked against its checksum;
    devices whose boxes grow to the same box share that read, each taking its window.
    ``indices``: the devices and their indices to plan for, instead of this
    process's (a restore plan plans every process's, one process at a time).
    """
    pieces = [piece.bounds for piece in record.pieces] if record is not None else []
    # Keyed by bounds: slices are not hashable before Python 3.12.
    by_box: dict[Bounds, tuple[Box, list[Any]]] = {}
    windows: dict[Any, Box] = {}
    if indices is None:
        indices = sharding.addressable_devices_indices_map(shape)
    for device, index in indices.items():
        assert index is not None  # every addressable device holds a part
        own = bounds_of(_box(index, shape))
        read = _covering(own, pieces)
        by_box.setdefault(read, (tuple(slice(a, b) for a, b in read), []))[1].append(device)
        if read != own:
            windows[device] = tuple(
                slice(a - r, b - r) for (a, b), (r, _) in zip(own, read, strict=True)
            )
    return list(by_box.values()), windows


def plan(item: StoredCheckpointable, target: Any) -> Plan | str:
    """What loading ``target`` from the checkpointable ``item`` of an opened checkpoint
    would read, or why it is left to Orbax. Its metadata, checksums and store walk are
    the ones kept on the checkpoint (read once, whoever reads them).

    On each process of a job it plans what that process's devices need: the parts
    of their shards (of a replica, once per process), never the rest of an array.
    """
    directory, name = item.directory, item.name
    layout = pytree.read_layout(item)
    if not (layout.ocdbt and layout.zarr3):
        return "not a zarr3 OCDBT store"
    flat, treedef = jax.tree_util.tree_flatten_with_path(target)
    wanted: dict[str, Any] = {}
    for path, leaf in flat:
        why = None if leaf is ... else _why_not_target(leaf)
        if why is not None:
            return why
        wanted[format_key(key_parts(path))] = leaf
    stored = {leaf.key: leaf for leaf in layout.leaves if leaf.kind != words.EMPTY}
    if set(stored) != set(wanted):
        return "the target's leaves are not the stored ones"
    left_out = {key for key, leaf in wanted.items() if leaf is ...}
    for key, leaf in stored.items():
        if key in left_out:
            continue
        target_type = type(wanted[key])
        if target_type is str:
            kinds: tuple[str, ...] = (words.STRING,)
        elif target_type in _SCALAR_KINDS:
            kinds = (words.SCALAR,)
        else:
            kinds = (words.JAX_ARRAY, words.NUMPY_ARRAY)
        if leaf.kind not in kinds or not leaf.stored:
            return f"leaf {key}: stored as a {leaf.kind}, not as its target"
    records = checksums.read_checksums(item)
    strings = _strings(layout, stored, wanted, records)
    if isinstance(strings, str):
        return strings
    impls = fit.key_impls(item) if any(map(_is_key, wanted.values())) else None
    paths = {
        key: pytree.storage_path(leaf.param)
        for key, leaf in stored.items()
        if leaf.kind != words.STRING and key not in left_out
    }
    contents = chunks.store_contents(layout, sorted(set(paths.values())), ctx=layout.context())
    files = chunkload.Files(directory)
    leaves = []
    for key, target_leaf in wanted.items():
        if key not in paths:
            continue  # a string, read above, or a leaf left out
        storage = paths[key]
        metadata = contents.other.get((storage + names.ZARR3_METADATA).encode("utf-8"))
        if not isinstance(metadata, bytes):
            return f"leaf {key}: metadata not inline"
        array = chunkload.plan(directory, metadata, contents.chunks.get(storage, {}), storage)
        if array is None:
            return f"leaf {key}: stored in a way not read here"
        scalar, key_target, cast = type(target_leaf) in _SCALAR_KINDS, None, None
        if scalar:
            if array.shape != () or array.dtype.kind not in _SCALAR_KINDS[type(target_leaf)]:
                return f"leaf {key}: stored as {array.dtype} {array.shape}, not as its target"
        elif _is_key(target_leaf):
            impl = target_leaf.dtype._impl.name
            data = jax.eval_shape(jax.random.key_data, target_leaf)
            if (
                impls is None
                or impls.get(stored[key].param) != impl
                or array.shape != tuple(data.shape)
                or array.dtype != np.dtype(data.dtype)
            ):
                return f"leaf {key}: not the data of a {impl} key of the target's shape"
            key_target = target_leaf
        elif array.shape != tuple(target_leaf.shape):
            return f"leaf {key}: the target asks for another shape"
        elif array.dtype != np.dtype(target_leaf.dtype):
            cast = np.dtype(target_leaf.dtype)
            why = _casts.why_not(
                array.dtype, cast, on_device=not isinstance(target_leaf, NumpyTarget)
            )
            if why is not None:
                return f"leaf {key}: {why}"
        record = None
        if records is not None:
            record = records.get(key)
            if (
                record is None
                or record.kind != checksums.ARRAY
                or (record.dtype, record.shape) != (str(array.dtype), array.shape)
            ):
                return f"leaf {key}: no checksum for it"
        # A scalar and a key's data are read on the host: a key is made, then put.
        on_host = scalar or key_target is not None or isinstance(target_leaf, NumpyTarget)
        sharding = None if on_host else target_leaf.sharding
        windows: dict[Any, Box] = {}
        if sharding is None:
            parts: list[tuple[Box, list[Any]]] = [(tuple(slice(0, n) for n in array.shape), [None])]
        else:
            parts, windows = device_parts(sharding, array.shape, record)
        leaves.append(
            Leaf(
                key,
                array,
                chunkload.BoxReader(array, files),
                record,
                sharding,
                parts,
                windows=windows,
                scalar=scalar,
                key_target=key_target,
                cast=cast,
            )
        )
    positions = {key: i for i, key in enumerate(wanted)}
    return Plan(
        name,
        directory,
        treedef,
        leaves,
        files,
        strings={positions[key]: value for key, value in strings.items()},
        left_out={positions[key] for key in left_out},
    )


def _strings(
    layout: pytree.PyTreeLayout,
    stored: dict[str, pytree.StoredLeaf],
    wanted: dict[str, Any],
    records: dict[str, LeafRecord] | None,
) -> dict[str, str] | str:
    """The string leaves' stored values by key, each checked against its checksum;
    or why the checkpointable is left to Orbax (whose load reports a damaged one)."""
    keys = [key for key in wanted if type(wanted[key]) is str]
    if not keys:
        return {}
    found = pytree.read_strings(layout, [stored[key].param for key in keys])
    values = {key: found[stored[key].param] for key in keys}
    if records is not None:
        for key, value in values.items():
            record = records.get(key)
            if record is None or checksums.check_value(record, value) is not True:
                return f"leaf {key}: its string does not match its checksum"
    return values
