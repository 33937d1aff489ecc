"""Arrays streamed from one checkpoint into another, a region at a time, checked as they go.

A new checkpoint made from old ones (a derived copy, an average) never holds a whole
tree: each array is read in boxes, each box handed to the writer, and only a few
boxes are in memory at once. The boxes are planned so that

- each covers whole stored chunks of every array read and whole chunks of the array
  written: no chunk is decoded twice, and no chunk written is left half-done;
- within each checksummed piece of the source they come in C order, so that the
  piece's checksum is taken as a stream (``PieceDigests``) and compared with the one
  recorded at save time before the checkpoint commits;
- they hold about ``REGION_BYTES`` where the chunks allow (a chunk is never split:
  an array Orbax stored as one compressed chunk is read whole).

Sources are read through tensorstore, or, where an uncompressed local store allows
it and checksums were recorded, straight from the data files (``rawread``), which
costs the page cache's speed instead of tensorstore's decoding. ``Reads`` keeps a
few boxes of reads in flight, never more than a byte budget (or one box, if larger).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorstore as ts
import xxhash

from tinax._format.arraydata import chunks, rawread
from tinax._format.arraydata.chunks import Box
from tinax._format.integrity import checksums
from tinax._format.integrity.checksums import Bounds, LeafRecord, Mismatch
from tinax._format.metadata import arrays, pytree

# Decoded bytes of one box, where the chunks allow.
REGION_BYTES = 8 << 20
# Bytes of reads in flight beside the box being worked on.
IN_FLIGHT_BYTES = 32 << 20
# Raw reads' buffers kept for the next steps: the steps in flight, of a few sources.
_POOLED_BUFFERS = 16
# A written array keeps its source's chunks when they hold at most this much (in
# the written dtype); larger ones (an array Orbax stored as one chunk) are stored
# as slabs of about ``SLAB_BYTES``, as tinax's saves store them.
KEPT_CHUNK_BYTES = 16 << 20
SLAB_BYTES = 8 << 20


def tiled_pieces(record: LeafRecord | None, shape: tuple[int, ...]) -> list[Bounds]:
    """The recorded pieces of an array when they tile it exactly, in order; else the
    whole array as one piece."""
    whole = checksums.full_bounds(shape)
    if record is None or record.kind != checksums.ARRAY or record.shape != shape:
        return [whole]
    unique = sorted(dict.fromkeys(piece.bounds for piece in record.pieces))
    covered = sum(math.prod(b - a for a, b in bounds) for bounds in unique)
    if not unique or covered != math.prod(shape) or _overlapping(unique):
        return [whole]
    return unique


def _overlapping(pieces: list[Bounds]) -> bool:
    for i, a in enumerate(pieces):
        for b in pieces[i + 1 :]:
            if all(max(a0, b0) < min(a1, b1) for (a0, a1), (b0, b1) in zip(a, b, strict=True)):
                return True
    return False


def write_chunk_shape(
    shape: tuple[int, ...],
    piece: tuple[int, ...],
    stored: tuple[int, ...] | None,
    itemsize: int,
) -> tuple[int, ...]:
    """The chunk shape an array is written with.

    The source's own chunks where they are small enough (``KEPT_CHUNK_BYTES`` in the
    written dtype); otherwise slabs of whole trailing rows of about ``SLAB_BYTES``
    within a piece, along its first dimension whose rows fit (a divisor of the
    piece's extent there when the array has several pieces, so that chunks never
    straddle two).

    Args:
      shape: The array's shape.
      piece: The shape of its checksummed pieces (``shape`` when it has one).
      stored: The source's chunk shape, if known.
      itemsize: Bytes per element written.
    """
    if not shape:
        return ()
    if (
        stored is not None
        and len(stored) == len(shape)
        and all(c > 0 for c in stored)
        and math.prod(min(c, s) for c, s in zip(stored, shape, strict=True)) * itemsize
        <= KEPT_CHUNK_BYTES
    ):
        return tuple(max(1, min(c, s)) for c, s in zip(stored, shape, strict=True))
    piece = tuple(max(1, p) for p in piece)
    d = split_axis(piece, itemsize, SLAB_BYTES)
    row = math.prod(piece[d + 1 :]) * itemsize
    k = max(1, min(piece[d], SLAB_BYTES // max(row, 1)))
    if piece != shape and piece[d] % k:
        k = max(n for n in range(1, k + 1) if piece[d] % n == 0)
    return (1,) * d + (k,) + piece[d + 1 :]


def plan_boxes(bounds: Bounds, units: Sequence[Sequence[int] | None], itemsize: int) -> list[Box]:
    """Boxes that walk the piece at ``bounds`` in its C order, each covering whole units.

    Each box has one index of the dimensions before some dimension ``s``, a run along
    ``s`` that is a multiple of every unit's extent there, and the whole extent of
    the dimensions after it: so the boxes' bytes, one after another, are the piece's
    bytes in C order, and no unit is cut. ``s`` is the first dimension whose run of
    one unit fits ``REGION_BYTES``, among those before which every unit has extent 1.

    Args:
      bounds: The piece, ``(start, stop)`` per dimension.
      units: Each array's unit of reading or writing (stored chunks, rows); ``None``
        for an array read whole.
      itemsize: The largest bytes per element among them.
    """
    extents = [b - a for a, b in bounds]
    if not bounds or 0 in extents:
        return [] if bounds else [()]  # no elements; or a scalar, one box
    rank = len(extents)
    shapes = [
        tuple(extents) if u is None or len(u) != rank else tuple(max(1, int(n)) for n in u)
        for u in units
    ] or [tuple(extents)]
    # Dimensions before s may only be walked one index at a time where no unit spans them.
    last = next((j for j in range(rank) if any(u[j] > 1 for u in shapes)), rank - 1)
    s = last
    for axis in range(last + 1):
        step = _step(shapes, axis, extents[axis])
        if step * math.prod(extents[axis + 1 :]) * itemsize <= REGION_BYTES:
            s = axis
            break
    step = _step(shapes, s, extents[s])
    row = math.prod(extents[s + 1 :]) * itemsize
    along = max(step, (REGION_BYTES // max(row, 1)) // step * step)
    return runs_along(bounds, s, along)


def split_axis(extents: Sequence[int], itemsize: int, limit: int) -> int:
    """The first dimension whose trailing dimensions, whole, hold at most ``limit``
    bytes (the last one if none do): a piece is cut along it, one index of those before."""
    for axis in range(len(extents)):
        if math.prod(extents[axis + 1 :]) * itemsize <= limit:
            return axis
    return len(extents) - 1


def runs_along(bounds: Bounds, axis: int, along: int) -> list[Box]:
    """The piece at ``bounds`` as boxes in C order: one index of each dimension before
    ``axis``, runs of ``along`` indices along it, the whole extent of those after it.
    """
    boxes: list[Box] = []
    lo, hi = bounds[axis]
    after = tuple(slice(a, b) for a, b in bounds[axis + 1 :])
    for corner in itertools.product(*(range(a, b) for a, b in bounds[:axis])):
        lead = tuple(slice(i, i + 1) for i in corner)
        for start in range(lo, hi, along):
            boxes.append((*lead, slice(start, min(start + along, hi)), *after))
    return boxes


def _step(shapes: Sequence[tuple[int, ...]], axis: int, extent: int) -> int:
    step = 1
    for unit in shapes:
        step = math.lcm(step, min(unit[axis], extent))
    return min(step, extent)


def split_box(box: Box, chunk: tuple[int, ...], itemsize: int, limit: int) -> list[Box]:
    """``box`` cut into parts of at most ``limit`` bytes on the chunk grid, in C order
    (one index of a dimension whose chunk is larger than ``limit`` stays whole)."""
    if not box or chunks.box_size(box) * itemsize <= limit:
        return [box]
    j = next((i for i, s in enumerate(box) if s.stop - s.start > 1), None)
    if j is None:
        return [box]
    per_index = chunks.box_size(box[j + 1 :]) * itemsize
    rows = max(1, limit // max(per_index, 1))
    unit = max(1, chunk[j]) if j < len(chunk) else 1
    start, stop = box[j].start, box[j].stop
    # Cuts fall on the chunk grid, which starts at the array's origin.
    grid = [start, *range((start // unit + 1) * unit, stop, unit), stop]
    parts: list[Box] = []
    i = 0
    while i < len(grid) - 1:
        k = i + 1
        while k < len(grid) - 1 and grid[k + 1] - grid[i] <= rows:
            k += 1
        part = (*box[:j], slice(grid[i], grid[k]), *box[j + 1 :])
        if grid[k] - grid[i] == 1 and chunks.box_size(part) * itemsize > limit:
            parts.extend(split_box(part, chunk, itemsize, limit))
        else:
            parts.append(part)
        i = k
    return parts


class PieceDigests:
    """The checksums of one array's pieces, taken as its boxes go by in each piece's
    C order, checked against the record saved with it (if any)."""

    def __init__(self, record: LeafRecord | None, pieces: Sequence[Bounds]) -> None:
        self.record = record
        self._hashers = {bounds: xxhash.xxh3_64() for bounds in pieces}

    def update(self, piece: Bounds, values: np.ndarray) -> None:
        hasher = self._hashers.get(piece)
        if hasher is not None:
            hasher.update(np.ascontiguousarray(values).reshape(-1).view(np.uint8).data)

    def digests(self) -> dict[Bounds, str]:
        """Each piece's checksum."""
        return {bounds: hasher.hexdigest() for bounds, hasher in self._hashers.items()}

    def mismatches(self) -> list[Mismatch]:
        """The recorded pieces whose bytes read differ from what was saved."""
        if self.record is None:
            return []
        found = self.digests()
        return [
            Mismatch(piece.bounds, piece.digest, found[piece.bounds])
            for piece in self.record.pieces
            if piece.bounds in found and found[piece.bounds] != piece.digest
        ]


