"""Where a restore puts each leaf: the boxes of it each device (or each process's host
memory) will hold, and which of them reads each box; and what live targets hold.

A target's sharding says it (``devices_indices_map``, every process's devices, so
that a plan covers the whole job). A target without one is given the sharding the
checkpoint records for it, as the load gives it (``with_recorded_shardings``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from tinax._format.arraydata.chunks import Box
from tinax._format.arraydata.readplan import Reads
from tinax._format.metadata import pytree
from tinax._format.metadata.layout import StoredCheckpointable
from tinax._format.naming.keys import format_key, key_parts
from tinax._targets import NumpyTarget, storage_spec
from tinax.checkpointing import _orbax

# The platform of a process's host memory, where NumPy targets and scalars land.
HOST = "host"
# Who reads a leaf: tinax's load engine, Orbax's load, or nobody (a placeholder).
TINAX = "tinax"
ORBAX = "Orbax"
NOT_READ = "not read"


@dataclasses.dataclass(frozen=True, order=True)
class Place:
    """Where restored values are held: one device, or one process's host memory.

    Attributes:
      process: The process it belongs to.
      id: The device's id; -1 for host memory.
      platform: ``cpu``, ``tpu``, ``gpu``…, or ``host``.
    """

    process: int
    id: int
    platform: str

    @property
    def name(self) -> str:
        """``cpu:3``, ``tpu:0``, ``host``."""
        return HOST if self.platform == HOST else f"{self.platform}:{self.id}"

    @property
    def in_host_memory(self) -> bool:
        """Whether what it holds is host memory (a CPU device's arrays are)."""
        return self.platform in (HOST, "cpu")


def host(process: int) -> Place:
    """A process's host memory."""
    return Place(process, -1, HOST)


def device_place(device: Any) -> Place:
    """The place of a JAX device."""
    return Place(int(device.process_index), int(device.id), str(device.platform))


@dataclasses.dataclass(frozen=True)
class Part:
    """One box of a leaf read once, and the places that take values from it: the first
    reads it; each takes the whole box (replicas get copies, the first CPU device the
    buffer itself) or only its window of it (a box grown to cover whole saved pieces).

    Attributes:
      box: What is read.
      places: Who takes values from it.
      windows: Each place's window of ``box``, ``None`` where it takes all of it.
    """

    box: Box
    places: tuple[Place, ...]
    windows: tuple[Box | None, ...] = ()

    @property
    def size(self) -> int:
        """Elements in the box."""
        return math.prod(s.stop - s.start for s in self.box)

    def taken(self) -> list[int]:
        """The elements each place takes of it."""
        windows = self.windows or (None,) * len(self.places)
        return [self.size if w is None else math.prod(s.stop - s.start for s in w) for w in windows]

    @property
    def transient(self) -> bool:
        """Whether its buffer outlives no array: every place takes a window of it."""
        return bool(self.windows) and all(w is not None for w in self.windows)


@dataclasses.dataclass(frozen=True)
class PartPlan:
    """One part of a leaf as the load will read it.

    Attributes:
      part: The box and the places taking values from it.
      nbytes: The box's bytes as restored (the target's dtype): its read buffer.
      itemsize: Bytes per value as restored.
      reserved: What Orbax's reader reserves for it (the box's whole chunks, as
        restored).
      reads: What reading it costs (the first of ``part.places`` reads).
      cast: The bytes of the box as stored where the target asks for another dtype,
        else 0: tinax's engine reads them into a buffer of their own and casts them
        into the restored values; Orbax's load reads them a second time, to check
        them.
      pieces: For a box grown to cover whole saved pieces, the bytes of each: on a
        CPU the engine reads it a piece at a time into its threads' buffers.
    """

    part: Part
    nbytes: int
    itemsize: int
    reserved: int
    reads: Reads
    cast: int = 0
    pieces: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class LeafPlan:
    """One leaf of a restore.

    Attributes:
      checkpointable: Its checkpointable's name.
      key: Its key (``keystr``).
      shape: Its shape as restored.
      dtype: Its dtype as restored.
      nbytes: One whole copy's bytes.
      reader: ``TINAX``, ``ORBAX`` or ``NOT_READ``.
      placement: Where it lands, in words (``8 shards``, ``replicated on 8
        devices``, ``cpu:0``, ``host``), or why it cannot be placed.
      given_sharding: Whether the target came with a sharding of its own.
      replicas: How many places hold each of its values.
      parts: Its parts, with their reads.
      target: What the live target leaf holds now, by place.
    """

    checkpointable: str
    key: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    reader: str
    placement: str
    given_sharding: bool
    replicas: int
    parts: tuple[PartPlan, ...]
    target: Mapping[Place, int]

    def held(self) -> dict[Place, int]:
        """The bytes each place holds once it is restored."""
        found: dict[Place, int] = {}
        for part in self.parts:
            for place, size in zip(part.part.places, part.part.taken(), strict=True):
                found[place] = found.get(place, 0) + size * part.itemsize
        return found


def _box(index: tuple[slice, ...], shape: tuple[int, ...]) -> Box:
    return tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape, strict=True))


def _indices(sharding: Any, shape: tuple[int, ...]) -> dict[int, dict[Any, Any]]:
    """Every process's devices and their indices."""
    found: dict[int, dict[Any, Any]] = {}
    for device, index in sharding.devices_indices_map(shape).items():
        found.setdefault(int(device.process_index), {})[device] = index
    return found


