"""A restore's leaves as its load will read and place them: for each leaf its parts
(``_plan_places``), what each part reads of the stored chunks (``tinax._format.readplan``),
what the live target holds, and which saved pieces its parts cut across."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from tinax._format.arraydata import chunks, readplan
from tinax._format.arraydata.readplan import Reads, StoredChunks
from tinax._format.metadata import arrays, pytree
from tinax._format.metadata.layout import StoredCheckpointable
from tinax._format.naming import names, words
from tinax._format.naming.keys import format_key, key_parts
from tinax._targets import NumpyTarget
from tinax.checkpointing import _load_plan
from tinax.checkpointing._plan_places import (
    ORBAX,
    TINAX,
    LeafPlan,
    Part,
    PartPlan,
    engine_parts,
    given_shardings,
    host_parts,
    live_holdings,
    sharding_parts,
    stored_nbytes,
)

# -- what is stored --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Stored:
    """A checkpointable's stored arrays as reads see them, by leaf key."""

    arrays: dict[str, StoredChunks | None]
    local: bool
    metadata_bytes: int


def stored(item: StoredCheckpointable) -> Stored:
    """The chunks of every array of a checkpointable (metadata only: the B+tree walk
    the load's own planning makes, kept on the opened checkpoint)."""
    directory = item.directory
    found: dict[str, StoredChunks | None] = {}
    metadata = 0
    try:
        tree = pytree.read_layout(item)
    except (ValueError, OSError):
        return Stored(found, readplan.read_in_place(directory), 0)
    leaves = [leaf for leaf in tree.leaves if leaf.stored and leaf.kind in words.ARRAY_KINDS]
    data: set[str] = set()
    if tree.ocdbt and tree.zarr3 and leaves:
        paths = {leaf.key: pytree.storage_path(leaf.param) for leaf in leaves}
        try:
            contents = chunks.store_contents(tree, sorted(set(paths.values())), ctx=tree.context())
        except (ValueError, OSError):
            contents = None
        if contents is not None:
            for key, storage in paths.items():
                meta = contents.other.get((storage + names.ZARR3_METADATA).encode("utf-8"))
                stored = contents.chunks.get(storage, {})
                array = (
                    readplan.stored_chunks(meta, stored, storage.encode("utf-8"))
                    if isinstance(meta, bytes)
                    else None
                )
                found[key] = array
                data.update(v.file for v in stored.values() if isinstance(v, arrays.ValueRef))
            metadata += sum(_node_length(node) for node in contents.nodes)
    # Metadata files a load reads: everything of the checkpointable but its data files,
    # as the walk that opened its checkpoint found them (nothing is listed again).
    for where, entry in item.checkpoint.files_under(directory):
        relative = str(where)[len(str(directory)) + 1 :]
        if entry.kind == "file" and relative not in data and "/d/" not in f"/{relative}":
            metadata += entry.size
    return Stored(found, readplan.read_in_place(directory), metadata)


def _node_length(location: str) -> int:
    try:
        return arrays.parse_location(location).length
    except ValueError:
        return 0


# -- leaves ----------------------------------------------------------------------------------


