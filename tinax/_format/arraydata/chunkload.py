"""Stored arrays' chunks read and decoded into host buffers, for loads at the host's speed.

Orbax keeps each array as a zarr3 array in an OCDBT store: each shard (the unit
stored under one key) is a value of the store, inline in a B+tree node when small,
else a byte range of a data file; a shard holds inner chunks, each the C-order
bytes of its values (codec ``bytes``), compressed by zstd or not, and an index of
where they are. Here a box of an array (the part one device holds) is read into a
caller's buffer: an uncompressed chunk straight into place with ``preadv``, a
compressed one read whole into a buffer the reading thread reuses (chunks of up to
``WHOLE_READ_BYTES``; larger ones are streamed from the file ``DECODE_READ_BYTES``
at a time) and decoded by zstd (the ``zstandard`` library) straight into place; a
chunk that the box cuts is decoded into one scratch chunk of the reading thread and
the box's part copied out. Every step releases the GIL, so several threads read,
decode and copy side by side.

Only what is known to be byte for byte is read this way: zarr3 metadata whose
codecs are ``bytes`` (little-endian), optionally followed by ``zstd``, alone or
inside a sharding codec with tensorstore's index layout; every chunk stored, each
of the size its shape says (decoded). Anything else, and anything inconsistent met
while reading, is ``rawread.Unsupported``: the caller loads through Orbax instead.

On a local disk chunks are read by offset; elsewhere (``gs://``) each box's
shards are fetched in as few ranged reads as there are runs of adjacent bytes in
each data file (``FileRanges``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from collections.abc import Mapping, Sequence

import numpy as np

from tinax._format.arraydata import rawread
from tinax._format.arraydata.rawread import Box, ChunkGrid, Unsupported
from tinax._format.metadata import arrays
from tinax._format.metadata.arrays import ValueRef
from tinax._format.storage.location import Location

# Codecs after ``bytes`` this reader decodes.
ZSTD = "zstd"
_MISSING = (1 << 64) - 1
# A shard's index is read whole: shards of more inner chunks are Orbax's to read.
MAX_INNER_CHUNKS = 1 << 20
# Ranges of one data file closer than this are fetched in one request (gs://): a
# request costs tens of milliseconds, this many bytes about as much.
COALESCE_GAP_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class StoredArray(ChunkGrid):
    """A zarr3 array of an OCDBT store whose chunks this module reads.

    Attributes:
      codec: ``"zstd"`` or ``None`` (the bytes as they are).
      values: Grid index → the value's inline bytes or where it is kept.
    """

    codec: str | None
    values: Mapping[tuple[int, ...], bytes | ValueRef]

    def chunks_in(self, box: Box) -> list[Chunk]:
        """The inner chunks ``box`` needs, each with where it lands in the box."""
        chunk = self.chunk_shape
        ranges = [range(s.start // c, -(-s.stop // c)) for s, c in zip(box, chunk, strict=True)]
        found = []
        for index in rawread._indices(ranges):
            lo = [i * c for i, c in zip(index, chunk, strict=True)]
            hi = [min(a + c, n) for a, c, n in zip(lo, chunk, self.shape, strict=True)]
            cut = [(max(a, s.start), min(b, s.stop)) for a, b, s in zip(lo, hi, box, strict=True)]
            found.append(
                Chunk(
                    index=index,
                    within=tuple(
                        slice(a - s.start, b - s.start) for (a, b), s in zip(cut, box, strict=True)
                    ),
                    part=tuple(slice(a - o, b - o) for (a, b), o in zip(cut, lo, strict=True)),
                    whole=all(
                        a == o and b - a == c for (a, b), o, c in zip(cut, lo, chunk, strict=True)
                    ),
                )
            )
        return found


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One inner chunk a box needs.

    Attributes:
      index: Its index in the chunk grid (inner chunks).
      within: Where its part lies in the box.
      part: Which part of the chunk the box takes.
      whole: Whether the box takes all of it.
    """

    index: tuple[int, ...]
    within: Box
    part: Box
    whole: bool


def _codec_chain(codecs: object, dtype: np.dtype) -> str | bool | None:
    """``None`` for ``[bytes]``, ``"zstd"`` for ``[bytes, zstd]``; ``False`` for anything else."""
    if not isinstance(codecs, list) or not codecs or not rawread._bytes_codec(codecs[0], dtype):
        return False
    if len(codecs) == 1:
        return None
    if len(codecs) == 2 and isinstance(codecs[1], dict) and codecs[1].get("name") == ZSTD:
        config = codecs[1].get("configuration") or {}
        if isinstance(config, dict) and set(config) <= {"level", "checksum"}:
            return ZSTD
    return False


