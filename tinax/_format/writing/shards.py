"""The bytes of one stored chunk as Orbax's zarr3 layout keeps it: a shard of one inner
chunk, its values little-endian in C order, then the shard's index and its checksum;
and which chunks a box of an array covers (``store_writer`` writes them)."""

from __future__ import annotations

import dataclasses
import struct
import sys

import numpy as np

from tinax._format.arraydata.chunks import Box
from tinax._format.metadata import arrays
from tinax._format.writing import ocdbt_root

# What follows a shard's one inner chunk: the shard's index (the chunk's offset and
# length, two little-endian uint64) and the index's CRC-32C.
TRAILER_BYTES = 20


def seal(lent: ocdbt_root.Lent, nbytes: int) -> None:
    """Writes the trailer of a shard whose one inner chunk fills the first ``nbytes`` of
    ``lent`` (lent ``nbytes + TRAILER_BYTES`` long)."""
    index = struct.pack("<QQ", 0, nbytes)
    trailer = index + struct.pack("<I", arrays.crc32c(index))
    np.frombuffer(lent.view, np.uint8)[nbytes:] = np.frombuffer(trailer, np.uint8)


def little_endian(dtype: np.dtype) -> bool:
    """Whether ``dtype``'s values are stored as they are (zarr3's ``bytes`` codec here
    is little-endian)."""
    return not (dtype.byteorder == ">" or (dtype.byteorder == "=" and sys.byteorder == "big"))


def encode_shard(values: np.ndarray, ring: ocdbt_root.BufferRing) -> ocdbt_root.Lent:
    """The stored bytes of one chunk written as Orbax writes it (``zarr3_metadata``), in
    a buffer lent by ``ring``: a shard of one inner chunk, its values little-endian in C
    order, then the shard's index and its checksum (``seal``)."""
    data = np.ascontiguousarray(values)
    if not little_endian(data.dtype):
        data = data.astype(data.dtype.newbyteorder("<"))
    raw = data.reshape(-1).view(np.uint8)
    lent = ring.lend(raw.nbytes + TRAILER_BYTES)
    np.frombuffer(lent.view, np.uint8)[: raw.nbytes] = raw
    seal(lent, raw.nbytes)
    return lent


@dataclasses.dataclass
class ChunkOut:
    """One whole chunk's stored bytes, made in place (``PyTreeWriter.chunk_out``).

    Attributes:
      values: Where the chunk's values go (the caller fills it).
    """

    values: np.ndarray
    name: str
    lent: ocdbt_root.Lent


def aligned(box: Box, chunk: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether ``box`` covers whole chunks (those at the array's end clipped)."""
    return all(
        s.start % c == 0 and (s.stop % c == 0 or s.stop == n)
        for s, c, n in zip(box, chunk, shape, strict=True)
    )


def chunk_boxes(box: Box, chunk: tuple[int, ...]) -> list[tuple[tuple[int, ...], Box]]:
    """The chunks a chunk-aligned ``box`` covers, in C order: grid index and box."""
    found: list[tuple[tuple[int, ...], Box]] = [((), ())]
    for s, c in zip(box, chunk, strict=True):
        found = [
            ((*index, i), (*part, slice(i * c, min((i + 1) * c, s.stop))))
            for index, part in found
            for i in range(s.start // c, -(-s.stop // c))
        ]
    return found
