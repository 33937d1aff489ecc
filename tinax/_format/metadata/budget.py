"""How many bytes a read may decode: claims in stored metadata checked before any decode.

A leaf's zarr metadata says its shape, dtype and chunk shape; a reader that believes
it allocates what it says. Damaged or hostile metadata can claim 10¹² elements over
a few kilobytes of data, and tensorstore then aborts the whole process trying to
allocate them. Every reader (loads, tables, ``read_leaf``, ``verify``, ``diff_table``)
gets each leaf's metadata through ``pytree.array_infos``, which refuses a claim that
no read could honour:

- a whole array larger than the machine's memory (``read_leaf`` and a load hold it
  whole);
- a single chunk larger than ``MAX_CHUNK_BYTES`` (the unit the store decodes at once:
  even a read of a small region decodes a whole chunk);
- where the stored bytes are known and the array is stored uncompressed, a claim
  larger than the bytes that hold it.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Sequence


def _physical_memory() -> int:
    """This machine's memory (or the container's limit, if lower); 16 GiB if unknown."""
    total = 16 << 30
    with contextlib.suppress(ValueError, OSError, AttributeError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/sys/fs/cgroup/memory.max", "rb") as f:
            limit = f.read().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


# The most a whole array may claim: what the machine can hold at all.
MAX_ARRAY_BYTES = _physical_memory()
# The most one stored chunk may claim: a quarter of memory (Orbax's default chunk is
# a device's whole shard, so legitimate chunks can be large).
MAX_CHUNK_BYTES = MAX_ARRAY_BYTES // 4


def describe_bytes(n: int) -> str:
    """``1.5 GiB``: a byte count for a message."""
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} bytes"  # pragma: no cover


def claim_problem(
    shape: Sequence[int],
    itemsize: int | None,
    chunk_shape: Sequence[int] | None,
    *,
    max_array_bytes: int | None = None,
    max_chunk_bytes: int | None = None,
) -> str | None:
    """What is impossible about an array's claimed shape and chunking, or ``None``.

    Args:
      shape: The claimed shape.
      itemsize: Bytes per element (``None`` for an unknown dtype: nothing to check).
      chunk_shape: The claimed unit of decoding (zarr3's inner chunk, zarr2's chunk).
      max_array_bytes: The limit for the whole array (``MAX_ARRAY_BYTES``).
      max_chunk_bytes: The limit for one chunk (``MAX_CHUNK_BYTES``).
    """
    if itemsize is None:
        return None
    array_limit = MAX_ARRAY_BYTES if max_array_bytes is None else max_array_bytes
    chunk_limit = MAX_CHUNK_BYTES if max_chunk_bytes is None else max_chunk_bytes
    nbytes = math.prod(shape) * itemsize
    if nbytes > array_limit:
        return (
            f"its metadata claims shape {tuple(shape)} ({describe_bytes(nbytes)}), more than "
            f"this machine's memory ({describe_bytes(array_limit)}) could ever hold"
        )
    if chunk_shape is not None:
        if len(chunk_shape) != len(shape) or any(c < 1 for c in chunk_shape):
            return f"its chunk shape {tuple(chunk_shape)} does not fit its shape {tuple(shape)}"
        chunk_bytes = math.prod(chunk_shape) * itemsize
        if chunk_bytes > chunk_limit:
            return (
                f"its metadata claims chunks of shape {tuple(chunk_shape)} "
                f"({describe_bytes(chunk_bytes)} each), more than a read may decode at once "
                f"({describe_bytes(chunk_limit)})"
            )
    return None


def stored_problem(claimed: int, stored: int) -> str | None:
    """What is impossible about an uncompressed array's claim against its stored bytes."""
    if stored < claimed:
        return (
            f"its metadata claims {describe_bytes(claimed)} of uncompressed data, but only "
            f"{describe_bytes(stored)} are stored for it"
        )
    return None
