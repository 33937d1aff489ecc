"""One stored array read whole, for ``read_leaf``: straight from its data files
when it is stored uncompressed with checksums (``rawread``), else through
tensorstore."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorstore as ts

from tinax._format.arraydata import chunks, rawread
from tinax._format.integrity import checksums
from tinax._format.metadata import arrays, pytree
from tinax._format.metadata.layout import StoredCheckpointable
from tinax._format.naming import names, words
from tinax.explore import _raw_scan
from tinax.explore._verify.integrity import PiecesCheck


def read_array(
    tree: pytree.PyTreeLayout,
    leaf: pytree.StoredLeaf,
    ctx: Any,
    record: checksums.LeafRecord | None = None,
    *,
    alone: bool = False,
) -> tuple[np.ndarray, bool]:
    """One stored array, read region by region into its own buffer.

    ``alone``: no other array of this opened checkpoint will be read (it was opened
    for this one): a small array's keys are looked up in its store alone
    (``chunks.one_array_contents``), a larger one's searched for in the store's walk,
    rather than every array's sorted out of it and kept for the next reader.

    Its claimed shape and chunking are checked first (``pytree.array_infos``, from
    the kept walk of a local store, else from a walk of its own). An
    uncompressed array with a checksum ``record`` is read straight from its data
    files (``rawread``) and checked against the record as its regions arrive; any
    other (or one that does not match its record: then tensorstore says what is
    wrong) through tensorstore, several chunk-aligned regions at once
    (``chunks.read_arrays``), with no more than ``chunks.IN_FLIGHT_BYTES`` beyond
    the array itself.

    Returns:
      The array, and whether it was checked against ``record`` already.

    Raises:
      ValueError: If the metadata claims the impossible or a region cannot be read.
    """
    walked = _walked_array(tree, leaf, ctx, alone, record)
    if walked is None:
        info = pytree.array_infos(tree, [leaf], ctx)[leaf.param]
    else:
        # One walk of the store gives both the metadata and where the chunks are.
        key, metadata, stored, contents = walked
        path = pytree.storage_path(leaf.param)
        info = pytree.array_infos(tree, [leaf], ctx, {key: metadata}, {path: stored})[leaf.param]
    dtype = arrays.numpy_dtype(info.dtype)
    if (
        walked is not None
        and record is not None
        and (record.dtype, record.shape) == (str(dtype), info.shape)
    ):
        chunk_values = contents.chunks.get(path)
        raw = rawread.plan(tree.directory, metadata, chunk_values, path, dtype, info.shape)
        value = None if raw is None else _read_raw(raw, record)
        if value is not None:
            return value, True
    out = np.empty(info.shape, dtype)
    boxes = chunks.regions(info.shape, info.chunk_shape, dtype.itemsize, chunks.REGION_BYTES)
    opened = ts.open(tree.array_spec(leaf), context=ctx, read=True)
    for _, box, values in chunks.read_arrays(
        [chunks.ArrayRead(None, opened, boxes, dtype.itemsize)]
    ):
        if isinstance(values, chunks.ReadFailure):
            raise ValueError(values.message)
        out[box] = values
    return out, False


def array_record(item: StoredCheckpointable, key: str) -> checksums.LeafRecord | None:
    """The checksums saved for array leaf ``key``; ``None`` if none (or unreadable:
    the check after the read says so)."""
    try:
        record = checksums.read_checksum(item, key)
    except ValueError:
        return None
    return record if record is not None and record.kind == checksums.ARRAY else None


def _walk(tree: pytree.PyTreeLayout, ctx: Any) -> chunks.StoreContents:
    """Every array's chunks and the other keys of ``tree``'s store: from its walk, kept
    with its opened checkpoint, so that reading leaf after leaf of one checkpoint walks
    its store once (a wide store's walk is most of the cost of reading one small leaf).
    What is read through it is checked against the saved checksums, and read again
    through tensorstore when it does not match.

    Raises:
      ValueError, OSError: If the store cannot be walked.
    """
    if tree.item is None:
        return chunks.store_contents(tree, _array_paths(tree), ctx=ctx)
    return tree.item.checkpoint.kept(
        ("array contents", tree.directory.path),
        lambda: chunks.store_contents(tree, _array_paths(tree), ctx=ctx),
    )


def _array_paths(tree: pytree.PyTreeLayout) -> tuple[str, ...]:
    """The storage paths of ``tree``'s stored arrays."""
    found = {
        pytree.storage_path(leaf.param)
        for leaf in tree.leaves
        if leaf.kind in words.ARRAY_KINDS and leaf.stored
    }
    return tuple(sorted(found))


def _walked_array(
    tree: pytree.PyTreeLayout,
    leaf: pytree.StoredLeaf,
    ctx: Any,
    alone: bool = False,
    record: checksums.LeafRecord | None = None,
) -> tuple[str, bytes, int, chunks.StoreContents] | None:
    """For a leaf of a local zarr3 OCDBT store (whose arrays may be read raw,
    ``rawread``), from the store's walk: its metadata's key and bytes (as
    ``arrays.read_values`` gives them), the bytes stored in its chunks (as that gives
    ``sizes``) and the store's contents; ``None`` if the store is not such, or the
    walk fails (the ordinary read then says what is wrong)."""
    if not (tree.ocdbt and tree.zarr3 and rawread.may_read(tree.directory)):
        return None
    path = pytree.storage_path(leaf.param)
    key = path + names.ZARR3_METADATA
    try:
        if alone:
            nbytes = None if record is None else _record_bytes(record)
            contents = chunks.one_array_contents(
                tree, path, _array_paths(tree), ctx=ctx, nbytes=nbytes
            )
        else:
            contents = _walk(tree, ctx)
    except (ValueError, OSError):
        return None
    metadata = contents.other.get(key.encode("utf-8"))
    if not isinstance(metadata, bytes):
        return None
    stored = sum(
        len(value) if isinstance(value, bytes) else value.length
        for value in contents.chunks.get(path, {}).values()
    )
    return key, metadata, stored, contents


def _read_raw(raw: rawread.RawArray, record: checksums.LeafRecord) -> np.ndarray | None:
    """The array read from its raw chunks and checked against ``record``; ``None`` if it
    cannot be read so or does not match."""
    out = np.empty(raw.shape, raw.dtype)
    boxes = chunks.regions(raw.shape, raw.unit, raw.dtype.itemsize, rawread.REGION_BYTES)
    check = PiecesCheck(record, raw.dtype)
    scan = _raw_scan.RawScan(raw, boxes, check.update, into=out)
    _raw_scan.scan([scan])
    bad, unchecked = check.results()
    return None if scan.failed or bad or unchecked else out


def _record_bytes(record: checksums.LeafRecord) -> int:
    """The bytes of the array ``record`` describes (its dtype's size unknown: 16)."""
    try:
        itemsize = np.dtype(record.dtype).itemsize
    except TypeError:
        itemsize = 16
    return math.prod(record.shape) * itemsize
