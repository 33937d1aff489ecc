"""What reading a box of a stored array costs, from metadata alone: its chunks, the
bytes read from each data file, and how many of those lie outside the box.

A load reads whole chunks (the unit the store decodes): a box that cuts a chunk (a
device's part on a mesh other than the one saved) reads all of it, and the bytes of
values outside the box are read for nothing. On a local disk the reader
(``chunkload``) reads each inner chunk's stored bytes once per box, and once per
shard the shard's index; on an object store each box's shards are fetched whole,
runs of one file closer than ``chunkload.COALESCE_GAP_BYTES`` in one request.

Where a shard holds several compressed inner chunks, each one's stored length is in
the shard's index, inside the data file; here it is taken as an even share of the
shard's bytes. Every other figure is exact.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence

from tinax._format.arraydata import chunkload, rawread
from tinax._format.arraydata.chunks import Box
from tinax._format.metadata import arrays
from tinax._format.metadata.arrays import ValueRef
from tinax._format.storage.location import Location

# Codecs that leave a chunk's stored bytes as many as its values' bytes.
_PLAIN_CODECS = frozenset({"bytes", "transpose", "crc32c"})
# A shard's index: two uint64 per inner chunk, then its crc32c.
_INDEX_ENTRY_BYTES = 16
_INDEX_CHECKSUM_BYTES = 4


@dataclasses.dataclass
class Reads:
    """What some reads cost.

    Attributes:
      nbytes: Bytes read from data files.
      chunks: Chunks decoded.
      beyond: Of ``nbytes``, those of values outside the boxes read.
      files: The data files read (relative to their store's directory).
      staged: Chunks decoded into a reading thread's scratch buffer, then copied
        into place (those a box cuts, or whose place in the box is not contiguous).
      staged_bytes: The largest such chunk's decoded bytes.
      compressed: Compressed chunks read whole into a reading thread's buffer.
      compressed_bytes: The longest of them (whole MiB, as that buffer grows), or 0.
    """

    nbytes: int = 0
    chunks: int = 0
    beyond: int = 0
    files: set[str] = dataclasses.field(default_factory=set)
    staged: int = 0
    staged_bytes: int = 0
    compressed: int = 0
    compressed_bytes: int = 0

    def add(self, other: Reads) -> None:
        """Adds ``other``'s reads to these."""
        self.nbytes += other.nbytes
        self.chunks += other.chunks
        self.beyond += other.beyond
        self.files |= other.files
        self.staged += other.staged
        self.staged_bytes = max(self.staged_bytes, other.staged_bytes)
        self.compressed += other.compressed
        self.compressed_bytes = max(self.compressed_bytes, other.compressed_bytes)


@dataclasses.dataclass(frozen=True)
class StoredChunks:
    """A stored zarr3 array as its reads see it.

    Attributes:
      shape: The array's shape.
      dtype: The stored dtype's NumPy name.
      itemsize: Bytes per stored value.
      grid_shape: The shape stored under one key (a shard, or a chunk).
      chunk_shape: The shape of one inner chunk.
      sharded: Whether each key holds a shard (inner chunks and their index).
      compressed: Whether a chunk's stored bytes are encoded (zstd, …).
      values: Grid index → the value's inline bytes or where it is kept; chunks
        not stored (all fill value) are absent and read nothing.
    """

    shape: tuple[int, ...]
    dtype: str
    itemsize: int
    grid_shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    sharded: bool
    compressed: bool
    values: Mapping[tuple[int, ...], bytes | ValueRef]

    @property
    def inner(self) -> tuple[int, ...]:
        """Inner chunks per shard, along each axis."""
        return tuple(g // c for g, c in zip(self.grid_shape, self.chunk_shape, strict=True))

    @property
    def chunk_bytes(self) -> int:
        """Decoded bytes of one inner chunk (a chunk at the array's end is stored whole)."""
        return math.prod(self.chunk_shape) * self.itemsize

    @property
    def index_bytes(self) -> int:
        """The bytes of one shard's index."""
        return _INDEX_ENTRY_BYTES * math.prod(self.inner) + _INDEX_CHECKSUM_BYTES


def stored_chunks(
    metadata: bytes, stored: Mapping[bytes, bytes | ValueRef], prefix: bytes
) -> StoredChunks | None:
    """The array whose ``zarr.json`` is ``metadata`` and whose chunk keys (after
    ``prefix``) are ``stored``; ``None`` if its layout is not one this module knows."""
    found = rawread.chunking(metadata)
    if found is None:
        return None
    try:
        dtype = arrays.numpy_dtype(found.data_type)
    except TypeError:
        return None
    values = found.stored_values(stored, prefix)
    if values is None:
        return None
    codecs = found.codecs
    compressed = any(
        not isinstance(codec, dict) or codec.get("name") not in _PLAIN_CODECS for codec in codecs
    )
    return StoredChunks(
        shape=found.shape,
        dtype=dtype.name,
        itemsize=dtype.itemsize,
        grid_shape=found.grid_shape,
        chunk_shape=found.chunk_shape,
        sharded=found.sharded,
        compressed=compressed,
        values=values,
    )


def read_in_place(directory: Location) -> bool:
    """Whether the chunks of the store at ``directory`` are read by offset from its
    files (a local disk), not fetched by range, shards whole (an object store)."""
    return directory.is_local


def _length(value: bytes | ValueRef) -> int:
    return value.length if isinstance(value, ValueRef) else len(value)


@dataclasses.dataclass(frozen=True)
class _Needed:
    """One inner chunk a box needs."""

    index: tuple[int, ...]
    # Its values within the array, and how many of them the box takes.
    values: int
    taken: int
    # Whether it is decoded straight into the box's buffer (it lies whole in the box,
    # at a contiguous place there), not into a scratch chunk first.
    direct: bool


def _contiguous(extents: tuple[int, ...], within: tuple[int, ...]) -> bool:
    """Whether a sub-box of ``extents`` of a C-ordered box ``within`` is contiguous."""
    for d in range(len(extents)):
        if all(e == w for e, w in zip(extents[d + 1 :], within[d + 1 :], strict=True)):
            return all(e == 1 for e in extents[:d])
    return True


def _chunks_in(array: StoredChunks, box: Box) -> list[_Needed]:
    """The inner chunks ``box`` needs (``chunkload.StoredArray.chunks_in``'s)."""
    chunk = array.chunk_shape
    spans = []
    for s, c, n in zip(box, chunk, array.shape, strict=True):
        along = []
        for i in range(s.start // c, -(-s.stop // c)):
            lo, hi = i * c, min((i + 1) * c, n)
            cut = max(0, min(hi, s.stop) - max(lo, s.start))
            along.append((i, hi - lo, cut, cut == c))
        spans.append(along)
    extents = tuple(s.stop - s.start for s in box)
    found: list[_Needed] = []
    for picked in itertools.product(*spans):
        whole = all(w for *_, w in picked)
        cuts = tuple(cut for _, _, cut, _ in picked)
        found.append(
            _Needed(
                index=tuple(i for i, *_ in picked),
                values=math.prod(size for _, size, _, _ in picked),
                taken=math.prod(cuts),
                direct=whole and _contiguous(cuts, extents),
            )
        )
    return found


def box_reads(
    array: StoredChunks,
    box: Box,
    *,
    local: bool,
    indexes_read: set[tuple[int, ...]] | None = None,
) -> Reads:
    """What reading ``box`` of ``array`` costs (see the module's docstring).

    Args:
      array: The stored array.
      box: The box read, within the array's shape.
      local: Whether its store is on a local disk (else an object store: shards are
        fetched whole).
      indexes_read: The shards whose index this reader has read already (a reader
        keeps them): updated; ``None`` for a box read by a reader of its own.
    """
    indexes = set() if indexes_read is None else indexes_read
    return _reads(array, [(n, n.taken, False) for n in _chunks_in(array, box)], local, indexes)


def boxes_reads(array: StoredChunks, boxes: Sequence[Box], *, local: bool) -> list[Reads]:
    """What reading ``boxes`` of ``array`` together costs, each box's share: a chunk
    that several boxes cut is read once (by the first that needs it), decoded apart
    and copied into each (``chunkload.BoxReader.read_shared``); the shard indexes are
    read once between them."""
    needs = [_chunks_in(array, box) for box in boxes]
    users: dict[tuple[int, ...], int] = {}
    taken: dict[tuple[int, ...], int] = {}
    for found in needs:
        for n in found:
            users[n.index] = users.get(n.index, 0) + 1
            taken[n.index] = taken.get(n.index, 0) + n.taken
    indexes: set[tuple[int, ...]] = set()
    seen: set[tuple[int, ...]] = set()
    out = []
    for found in needs:
        chunks = []
        for n in found:
            if users[n.index] == 1:
                chunks.append((n, n.taken, False))
            elif n.index not in seen:
                seen.add(n.index)
                chunks.append((n, taken[n.index], True))
        out.append(_reads(array, chunks, local, indexes))
    return out


def shares_chunks(array: StoredChunks, boxes: Sequence[Box]) -> bool:
    """Whether two of ``boxes`` need some chunk in common."""
    seen: set[tuple[int, ...]] = set()
    for box in boxes:
        found = {n.index for n in _chunks_in(array, box)}
        if found & seen:
            return True
        seen |= found
    return False


def _reads(
    array: StoredChunks,
    chunks: Sequence[tuple[_Needed, int, bool]],
    local: bool,
    indexes: set[tuple[int, ...]],
) -> Reads:
    """What reading ``chunks`` costs: each with the values wanted of it, and whether it
    is decoded apart whatever it is (read once for several boxes)."""
    reads = Reads()
    shards: dict[tuple[int, ...], bytes | ValueRef] = {}
    inner = array.inner
    per_shard = math.prod(inner)
    for needed, taken, apart in chunks:
        grid = tuple(i // n for i, n in zip(needed.index, inner, strict=True))
        value = array.values.get(grid)
        if value is None:
            continue  # never stored: the fill value, read from nowhere
        shards[grid] = value
        if not array.sharded:
            length = _length(value)
        elif array.compressed:
            length = max(0, _length(value) - array.index_bytes) // per_shard
        else:
            length = array.chunk_bytes
        reads.chunks += 1
        if apart or not needed.direct:
            reads.staged += 1
            reads.staged_bytes = max(reads.staged_bytes, array.chunk_bytes)
        if isinstance(value, ValueRef):
            reads.files.add(value.file)
            reads.nbytes += length
            reads.beyond += length - length * min(taken, needed.values) // max(1, needed.values)
            if array.compressed and local and length <= chunkload.WHOLE_READ_BYTES:
                whole_mib = -(-length // (1 << 20)) << 20
                reads.compressed += 1
                reads.compressed_bytes = max(reads.compressed_bytes, whole_mib)
    if array.sharded and local:
        for grid, value in shards.items():
            if isinstance(value, ValueRef) and grid not in indexes:
                indexes.add(grid)
                reads.nbytes += array.index_bytes
    if not local:
        # Whole shards, in runs: what is fetched beyond the chunks' own bytes is beyond too.
        wanted = reads.nbytes - reads.beyond
        reads.nbytes = _fetched([v for v in shards.values() if isinstance(v, ValueRef)])
        reads.beyond = max(0, reads.nbytes - wanted)
    return reads


def _fetched(refs: list[ValueRef]) -> int:
    """The bytes ``chunkload.FileRanges`` fetches for ``refs``."""
    total = 0
    by_file: dict[str, list[tuple[int, int]]] = {}
    for ref in refs:
        by_file.setdefault(ref.file, []).append((ref.offset, ref.offset + ref.length))
    for spans in by_file.values():
        spans.sort()
        start, stop = spans[0]
        for a, b in spans[1:]:
            if a <= stop + chunkload.COALESCE_GAP_BYTES:
                stop = max(stop, b)
            else:
                total += stop - start
                start, stop = a, b
        total += stop - start
    return total


def aligned_bytes(array: StoredChunks, box: Box) -> int:
    """The decoded bytes of the whole chunks ``box`` touches: what a reader that
    decodes chunk by chunk into a buffer of the box's chunk-aligned extent (Orbax's)
    reserves for it."""
    total = array.itemsize
    for s, c in zip(box, array.chunk_shape, strict=True):
        total *= -(-s.stop // c) * c - s.start // c * c
    return total
