"""Reading uncompressed zarr3 chunks straight from an OCDBT store's data files.

tinax stores arrays uncompressed by default on a CPU (and anywhere on request):
each zarr3 chunk (a shard holding inner chunks, or a plain chunk) is the C-order
bytes of its values, kept as one byte range of a data file. Decoding such a chunk
through tensorstore costs several times what the bytes alone cost to read (buffers
allocated and copied per read);
here the bytes are read with ``preadv`` straight into the region's array, on a few
threads, so that reading runs at the speed of the page cache.

Only what is known to be byte for byte is read this way: a local store, zarr3
metadata whose codecs are exactly ``bytes`` (little-endian) or a sharding codec over
it with tensorstore's index layout, every chunk stored out of line, each of the
size its shape says. Anything else, and any inconsistency met while reading (a
missing chunk, an index entry out of range, a short read), is ``Unsupported``: the
caller reads that array through tensorstore instead. The bytes read are trusted no
more than tensorstore's: callers use this path only for arrays whose checksums were
recorded at save time, check them as the regions stream by, and read the array
again through tensorstore when they do not match, so that what is reported about a
damaged array is what tensorstore finds.

(Over 500 lines: the metadata it accepts, the shard index it decodes and the threads
that read regions into place are one contract of what is byte for byte; each part
relies on what the others checked.)
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import os
import stat
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

import numpy as np

from tinax._format.arraydata import blocks
from tinax._format.metadata.arrays import ValueRef
from tinax._format.pools import ProcessPool
from tinax._format.storage.location import Location

Box = tuple[slice, ...]

# Chunks smaller than this are read through tensorstore: per read, the Python work
# here would cost more than tensorstore's decoding saves.
MIN_CHUNK_BYTES = 256 << 10
# Regions read raw: small enough that a region stays in the processor's cache while
# it is digested and compared.
REGION_BYTES = 2 << 20
# Threads reading chunks: the copy from the page cache is the kernel's work, and
# runs beside the caller's hashing and statistics (or, in ``explore._raw_scan``,
# each does all of a region's work beside the caller's thread doing the same).
THREADS = 2
_MISSING = (1 << 64) - 1
# The file name a ``RawArray`` gives a value kept inline (no data file has it).
INLINE = "\0inline/"


class Unsupported(Exception):
    """This array (or one of its chunks) cannot be read here; read it through tensorstore."""


_readers = ProcessPool(THREADS, "tinax-read")


def executor() -> concurrent.futures.ThreadPoolExecutor:
    """The ``THREADS`` reading threads, started on first use."""
    return _readers.executor()


class DataFiles:
    """The local data files one read opens (a diff, a data check, a leaf, a copy), each
    opened once and kept open until ``close``: reading region after region of one
    file, or array after array stored in it, opens it once. Thread-safe; a context
    manager that closes them."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def fd(self, path: str) -> int:
        """The descriptor of the regular file ``path``, opened the first time it is asked
        for (links not followed).

        Raises:
          Unsupported: If it cannot be opened.
        """
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                try:
                    fd = self._fds[path] = _open_regular(path)
                except OSError as e:
                    raise Unsupported(str(e)) from None
            return fd

    def close(self) -> None:
        """Closes every file opened."""
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def __enter__(self) -> DataFiles:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