def _placement(parts: Sequence[Part], sharding: Any, shape: tuple[int, ...]) -> tuple[str, int]:
    """Where a leaf lands, in words, and how many places hold each value."""
    places = {p for part in parts for p in part.places}
    if not places:
        return "nowhere", 0
    if len(places) == 1:
        return next(iter(places)).name, 1
    if sharding is None:
        return f"host of {len(places)} processes", len(places)
    shards = len(
        {
            tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))
            for index in sharding.devices_indices_map(shape).values()
        }
    )
    replicas = max(1, len(places) // max(1, shards))
    if shards == 1:
        return f"replicated on {len(places)} devices", len(places)
    if replicas > 1:
        return f"{shards} shards, each on {replicas} devices", replicas
    return f"{shards} shards", 1


def _used(part: Part) -> int:
    """The elements of a part's box that some place takes."""
    if not part.windows or any(w is None for w in part.windows):
        return part.size
    distinct = {tuple((s.start, s.stop) for s in w) for w in part.windows if w is not None}
    return sum(math.prod(b - a for a, b in w) for w in distinct)


def _part_plans(
    parts: Sequence[Part],
    stored: StoredChunks | None,
    *,
    itemsize: int,
    dtype: str,
    local: bool,
    record: Any = None,
    engine: bool = False,
) -> tuple[PartPlan, ...]:
    """The parts with what reading each costs (each process reads its own); ``engine``:
    tinax's engine reads them (a cast once, on the host), else Orbax's load."""
    found = []
    indexes: dict[int, set[tuple[int, ...]]] = {}
    for part in parts:
        nbytes = part.size * itemsize
        if stored is None or len(stored.shape) != len(part.box):
            # A layout not read here (zarr2, no OCDBT): its values' bytes, as decoded.
            size = part.size * (stored.itemsize if stored is not None else itemsize)
            found.append(PartPlan(part, nbytes, itemsize, size, Reads(nbytes=size)))
            continue
        reads = readplan.box_reads(
            stored,
            part.box,
            local=local,
            indexes_read=indexes.setdefault(part.places[0].process, set()),
        )
        used = _used(part)
        if used < part.size:
            # A box grown to cover whole saved pieces: what no place takes is beyond.
            wanted = (reads.nbytes - reads.beyond) * used // part.size
            reads = dataclasses.replace(reads, beyond=reads.nbytes - wanted)
        reserved = readplan.aligned_bytes(stored, part.box) * itemsize // stored.itemsize
        cast = 0
        if stored.dtype != dtype:
            # Read as stored: the engine casts the values it read; Orbax's load reads
            # the stored values again to check them (_orbax).
            cast = part.size * stored.itemsize
        if cast and not engine:
            reads = dataclasses.replace(
                reads,
                nbytes=2 * reads.nbytes,
                chunks=2 * reads.chunks,
                beyond=2 * reads.beyond,
            )
        found.append(PartPlan(part, nbytes, itemsize, reserved, reads, cast, _pieces(part, record)))
    return tuple(found)


def _pieces(part: Part, record: Any) -> tuple[int, ...]:
    """The bytes of the saved pieces a grown box is made of (``_fast_load._pieces``)."""
    if record is None or not part.transient:
        return ()
    bounds = tuple((s.start, s.stop) for s in part.box)
    sizes = [
        math.prod(b - a for a, b in piece.bounds)
        for piece in record.pieces
        if all(
            o0 <= p0 and p1 <= o1 for (o0, o1), (p0, p1) in zip(bounds, piece.bounds, strict=True)
        )
    ]
    if sum(sizes) != part.size:
        return ()
    itemsize = int(np.dtype(record.dtype).itemsize)
    return tuple(size * itemsize for size in sizes)


def _parts(
    leaf: Any, shape: tuple[int, ...], engine: _load_plan.Leaf | None, processes: int
) -> tuple[list[Part], str]:
    """Where a target leaf's parts land (the engine's reads where it reads them), and
    why it lands nowhere."""
    sharding = getattr(leaf, "sharding", None)
    if isinstance(leaf, NumpyTarget) or type(leaf) is np.ndarray:
        return host_parts(shape, processes), ""
    if sharding is None:
        return [], "no sharding: the saved one names devices this job lacks"
    if tuple(leaf.shape) != shape:  # a typed PRNG key: its key data, whole, per device
        whole = tuple(slice(0, n) for n in shape)
        return [Part(whole, p.places) for p in sharding_parts(sharding, tuple(leaf.shape))], ""
    if engine is not None and engine.sharding is not None:
        return engine_parts(sharding, shape, engine.record), ""
    return sharding_parts(sharding, shape), ""


def leaf_plans(
    name: str,
    target: Any,
    abstract: Any,
    engine: _load_plan.Plan | None,
    stored: Stored,
    processes: int,
) -> list[LeafPlan]:
    """One checkpointable's leaves, as its load will read and place them."""
    live = dict(_flat(target))
    given = given_shardings(target)
    reader = ORBAX if engine is None else TINAX
    engine_leaves = {} if engine is None else {leaf.key: leaf for leaf in engine.leaves}
    leaves = []
    for key, leaf in _flat(abstract):
        spec = stored_nbytes(leaf)
        if spec is None:
            continue  # a placeholder, a Python scalar or string, an empty node
        shape, nbytes = spec
        parts, lost = _parts(leaf, shape, engine_leaves.get(key), processes)
        sharding = getattr(leaf, "sharding", None)
        where, replicas = _placement(parts, sharding, tuple(int(d) for d in leaf.shape))
        itemsize = nbytes // max(1, math.prod(shape))
        leaves.append(
            LeafPlan(
                checkpointable=name,
                key=key,
                shape=shape,
                dtype=str(leaf.dtype),
                nbytes=nbytes,
                reader=reader,
                placement=lost or where,
                given_sharding=given.get(key, isinstance(leaf, NumpyTarget)),
                replicas=replicas,
                parts=_part_plans(
                    parts,
                    stored.arrays.get(key),
                    itemsize=itemsize,
                    dtype=_stored_dtype(leaf),
                    local=stored.local,
                    record=getattr(engine_leaves.get(key), "record", None),
                    engine=engine is not None,
                ),
                target=live_holdings(live.get(key)),
            )
        )
    return leaves


def _stored_dtype(leaf: Any) -> str:
    """The NumPy name of the dtype a target leaf is stored as (a key: its data's)."""
    from tinax._targets import storage_spec

    return storage_spec(tuple(leaf.shape), leaf.dtype)[1]


def _flat(tree: Any) -> list[tuple[str, Any]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(format_key(key_parts(path)), leaf) for path, leaf in flat]
