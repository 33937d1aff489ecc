"""Arrays read raw (``rawread``) on every core in one pass: read whole, checked, or
compared.

A worker takes one region at a time and does all of its work: it reads the region
(into its place in the array being read, or into its own buffers: for a pair being
compared, both sides, or the stored one beside live values in memory, which it then
adds to its own statistics of that pair), and hands it to the checksum in the
regions' order (a checksum is a stream, so a region whose predecessor is not digested
yet waits for it). Workers take regions one after another from one list, so every
core stays busy whatever the arrays' sizes, and no region's bytes change threads:
they are digested and compared while still in the core's cache. The calling thread
is one of the workers; the others run on ``rawread``'s threads.

Memory beyond the arrays read: for pairs, two region buffers and one block of
working space per worker, whatever the arrays' sizes.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
from collections.abc import Callable, Sequence

import numpy as np

from tinax._format.arraydata import chunks, rawread
from tinax.explore._numeric import PairStats

Box = chunks.Box
Digest = Callable[[Box, np.ndarray], None]


@dataclasses.dataclass(eq=False)
class RawScan:
    """One array read raw region by region: into ``into``, or compared with ``right``,
    or (neither given) only digested.

    Attributes:
      left: The array (of a pair, the first side).
      boxes: The regions, tiling the array in C order (``chunks.regions``).
      digest_left: Its checksum (or whatever else must see every region of it in
        order), fed every region in order.
      right, digest_right: The second side of a pair (same shape and dtype) and its
        checksum.
      into: For an array read whole, the array its regions are read into.
      values: The second side of a pair held in memory (live state), instead of
        ``right``.
      swapped: Whether ``values`` is the first side of the pair (the statistics are
        of ``b - a``).
      failed: Set when a region could not be read raw (``rawread.Unsupported``): the
        caller reads the array another way. Its statistics and digests are then
        incomplete.
      stats: A pair's statistics of every region, once the scan is done (``None``
        for an array without elements).
    """

    left: rawread.RawArray
    boxes: Sequence[Box]
    digest_left: Digest
    right: rawread.RawArray | None = None
    digest_right: Digest | None = None
    into: np.ndarray | None = None
    values: np.ndarray | None = None
    swapped: bool = False
    failed: bool = False
    stats: PairStats | None = None
    _digested: int = 0  # regions digested so far, in order

    def nbytes(self, box: Box) -> int:
        return chunks.box_size(box) * self.left.dtype.itemsize


def workers() -> int:
    """Threads that scan at once: one a core this process may run on, at most the
    calling thread and ``rawread``'s."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, rawread.THREADS + 1))


class _Scan:
    """The state the workers share; ``cond`` guards all of it."""

    def __init__(self, pairs: Sequence[RawScan]) -> None:
        self.items = [(pair, i) for pair in pairs for i in range(len(pair.boxes))]
        self.largest = max(
            (pair.nbytes(box) for pair, box in self._boxes() if pair.into is None),
            default=0,
        )
        self.next = 0
        self.done = 0
        self.stop = False
        self.cond = threading.Condition()
        self.parts: list[tuple[RawScan, PairStats]] = []

    def _boxes(self) -> list[tuple[RawScan, Box]]:
        return [(pair, pair.boxes[i]) for pair, i in self.items]

    def take(self) -> tuple[RawScan, int] | None:
        with self.cond:
            if self.stop or self.next >= len(self.items):
                return None
            self.next += 1
            return self.items[self.next - 1]

    def fail(self, pair: RawScan) -> None:
        with self.cond:
            pair.failed = True
            self.cond.notify_all()

    def wait_turn(self, pair: RawScan, index: int) -> bool:
        """Waits until region ``index`` of ``pair`` is next to be digested; ``False``
        when it never will be (the pair failed, or the scan stopped)."""
        with self.cond:
            while pair._digested != index and not pair.failed and not self.stop:
                self.cond.wait()
            return not (pair.failed or self.stop)

    def digested(self, pair: RawScan, nbytes: int) -> int:
        with self.cond:
            pair._digested += 1
            self.done += nbytes
            self.cond.notify_all()
            return self.done


def _work(scan: _Scan, progress: Callable[[int], None] | None) -> None:
    buffers = (np.empty(scan.largest, np.uint8), np.empty(scan.largest, np.uint8))
    mine: dict[int, PairStats] = {}
    current: PairStats | None = None
    try:
        while (item := scan.take()) is not None:
            pair, index = item
            if pair.failed:
                continue
            box = pair.boxes[index]
            nbytes = pair.nbytes(box)
            shape = tuple(s.stop - s.start for s in box)
            dtype = pair.left.dtype
            if pair.into is not None:
                left = pair.into[box]
            else:
                left = buffers[0][:nbytes].view(dtype).reshape(shape)
            right: np.ndarray | None = None
            if pair.values is not None:
                right = pair.values[box]
            elif pair.right is not None:
                right = buffers[1][:nbytes].view(dtype).reshape(shape)
            try:
                pair.left.read_into(box, left)
                if pair.right is not None and right is not None:
                    pair.right.read_into(box, right)
            except rawread.Unsupported:
                scan.fail(pair)
                continue
            if right is None:  # read whole, or only digested
                if scan.wait_turn(pair, index):
                    pair.digest_left(box, left)
                    done = scan.digested(pair, nbytes)
                    if progress is not None:
                        progress(done)
                continue
            stats = mine.get(id(pair))
            if stats is None:
                if current is not None:
                    current.done()  # regions come array after array
                stats = current = mine[id(pair)] = PairStats(pair.left.dtype)
                with scan.cond:
                    scan.parts.append((pair, stats))
            if pair.swapped:
                stats.update(right, left)
            else:
                stats.update(left, right)
            if not scan.wait_turn(pair, index):
                continue
            pair.digest_left(box, left)
            if pair.digest_right is not None:
                pair.digest_right(box, right)
            done = scan.digested(pair, 2 * nbytes)
            if progress is not None:
                progress(done)
    except BaseException:
        with scan.cond:
            scan.stop = True
            scan.cond.notify_all()
        raise
    finally:
        if current is not None:
            current.done()


def scan(pairs: Sequence[RawScan], progress: Callable[[int], None] | None = None) -> None:
    """Reads every array, and compares every pair, setting each one's ``stats``; or
    marks it ``failed``.

    ``progress`` is called on the calling thread with the bytes (of a pair, both
    sides') done so far. An error on any worker stops them all and is raised here.
    """
    if len(pairs) > 1:
        # Most of the arrays' data files are read: on an object store, in large blocks
        # from their first read on (one array alone, ``read_leaf``, reads its bytes).
        rawread.read_through([side for p in pairs for side in (p.left, p.right) if side])
    state = _Scan(pairs)
    helpers = min(workers(), len(state.items)) - 1
    pending = [rawread.executor().submit(_work, state, None) for _ in range(helpers)]
    try:
        _work(state, progress)
    finally:
        if state.stop:
            for future in pending:
                future.cancel()
        concurrent.futures.wait(pending)
    for future in pending:
        if not future.cancelled():
            future.result()  # a helper's error
    if progress is not None:
        progress(state.done)  # the helpers' last regions too
    # Each worker's statistics of a pair cover the regions it took: add them up.
    for pair, stats in state.parts:
        if pair.stats is None:
            pair.stats = stats
        else:
            pair.stats.merge(stats)
