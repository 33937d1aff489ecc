"""An OCDBT store given one more version: its keys, and values written beside tensorstore.

A new checkpoint that copies stored chunks as they are (``stored_copy``) writes their
bytes into a data file of its own, straight from the bytes read, on a local disk:
handing each 8 MiB chunk to tensorstore's key-value store instead costs a copy into
4 KiB buffers and a write of each, several times what the bytes cost to read. The
store's other keys (array metadata, arrays that were cast or encoded) are written by
tensorstore as usual; once it has committed them, ``add_version`` commits a new
version of the store whose B+tree is one leaf node holding every key the store has
and the copied chunks, each pointing at its bytes in the new data file, and a
manifest that names it. Tensorstore, Orbax and every tinax reader read the store as
any other: the format lets a B+tree point at any file under the store.

The node and its entries are encoded as tensorstore's format specifies them (the
``ocdbt`` driver's "B+tree node format": a header, a table of data files, the keys
prefix-compressed, value lengths and kinds, out-of-line references, inline values, a
CRC-32C), uncompressed; the manifest is encoded by tensorstore itself
(``ts.ocdbt.undump_manifest``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import errno
import itertools
import os
import struct
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorstore as ts

from tinax._format.metadata import arrays
from tinax._format.metadata.arrays import ValueRef
from tinax._format.naming import names
from tinax._format.storage.location import Location

# The B+tree node's magic value and format version (tensorstore's ``btree.h``).
_BTREE_MAGIC = 0x0CDB20DE
_FORMAT_VERSION = 0
_UNCOMPRESSED = 0
# The most entries one node may hold (``kMaxNodeArity``).
MAX_NODE_ENTRIES = 1 << 20
# Under the store's ``max_decoded_node_bytes`` (Orbax sets 100 MB), with room to spare.
MAX_NODE_BYTES = 64 << 20
# The most arrays, and stored chunks, a store may have for its keys to be given a
# version here (one node: each array's metadata is up to a KiB, inline).
MAX_ARRAYS = 20_000
MAX_ADDED = 500_000
DATA_DIR = "d"
# Bytes written between two syncs of a data file.
SYNC_BYTES = 64 << 20
# Bytes a data file writes behind its caller (``DataFile.append``).
WRITE_BEHIND_BYTES = 64 << 20


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _common(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _data_file_table(files: Sequence[str]) -> bytes:
    """The node's table of data files (all with an empty base path), prefix-compressed."""
    paths = [f.encode("utf-8") for f in files]
    prefixes = [_common(a, b) for a, b in itertools.pairwise(paths)]
    suffixes = [p[n:] for p, n in zip(paths, [0, *prefixes], strict=True)]
    return b"".join(
        [
            _varint(len(paths)),
            *map(_varint, prefixes),
            *(_varint(len(s)) for s in suffixes),
            *(_varint(0) for _ in paths),
            *suffixes,
        ]
    )


def encode_leaf(entries: Mapping[bytes, bytes | ValueRef]) -> bytes:
    """One B+tree leaf node holding ``entries``: key → inline value or where it is stored.

    Raises:
      ValueError: If there are no entries, or more than one node may hold.
    """
    if not entries or len(entries) > MAX_NODE_ENTRIES:
        raise ValueError(f"a B+tree leaf holds 1 to {MAX_NODE_ENTRIES} keys, not {len(entries)}")
    keys = sorted(entries)
    files = sorted({v.file for v in entries.values() if isinstance(v, ValueRef)})
    file_index = {f: i for i, f in enumerate(files)}
    prefixes = [_common(a, b) for a, b in itertools.pairwise(keys)]
    suffixes = [k[n:] for k, n in zip(keys, [0, *prefixes], strict=True)]
    values = [entries[k] for k in keys]
    indirect = [v for v in values if isinstance(v, ValueRef)]
    body = b"".join(
        [
            bytes([0]),  # height: a leaf
            _data_file_table(files),
            _varint(len(keys)),
            *map(_varint, prefixes),
            *(_varint(len(s)) for s in suffixes),
            *suffixes,
            *(_varint(v.length if isinstance(v, ValueRef) else len(v)) for v in values),
            *(_varint(1 if isinstance(v, ValueRef) else 0) for v in values),
            *(_varint(file_index[v.file]) for v in indirect),
            *(_varint(v.offset) for v in indirect),
            *(v for v in values if isinstance(v, bytes)),
        ]
    )
    head = _varint(_FORMAT_VERSION) + _varint(_UNCOMPRESSED)
    length = 4 + 8 + len(head) + len(body) + 4
    node = struct.pack(">I", _BTREE_MAGIC) + struct.pack("<Q", length) + head + body
    return node + struct.pack("<I", arrays.crc32c(node))