def plan(
    directory: Location,
    metadata: bytes,
    stored: Mapping[bytes, bytes | ValueRef],
    path: str,
) -> StoredArray | None:
    """The array at storage path ``path`` as chunks this module reads; ``None`` if it is not.

    Args:
      directory: The OCDBT store's directory.
      metadata: The array's ``zarr.json``.
      stored: The array's chunk keys (with ``path`` before them) and their values.
      path: The array's storage path within the store.
    """
    found = rawread.chunking(metadata)
    if found is None:
        return None
    try:
        dtype = arrays.numpy_dtype(found.data_type)
    except TypeError:
        return None
    if not rawread._little(dtype) or dtype.hasobject:
        return None
    codec = _codec_chain(found.codecs, dtype)
    # Chunks not stored: those of other processes in a part saved by one process
    # (``metadata.hostparts``), or fill values left out. A read that needs one finds
    # it missing (``Unsupported``), and the load goes to Orbax.
    values = found.stored_values(stored, path.encode("utf-8"))
    inner = math.prod(g // c for g, c in zip(found.grid_shape, found.chunk_shape, strict=True))
    if codec is False or values is None or inner > MAX_INNER_CHUNKS:
        return None
    return StoredArray.laid_out(
        directory, found, dtype, codec=codec if isinstance(codec, str) else None, values=values
    )


# -- where a chunk's bytes are ---------------------------------------------------------------


class Files:
    """The data files of one load, opened once each; closed by ``close``.

    Local files are read by offset into the caller's buffers. Remote ones
    (``gs://``) are read through the storage, in the ranges ``FileRanges`` asks for.
    """

    def __init__(self, directory: Location) -> None:
        self.directory = directory
        self.local = directory.is_local
        self._opened = rawread.DataFiles()

    def fd(self, file: str) -> int:
        return self._opened.fd(self._location(file).path)

    def _location(self, file: str) -> Location:
        where = self.directory
        for part in filter(None, file.split("/")):
            where = where / part
        return where

    def read_into(self, file: str, offset: int, into: np.ndarray) -> None:
        """Fills ``into`` (a byte array) from ``file`` at ``offset`` (local files)."""
        rawread._pread(self.fd(file), into, offset)

    def fetch(self, file: str, offset: int, length: int) -> bytes:
        """``length`` bytes of ``file`` from ``offset``, in one request.

        Raises:
          Unsupported: If the file is shorter, or cannot be read.
        """
        try:
            data = self._location(file).read_range(offset, length)
        except OSError as e:
            raise Unsupported(str(e)) from None
        if len(data) != length:
            raise Unsupported("a data file is shorter than a chunk in it")
        return data

    def close(self) -> None:
        self._opened.close()


class FileRanges:
    """The shards of one box fetched ahead (``gs://``): each data file's needed
    ranges, runs closer than ``COALESCE_GAP_BYTES`` merged, one request per run."""

    def __init__(self, files: Files, refs: Sequence[ValueRef]) -> None:
        self._runs: dict[str, list[tuple[int, bytes]]] = {}
        by_file: dict[str, list[tuple[int, int]]] = {}
        for ref in refs:
            by_file.setdefault(ref.file, []).append((ref.offset, ref.offset + ref.length))
        for file, spans in by_file.items():
            spans.sort()
            runs: list[list[int]] = []
            for start, stop in spans:
                if runs and start <= runs[-1][1] + COALESCE_GAP_BYTES:
                    runs[-1][1] = max(runs[-1][1], stop)
                else:
                    runs.append([start, stop])
            self._runs[file] = [(a, files.fetch(file, a, b - a)) for a, b in runs]

    def value(self, ref: ValueRef) -> memoryview:
        for start, data in self._runs.get(ref.file, []):
            if start <= ref.offset and ref.offset + ref.length <= start + len(data):
                return memoryview(data)[ref.offset - start : ref.offset - start + ref.length]
        raise Unsupported("a shard was not fetched")


class Scratch(threading.local):
    """What each reading thread reuses: one decoded chunk (for chunks a box cuts), one
    compressed chunk read whole, its zstd decoder, and one piece of an array read
    whole (for a caller that takes windows of it)."""

    def __init__(self) -> None:
        self.decoded = np.empty(0, np.uint8)
        self.compressed = np.empty(0, np.uint8)
        self.piece = np.empty(0, np.uint8)
        self.decoder: object = None

    def take_piece(self, nbytes: int) -> np.ndarray:
        if self.piece.nbytes < nbytes:
            # Aligned as a fresh NumPy array is: the chunks are decoded straight in.
            self.piece = np.empty(nbytes, np.uint8)
        return self.piece[:nbytes]

    def take_decoded(self, nbytes: int) -> np.ndarray:
        if self.decoded.nbytes < nbytes:
            self.decoded = np.empty(nbytes, np.uint8)
        return self.decoded[:nbytes]

    def take_compressed(self, nbytes: int) -> np.ndarray:
        if self.compressed.nbytes < nbytes:
            # Whole MiB: chunks a little longer than the last do not make another.
            self.compressed = np.empty(-(-nbytes // (1 << 20)) << 20, np.uint8)
        return self.compressed[:nbytes]


# A compressed chunk of a local file up to this long is read whole, in one call,
# into the reading thread's reused buffer, and decoded from memory: a frame read in
# small pieces costs a system call and a fresh Python bytes object for each. Longer
# ones (chunks of writers other than tinax) are streamed from the file, never held
# whole, ``DECODE_READ_BYTES`` at a time.
WHOLE_READ_BYTES = 16 << 20
DECODE_READ_BYTES = 1 << 20
# The longest zstd frame header.
_ZSTD_HEADER_BYTES = 18


class _FileRange:
    """A byte range of an open file, read front to back as a zstd decoder asks."""

    def __init__(self, fd: int, offset: int, length: int) -> None:
        self.fd = fd
        self.offset = offset
        self.left = length

    def head(self, nbytes: int) -> bytes:
        return os.pread(self.fd, min(nbytes, self.left), self.offset)

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        data = os.pread(self.fd, size, self.offset) if size else b""
        if len(data) != size:
            raise Unsupported("a data file is shorter than a chunk in it")
        self.offset += size
        self.left -= size
        return data


def _decompress_into(scratch: Scratch, source: memoryview | _FileRange, into: np.ndarray) -> None:
    """Decodes one zstd frame into ``into``, which it must fill exactly."""
    import zstandard

    if scratch.decoder is None:
        scratch.decoder = zstandard.ZstdDecompressor()
    decoder: zstandard.ZstdDecompressor = scratch.decoder  # type: ignore[assignment]
    head = source.head(_ZSTD_HEADER_BYTES) if isinstance(source, _FileRange) else source
    try:
        size = zstandard.frame_content_size(head)
    except zstandard.ZstdError as e:
        raise _Undecodable(f"zstd decompress failed: {e}") from None
    if size not in (into.nbytes, -1):
        raise _Undecodable(f"a zstd frame holds {size} bytes where {into.nbytes} are expected")
    try:
        read_size = DECODE_READ_BYTES if isinstance(source, _FileRange) else max(1, len(source))
        # Any object with read() is a source (its annotation says IO).
        reader = decoder.stream_reader(
            source,  # type: ignore[arg-type]
            read_size=read_size,
            closefd=False,
        )
        out = memoryview(into.reshape(-1).view(np.uint8).data).cast("B")
        done = 0
        while done < len(out):
            n = reader.readinto(out[done:])
            if n == 0:
                break
            done += n
        if done != len(out) or reader.read(1):
            raise _Undecodable(
                f"a zstd frame decodes to {done}{'+' if done == len(out) else ''} bytes "
                f"where {len(out)} are expected"
            )
    except zstandard.ZstdError as e:
        raise _Undecodable(f"zstd decompress failed: {e}") from None


class _Undecodable(Unsupported):
    """Stored bytes that do not decode: damage, which the Orbax load then reports."""


class BoxReader:
    """Reads boxes of one array into buffers (see the module's docstring).

    Shard indexes are read once each and kept while the reader lives. Thread-safe:
    the chunks of one box may be read on several threads at once.
    """

    def __init__(self, array: StoredArray, files: Files) -> None:
        self.array = array
        self.files = files
        self._indexes: dict[tuple[int, ...], np.ndarray] = {}
        self._lock = threading.Lock()

    def refs(self, box: Box) -> list[ValueRef]:
        """Where the shards the box needs are kept (those not inline), in file order."""
        grids = {self.array.grid_of(chunk.index) for chunk in self.array.chunks_in(box)}
        found = [v for g in grids if isinstance(v := self.array.values.get(g), ValueRef)]
        return sorted(found, key=lambda ref: (ref.file, ref.offset))

    def fetch(self, box: Box) -> FileRanges | None:
        """The box's shards fetched in few requests, where files are not local."""
        if self.files.local:
            return None
        return FileRanges(self.files, self.refs(box))

    def read(
        self,
        chunks: Sequence[Chunk],
        out: np.ndarray,
        scratch: Scratch,
        fetched: FileRanges | None = None,
    ) -> None:
        """Reads ``chunks`` (of ``chunks_in(box)``) into ``out``, the box's buffer.

        Raises:
          Unsupported: If a chunk is missing, of the wrong size, or does not decode.
        """
        array = self.array
        nbytes = array.chunk_bytes
        for chunk in chunks:
            value, start, length = self._where(chunk.index, fetched)
            target = out[chunk.within] if out.ndim else out
            direct = chunk.whole and target.flags.c_contiguous
            into = target.reshape(-1).view(np.uint8) if direct else scratch.take_decoded(nbytes)
            if array.codec is None:
                if length != nbytes:
                    raise Unsupported("a chunk is not of the size its shape says")
                self._bytes_into(value, start, into)
            else:
                # zstd's worst case is a little over the bytes it stores: a stored length
                # beyond it is damage, and is not read into memory.
                if length > nbytes + nbytes // 128 + 1024:
                    raise _Undecodable("a zstd chunk is longer than its values could need")
                _decompress_into(scratch, self._source(value, start, length, scratch), into)
            if not direct:
                decoded = into.view(array.dtype).reshape(array.chunk_shape)
                out[chunk.within] = decoded[chunk.part]

    def _where(
        self, index: tuple[int, ...], fetched: FileRanges | None
    ) -> tuple[bytes | ValueRef | memoryview, int, int]:
        """The value holding inner chunk ``index``, and its bytes' start and length in it."""
        array = self.array
        grid = array.grid_of(index)
        value = array.values.get(grid)
        if value is None:
            raise Unsupported("a chunk is not stored")
        held: bytes | ValueRef | memoryview = value
        if fetched is not None and isinstance(value, ValueRef):
            held = fetched.value(value)
        size = len(held) if not isinstance(held, ValueRef) else held.length
        if not array.sharded:
            return held, 0, size
        table = self._index(grid, held, size)
        start, length = (int(v) for v in table[array.position_in_shard(index)])
        index_bytes = 16 * array.inner_count + 4
        if start == _MISSING or start + length > size - index_bytes:
            raise Unsupported("a shard's index entry is out of range")
        return held, start, length

    def _index(
        self, grid: tuple[int, ...], held: bytes | ValueRef | memoryview, size: int
    ) -> np.ndarray:
        with self._lock:
            table = self._indexes.get(grid)
        if table is not None:
            return table
        count = self.array.inner_count
        index_bytes = 16 * count + 4
        if size < index_bytes:
            raise Unsupported("a shard is shorter than its index")
        raw = np.empty(index_bytes, np.uint8)
        self._bytes_into(held, size - index_bytes, raw)
        # The index's own crc32c is left to tensorstore: an index that lies sends a
        # read out of range (refused above) or to bytes the checksums refuse.
        table = raw[: 16 * count].view("<u8").reshape(count, 2).copy()
        with self._lock:
            self._indexes[grid] = table
        return table

    def _bytes_into(
        self, held: bytes | ValueRef | memoryview, start: int, into: np.ndarray
    ) -> None:
        if isinstance(held, ValueRef):
            if start + into.nbytes > held.length:
                raise Unsupported("a chunk runs past its value")
            self.files.read_into(held.file, held.offset + start, into)
            return
        data = memoryview(held)[start : start + into.nbytes]
        if len(data) != into.nbytes:
            raise Unsupported("a chunk runs past its value")
        into[:] = np.frombuffer(data, np.uint8)

    def _source(
        self, held: bytes | ValueRef | memoryview, start: int, length: int, scratch: Scratch
    ) -> memoryview | _FileRange:
        if start + length > (held.length if isinstance(held, ValueRef) else len(held)):
            raise Unsupported("a chunk runs past its value")
        if isinstance(held, ValueRef):
            if length <= WHOLE_READ_BYTES:
                whole = scratch.take_compressed(length)
                self.files.read_into(held.file, held.offset + start, whole)
                return memoryview(whole.data)
            return _FileRange(self.files.fd(held.file), held.offset + start, length)
        return memoryview(held)[start : start + length]


def undecodable(error: BaseException) -> str | None:
    """The complaint, if ``error`` says stored bytes do not decode."""
    return str(error) if isinstance(error, _Undecodable) else None