def sharding_parts(sharding: Any, shape: tuple[int, ...]) -> list[Part]:
    """The parts a sharding makes of an array of ``shape``, over every process's
    devices: one per distinct box of each process, its devices in id order (as
    Orbax's load reads them)."""
    parts = []
    for indices in _indices(sharding, shape).values():
        by_box: dict[tuple[tuple[int, int], ...], tuple[Box, list[Place]]] = {}
        for device, index in indices.items():
            box = _box(index, shape)
            bounds = tuple((s.start, s.stop) for s in box)
            by_box.setdefault(bounds, (box, []))[1].append(device_place(device))
        parts += [Part(box, tuple(sorted(places))) for box, places in by_box.values()]
    return parts


def engine_parts(sharding: Any, shape: tuple[int, ...], record: Any) -> list[Part]:
    """The parts tinax's engine reads of an array on every process
    (``_load_plan.device_parts``): a device's box that cuts across a saved piece
    grows to cover the pieces it overlaps, and the device takes its window of it."""
    from tinax.checkpointing._load_plan import device_parts

    parts = []
    for indices in _indices(sharding, shape).values():
        found, windows = device_parts(sharding, shape, record, indices)
        for box, devices in found:
            ranked = sorted(devices, key=lambda d: (int(d.process_index), int(d.id)))
            parts.append(
                Part(
                    box,
                    tuple(device_place(d) for d in ranked),
                    tuple(windows.get(d) for d in ranked),
                )
            )
    return parts


def host_parts(shape: tuple[int, ...], processes: int) -> list[Part]:
    """A leaf restored whole into every process's host memory."""
    whole = tuple(slice(0, n) for n in shape)
    return [Part(whole, (host(p),)) for p in range(processes)]


def stored_nbytes(leaf: Any) -> tuple[tuple[int, ...], int] | None:
    """The shape and bytes of an array target as it is stored (a typed PRNG key as its
    key data), or ``None`` for a leaf that is no array."""
    if not isinstance(leaf, jax.ShapeDtypeStruct | jax.Array | NumpyTarget | np.ndarray):
        return None
    shape, dtype = storage_spec(tuple(leaf.shape), leaf.dtype)
    return shape, math.prod(shape) * np.dtype(dtype).itemsize


def live_holdings(leaf: Any) -> dict[Place, int]:
    """What a live target leaf holds now, by place: a ``jax.Array``'s shards (every
    process's, as its sharding says), a NumPy array's host memory."""
    if isinstance(leaf, np.ndarray):
        return {host(jax.process_index()): int(leaf.nbytes)}
    if not isinstance(leaf, jax.Array) or getattr(leaf, "is_deleted", lambda: False)():
        return {}
    held: dict[Place, int] = {}
    itemsize = leaf.dtype.itemsize if hasattr(leaf.dtype, "itemsize") else 0
    for device, index in leaf.sharding.devices_indices_map(tuple(leaf.shape)).items():
        size = math.prod(s.stop - s.start for s in _box(index, tuple(leaf.shape)))
        place = device_place(device)
        held[place] = held.get(place, 0) + size * itemsize
    return held


def with_recorded_shardings(item: StoredCheckpointable, target: Any) -> Any:
    """``target`` with each array leaf that has no sharding (``nnx.eval_shape``'s) given
    the one the checkpoint records for it, as Orbax would restore it.

    Orbax reads that record once per such array, a request each on an object store; here
    the ``_sharding`` file already read with the checkpoint's metadata answers them all,
    and the load engine can read those arrays too. Leaves whose record is missing or
    names devices this process lacks are left for Orbax to judge.
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(target)
    wanted = [
        (i, format_key(key_parts(path)))
        for i, (path, leaf) in enumerate(leaves)
        if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is None
    ]
    if not wanted:
        return target
    try:
        tree = pytree.read_layout(item)
        records = pytree.sharding_records(tree)
    except (ValueError, OSError):
        return target
    params = {leaf.key: leaf.param for leaf in tree.leaves}
    made: dict[str, Any] = {}
    values = [leaf for _, leaf in leaves]
    for i, key in wanted:
        record = records.get(params.get(key, ""))
        if record is None:
            continue
        if record not in made:
            made[record] = _orbax.recorded_sharding(record)
        if made[record] is not None:
            leaf = values[i]
            values[i] = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=made[record])
    return jax.tree_util.tree_unflatten(treedef, values)


def given_shardings(target: Any) -> Mapping[str, bool]:
    """Whether each array leaf of ``target`` (by key) came with a sharding of its own."""
    flat, _ = jax.tree_util.tree_flatten_with_path(target)
    return {
        format_key(key_parts(path)): getattr(leaf, "sharding", None) is not None
        for path, leaf in flat
        if isinstance(leaf, jax.ShapeDtypeStruct | jax.Array)
    }


def relabelled(leaves: Sequence[LeafPlan], platform: str) -> list[LeafPlan]:
    """``leaves`` as if their devices were of ``platform`` (``tpu``: the host memory
    model of an accelerator), for a plan made on a machine without them."""

    def move(place: Place) -> Place:
        return place if place.platform == HOST else dataclasses.replace(place, platform=platform)

    return [
        dataclasses.replace(
            leaf,
            parts=tuple(
                dataclasses.replace(
                    p,
                    part=dataclasses.replace(p.part, places=tuple(move(q) for q in p.part.places)),
                )
                for p in leaf.parts
            ),
            target={move(q): n for q, n in leaf.target.items()},
        )
        for leaf in leaves
    ]