@dataclasses.dataclass
class SourceArray:
    """One stored array of a source, ready to be read box by box.

    Attributes:
      key: The leaf's key (keystr), for messages.
      shape: Its shape.
      dtype: Its stored dtype.
      chunk_shape: Its stored chunk shape (what tensorstore decodes at once).
      record: Its recorded checksums, if any.
      unit: The unit boxes must cover whole: the stored chunk, or a row where it is
        read raw.
      spec: The tensorstore spec of the array, opened (in ``ctx``) the first time
        tensorstore reads it: an array read raw is never opened (its store's walk
        told where its chunks are; opening it would read the store's manifest and
        B+tree again).
      ctx: The tensorstore context it is opened in.
      raw: The raw reader of its chunks, where one applies.
      metadata: Its ``zarr.json`` as stored, where it is read raw.
    """

    key: str
    shape: tuple[int, ...]
    dtype: np.dtype
    chunk_shape: tuple[int, ...] | None
    record: LeafRecord | None
    unit: tuple[int, ...] | None
    spec: dict[str, Any]
    ctx: Any
    raw: rawread.RawArray | None = None
    metadata: bytes | None = None
    _opened: list[Any] = dataclasses.field(default_factory=list, repr=False, compare=False)
    _opening: threading.Lock = dataclasses.field(
        default_factory=threading.Lock, repr=False, compare=False
    )

    def array(self) -> Any:
        """The tensorstore array, opened the first time it is asked for."""
        with self._opening:
            if not self._opened:
                self._opened.append(ts.open(self.spec, context=self.ctx, read=True).result())
            return self._opened[0]

    def read(self, box: Box, pool: rawread.BufferPool | None = None) -> Any:
        """Starts reading ``box`` (a raw read into a buffer of ``pool``, if given);
        returns a future of its values."""
        if self.raw is not None:
            raw = self.raw
            shape = [s.stop - s.start for s in box]
            nbytes = math.prod(shape) * self.dtype.itemsize
            buffer = pool.take(nbytes) if pool is not None else np.empty(nbytes, np.uint8)
            out = buffer[:nbytes].view(self.dtype).reshape(shape)
            return rawread.executor().submit(_read_raw, raw, box, out, self._through_tensorstore)
        return self.array()[box].read()

    def _through_tensorstore(self, box: Box) -> np.ndarray:
        return np.asarray(self.array()[box].read().result())