@dataclasses.dataclass(frozen=True)
class ChunkGrid:
    """How a zarr3 array of an OCDBT store is cut into chunks, and where the store is.

    Attributes:
      directory: The store's directory.
      shape: The array's shape.
      dtype: Its NumPy dtype (little-endian, or of single bytes).
      grid_shape: The shape stored under one key (a shard, or a chunk).
      chunk_shape: The shape of one inner chunk (the unit decoded, one byte range
        when stored raw).
      sharded: Whether each key holds a shard (inner chunks and their index).
    """

    directory: Location
    shape: tuple[int, ...]
    dtype: np.dtype
    grid_shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    sharded: bool

    @classmethod
    def laid_out(cls, directory: Location, found: Chunking, dtype: np.dtype, **rest: Any) -> Self:
        """An array of ``cls`` with ``found``'s chunks; ``rest`` are its own fields."""
        return cls(
            directory=directory,
            shape=found.shape,
            dtype=dtype,
            grid_shape=found.grid_shape,
            chunk_shape=found.chunk_shape,
            sharded=found.sharded,
            **rest,
        )

    @property
    def chunk_bytes(self) -> int:
        """Decoded bytes of one inner chunk."""
        return math.prod(self.chunk_shape) * self.dtype.itemsize

    @property
    def inner(self) -> tuple[int, ...]:
        """Inner chunks per shard, along each axis."""
        return tuple(g // c for g, c in zip(self.grid_shape, self.chunk_shape, strict=True))

    @property
    def inner_count(self) -> int:
        """Inner chunks per shard."""
        return math.prod(self.inner)

    def grid_of(self, index: tuple[int, ...]) -> tuple[int, ...]:
        """The grid index of the shard holding inner chunk ``index``."""
        return tuple(i // n for i, n in zip(index, self.inner, strict=True))

    def position_in_shard(self, index: tuple[int, ...]) -> int:
        """Inner chunk ``index``'s entry in its shard's index (C order)."""
        position = 0
        for i, n in zip(index, self.inner, strict=True):
            position = position * n + i % n
        return position


@dataclasses.dataclass(frozen=True)
class RawArray(ChunkGrid):
    """An uncompressed zarr3 array whose chunks can be read as raw bytes.

    Attributes:
      values: Grid index → where that key's bytes are.
      inline: The bytes of keys the store keeps inline in its B+tree (small arrays),
        by the name their ``values`` give as a file (``INLINE`` and a number): read
        from here, without a request.
      files: The data files of the read it belongs to, opened once for all of its
        reads; ``None``: each read opens (and closes) what it reads.
    """

    values: Mapping[tuple[int, ...], ValueRef]
    inline: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    files: DataFiles | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def unit(self) -> tuple[int, ...]:
        """The smallest box ``read_into`` reads: a row when chunks hold whole rows (their
        bytes are then contiguous rows of the array), else a chunk."""
        if self.shape and self.chunk_shape[1:] == self.shape[1:]:
            return (1, *self.shape[1:])
        return self.chunk_shape

    def read_into(self, box: Box, out: np.ndarray) -> None:
        """Reads ``box`` into ``out``: whole chunks (clipped at the array's end), or any
        rows where chunks hold whole rows (see ``unit``).

        Raises:
          Unsupported: If a chunk is missing or inconsistent, or a read comes short.
        """
        chunk = self.chunk_shape
        rank = len(self.shape)
        if out.shape != tuple(s.stop - s.start for s in box):
            raise Unsupported("the region's buffer does not fit it")
        if (
            rank
            and self.unit[0] == 1
            and out.flags.c_contiguous
            and all(s == slice(0, n) for s, n in zip(box[1:], self.shape[1:], strict=True))
        ):
            self._read_rows(box[0].start, box[0].stop, out)
            return
        if any(s.start % c for s, c in zip(box, chunk, strict=True)):
            raise Unsupported("the region does not start at a chunk")
        ranges = [range(s.start // c, -(-s.stop // c)) for s, c in zip(box, chunk, strict=True)]
        nbytes = self.chunk_bytes
        scratch: np.ndarray | None = None
        fds: dict[str, int] = {}
        try:
            for index in _indices(ranges):
                offset, length = self._chunk_range(index, nbytes, fds)
                if length != nbytes:
                    raise Unsupported("a chunk is not of the size its shape says")
                lo = [i * c for i, c in zip(index, chunk, strict=True)]
                hi = [min(a + c, s.stop) for a, c, s in zip(lo, chunk, box, strict=True)]
                local = tuple(
                    slice(a - s.start, b - s.start) for a, b, s in zip(lo, hi, box, strict=True)
                )
                file = self.values[self.grid_of(index)].file
                # The chunk's rows land contiguously in ``out`` when it spans the
                # region's trailing extent and is cut, if at all, along the first axis.
                trailing = all(hi[d] - lo[d] == chunk[d] == out.shape[d] for d in range(1, rank))
                target = out[local] if rank else out
                if (rank == 0 or trailing) and target.flags.c_contiguous:
                    self.read_at(file, target.reshape(-1).view(np.uint8), offset, fds)
                else:
                    if scratch is None:
                        scratch = np.empty(chunk, self.dtype)
                    self.read_at(file, scratch.reshape(-1).view(np.uint8), offset, fds)
                    out[local] = scratch[
                        tuple(slice(0, b - a) for a, b in zip(lo, hi, strict=True))
                    ]
        finally:
            for fd in fds.values():
                os.close(fd)

    def _read_rows(self, start: int, stop: int, out: np.ndarray) -> None:
        """Reads rows ``start:stop`` into ``out``, chunks holding whole rows."""
        rows = self.chunk_shape[0]
        row_bytes = math.prod(self.shape[1:]) * self.dtype.itemsize
        nbytes = rows * row_bytes
        flat = out.reshape(-1).view(np.uint8)
        fds: dict[str, int] = {}
        try:
            for i in range(start // rows, -(-stop // rows)):
                index = (i,) + (0,) * (len(self.shape) - 1)
                offset, length = self._chunk_range(index, nbytes, fds)
                if length != nbytes:
                    raise Unsupported("a chunk is not of the size its shape says")
                first, last = max(i * rows, start), min((i + 1) * rows, stop)
                self.read_at(
                    self.values[self.grid_of(index)].file,
                    flat[(first - start) * row_bytes : (last - start) * row_bytes],
                    offset + (first - i * rows) * row_bytes,
                    fds,
                )
        finally:
            for fd in fds.values():
                os.close(fd)

    def file(self, file: str) -> Location:
        """The data file ``file`` (as a value names it: ``d/…``) of the store."""
        where = self.directory
        for part in filter(None, file.split("/")):
            where = where / part
        return where

    def open_file(self, file: str, fds: dict[str, int]) -> int:
        """The descriptor of the local data file ``file``, opened into ``fds`` if it is
        not there yet (a regular file, links not followed).

        Raises:
          Unsupported: If it cannot be opened.
        """
        if self.files is not None:
            return self.files.fd(self.file(file).path)
        fd = fds.get(file)
        if fd is None:
            try:
                fd = fds[file] = _open_regular(self.file(file).path)
            except OSError as e:
                raise Unsupported(str(e)) from None
        return fd

    def read_at(self, file: str, into: np.ndarray, offset: int, fds: dict[str, int]) -> None:
        """Fills ``into`` from the data file ``file`` at ``offset``: by ``pread`` on a local
        disk, from blocks read ahead on an object store."""
        kept = self.inline.get(file)
        if kept is not None:
            if offset < 0 or offset + into.nbytes > len(kept):
                raise Unsupported("a read goes past an inline value's end")
            into[...] = np.frombuffer(kept, np.uint8, into.nbytes, offset)
            return
        if self.directory.is_local:
            _pread(self.open_file(file, fds), into, offset)
            return
        try:
            blocks.read_into(self.file(file), into, offset)
        except OSError as e:
            raise Unsupported(str(e)) from None

    def _chunk_range(
        self, index: tuple[int, ...], nbytes: int, fds: dict[str, int]
    ) -> tuple[int, int]:
        """Where inner chunk ``index``'s bytes are: file offset and length."""
        value = self.values.get(self.grid_of(index))
        if value is None:
            raise Unsupported("a chunk is not stored")
        if not self.sharded:
            return value.offset, value.length
        count = self.inner_count
        index_bytes = 16 * count + 4
        if value.length < index_bytes:
            raise Unsupported("a shard is shorter than its index")
        table = np.empty(index_bytes, np.uint8)
        self.read_at(value.file, table, value.offset + value.length - index_bytes, fds)
        entries = table[: 16 * count].view("<u8").reshape(count, 2)
        start, length = (int(v) for v in entries[self.position_in_shard(index)])
        if start == _MISSING or start + length > value.length - index_bytes:
            raise Unsupported("a shard's index entry is out of range")
        return value.offset + start, length


class BufferPool:
    """Region buffers handed from one region of a scan to the next.

    A scan reads region after region of the same few sizes; a fresh buffer for each
    would be fresh memory, faulted in page by page, each time. At most ``keep``
    idle buffers are kept, so the pool holds no more than the regions in flight.
    """

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        with self._lock:
            for i, buf in enumerate(self._free):
                if nbytes <= buf.nbytes <= 2 * nbytes:
                    return self._free.pop(i)
        return np.empty(nbytes, np.uint8)

    def give(self, values: np.ndarray) -> None:
        """Takes back the buffer under ``values`` (a region this pool's reads gave)."""
        root = values
        while isinstance(root.base, np.ndarray):
            root = root.base
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(root)


class Digest:
    """A hook run on each region of one array on the reading thread, in the regions'
    order (a checksum is a stream), so that digesting overlaps the caller's work.

    Each region's read waits for the one before it to be digested before digesting
    its own; a region that fails marks the digest ``failed`` and the rest are skipped.
    """

    def __init__(self, update: Callable[[Box, np.ndarray], None]) -> None:
        self.update = update
        self.failed = False
        self._tail = threading.Event()
        self._tail.set()

    def _next(self) -> tuple[threading.Event, threading.Event]:
        before, mine = self._tail, threading.Event()
        self._tail = mine
        return before, mine


class PooledArray:
    """A raw array whose region reads come in a pool's buffers, as ``chunks.read_arrays``
    takes it: each region's values are valid until the next region is asked for. With
    a ``digest``, each region is handed to it on the reading thread first."""

    def __init__(self, array: RawArray, pool: BufferPool, digest: Digest | None = None) -> None:
        self.array = array
        self.pool = pool
        self.digest = digest

    def __getitem__(self, box: Box) -> _RawRead:
        return _RawRead(self.array, box, self.pool, self.digest)

    def release(self, values: object) -> None:
        if isinstance(values, np.ndarray):
            self.pool.give(values)


class _RawRead:
    """One region's pending read."""

    def __init__(self, array: RawArray, box: Box, pool: BufferPool, digest: Digest | None) -> None:
        self.array = array
        self.box = box
        self.pool = pool
        self.digest = digest

    def read(self) -> concurrent.futures.Future[np.ndarray]:
        # Regions are asked for in order: the digest's chain follows that order.
        order = None if self.digest is None else self.digest._next()
        return executor().submit(self._run, order)

    def _run(self, order: tuple[threading.Event, threading.Event] | None) -> np.ndarray:
        try:
            shape = [s.stop - s.start for s in self.box]
            nbytes = math.prod(shape) * self.array.dtype.itemsize
            buf = self.pool.take(nbytes)
            out = buf[:nbytes].view(self.array.dtype).reshape(shape)
            try:
                self.array.read_into(self.box, out)
            except BaseException:
                self.pool.give(buf)
                if self.digest is not None:
                    self.digest.failed = True
                raise
            if order is not None and self.digest is not None:
                # Never ahead of the region before: the pool's threads take regions
                # in the order they were asked for, so that one is running or done.
                order[0].wait()
                if not self.digest.failed:
                    try:
                        self.digest.update(self.box, out)
                    except BaseException:
                        self.digest.failed = True
                        raise
            return out
        finally:
            if order is not None:
                order[0].wait()
                order[1].set()


def _indices(ranges: list[range]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for r in ranges:
        out = [(*head, i) for head in out for i in r]
    return out


def _open_regular(path: str) -> int:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path!r} is not a regular file")
    return fd


def _pread(fd: int, into: np.ndarray, offset: int) -> None:
    """Fills the bytes of ``into`` from ``fd`` at ``offset``."""
    view = memoryview(into.data).cast("B")
    done = 0
    while done < len(view):
        try:
            n = os.preadv(fd, [view[done:]], offset + done)
        except OSError as e:
            raise Unsupported(str(e)) from None
        if n <= 0:
            raise Unsupported("a data file is shorter than a chunk in it")
        done += n


# -- which arrays qualify -----------------------------------------------------------------------


def _little(dtype: np.dtype) -> bool:
    if dtype.itemsize == 1 or dtype.byteorder == "|":
        return True
    if dtype.byteorder == "<":
        return True
    return dtype.byteorder == "=" and sys.byteorder == "little"


def _bytes_codec(codec: object, dtype: np.dtype) -> bool:
    if not isinstance(codec, dict) or codec.get("name") != "bytes":
        return False
    config = codec.get("configuration") or {}
    if not isinstance(config, dict) or set(config) - {"endian"}:
        return False
    endian = config.get("endian")
    return endian == "little" or (endian is None and dtype.itemsize == 1)


def _index_codecs(codecs: object) -> bool:
    if not isinstance(codecs, list) or len(codecs) != 2:
        return False
    first, second = codecs
    return (
        isinstance(first, dict)
        and first.get("name") == "bytes"
        and (first.get("configuration") or {}) == {"endian": "little"}
        and isinstance(second, dict)
        and second.get("name") == "crc32c"
        and not second.get("configuration")
    )


def _ints(value: object, rank: int) -> tuple[int, ...] | None:
    if (
        isinstance(value, list)
        and len(value) == rank
        and all(type(v) is int and v > 0 for v in value)
    ):
        return tuple(value)
    return None


def _grid_index(name: bytes, rank: int, separator: str) -> tuple[int, ...] | None:
    text = name.decode("ascii", "replace")
    if rank == 0:
        return () if text == "c" else None
    parts = text.split(separator)
    if len(parts) != rank + 1 or parts[0] != "c" or not all(p.isdigit() for p in parts[1:]):
        return None
    return tuple(int(p) for p in parts[1:])


def read_through(arrays: Sequence[RawArray]) -> None:
    """Says that most of these arrays' data files are about to be read: on an object
    store, they are read in large blocks from the first read on (``blocks``)."""
    remote = {
        str(where): where
        for array in arrays
        if not array.directory.is_local
        for where in (array.file(value.file) for value in array.values.values())
    }
    blocks.read_through(list(remote.values()))


def may_read(directory: Location) -> bool:
    """Whether arrays under ``directory`` can be read here at all: its files must be
    read by offset, on a local disk or an object store's listed snapshot (whose data
    files are read in large blocks, ``tinax._format.arraydata.blocks``). A caller asks this
    before it looks an array's chunks up."""
    return directory.is_local or (
        directory.storage.parallel_reads and directory.entry() is not None
    )


@dataclasses.dataclass(frozen=True)
class Chunking:
    """How a zarr3 array's chunks are laid out, as its metadata says (checked).

    Attributes:
      shape: The array's shape (every extent positive).
      data_type: zarr3's name of its dtype.
      grid_shape: The shape stored under one key (shard or chunk).
      chunk_shape: The shape of one inner chunk (the unit decoded).
      sharded: Whether each key holds a shard (tensorstore's index at its end).
      codecs: The codecs of one inner chunk, as stored.
      separator: The chunk keys' separator.
    """

    shape: tuple[int, ...]
    data_type: str
    grid_shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    sharded: bool
    codecs: list[object]
    separator: str

    def stored_values(
        self, stored: Mapping[bytes, bytes | ValueRef], prefix: bytes
    ) -> dict[tuple[int, ...], bytes | ValueRef] | None:
        """Grid index → value, for every key of ``stored``; ``None`` if a key is not one
        of this array's chunks (with ``prefix``). Chunks left out (their values all the
        fill value) are absent."""
        values: dict[tuple[int, ...], bytes | ValueRef] = {}
        for key, value in stored.items():
            if not key.startswith(prefix):
                return None
            index = _grid_index(key[len(prefix) :], len(self.shape), self.separator)
            if index is None:
                return None
            values[index] = value
        return values

    def grid_values(
        self, stored: Mapping[bytes, bytes | ValueRef], prefix: bytes
    ) -> dict[tuple[int, ...], bytes | ValueRef] | None:
        """``stored_values``, ``None`` also if a chunk is not stored."""
        values = self.stored_values(stored, prefix)
        expected = math.prod(-(-s // g) for s, g in zip(self.shape, self.grid_shape, strict=True))
        return values if values is not None and len(values) == expected else None


def chunking(metadata: bytes) -> Chunking | None:
    """The chunk layout a ``zarr.json`` claims, if it is one this module and
    ``chunkload`` read: a regular grid, default key encoding, and either a plain codec
    chain or one sharding codec with tensorstore's index (``bytes`` + ``crc32c``, at
    the end) over it; ``None`` for anything else."""
    try:
        meta = json.loads(metadata)
    except (ValueError, RecursionError):
        return None
    if not isinstance(meta, dict) or meta.get("zarr_format") != 3:
        return None
    shape = meta.get("shape")
    data_type = meta.get("data_type")
    if (
        not isinstance(shape, list)
        or not all(type(s) is int and s > 0 for s in shape)
        or not isinstance(data_type, str)
    ):
        return None
    rank = len(shape)
    grid = meta.get("chunk_grid")
    if not (
        isinstance(grid, dict)
        and grid.get("name") == "regular"
        and isinstance(grid.get("configuration"), dict)
    ):
        return None
    grid_shape = _ints(grid["configuration"].get("chunk_shape"), rank)
    encoding = meta.get("chunk_key_encoding")
    if not isinstance(encoding, dict) or encoding.get("name") != "default":
        return None
    separator = (encoding.get("configuration") or {}).get("separator", "/")
    codecs = meta.get("codecs")
    if grid_shape is None or separator not in ("/", ".") or not isinstance(codecs, list):
        return None
    if not codecs or not all(isinstance(c, dict) for c in codecs):
        return None
    first = codecs[0]
    if first.get("name") != "sharding_indexed":
        return Chunking(tuple(shape), data_type, grid_shape, grid_shape, False, codecs, separator)
    config = first.get("configuration")
    if (
        len(codecs) != 1
        or not isinstance(config, dict)
        or set(config)
        - {
            "chunk_shape",
            "codecs",
            "index_codecs",
            "index_location",
        }
    ):
        return None
    inner = config.get("codecs")
    chunk_shape = _ints(config.get("chunk_shape"), rank)
    if (
        chunk_shape is None
        or not isinstance(inner, list)
        or not _index_codecs(config.get("index_codecs"))
        or config.get("index_location", "end") != "end"
        or any(g % c for g, c in zip(grid_shape, chunk_shape, strict=True))
    ):
        return None
    return Chunking(tuple(shape), data_type, grid_shape, chunk_shape, True, inner, separator)


def raw_array(
    directory: Location,
    metadata: bytes,
    stored: Mapping[bytes, bytes | ValueRef],
    prefix: bytes,
    dtype: np.dtype,
    files: DataFiles | None = None,
) -> RawArray | None:
    """The array as raw chunks, if its zarr3 metadata and chunks allow it; else ``None``.

    Args:
      directory: The OCDBT store's directory.
      metadata: The array's ``zarr.json``.
      stored: The array's chunk keys (with ``prefix``) and where their values are.
      prefix: The array's storage path within the store, as bytes.
      dtype: The dtype the array is read as (from the same metadata).
      files: The data files of the read it belongs to (see ``RawArray.files``).
    """
    if not may_read(directory) or not _little(dtype):
        return None
    found = chunking(metadata)
    if (
        found is None
        or len(found.codecs) != 1
        or not _bytes_codec(found.codecs[0], dtype)
        or (
            # On an object store a chunk read through tensorstore is a round trip of
            # its own, which costs far more than the Python work here: every chunk is
            # read raw there.
            directory.is_local
            and math.prod(found.chunk_shape) * dtype.itemsize < MIN_CHUNK_BYTES
            and math.prod(found.chunk_shape) < math.prod(found.shape)
        )
    ):
        return None
    values = found.grid_values(stored, prefix)
    if values is None:
        return None
    inline: dict[str, bytes] = {}
    refs: dict[tuple[int, ...], ValueRef] = {}
    for grid, value in values.items():
        if isinstance(value, bytes):
            # Already in hand from the B+tree's leaves: read from memory.
            name = f"{INLINE}{len(inline)}"
            inline[name] = value
            refs[grid] = ValueRef(name, 0, len(value), "")
        elif isinstance(value, ValueRef):
            refs[grid] = value
        else:
            return None
    return RawArray.laid_out(directory, found, dtype, values=refs, inline=inline, files=files)


def plan(
    directory: Location,
    metadata: bytes | None,
    stored: Mapping[bytes, bytes | ValueRef] | None,
    path: str,
    dtype: np.dtype,
    shape: tuple[int, ...] | None = None,
    files: DataFiles | None = None,
) -> RawArray | None:
    """``raw_array`` for an array at storage path ``path``, when its metadata is at hand;
    ``None`` too when ``shape`` is given and the metadata claims another."""
    if metadata is None or stored is None:
        return None
    found = raw_array(directory, metadata, stored, path.encode("utf-8"), dtype, files)
    return None if found is None or (shape is not None and found.shape != shape) else found
