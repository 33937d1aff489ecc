"""Arrays copied into a new checkpoint as the bytes they are stored as, checked on the way.

An array a new checkpoint keeps as it is (a plain copy, a selection of leaves, a
rename: no cast) need not be decoded and encoded again: each of its stored chunks
(a zarr3 shard with its index, or a plain chunk, uncompressed) is read as bytes from
the source's data file, the values in it are fed to the checksums of the pieces
they belong to, and the same bytes are written under the array's new key, its zarr
metadata copied as it is. What was saved is what is written, byte for byte, so the
source's checksums are the copy's, and the copy is refused, naming the leaf, when
the bytes read do not match them. On a local disk the writer has the kernel copy
the bytes from the source's file (``ocdbt_root.DataFile``) once they are checked:
checkpoints are never changed once committed, so those are the bytes checked. A
source data file the copy keeps (nearly) whole (``whole_files``) is not copied at
all: the writer hard-links it into the new store and references the chunks where
they are in it (``PyTreeWriter.link_files``).

Only arrays whose stored chunks hold their values in C order, one after another,
qualify: read raw (``rawread``: uncompressed, little-endian, every chunk out of
line), checksums recorded, chunks of whole rows (every dimension after the first
whole), pieces of whole rows on the chunk grid, and no stored chunk larger than
``MAX_VALUE_BYTES``. Any other array is streamed value by value (``streaming``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import math
import os
import struct
from collections.abc import Callable, Iterator

import numpy as np

from tinax._format.arraydata import rawread
from tinax._format.integrity import checksums
from tinax._format.integrity.checksums import Bounds, CorruptDataError
from tinax._format.metadata import arrays
from tinax._format.metadata.arrays import ValueRef
from tinax._format.writing import streaming
from tinax._format.writing.store_writer import PyTreeWriter

# Whether data files a copy keeps (nearly) whole are hard-linked, not copied
# (``whole_files``), and the share of a file's bytes its kept values must make up.
LINK_FILES = True
LINK_SHARE = 0.9
# The largest stored chunk copied whole: larger ones are streamed in regions.
MAX_VALUE_BYTES = 16 << 20
# Bytes of stored chunks read ahead of the one being written.
IN_FLIGHT_BYTES = 32 << 20
_MISSING = (1 << 64) - 1


@dataclasses.dataclass(frozen=True)
class StoredArray:
    """An array of a source whose stored chunks are copied as they are.

    Attributes:
      source: The array, opened for reading.
      metadata: Its ``zarr.json``, written as it is.
      chunks: Each stored chunk, in the order of its rows: the key that follows the
        array's path (``c/3/0``) and its grid index.
      grid_rows: The rows of one stored chunk (a shard, or a plain chunk).
      inner_rows: The rows of one inner chunk of a shard (``grid_rows`` unsharded).
      row_bytes: The bytes of one row.
      pieces: The checksummed pieces, each a run of whole rows.
    """

    source: streaming.SourceArray
    metadata: bytes
    chunks: list[tuple[str, tuple[int, ...]]]
    grid_rows: int
    inner_rows: int
    row_bytes: int
    pieces: list[Bounds]

    @property
    def raw(self) -> rawread.RawArray:
        assert self.source.raw is not None
        return self.source.raw

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """The chunk shape the copy is stored with: the source's."""
        return self.raw.grid_shape