class Lent:
    """Bytes in a buffer lent by a ``BufferRing``, handed back to it once written.

    Attributes:
      view: The bytes.
    """

    __slots__ = ("_buffer", "_ring", "view")

    def __init__(self, ring: BufferRing, buffer: np.ndarray, nbytes: int) -> None:
        self._ring = ring
        self._buffer = buffer
        self.view = memoryview(buffer)[:nbytes]  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.view)

    def give_back(self) -> None:
        """Returns the buffer to its ring (once: the view must not be used after)."""
        if self._buffer is not None:
            self._ring.take_back(self._buffer)
            self._buffer = None  # type: ignore[assignment]


class BufferRing:
    """Buffers for bytes written behind their maker (``DataFile.append``), used again
    once written: memory a process touched lately, where fresh buffers would be faulted
    in page by page (in a bench of encoded chunks, that copy took 0.12 s of a 0.46 s
    cast). It keeps at most ``keep_bytes`` free; the writes behind bound the rest."""

    def __init__(self, keep_bytes: int = WRITE_BEHIND_BYTES) -> None:
        self._keep_bytes = keep_bytes
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def lend(self, nbytes: int) -> Lent:
        """A buffer of ``nbytes`` (its bytes as they were left)."""
        with self._lock:
            fitting = [i for i, b in enumerate(self._free) if nbytes <= b.nbytes <= 2 * nbytes]
            if fitting:
                best = min(fitting, key=lambda i: self._free[i].nbytes)
                return Lent(self, self._free.pop(best), nbytes)
        return Lent(self, np.empty(nbytes, np.uint8), nbytes)

    def take_back(self, buffer: np.ndarray) -> None:
        with self._lock:
            self._free.append(buffer)
            self._free.sort(key=lambda b: b.nbytes)
            while sum(b.nbytes for b in self._free) > self._keep_bytes:
                del self._free[0]  # the smallest