def _read_raw(
    raw: rawread.RawArray, box: Box, out: np.ndarray, fallback: Callable[[Box], np.ndarray]
) -> np.ndarray:
    try:
        raw.read_into(box, out)
    except rawread.Unsupported:
        # Whatever the raw path cannot make sense of, tensorstore reads (and words).
        return fallback(box)
    return out


def source_arrays(
    tree: pytree.PyTreeLayout,
    leaves: Sequence[pytree.StoredLeaf],
    records: dict[str, LeafRecord] | None,
    ctx: ts.Context,
    files: rawread.DataFiles | None = None,
) -> dict[str, SourceArray]:
    """The stored arrays of ``leaves`` (scalars among them), by key, opened for reading
    (those read raw from their data files in ``files``, each opened once, if given).

    Their claimed shapes and chunks are checked first (``pytree.array_infos``).

    Raises:
      ValueError: If an array's metadata is missing, garbled or claims the impossible.
    """
    stored = [leaf for leaf in leaves if leaf.stored and leaf.kind in _STORED_KINDS]
    infos = pytree.array_infos(tree, stored, ctx)
    contents = _walk(tree, stored, ctx) if records is not None else None
    found: dict[str, SourceArray] = {}
    for leaf in stored:
        info = infos[leaf.param]
        try:
            dtype = arrays.numpy_dtype(info.dtype)
        except TypeError:
            raise ValueError(
                f"array {leaf.param!r} under {str(tree.directory)!r} has dtype {info.dtype}, "
                "which cannot be read"
            ) from None
        record = None if records is None else records.get(leaf.key)
        if record is not None and (record.kind != checksums.ARRAY or record.shape != info.shape):
            record = None if record.kind == checksums.ARRAY else record
        raw = metadata = None
        if contents is not None and record is not None and record.dtype == str(dtype):
            path = pytree.storage_path(leaf.param)
            metadata = contents.other.get((path + _ZARR3).encode("utf-8"))
            if isinstance(metadata, bytes):
                raw = rawread.plan(
                    tree.directory,
                    metadata,
                    contents.chunks.get(path),
                    path,
                    dtype,
                    info.shape,
                    files,
                )
        chunk = tuple(info.chunk_shape) if info.chunk_shape is not None else None
        found[leaf.key] = SourceArray(
            key=leaf.key,
            shape=tuple(info.shape),
            dtype=dtype,
            chunk_shape=chunk,
            record=record,
            unit=raw.unit if raw is not None else chunk,
            spec=tree.array_spec(leaf),
            ctx=ctx,
            raw=raw,
            metadata=metadata if raw is not None and isinstance(metadata, bytes) else None,
        )
    return found