def plan(source: streaming.SourceArray) -> StoredArray | None:
    """The array as stored chunks to copy, if it qualifies (see the module); else ``None``."""
    raw, record, metadata = source.raw, source.record, source.metadata
    if raw is None or record is None or metadata is None or len(raw.shape) < 1:
        return None
    layout = rawread.chunking(metadata)
    shape = raw.shape
    if (
        layout is None
        or raw.inline  # kept in the B+tree: no data file to copy from
        or raw.grid_shape[1:] != shape[1:]
        or raw.chunk_shape[1:] != shape[1:]
        or any(v.length > MAX_VALUE_BYTES for v in raw.values.values())
    ):
        return None
    inner_rows = raw.chunk_shape[0]
    pieces = streaming.tiled_pieces(record, shape)
    for bounds in pieces:
        (start, stop), *rest = bounds
        if any((a, b) != (0, n) for (a, b), n in zip(rest, shape[1:], strict=True)):
            return None
        if start % inner_rows or (stop % inner_rows and stop != shape[0]):
            return None
    sep = layout.separator
    count = -(-shape[0] // raw.grid_shape[0])
    chunks = []
    for i in range(count):
        index = (i,) + (0,) * (len(shape) - 1)
        chunks.append((sep.join(["c", *map(str, index)]), index))
    return StoredArray(
        source=source,
        metadata=metadata,
        chunks=chunks,
        grid_rows=raw.grid_shape[0],
        inner_rows=inner_rows,
        row_bytes=math.prod(shape[1:]) * source.dtype.itemsize,
        pieces=pieces,
    )


def _inner_ranges(
    array: StoredArray, value: memoryview, first_row: int
) -> Iterator[tuple[int, int, int]]:
    """Where the values of each inner chunk of a stored chunk are in its bytes, in
    order: ``(offset, nbytes, first row)``, the rows past the array's end left out.

    Raises:
      CorruptDataError: If the shard's index does not check or points out of it.
    """
    rows = array.source.shape[0]
    last_row = min(first_row + array.grid_rows, rows)
    inner_bytes = array.inner_rows * array.row_bytes
    if not array.raw.sharded:
        if len(value) != array.grid_rows * array.row_bytes:
            raise CorruptDataError("a chunk is not of the size its shape says")
        yield 0, (last_row - first_row) * array.row_bytes, first_row
        return
    count = array.grid_rows // array.inner_rows
    index_bytes = 16 * count + 4
    if len(value) < index_bytes:
        raise CorruptDataError("a shard is shorter than its index")
    index = bytes(value[len(value) - index_bytes :])
    if struct.unpack("<I", index[-4:])[0] != arrays.crc32c(index[:-4]):
        raise CorruptDataError("a shard's index does not match its CRC-32C")
    entries = struct.unpack(f"<{2 * count}Q", index[:-4])
    for j in range(count):
        row = first_row + j * array.inner_rows
        if row >= last_row:
            break
        start, length = entries[2 * j], entries[2 * j + 1]
        if start == _MISSING or length != inner_bytes or start + length > len(value) - index_bytes:
            raise CorruptDataError("a shard's index entry is missing or out of range")
        yield start, (min(row + array.inner_rows, last_row) - row) * array.row_bytes, row


def whole_files(copied: list[StoredArray]) -> set[str]:
    """The local data files of which the stored chunks of ``copied`` make up at least
    ``LINK_SHARE`` of the bytes: a new checkpoint that keeps them may link them whole
    (``PyTreeWriter.link_files``), writing none of their bytes again, with little of a
    file kept alive that it does not use."""
    if not LINK_FILES:
        return set()
    kept: dict[str, int] = {}
    for array in copied:
        raw = array.raw
        if not raw.directory.is_local:
            continue
        for _, grid in array.chunks:
            value = raw.values[grid]
            path = raw.file(value.file).path
            kept[path] = kept.get(path, 0) + value.length
    found = set()
    for path, nbytes in kept.items():
        try:
            size = os.stat(path, follow_symlinks=False).st_size
        except OSError:
            continue
        if size and nbytes >= LINK_SHARE * size:
            found.add(path)
    return found


def _piece_of(array: StoredArray, row: int) -> Bounds:
    for bounds in array.pieces:
        if bounds[0][0] <= row < bounds[0][1]:
            return bounds
    raise AssertionError(f"row {row} is in no piece")  # the pieces tile the rows


def copy(
    writer: PyTreeWriter,
    key: str,
    array: StoredArray,
    where: str,
    *,
    progress: Callable[[int], None] | None = None,
    count: Callable[[np.ndarray], None] | None = None,
) -> None:
    """Copies every stored chunk of ``array`` into ``writer``'s array ``key`` (added
    with the array's metadata), checking the values against the source's checksums,
    which become the copy's; ``count`` is given the values of each chunk (in the
    array's dtype), to count NaN and Inf on the way.

    Raises:
      CorruptDataError: If the bytes read do not match the checksums recorded for
        them, or a chunk is not stored as its metadata says, naming ``where`` (the
        checkpoint, checkpointable and leaf).
      ValueError: If a chunk cannot be read.
    """
    digests = streaming.PieceDigests(array.source.record, array.pieces)
    try:
        reading = _Ahead(array)
    except rawread.Unsupported as e:
        raise ValueError(f"{where}: cannot be read: {e}") from None
    try:
        for (suffix, index), read in zip(array.chunks, reading, strict=True):
            if isinstance(read, BaseException):
                raise read
            first_row = index[0] * array.grid_rows
            try:
                for offset, nbytes, row in _inner_ranges(array, read.value, first_row):
                    values = np.frombuffer(read.value, np.uint8, nbytes, offset)
                    digests.update(_piece_of(array, row), values)
                    if count is not None:
                        count(values.view(array.source.dtype))
            except CorruptDataError as e:
                raise CorruptDataError(f"{where}: the stored data is corrupt: {e}") from None
            writer.write_stored(key, suffix, read.value, read.origin, read.source)
            reading.give(read)
            if progress is not None:
                rows = min(array.grid_rows, array.source.shape[0] - first_row)
                progress(rows * array.row_bytes)
    except rawread.Unsupported as e:
        raise ValueError(f"{where}: cannot be read: {e}") from None
    finally:
        reading.close()
    bad = digests.mismatches()
    if bad:
        assert array.source.record is not None
        raise CorruptDataError(
            f"{where.rsplit(': leaf ', 1)[0]}: "
            + checksums.mismatch_message(array.source.key, array.source.record, bad)
        )
    writer.set_digests(key, digests.digests())


@dataclasses.dataclass(frozen=True)
class _Read:
    """One stored chunk read: its bytes, where they are in a local file (descriptor and
    offset; the file's path and offset), and the pooled buffer they are in."""

    value: memoryview
    origin: tuple[int, int] | None
    buffer: np.ndarray | None
    source: tuple[str, int] | None = None


class _Ahead:
    """The stored chunks of an array, read on the reading threads ahead of their use,
    within ``IN_FLIGHT_BYTES``; each a ``bytes``, or the error its read raised."""

    def __init__(self, array: StoredArray) -> None:
        self.array = array
        self._next = 0
        self._pending: collections.deque[tuple[int, concurrent.futures.Future[_Read]]] = (
            collections.deque()
        )
        # Reads land in buffers reused from one stored chunk to the next: fresh ones
        # would be fresh memory, faulted in page by page.
        self._buffers = rawread.BufferPool(keep=2 + IN_FLIGHT_BYTES // (1 << 20))
        self._in_flight = 0
        # Opened here, before any read: the reading threads share them. Those opened
        # for this copy alone (not the source's, ``RawArray.files``) it closes.
        self._fds: dict[str, int] = {}
        self._owned: dict[str, int] = {}
        if array.raw.directory.is_local:
            for value in array.raw.values.values():
                self._fds[value.file] = array.raw.open_file(value.file, self._owned)

    def _read(self, value: ValueRef) -> _Read:
        raw = self.array.raw
        if not raw.directory.is_local:
            into = np.empty(value.length, np.uint8)
            raw.read_at(value.file, into, value.offset, self._fds)
            return _Read(memoryview(into.data).cast("B"), None, None)
        buffer = self._buffers.take(value.length)
        into = buffer.reshape(-1).view(np.uint8)[: value.length]
        try:
            raw.read_at(value.file, into, value.offset, self._fds)
        except rawread.Unsupported:
            self._buffers.give(buffer)
            raise
        return _Read(
            memoryview(into.data).cast("B"),
            (self._fds[value.file], value.offset),
            buffer,
            (raw.file(value.file).path, value.offset),
        )

    def give(self, read: _Read) -> None:
        """Takes back the buffer of a read the caller is done with."""
        if read.buffer is not None:
            self._buffers.give(read.buffer)

    def _top_up(self) -> None:
        values = self.array.raw.values
        chunks = self.array.chunks
        while self._next < len(chunks):
            value = values[chunks[self._next][1]]
            if self._pending and self._in_flight + value.length > IN_FLIGHT_BYTES:
                return
            self._pending.append((value.length, rawread.executor().submit(self._read, value)))
            self._in_flight += value.length
            self._next += 1

    def __iter__(self) -> Iterator[_Read | BaseException]:
        while True:
            self._top_up()
            if not self._pending:
                return
            length, future = self._pending.popleft()
            self._in_flight -= length
            try:
                value = future.result()
            except Exception as e:
                yield e
                continue
            yield value

    def close(self) -> None:
        """Waits for the reads in flight and closes the files."""
        for _, future in self._pending:
            future.cancel()
        for _, future in self._pending:
            with contextlib.suppress(BaseException):
                future.result()
        self._pending.clear()
        for fd in self._owned.values():
            os.close(fd)
        self._fds, self._owned = {}, {}
