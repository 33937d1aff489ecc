"""``verify``'s check of the checksums tinax records with every save.

Without data it says which checkpointables carry checksums, checks the record is
readable and covers every stored value, and checks the files recorded whole (Grain
iterator states). With data, every array's recorded pieces are digested as the
array's regions stream by, so a flipped byte anywhere in array data is found and
named, in the same bounded memory as the rest of ``verify``.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import xxhash

from tinax._format.arraydata.chunks import Box
from tinax._format.integrity import checksums
from tinax._format.integrity.checksums import Bounds, LeafRecord, Piece
from tinax._format.metadata import arrays, pytree
from tinax._format.naming import words
from tinax.explore._verify.checks import (
    Check,
    Finding,
    LeafScan,
    StoredArray,
    VerifyTarget,
)

# A piece whose bytes do not arrive in its own C order (a region layout that cuts
# across it) is assembled in memory up to this size; a larger one is reported as not
# checked rather than read twice.
MAX_ASSEMBLED_BYTES = 64 << 20


def _intersection(box: Box, bounds: Bounds) -> Bounds | None:
    out = []
    for s, (lo, hi) in zip(box, bounds, strict=True):
        a, b = max(s.start, lo), min(s.stop, hi)
        if a >= b:
            return None
        out.append((a, b))
    return tuple(out)


class _PieceDigest:
    """One recorded piece, digested from the regions that overlap it."""

    def __init__(self, piece: Piece, dtype: np.dtype) -> None:
        self.piece = piece
        self.dtype = dtype
        self.hasher = xxhash.xxh3_64()
        # Streaming works while the piece's rows arrive whole and in order.
        self.next_row = piece.bounds[0][0] if piece.bounds else 0
        self.streaming = True
        self.buffer: np.ndarray | None = None
        self.filled = 0
        self.too_large = False

    @property
    def size(self) -> int:
        return int(np.prod([b - a for a, b in self.piece.bounds], dtype=np.int64))

    def take(self, overlap: Bounds, values: np.ndarray) -> None:
        bounds = self.piece.bounds
        whole_rows = overlap[1:] == bounds[1:]
        if self.streaming and whole_rows and (not bounds or overlap[0][0] == self.next_row):
            self.hasher.update(np.ascontiguousarray(values).reshape(-1).view(np.uint8).data)
            self.next_row = overlap[0][1] if bounds else 1
            self.filled += values.size
            return
        if self.streaming:
            # Out of order: from here on the piece is assembled, then digested whole.
            self.streaming = False
            if self.filled:
                self.too_large = True  # what was streamed cannot be placed again
                return
        if self.too_large:
            return
        if self.buffer is None:
            if self.size * self.dtype.itemsize > MAX_ASSEMBLED_BYTES:
                self.too_large = True
                return
            self.buffer = np.empty([b - a for a, b in bounds], self.dtype)
        where = tuple(
            slice(a - lo, b - lo) for (a, b), (lo, _) in zip(overlap, bounds, strict=True)
        )
        self.buffer[where] = values
        self.filled += values.size

    def result(self) -> bool | None:
        """Whether the bytes match the record; ``None`` if they could not be digested."""
        if self.too_large or self.filled != self.size:
            return None
        if self.streaming:
            return self.hasher.hexdigest() == self.piece.digest
        assert self.buffer is not None
        return checksums.digest(self.buffer) == self.piece.digest


class PiecesCheck:
    """One array's recorded pieces, digested as its regions stream by (any reader's).

    Regions arrive in C order and tile the array, as ``chunks.regions`` makes them.
    """

    def __init__(self, record: LeafRecord, dtype: np.dtype) -> None:
        self.record = record
        self.pieces = [_PieceDigest(piece, dtype) for piece in record.pieces]

    def update(self, box: Box, values: np.ndarray) -> None:
        """Takes one region's values."""
        for piece in self.pieces:
            if not piece.piece.bounds:
                piece.take((), values)
                continue
            overlap = _intersection(box, piece.piece.bounds)
            if overlap is None:
                continue
            local = tuple(
                slice(a - s.start, b - s.start) for (a, b), s in zip(overlap, box, strict=True)
            )
            piece.take(overlap, values[local])

    def results(self) -> tuple[list[Piece], int]:
        """The pieces whose bytes differ from their record, and how many were not checked."""
        results = [p.result() for p in self.pieces]
        bad = [p.piece for p, ok in zip(self.pieces, results, strict=True) if ok is False]
        return bad, sum(ok is None for ok in results)