_STORED_KINDS = frozenset({"jax.Array", "np.ndarray", "scalar"})
_ZARR3 = "zarr.json"


def _walk(
    tree: pytree.PyTreeLayout, leaves: Sequence[pytree.StoredLeaf], ctx: ts.Context
) -> chunks.StoreContents | None:
    """The walk of a local zarr3 OCDBT store that raw reads need; ``None`` where they
    do not apply or the walk fails (tensorstore then reads, and says what is wrong)."""
    if not (tree.ocdbt and tree.zarr3 and rawread.may_read(tree.directory)) or not leaves:
        return None
    paths = sorted({pytree.storage_path(leaf.param) for leaf in leaves})
    try:
        return chunks.store_contents(tree, paths, ctx=ctx)
    except (ValueError, OSError):
        return None


def failure_message(error: BaseException) -> str:
    """A failed read's message, in the words every reader uses for undecodable bytes."""
    message = arrays.message(error)
    complaint = checksums.undecodable(message)
    return message if complaint is None else checksums.undecodable_words(complaint)


@dataclasses.dataclass
class _Pending:
    tag: Any
    futures: list[Any]
    nbytes: int


class Reads:
    """Reads of boxes issued ahead of their use, within a byte budget.

    ``add`` queues a step (a tag and the reads it needs, each ``(array, box)``);
    iterating gives each step's tag and values in order, each step's reads issued
    while earlier steps are worked on, as long as the bytes in flight stay within
    ``budget`` (a step larger than that is read alone).
    """

    def __init__(self, budget: int = IN_FLIGHT_BYTES) -> None:
        self.budget = budget
        self._queued: collections.deque[tuple[Any, list[tuple[SourceArray, Box]], int]] = (
            collections.deque()
        )
        self._pending: collections.deque[_Pending] = collections.deque()
        self._in_flight = 0
        # Raw reads land in buffers handed from one step to a later one: fresh ones
        # would be fresh memory, faulted in page by page at every step.
        self._pool = rawread.BufferPool(keep=_POOLED_BUFFERS)
        self._lent: list[np.ndarray] = []
        # The bytes of the step the caller holds (until it asks for the next).
        self._held = 0

    def add(self, tag: Any, reads: list[tuple[SourceArray, Box]]) -> None:
        nbytes = sum(chunks.box_size(box) * array.dtype.itemsize for array, box in reads)
        self._queued.append((tag, reads, nbytes))

    def _top_up(self) -> None:
        # A step larger than the budget is read alone: not while the caller holds
        # another, nor beside one in flight.
        while self._queued and (
            (not self._pending and not self._held)
            or self._in_flight + self._held + self._queued[0][2] <= self.budget
        ):
            tag, reads, nbytes = self._queued.popleft()
            futures = []
            for array, box in reads:
                try:
                    futures.append(array.read(box, self._pool))
                except Exception as e:
                    futures.append(e)
            self._pending.append(_Pending(tag, futures, nbytes))
            self._in_flight += nbytes

    def __iter__(self) -> Reads:
        return self

    def __next__(self) -> tuple[Any, list[np.ndarray | BaseException]]:
        # The caller is done with the step before: its buffers serve the next reads.
        for lent in self._lent:
            self._pool.give(lent)
        self._lent = []
        self._held = 0
        self._top_up()
        if not self._pending:
            raise StopIteration
        step = self._pending.popleft()
        values: list[np.ndarray | BaseException] = []
        for future in step.futures:
            if isinstance(future, BaseException):
                values.append(future)
                continue
            try:
                found = np.asarray(future.result())
            except Exception as e:
                values.append(e)
                continue
            values.append(found)
            if isinstance(future, concurrent.futures.Future):
                self._lent.append(found)
        self._in_flight -= step.nbytes
        self._held = step.nbytes
        # The next reads start while the caller works on these.
        self._top_up()
        return step.tag, values


class Scratch:
    """Working arrays reused from one box to the next, by name (an accumulator, a cast):
    fresh ones would be fresh memory, faulted in page by page at every box. Each
    name's buffer is as large as the largest box asked for."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An array of ``shape`` and ``dtype`` (its values left as they were)."""
        nbytes = math.prod(shape) * dtype.itemsize
        buffer = self._buffers.get(name)
        if buffer is None or buffer.nbytes < nbytes:
            buffer = self._buffers[name] = np.empty(max(nbytes, 1), np.uint8)
        return buffer[:nbytes].view(dtype).reshape(shape)
