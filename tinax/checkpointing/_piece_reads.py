"""A part of an array read a saved piece at a time: a box a load onto another mesh
grows to cover whole saved pieces (``_load_plan.device_parts``), whose devices each
take a window of it. On a CPU the windows are the arrays: each piece is read into
the reading thread's piece buffer (``chunkload.Scratch``), checked against its
checksum, and its share of each window copied into place (cast, where the target
asks for another dtype: ``_casts``), so that no buffer of the whole box is held; the
load holds the restored arrays and one piece per thread, or under a budget fewer
(``PieceBuffers``).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tinax._format.arraydata import chunkload, nonfinite
from tinax._format.arraydata.rawread import Box, Unsupported
from tinax._format.integrity import checksums
from tinax._format.integrity.checksums import Bounds
from tinax.checkpointing._casts import cast_into
from tinax.checkpointing._host_buffers import aligned
from tinax.checkpointing._load_plan import Leaf, bounds_of, inside


class Mismatch(Unsupported):
    """A part that does not match its checksums: the Orbax load reports it."""


class PieceBuffers:
    """The buffers pieces are read into, shared by the reading threads and at most
    ``count`` of them: under a budget fewer than the threads, each of which would
    otherwise keep one of its own, grown to the largest piece it read."""

    def __init__(self, count: int) -> None:
        self._free = [np.empty(0, np.uint8) for _ in range(max(1, count))]
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def taken(self, nbytes: int) -> Iterator[np.ndarray]:
        """A buffer of ``nbytes`` for the block; waits while every one is in use."""
        with self._cond:
            while not self._free:
                self._cond.wait()
            # The largest one free: a buffer grows only where none is large enough.
            self._free.sort(key=lambda b: b.nbytes)
            found = self._free.pop()
        try:
            if found.nbytes < nbytes:
                found = np.empty(nbytes, np.uint8)
            yield found[:nbytes]
        finally:
            with self._cond:
                self._free.append(found)
                self._cond.notify()


def pieces_of(leaf: Leaf, box: Box) -> list[checksums.Piece]:
    """The saved pieces that make up ``box`` (a box grown to cover whole pieces), or
    none where they do not tile it."""
    if leaf.record is None:
        return []
    bounds = bounds_of(box)
    found = [piece for piece in leaf.record.pieces if inside(bounds, piece.bounds)]
    size = sum(math.prod(b - a for a, b in piece.bounds) for piece in found)
    return found if size == math.prod(s.stop - s.start for s in box) else []


def window_arrays(
    leaf: Leaf, box: Box, devices: Sequence[Any]
) -> dict[Bounds, tuple[Bounds, np.ndarray]]:
    """The arrays of the distinct windows ``devices`` take of ``box``: by their bounds
    within it, with their bounds in the array."""
    found: dict[Bounds, tuple[Bounds, np.ndarray]] = {}
    for device in devices:
        own = bounds_of(leaf.windows[device])
        if own in found:
            continue
        at = tuple((s.start + a, s.start + b) for s, (a, b) in zip(box, own, strict=True))
        shape = [b - a for a, b in own]
        dtype = leaf.stored.dtype if leaf.cast is None else leaf.cast
        found[own] = (at, aligned(math.prod(shape) * dtype.itemsize).view(dtype).reshape(shape))
    return found


def read_piece(
    leaf: Leaf,
    piece: checksums.Piece,
    windows: Mapping[Bounds, tuple[Bounds, np.ndarray]],
    scratch: chunkload.Scratch,
    *,
    count: bool = False,
    shared: PieceBuffers | None = None,
) -> tuple[int, int]:
    """Reads ``piece`` into the thread's piece buffer (one of ``shared``, where given),
    checks it, and copies its share of each window (``window_arrays``) into place,
    cast to the leaf's target dtype where it has one.

    Returns:
      With ``count``, the NaN and Inf of the stored values it copied (each distinct
      window once), else ``(0, 0)``.

    Raises:
      Mismatch: If the piece does not match its checksum, naming the leaf.
      Unsupported: If a chunk cannot be read as stored.
    """
    assert leaf.record is not None
    nbytes = math.prod(b - a for a, b in piece.bounds) * leaf.stored.dtype.itemsize
    if shared is None:
        return _read_into(scratch.take_piece(nbytes), leaf, piece, windows, scratch, count)
    with shared.taken(nbytes) as raw:
        return _read_into(raw, leaf, piece, windows, scratch, count)


def _read_into(
    raw: np.ndarray,
    leaf: Leaf,
    piece: checksums.Piece,
    windows: Mapping[Bounds, tuple[Bounds, np.ndarray]],
    scratch: chunkload.Scratch,
    count: bool,
) -> tuple[int, int]:
    """``read_piece``, into ``raw``."""
    assert leaf.record is not None
    dtype = leaf.stored.dtype
    values = raw.view(dtype).reshape([b - a for a, b in piece.bounds])
    box = tuple(slice(a, b) for a, b in piece.bounds)
    leaf.reader.read(leaf.stored.chunks_in(box), values, scratch)
    found = checksums.digest(values)
    if found != piece.digest:
        bad = [checksums.Mismatch(piece.bounds, piece.digest, found)]
        raise Mismatch(checksums.mismatch_message(leaf.key, leaf.record, bad))
    nan = inf = 0
    for bounds, window in windows.values():
        common = [
            (max(a0, b0), min(a1, b1))
            for (a0, a1), (b0, b1) in zip(bounds, piece.bounds, strict=True)
        ]
        if any(lo >= hi for lo, hi in common):
            continue
        into = tuple(
            slice(lo - w0, hi - w0) for (lo, hi), (w0, _) in zip(common, bounds, strict=True)
        )
        out = tuple(
            slice(lo - p0, hi - p0) for (lo, hi), (p0, _) in zip(common, piece.bounds, strict=True)
        )
        if count:
            more_nan, more_inf = nonfinite.count(values[out])
            nan, inf = nan + more_nan, inf + more_inf
        if leaf.cast is None:
            window[into] = values[out]
        else:
            cast_into(window[into], values[out])
    return nan, inf
