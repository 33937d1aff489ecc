"""Array data files on an object store, read in large blocks, ahead of the reader.

A scan, a diff or a verify reads a checkpoint's chunks one after another, mostly in the
order they lie in its data files. On a local disk each chunk is a ``pread``; on a
bucket each read is a round trip of 10-150 ms, so a chunk of a few kilobytes a request
would cost a request per leaf. Here, once a file is read where its last read ended (a
reader going through it), it is read in blocks of ``BLOCK_BYTES`` (one ranged request
each); a chunk is copied out of the blocks that hold it, and the next blocks of the
same file are requested side by side while the reader works through this one. A read
elsewhere in a file (one leaf's chunks, ``read_leaf``) asks for just its bytes. At most
``KEPT_BYTES`` of blocks are kept (the least recently used go first), so memory stays
bounded whatever the checkpoint's size.

Blocks are keyed by the file's location and its stamp (size and generation), so a file
replaced meanwhile is read afresh. What a block holds is the stored bytes, trusted no
more than any other read: callers check chunks against their checksums.
"""

from __future__ import annotations

import concurrent.futures
import threading

import numpy as np

from tinax._format.lru import LruCache
from tinax._format.storage.location import Location

# One ranged request each: large enough that the round trip is a small part of its
# time, small enough that a scan of a small checkpoint reads little it does not need.
BLOCK_BYTES = 8 << 20
# Blocks kept at most, in bytes (in flight ones included).
KEPT_BYTES = 128 << 20
# Blocks of a file requested ahead of the one being read.
AHEAD = 3
# Requests in flight at once.
THREADS = 8
# Files whose last read is remembered, to tell a reader going through one.
_FILES_FOLLOWED = 256
# What is remembered of a file a reader is known to go through.
_THROUGH = -1

_Key = tuple[str, str, int]


class _Blocks:
    """The blocks read so far, and the ones being read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Past the budget (blocks in flight included), the least recently used go first.
        self._kept: LruCache[_Key, concurrent.futures.Future[bytes]] = LruCache(
            max(1, KEPT_BYTES // BLOCK_BYTES)
        )
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        # Where the last read of each file ended, for the files read recently.
        self._ends: LruCache[tuple[str, str], int] = LruCache(_FILES_FOLLOWED)

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                THREADS, thread_name_prefix="tinax-blocks"
            )
        return self._pool

    def _block(
        self, where: Location, stamp: str, size: int, index: int
    ) -> concurrent.futures.Future[bytes]:
        """The block ``index`` of the file, read (or being read); the caller holds the lock."""
        key = (str(where), stamp, index)
        found = self._kept.get(key)
        if found is not None:
            return found
        start = index * BLOCK_BYTES
        length = min(BLOCK_BYTES, size - start)
        future = self._executor().submit(where.read_range, start, length)
        self._kept.put(key, future)
        return future

    def read_into(self, where: Location, into: np.ndarray, offset: int) -> None:
        """Fills the bytes of ``into`` from the file ``where`` at ``offset``.

        Raises:
          OSError: If the file is not listed, is shorter than asked, or cannot be read.
        """
        entry = where.entry()
        if entry is None:
            raise OSError(f"{str(where)!r} is not there")
        view = memoryview(into.data).cast("B")
        end = offset + len(view)
        if end > entry.size:
            raise OSError(f"{str(where)!r} is shorter than a chunk in it")
        first, last = offset // BLOCK_BYTES, (end - 1) // BLOCK_BYTES if view else -1
        blocks_in_file = -(-entry.size // BLOCK_BYTES)
        file = (str(where), entry.stamp)
        with self._lock:
            previous = self._ends.get(file)
            # A file read through (``read_through``) stays one: its end is not followed.
            self._ends.put(file, _THROUGH if previous == _THROUGH else end)
            held = all((*file, i) in self._kept for i in range(first, last + 1))
            following = previous is not None and (
                previous == _THROUGH or previous <= offset < previous + BLOCK_BYTES
            )
        if not (held or following):
            # Not (yet) a reader going through the file: just the bytes asked for.
            data = where.read_range(offset, len(view))
            if len(data) != len(view):
                raise OSError(f"{str(where)!r} is shorter than a chunk in it")
            view[:] = data
            return
        with self._lock:
            wanted = [
                self._block(where, entry.stamp, entry.size, i) for i in range(first, last + 1)
            ]
            for ahead in range(last + 1, min(last + 1 + AHEAD, blocks_in_file)):
                self._block(where, entry.stamp, entry.size, ahead)
        done = 0
        for index, future in zip(range(first, last + 1), wanted, strict=True):
            try:
                data = future.result()
            except BaseException:
                # A failed read is not kept: the next reader asks again.
                with self._lock:
                    key = (str(where), entry.stamp, index)
                    if self._kept.get(key) is future:
                        self._kept.pop(key)
                raise
            start = index * BLOCK_BYTES
            lo = max(offset, start) - start
            hi = min(end, start + len(data)) - start
            if hi - lo <= 0:
                raise OSError(f"{str(where)!r} is shorter than a chunk in it")
            view[done : done + hi - lo] = data[lo:hi]
            done += hi - lo
        if done != len(view):
            raise OSError(f"{str(where)!r} is shorter than a chunk in it")

    def read_through(self, files: list[Location]) -> None:
        """Takes each of ``files`` for one a reader goes through from its start."""
        for where in files:
            entry = where.entry()
            if entry is None:
                continue
            with self._lock:
                self._ends.put((str(where), entry.stamp), _THROUGH)

    def clear(self) -> None:
        """Forgets every block."""
        with self._lock:
            self._kept.clear()


_BLOCKS = _Blocks()
read_into = _BLOCKS.read_into
read_through = _BLOCKS.read_through
clear = _BLOCKS.clear