class _ChecksumScan(LeafScan):
    def __init__(self, array: StoredArray, record: LeafRecord, dtype: np.dtype) -> None:
        self.array = array
        self.check = PiecesCheck(record, dtype)

    def update(self, box: Box, values: np.ndarray) -> None:
        self.check.update(box, values)

    def finish(self) -> Iterable[Finding]:
        bad, unchecked = self.check.results()
        if bad:
            where = f" (piece {checksums.describe_bounds(bad[0].bounds)})" if bad[0].bounds else ""
            more = f" and {len(bad) - 1} more piece(s)" if len(bad) > 1 else ""
            yield Finding(
                self.array.part,
                words.ERROR,
                f"its stored data is corrupt: it does not match the checksum recorded when "
                f"it was saved{where}{more}",
            )
        if unchecked:
            yield Finding(
                self.array.part,
                words.INFO,
                f"{unchecked} recorded piece(s) not checked: their bytes arrive out of order "
                f"and exceed {MAX_ASSEMBLED_BYTES >> 20} MiB",
            )


class ChecksumCheck(Check):
    """The checksums recorded at save time: present, readable, and matching the data."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, LeafRecord] | None] = {}

    def structure(self, target: VerifyTarget) -> Iterable[Finding]:
        checkpoint = target.checkpoint
        if checkpoint is None or not target.safe:
            return
        unrecorded = []
        for item in checksums.checksummed(checkpoint):
            try:
                records = checksums.read_checksums(item)
            except ValueError as e:
                self.records[item.name] = None
                yield Finding(target.relative(item.directory), words.ERROR, str(e))
                continue
            self.records[item.name] = records
            if records is None:
                unrecorded.append(item.name)
                continue
            for problem in checksums.check_files(item, records):
                yield Finding(target.relative(item.directory), words.ERROR, problem)
            yield from self._coverage(target, item.name, records)
            if target.data:
                yield from self._strings(target, item.name, records)
        if unrecorded:
            yield Finding(
                "",
                words.INFO,
                f"no checksums recorded for {', '.join(map(repr, unrecorded))} (written by "
                "Orbax itself or an older tinax): damaged array bytes there cannot be detected",
            )

    @staticmethod
    def _coverage(
        target: VerifyTarget, name: str, records: dict[str, LeafRecord]
    ) -> Iterable[Finding]:
        state = target.trees.get(name)
        if state is None:
            return
        for array in state.arrays:
            record = records.get(array.key)
            if record is None:
                yield Finding(array.part, words.WARNING, "no checksum is recorded for it")
            elif record.shape != array.info.shape:
                yield Finding(
                    array.part,
                    words.ERROR,
                    f"its checksum record is for shape {record.shape}, the array store holds "
                    f"{array.info.shape}",
                )

    @staticmethod
    def _strings(
        target: VerifyTarget, name: str, records: dict[str, LeafRecord]
    ) -> Iterable[Finding]:
        state = target.trees.get(name)
        if state is None or state.tree is None:
            return
        wanted = [leaf for leaf in state.tree.leaves if leaf.kind == words.STRING]
        if not wanted:
            return
        values = pytree.read_strings(state.tree, [leaf.param for leaf in wanted])
        for leaf in wanted:
            record = records.get(leaf.key)
            if record is not None and checksums.check_value(record, values[leaf.param]) is False:
                yield Finding(
                    f"{name} {leaf.key}",
                    words.ERROR,
                    "the stored string is corrupt: it does not match its checksum",
                )

    def leaf(self, target: VerifyTarget, array: StoredArray) -> LeafScan | None:
        records = self.records.get(array.checkpointable)
        record = None if records is None else records.get(array.key)
        if record is None or record.kind != checksums.ARRAY:
            return None
        if record.shape != array.info.shape:
            return None  # reported by ``structure``
        try:
            dtype = arrays.numpy_dtype(array.info.dtype)
        except TypeError:
            return None  # an unknown dtype is reported by the pytree check
        return _ChecksumScan(array, record, dtype)
