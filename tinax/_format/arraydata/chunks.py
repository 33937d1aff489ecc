"""A stored array's chunks: which exist, where their bytes are, and reading them a region at a time.

Orbax writes each array as a zarr array whose chunks (zarr3 shards holding inner
chunks, or zarr2 chunks) are values of the checkpointable's key-value store: inline
in an OCDBT B+tree node when small, otherwise a byte range of one of its data files.
Reading a whole leaf at once needs memory for all of it; ``read_regions`` instead
decodes it one chunk-aligned region after another, with a bounded number of bytes in
flight, so that a scan of any checkpoint holds only a few regions at a time.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tensorstore as ts

from tinax._format.integrity import checksums
from tinax._format.metadata import arrays, pytree
from tinax._format.metadata.arrays import ValueRef
from tinax._format.storage.location import FILE, Location

# One region is at most this many decoded bytes, unless a single stored chunk is larger
# (a chunk is the unit the store decodes, so a region never splits one).
REGION_BYTES = 4 << 20
# Decoded bytes requested ahead of the region being used, per array read.
IN_FLIGHT_BYTES = 16 << 20
# Raw stored bytes compared at a time when telling identical chunks apart.
COMPARE_BYTES = 8 << 20

Box = tuple[slice, ...]
StoredValue = bytes | ValueRef

# What follows an array's storage path in the key of one of its chunks: zarr3's
# default encoding (``c/0/1``, ``c`` for a 0-d array, or ``.`` separated) and zarr2's
# (``0.1``, ``0`` for a 0-d array, or ``/`` separated).
_ZARR3_CHUNK = re.compile(rb"c(?:[/.]\d+)*")
_ZARR2_CHUNK = re.compile(rb"\d+(?:[/.]\d+)*")


def regions(
    shape: Sequence[int], chunk_shape: Sequence[int] | None, itemsize: int, max_bytes: int
) -> list[Box]:
    """Chunk-aligned boxes that tile an array, each at most ``max_bytes`` where chunks allow.

    A box spans whole chunks only, so no chunk is decoded twice. Boxes take full
    extents of the trailing dimensions when they fit, and several chunks along one
    dimension, so that small chunks are read many at a time.

    Args:
      shape: The array's shape.
      chunk_shape: The shape of the unit the store decodes; ``None`` for one chunk.
      itemsize: Bytes per element.
      max_bytes: The target size of a box, in decoded bytes.

    Returns:
      The boxes in C order; none for an array without elements, one for a 0-d array.
    """
    shape = tuple(int(d) for d in shape)
    if not shape:
        return [()]
    if 0 in shape:
        return []
    chunks = tuple(shape) if chunk_shape is None or len(chunk_shape) != len(shape) else chunk_shape
    chunks = tuple(max(1, min(int(c), s)) for c, s in zip(chunks, shape, strict=True))
    rank = len(shape)
    # The first dimension along which boxes can take several chunks, the dimensions
    # after it being taken whole.
    split = rank - 1
    for d in range(rank):
        unit = math.prod(chunks[: d + 1]) * math.prod(shape[d + 1 :]) * itemsize
        if unit <= max_bytes:
            split = d
            break
    unit = math.prod(chunks[: split + 1]) * math.prod(shape[split + 1 :]) * itemsize
    along = chunks[split] * max(1, max_bytes // max(unit, 1))
    outer = [range(0, shape[d], chunks[d]) for d in range(split)]
    boxes: list[Box] = []
    for corner in itertools.product(*outer):
        lead = tuple(slice(c, min(c + chunks[d], shape[d])) for d, c in enumerate(corner))
        for start in range(0, shape[split], along):
            middle = slice(start, min(start + along, shape[split]))
            boxes.append((*lead, middle, *(slice(0, s) for s in shape[split + 1 :])))
    return boxes


def box_size(box: Box) -> int:
    """Number of elements in ``box``."""
    return math.prod(s.stop - s.start for s in box)


@dataclasses.dataclass(frozen=True)
class ArrayRead:
    """The regions to read of one array.

    Attributes:
      tag: Whatever the caller tells the array by; handed back with each region.
      array: An open tensorstore array, a future of one, or anything indexed by a
        box that gives an object with ``read()`` returning a future.
      boxes: The regions, in the order they are wanted.
      itemsize: Bytes per element, for the in-flight budget.
    """

    tag: Any
    array: Any
    boxes: Sequence[Box]
    itemsize: int


@dataclasses.dataclass(frozen=True)
class ReadFailure:
    """A region that could not be read or decoded, and why (tensorstore's words)."""

    message: str


def _failure_message(error: BaseException) -> str:
    """Tensorstore's words for a failed read; for bytes that do not decode, that the
    stored data is corrupt, with the codec's complaint, as every reader says it."""
    message = arrays.message(error)
    complaint = checksums.undecodable(message)
    return message if complaint is None else checksums.undecodable_words(complaint)


def _opened(array: Any) -> Any:
    # A tensorstore open future has ``result``; an open array (or an adapter) does not.
    return array.result() if isinstance(array, ts.Future) else array


def read_arrays(
    reads: Iterable[ArrayRead], *, in_flight_bytes: int = IN_FLIGHT_BYTES
) -> Iterator[tuple[Any, Box, np.ndarray | ReadFailure]]:
    """Every region of every array, decoded, in order, reading ahead within a budget.

    Reads of the following regions (of this array and the next ones) are issued
    while the caller works on the current one, up to ``in_flight_bytes`` of decoded
    data and at least one region, so that decoding overlaps the caller's work and
    small arrays are read many at a time. A region that cannot be read is handed
    back as a ``ReadFailure`` and the rest go on; once an array has failed to open,
    its regions are not read.

    Yields:
      ``(tag, box, values)``, ``values`` a ``np.ndarray`` or a ``ReadFailure``.
    """
    pending: collections.deque[tuple[Any, Box, Any, int, Any]] = collections.deque()
    queued = 0
    regions = ((read, box) for read in reads for box in read.boxes)
    current: ArrayRead | None = None
    array: Any = None
    exhausted = False
    while True:
        while not exhausted and (not pending or queued < in_flight_bytes):
            item = next(regions, None)
            if item is None:
                exhausted = True
                break
            read, box = item
            nbytes = box_size(box) * read.itemsize
            if read is not current:
                current = read
                try:
                    array = _opened(read.array)
                except Exception as e:
                    array = _Broken(_failure_message(e))
            try:
                future: Any = array[box].read()
            except Exception as e:
                future = _Broken(_failure_message(e))
            pending.append((read.tag, box, future, nbytes, array))
            queued += nbytes
        if not pending:
            return
        tag, box, future, nbytes, source = pending.popleft()
        queued -= nbytes
        if isinstance(future, _Broken):
            yield tag, box, ReadFailure(future.message)
            continue
        try:
            values = future.result()
        except Exception as e:
            yield tag, box, ReadFailure(_failure_message(e))
            continue
        yield tag, box, values
        release = getattr(source, "release", None)
        if release is not None:
            release(values)


class _Broken:
    """An array that could not be opened: every one of its regions fails alike."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __getitem__(self, box: Box) -> _Broken:
        return self

    def read(self) -> _Broken:
        return self


# -- which chunks are stored -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StoreContents:
    """Every key of a checkpointable's OCDBT store, grouped by the array it belongs to.

    Attributes:
      chunks: Array storage path (``param/``, ``""`` for a root leaf) → chunk key →
        its inline bytes or where it is kept.
      nodes: Locations of the B+tree nodes read.
      other: Keys that belong to no known array's chunks (array metadata among
        them), with their values.
    """

    chunks: dict[str, dict[bytes, StoredValue]]
    nodes: tuple[str, ...]
    other: dict[bytes, StoredValue]


def _array_of(key: bytes, paths: Mapping[bytes, str], chunk: re.Pattern[bytes]) -> str | None:
    """The storage path of the array whose chunk ``key`` is, if any."""
    if b"" in paths and chunk.fullmatch(key):
        return paths[b""]
    # Each "/" in turn, found in C: a wide store has tens of thousands of keys.
    slash = key.find(b"/")
    while slash >= 0:
        end = slash + 1
        prefix = key[:end]
        if prefix in paths and chunk.fullmatch(key, end):
            return paths[prefix]
        slash = key.find(b"/", end)
    return None


def store_contents(
    tree: pytree.PyTreeLayout,
    storage_paths: Iterable[str],
    *,
    ctx: ts.Context,
    under: str | None = None,
) -> StoreContents:
    """The chunks of each array stored in the OCDBT store of ``tree``, from its walk
    (kept on its opened checkpoint: walked once for every reader).

    Args:
      tree: A pytree checkpointable written with OCDBT.
      storage_paths: The arrays' storage paths (``pytree.storage_path``).
      ctx: The tensorstore context.
      under: A storage path: only the keys under it are told apart (each still
        given to the array it belongs to among all of ``storage_paths``), the rest
        of the store left out: for a reader of one array that reads no other.

    Raises:
      ValueError: If the manifest or a B+tree node cannot be read, or a value's
        location is not OCDBT's.
    """
    walk = tree.walk_store(ctx)
    values = walk.values
    if under is not None:
        prefix = under.encode("utf-8")
        values = {key: value for key, value in values.items() if key.startswith(prefix)}
    return _grouped(tree, storage_paths, values, walk.nodes)


def _grouped(
    tree: pytree.PyTreeLayout,
    storage_paths: Iterable[str],
    values: Mapping[bytes, bytes | str],
    nodes: tuple[str, ...],
) -> StoreContents:
    """Keys of the store of ``tree`` with their values, grouped by the array (among
    ``storage_paths``) whose chunks they are."""
    paths = {p.encode("utf-8"): p for p in storage_paths}
    pattern = _ZARR3_CHUNK if tree.zarr3 else _ZARR2_CHUNK
    chunks: dict[str, dict[bytes, StoredValue]] = {p: {} for p in paths.values()}
    other: dict[bytes, StoredValue] = {}
    # One array not at the root: most keys are told apart by their first bytes.
    only = next(iter(paths)) if len(paths) == 1 and b"" not in paths else None
    for key, value in values.items():
        if only is not None and not key.startswith(only):
            owner = None
        else:
            owner = _array_of(key, paths, pattern)
        stored = value if isinstance(value, bytes) else arrays.parse_location(value)
        if owner is None:
            other[key] = stored
        else:
            chunks[owner][key] = stored
    return StoreContents(chunks=chunks, nodes=nodes, other=other)


# An array read alone from a store on a local disk, holding at most this many bytes, has
# its keys looked up, each value read into memory (``array_contents``); a larger one is
# read from its data files by offset, as the store's walk locates its chunks. A bucket's
# store is walked: looked up, each of its keys would be a request of its own.
LOOKED_UP_BYTES = 1 << 20


def one_array_contents(
    tree: pytree.PyTreeLayout,
    path: str,
    storage_paths: Iterable[str],
    *,
    ctx: ts.Context,
    nbytes: int | None,
) -> StoreContents:
    """The keys under storage path ``path`` (one array's chunks and metadata) for a reader
    of that array alone: looked up (``array_contents``) where that is cheaper than the
    walk, a store on a local disk and an array of at most ``LOOKED_UP_BYTES``; else from
    the store's walk, only that array's keys told apart (``store_contents(...,
    under=path)``).

    Args:
      tree: A pytree checkpointable written with OCDBT.
      path: The array's storage path (``pytree.storage_path``).
      storage_paths: Every array's storage path.
      ctx: The tensorstore context.
      nbytes: The array's bytes, if known (its checksum record's shape and dtype).

    Raises:
      ValueError: As ``array_contents`` and ``store_contents`` do.
    """
    if nbytes is not None and nbytes <= LOOKED_UP_BYTES and tree.directory.is_local:
        return array_contents(tree, path, storage_paths, ctx=ctx)
    return store_contents(tree, storage_paths, ctx=ctx, under=path)


def array_contents(
    tree: pytree.PyTreeLayout, path: str, storage_paths: Iterable[str], *, ctx: ts.Context
) -> StoreContents:
    """The keys under storage path ``path`` in the OCDBT store of ``tree`` (one array's
    chunks and metadata), as ``store_contents(..., under=path)`` gives them, but looked
    up by their key range instead of walked: tensorstore searches the store's B+tree
    for that range alone, and no other key is read into Python (a wide store's walk
    makes an entry for each of its tens of thousands of keys). Every value comes as
    its bytes, a chunk kept in a data file too: for a reader of one small array.

    Args:
      tree: A pytree checkpointable written with OCDBT.
      path: The array's storage path (``pytree.storage_path``).
      storage_paths: Every array's storage path: each key is given to the array it
        belongs to among them (an array may be stored below another's path).
      ctx: The tensorstore context.

    Raises:
      ValueError: If the store cannot be opened or a key cannot be read.
    """
    prefix = path.encode("utf-8")
    # The keys starting with ``prefix``: up to its last byte's successor ("/" -> "0").
    end = prefix[:-1] + bytes([prefix[-1] + 1]) if prefix else b""
    store = ts.KvStore.open(arrays.kvstore_spec(tree.directory, ocdbt=True), context=ctx).result()
    listed = time.time()
    keys = store.list(ts.KvStore.KeyRange(prefix, end)).result()
    # The manifest the listing read is fresh enough for the values: not read again.
    reads = [(key, store.read(key, staleness_bound=listed)) for key in keys]
    values: dict[bytes, bytes | str] = {}
    for key, read in reads:
        result = read.result()
        if result.state == "value":
            values[key] = bytes(result.value)
    owners = [p for p in storage_paths if p.startswith(path) or path.startswith(p)]
    return _grouped(tree, owners, values, ())


def missing_data(tree: pytree.PyTreeLayout, refs: Iterable[ValueRef]) -> dict[str, str]:
    """Data files that the store of ``tree`` refers to but that do not hold the bytes it
    expects (as its checkpoint's walk found them).

    Returns:
      File (relative to its directory) → what is wrong with it: missing, not a
      regular file, or shorter than the furthest byte a value needs.
    """
    directory = tree.directory
    needed: dict[str, int] = {}
    for ref in refs:
        needed[ref.file] = max(needed.get(ref.file, 0), ref.offset + ref.length)
    listings: dict[str, dict[str, Any]] = {}
    problems: dict[str, str] = {}
    for file, end in sorted(needed.items()):
        parent, _, name = file.rpartition("/")
        if parent not in listings:
            where = directory
            for part in filter(None, parent.split("/")):
                where = where / part
            listings[parent] = tree.entries(where)
        entry = listings[parent].get(name)
        if entry is None:
            problems[file] = "is missing"
        elif entry.kind != FILE:
            problems[file] = f"is a {entry.kind}, not a regular file"
        elif entry.size < end:
            problems[file] = f"is {entry.size} bytes, but values stored in it reach byte {end}"
    return problems


def expected_chunk_count(shape: Sequence[int], grid_shape: Sequence[int] | None) -> int:
    """How many chunks (zarr3: shards) tile an array of ``shape``."""
    if not shape:
        return 1
    if grid_shape is None or len(grid_shape) != len(shape):
        return 1
    return math.prod(-(-int(s) // max(1, int(c))) for s, c in zip(shape, grid_shape, strict=True))


# -- comparing stored bytes ----------------------------------------------------------------


def same_stored_value(
    a_dir: Location, a: StoredValue, b_dir: Location, b: StoredValue, *, block: int = COMPARE_BYTES
) -> bool:
    """Whether two stored values hold the same bytes, compared ``block`` bytes at a time.

    Raises:
      OSError: If a data file cannot be read.
    """
    if stored_bytes([a]) != stored_bytes([b]):
        return False
    if isinstance(a, bytes) or isinstance(b, bytes):
        # Inline values are small; the same bytes may be inline in one store only.
        return _value_bytes(a_dir, a) == _value_bytes(b_dir, b)
    a_file, b_file = _file(a_dir, a.file), _file(b_dir, b.file)
    # Values that differ mostly differ early: a small first block settles them.
    start, size = 0, min(block, 64 << 10)
    while start < a.length:
        size = min(size, a.length - start)
        left = a_file.read_range(a.offset + start, size)
        right = b_file.read_range(b.offset + start, size)
        if left != right or len(left) != size:
            return False
        start += size
        size = block
    return True


def _file(directory: Location, relative: str) -> Location:
    where = directory
    for part in filter(None, relative.split("/")):
        where = where / part
    return where


def _value_bytes(directory: Location, value: StoredValue) -> bytes:
    if isinstance(value, bytes):
        return value
    return _file(directory, value.file).read_range(value.offset, value.length)


def stored_bytes(values: Iterable[StoredValue]) -> int:
    """The stored size of ``values``."""
    return sum(len(v) if isinstance(v, bytes) else v.length for v in values)
