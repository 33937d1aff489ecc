"""Every stored value of a checkpoint checked against the checksums saved with it.

A promotion copies a local checkpoint to the durable tier only if its values are what
was saved: each recorded piece of each array is read through tensorstore (whatever its
codec), a slab at a time in the piece's own C order, and digested as the slabs
arrive, so memory holds a few slabs (``SLAB_BYTES``) whatever the array's size;
strings and the files recorded whole (Grain iterator states) are checked too, and a
checkpoint whose save promised checksums that are gone is refused.

A checkpoint saved without checksums (by Orbax itself) has nothing to check against;
it passes as far as its metadata reads.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import tensorstore as ts
import xxhash

from tinax._format.arraydata import chunks
from tinax._format.integrity import checksums
from tinax._format.integrity.checksums import Bounds, LeafRecord
from tinax._format.metadata import arrays, layout, pytree
from tinax._format.naming import words

# A slab of a piece read at a time, in decoded bytes (a single row may be larger).
SLAB_BYTES = 4 << 20


def slabs(bounds: Bounds, itemsize: int, chunk_shape: tuple[int, ...] | None) -> list[chunks.Box]:
    """Boxes that tile the piece ``bounds`` in its C order, each about ``SLAB_BYTES``.

    The bytes of the boxes, one after another, are the bytes of the piece in C order:
    each box takes whole extents of the trailing dimensions from the first dimension
    whose trailing extents fit, and single indices before it.
    """
    if not bounds:
        return [()]
    extents = [b - a for a, b in bounds]
    if 0 in extents:
        return []
    split = len(bounds) - 1
    for d in range(len(bounds)):
        if math.prod(extents[d + 1 :]) * itemsize <= SLAB_BYTES:
            split = d
            break
    inner = math.prod(extents[split + 1 :]) * itemsize
    step = max(1, SLAB_BYTES // max(inner, 1))
    if chunk_shape is not None and len(chunk_shape) == len(bounds):
        # Whole chunks along the split dimension where a slab holds one or more: none
        # is decoded twice.
        along = max(1, chunk_shape[split])
        if step >= along:
            step = step // along * along
    trailing = tuple(slice(a, b) for a, b in bounds[split + 1 :])
    boxes: list[chunks.Box] = []
    for corner in itertools.product(*(range(a, b) for a, b in bounds[:split])):
        lead = tuple(slice(i, i + 1) for i in corner)
        start, stop = bounds[split]
        for s in range(start, stop, step):
            boxes.append((*lead, slice(s, min(s + step, stop)), *trailing))
    return boxes


# Given each slab of values read: the checkpointable, the leaf's key, the values.
Count = Callable[[str, str, np.ndarray], None]


def check_values(checkpoint: layout.Checkpoint, count: Count | None = None) -> list[str]:
    """What is wrong with ``checkpoint``'s stored values, checked against their checksums.

    Args:
      checkpoint: An opened checkpoint (``preflight.check``'s).
      count: Also given every slab of array values as it is read (each value once),
        with its checkpointable and leaf: to count NaN and Inf on the way.

    Returns:
      One message per damaged value, file or record (empty if none), each naming the
      checkpointable and the leaf or file.
    """
    problems: list[str] = []
    missing = checksums.missing_promised(checkpoint)
    if missing:
        problems.append(
            f"checkpointable(s) {missing} lost the checksums saved with them "
            "(their data cannot be trusted)"
        )
    ctx = arrays.context_of(checkpoint)
    for item in checksums.checksummed(checkpoint):
        try:
            records = checksums.read_checksums(item)
        except ValueError as e:
            problems.append(f"{item.name}: {e}")
            continue
        if records is None:
            continue
        problems.extend(f"{item.name}: {p}" for p in checksums.check_files(item, records))
        if item.layout == layout.PYTREE:
            try:
                found = _check_tree(item, records, ctx, count)
                problems.extend(f"{item.name}: {p}" for p in found)
            except ValueError as e:
                problems.append(f"{item.name}: {e}")
    return problems


def _check_tree(
    item: layout.StoredCheckpointable,
    records: dict[str, LeafRecord],
    ctx: ts.Context,
    count: Count | None = None,
) -> list[str]:
    tree = pytree.read_layout(item)
    problems: list[str] = []
    strings = [leaf for leaf in tree.leaves if leaf.stored and leaf.kind == words.STRING]
    if strings:
        values = pytree.read_strings(tree, [leaf.param for leaf in strings])
        for leaf in strings:
            record = records.get(leaf.key)
            if record is not None and checksums.check_value(record, values[leaf.param]) is False:
                problems.append(f"leaf {leaf.key}: the stored string does not match its checksum")
    reads: list[chunks.ArrayRead] = []
    # Per read: the leaf, its record and the piece's digest so far.
    for leaf, info in pytree.leaf_infos(tree, ctx):
        record = records.get(leaf.key)
        if info is None or record is None or record.kind != checksums.ARRAY:
            continue
        dtype = arrays.numpy_dtype(info.dtype)
        if str(dtype) != record.dtype or tuple(info.shape) != record.shape:
            problems.append(
                f"leaf {leaf.key}: stored as {dtype} {tuple(info.shape)}, its checksums "
                f"were recorded for {record.dtype} {record.shape}"
            )
            continue
        opened = ts.open(tree.array_spec(leaf), context=ctx, read=True)
        for piece in record.pieces:
            boxes = slabs(piece.bounds, dtype.itemsize, info.chunk_shape)
            reads.append(chunks.ArrayRead((leaf.key, record, piece), opened, boxes, dtype.itemsize))
    problems.extend(_digest_pieces(reads, None if count is None else _named(count, item.name)))
    return problems


def _named(count: Count, name: str) -> Callable[[str, np.ndarray], None]:
    return lambda key, values: count(name, key, values)


def _digest_pieces(
    reads: list[chunks.ArrayRead], count: Callable[[str, np.ndarray], None] | None = None
) -> list[str]:
    """Reads every piece slab by slab and compares each piece's digest with its record."""
    problems: list[str] = []
    remaining = {id(read.tag): len(read.boxes) for read in reads}
    hashers: dict[int, xxhash.xxh3_64] = {}
    failed: set[int] = set()
    for tag, _, values in chunks.read_arrays(reads):
        key, record, piece = tag
        mark = id(tag)
        if mark in failed:
            continue
        if isinstance(values, chunks.ReadFailure):
            failed.add(mark)
            problems.append(f"leaf {key}: {values.message}")
            continue
        hasher = hashers.setdefault(mark, xxhash.xxh3_64())
        hasher.update(np.ascontiguousarray(values).reshape(-1).view(np.uint8).data)
        if count is not None:
            count(key, values)
        remaining[mark] -= 1
        if remaining[mark] == 0:
            found = hasher.hexdigest()
            if found != piece.digest:
                problems.append(
                    checksums.mismatch_message(
                        key, record, [checksums.Mismatch(piece.bounds, piece.digest, found)]
                    )
                )
    return problems