class DataFile:
    """A data file of the store written here, value after value (local disk).

    A value read from a file on the same machine is copied by the kernel from that
    file (``copy_file_range``), never through this process's memory: copying the
    bytes from a buffer into the page cache costs several times more. Other values
    given as ``bytes`` (which nothing can change) are written on a thread of the
    file's own while the caller goes on, at most ``WRITE_BEHIND_BYTES`` of them at a
    time. What is written is handed to the disk as it goes (``fdatasync`` on that
    thread every ``SYNC_BYTES``), so that the sync before the commit finds little left.

    Attributes:
      name: Its path under the store (``d/…``).
      size: The bytes written so far.
    """

    def __init__(self, directory: Location) -> None:
        self.name = f"{DATA_DIR}/{uuid.uuid4().hex}"
        os.makedirs(os.path.join(directory.path, DATA_DIR), exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        self._fd = os.open(os.path.join(directory.path, self.name), flags, 0o666)
        self.size = 0
        self._unsynced = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tinax-sync")
        self._syncing: concurrent.futures.Future[None] | None = None
        # Writes behind the caller, in order: each one's future and length.
        self._behind: collections.deque[tuple[concurrent.futures.Future[None], int]] = (
            collections.deque()
        )
        self._behind_bytes = 0

    def append(
        self, value: bytes | memoryview | Lent, origin: tuple[int, int] | None = None
    ) -> ValueRef:
        """Writes ``value`` at the file's end; returns where it is.

        Args:
          value: The bytes: ``bytes`` and a ``Lent`` buffer (given back once written)
            are written behind the caller, a ``memoryview`` (which the caller may
            reuse) before returning.
          origin: Where the same bytes are in a local file (its descriptor and
            offset): the kernel copies them from there.

        Raises:
          OSError: If it cannot be written.
        """
        offset = self.size
        length = len(value)
        if isinstance(value, Lent) or (origin is None and isinstance(value, bytes)):
            self._behind.append((self._pool.submit(self._write_behind, value, offset), length))
            self._behind_bytes += length
            while self._behind_bytes > WRITE_BEHIND_BYTES:
                self._wait_oldest()
        else:
            done = 0
            if origin is not None:
                done = _copy_range(origin[0], origin[1], self._fd, offset, length)
            self._write(memoryview(value).cast("B")[done:], offset + done)
        self.size += length
        self._unsynced += length
        if self._unsynced >= SYNC_BYTES and (self._syncing is None or self._syncing.done()):
            if self._syncing is not None:
                self._syncing.result()
            self._unsynced = 0
            self._syncing = self._pool.submit(os.fdatasync, self._fd)
        return ValueRef(self.name, offset, length, "")

    def _write(self, value: bytes | memoryview, offset: int) -> None:
        view = memoryview(value).cast("B")
        while view:
            n = os.pwrite(self._fd, view, offset)
            view, offset = view[n:], offset + n

    def _write_behind(self, value: bytes | Lent, offset: int) -> None:
        if not isinstance(value, Lent):
            self._write(value, offset)
            return
        try:
            self._write(value.view, offset)
        finally:
            value.give_back()

    def _wait_oldest(self) -> None:
        future, length = self._behind.popleft()
        self._behind_bytes -= length
        future.result()

    def close(self) -> None:
        """Waits for the writes and the sync in flight and closes the file.

        Raises:
          OSError: If a write or the sync failed.
        """
        if self._fd < 0:
            return
        try:
            while self._behind:
                self._wait_oldest()
            if self._syncing is not None:
                self._syncing.result()
        finally:
            self._pool.shutdown(wait=True)
            os.close(self._fd)
            self._fd = -1


class NewValues:
    """The values a new version of a local store adds: written into data files of its
    own (``DataFile``, a new one past ``file_bytes``), or referenced where they are in
    a source's data file linked into the store (``link_files``).

    Attributes:
      added: Each value's key and where it is, for ``add_version``.
    """

    def __init__(self, directory: Location, file_bytes: int) -> None:
        self.directory = directory
        self.file_bytes = file_bytes
        self.added: dict[bytes, ValueRef] = {}
        self._file: DataFile | None = None
        # Source data files to link rather than copy: path → the link's name, once made.
        self._linkable: set[str] = set()
        self._links: dict[str, str] = {}

    def link_files(self, paths: set[str]) -> None:
        """Has the values ``append`` is given from these local data files kept where
        they are: each file hard-linked into the store's data directory (where the
        file system allows), its values referenced at their offsets in it. Only for
        files of committed checkpoints, which never change."""
        self._linkable = set(paths) if self.directory.is_local else set()

    def _linked(self, path: str) -> str | None:
        """The name in the store of the link to ``path``, made on first use; ``None``
        where none can be made (another file system, a name taken)."""
        name = self._links.get(path)
        if name is None:
            name = f"{DATA_DIR}/{os.path.basename(path)}"
            if name in self._links.values():
                return None
            os.makedirs(os.path.join(self.directory.path, DATA_DIR), exist_ok=True)
            try:
                os.link(path, os.path.join(self.directory.path, name), follow_symlinks=False)
            except OSError:
                self._linkable.discard(path)
                return None
            self._links[path] = name
        return name

    def append(
        self,
        key: bytes,
        value: bytes | memoryview | Lent,
        origin: tuple[int, int] | None = None,
        source: tuple[str, int] | None = None,
    ) -> None:
        """Adds ``value`` under ``key``. ``origin``: where the same bytes are in a local
        file (descriptor, offset), for the kernel to copy them; ``source``: that file's
        path and the offset, to reference them there if ``link_files`` named it.

        Raises:
          OSError: If it cannot be written.
        """
        if source is not None and source[0] in self._linkable:
            linked = self._linked(source[0])
            if linked is not None:
                self.added[key] = ValueRef(linked, source[1], len(value), "")
                return
        if self._file is not None and self._file.size + len(value) > self.file_bytes:
            self._file.close()
            self._file = None
        if self._file is None:
            self._file = DataFile(self.directory)
        self.added[key] = self._file.append(value, origin)

    def close(self) -> None:
        """Closes the data file being written (synced).

        Raises:
          OSError: If the sync failed.
        """
        if self._file is not None:
            file, self._file = self._file, None
            file.close()


def _copy_range(source: int, offset: int, target: int, at: int, length: int) -> int:
    """Copies up to ``length`` bytes by ``copy_file_range``; returns how many it copied
    (fewer where the kernel cannot: another filesystem, an old kernel)."""
    done = 0
    while done < length:
        try:
            n = os.copy_file_range(source, target, length - done, offset + done, at + done)
        except OSError as e:
            if e.errno in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                return done
            raise
        if n <= 0:
            return done
        done += n
    return done


def add_version(directory: Location, added: Mapping[bytes, ValueRef]) -> None:
    """Commits a new version of the OCDBT store in ``directory`` (local, written by
    tensorstore and committed, nothing writing it): every key it has, and ``added``.

    Raises:
      ValueError: If a key of ``added`` is in the store already, or the store cannot
        be read or is too large for one node.
      OSError: If a file cannot be written.
    """
    ctx = arrays.context()
    entries: dict[bytes, bytes | ValueRef] = {}
    for key, value in arrays.walk_ocdbt(directory, ctx).values.items():
        entries[key] = value if isinstance(value, bytes) else arrays.parse_location(value)
    both = set(entries) & set(added)
    if both:
        raise ValueError(f"keys written twice into {str(directory)!r}: {sorted(both)[:3]}")
    entries.update(added)
    node = encode_leaf(entries)
    if len(node) > MAX_NODE_BYTES:
        raise ValueError(f"the keys of {str(directory)!r} do not fit one B+tree node")
    node_file = f"{DATA_DIR}/{uuid.uuid4().hex}"
    (directory / DATA_DIR / node_file.split("/", 1)[1]).write_new(node)
    base = ts.KvStore.open(directory.kvstore(), context=ctx).result()
    manifest: dict[str, Any] = ts.ocdbt.dump(base, context=ctx).result()
    last = manifest["versions"][-1]
    manifest["versions"] = [
        {
            "commit_time": max(time.time_ns(), int(last["commit_time"]) + 1),
            "generation_number": int(last["generation_number"]) + 1,
            "root": {
                "location": f"btreenode::{node_file}:0:{len(node)}",
                "statistics": {
                    "num_indirect_value_bytes": sum(
                        v.length for v in entries.values() if isinstance(v, ValueRef)
                    ),
                    "num_keys": len(entries),
                    "num_tree_bytes": len(node),
                },
            },
            "root_height": 0,
        }
    ]
    manifest["version_tree_nodes"] = []
    encoded = ts.ocdbt.undump_manifest(manifest)
    # Written beside the old one, then renamed over it: a reader sees one or the other.
    target = os.path.join(directory.path, names.OCDBT_MANIFEST)
    staging = target + ".new"
    (directory / (names.OCDBT_MANIFEST + ".new")).write_new(encoded)
    os.replace(staging, target)
