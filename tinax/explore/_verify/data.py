"""``verify``'s data pass: every array's regions read once, fed to every check's scan,
and NaN/Inf counted."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import tensorstore as ts

from tinax._format.arraydata import chunks, rawread
from tinax._format.callbacks import Progress
from tinax._format.integrity import checksums
from tinax._format.metadata import arrays, pytree
from tinax._format.naming import names, words
from tinax.explore import _raw_scan
from tinax.explore._numeric import ValueCounts
from tinax.explore._verify.checks import (
    Check,
    Finding,
    LeafScan,
    PyTreeState,
    StoredArray,
    VerifyTarget,
)
from tinax.explore._verify.integrity import ChecksumCheck, _ChecksumScan


class _NonFiniteScan(LeafScan):
    def __init__(self, array: StoredArray, counts: ValueCounts) -> None:
        self.array = array
        self.counts = counts

    def update(self, box: chunks.Box, values: np.ndarray) -> None:
        self.counts.update(values)

    def finish(self) -> Iterable[Finding]:
        nan, inf = self.counts.nan, self.counts.inf
        if nan or inf:
            yield Finding(self.array.part, words.WARNING, f"holds {nan:,} NaN and {inf:,} Inf")


class NonFiniteCheck(Check):
    """Counts NaN and infinite values in every floating-point leaf (when data is read)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], ValueCounts] = {}

    def leaf(self, target: VerifyTarget, array: StoredArray) -> LeafScan | None:
        counts = ValueCounts(arrays.numpy_dtype(array.info.dtype))
        self.counts[(array.checkpointable, array.key)] = counts
        return _NonFiniteScan(array, counts)


def read_data(
    target: VerifyTarget,
    active: list[Check],
    progress: Progress | None,
    rows: list[tuple[Any, ...]],
) -> list[Finding]:
    found: list[Finding] = []
    work: list[tuple[StoredArray, PyTreeState]] = []
    for name, state in target.trees.items():
        if state.tree is None:
            continue
        if not (target.safe and state.readable):
            found.append(
                Finding(name, words.INFO, "data not read: its array store is damaged (see above)")
            )
            continue
        for array in state.arrays:
            if array.info.itemsize is None:
                continue  # An unknown dtype is reported already; nothing can decode it.
            if array.key in state.damaged:
                found.append(
                    Finding(array.part, words.INFO, "data not read: a data file of it is damaged")
                )
            else:
                work.append((array, state))
    sizes = [math.prod(a.info.shape) * (a.info.itemsize or 0) for a, _ in work]
    total, done = sum(sizes), 0
    if progress is not None:
        progress(0, total)

    # Uncompressed arrays with saved checksums are read straight from their data
    # files; one that cannot be, or does not match its checksums, is read again
    # through tensorstore, which then says what is wrong with it.
    raw: dict[int, rawread.RawArray] = {}
    for index, (array, state) in enumerate(work):
        planned = _raw_array(target, active, array, state)
        if planned is not None:
            raw[index] = planned

    def reads(indices: Iterable[int]) -> Iterable[chunks.ArrayRead]:
        for index in indices:
            array, state = work[index]
            itemsize = array.info.itemsize or 1
            assert state.tree is not None
            leaf = state.tree.find(array.key, name=array.checkpointable)
            spec = state.tree.array_spec(leaf)
            boxes = chunks.regions(
                array.info.shape, array.info.chunk_shape, itemsize, chunks.REGION_BYTES
            )
            yield chunks.ArrayRead(
                index, ts.open(spec, context=target.ctx, read=True), boxes, itemsize
            )

    scans: dict[int, list[LeafScan]] = {}
    failed: dict[int, str] = {}

    def run(regions: Iterable[chunks.ArrayRead], counted: bool, ahead: int) -> None:
        nonlocal done
        for index, box, values in chunks.read_arrays(regions, in_flight_bytes=ahead):
            if index not in scans:
                array = work[index][0]
                scans[index] = [s for c in active if (s := c.leaf(target, array)) is not None]
            if isinstance(values, chunks.ReadFailure):
                failed.setdefault(index, values.message)
            elif index not in failed:
                for leaf_scan in scans[index]:
                    leaf_scan.update(box, values)
            if counted:
                done += chunks.box_size(box) * (work[index][0].info.itemsize or 0)
                if progress is not None:
                    progress(done, total)

    # Raw arrays: each region read, checksummed and scanned on one of every core's
    # threads, in the regions' order (``_raw_scan``).
    raw_scans: dict[int, _raw_scan.RawScan] = {}
    for index, found_raw in raw.items():
        array = work[index][0]
        scans[index] = leaf_scans = [s for c in active if (s := c.leaf(target, array)) is not None]
        boxes = chunks.regions(
            array.info.shape, found_raw.unit, array.info.itemsize or 1, rawread.REGION_BYTES
        )
        raw_scans[index] = _raw_scan.RawScan(found_raw, boxes, _feed(leaf_scans))
    if raw_scans:

        def scanned(nbytes: int) -> None:
            if progress is not None:
                progress(min(nbytes, total), total)

        _raw_scan.scan(list(raw_scans.values()), scanned)
        done = sum(sizes[index] for index in raw_scans)
    run(
        reads(i for i in range(len(work)) if i not in raw_scans),
        counted=True,
        ahead=chunks.IN_FLIGHT_BYTES,
    )
    again = [
        index
        for index, found_raw in raw_scans.items()
        if found_raw.failed or not _matched(scans.get(index, []))
    ]
    for index in again:
        scans.pop(index, None)
        failed.pop(index, None)
    if again:
        run(reads(again), counted=False, ahead=chunks.IN_FLIGHT_BYTES)
    for index, (array, _) in enumerate(work):
        counts = _nonfinite(active, array)
        if index in failed:
            complaint = checksums.undecodable(failed[index])
            said = (
                f"its data cannot be read: {failed[index]}"
                if complaint is None
                else checksums.undecodable_words(complaint)
            )
            found.append(Finding(array.part, words.ERROR, said))
        else:
            for scan in scans.get(index, []):
                found.extend(scan.finish())
        rows.append(
            (
                array.checkpointable,
                array.key,
                array.info.dtype,
                sizes[index],
                None if counts is None or index in failed else counts.nan,
                None if counts is None or index in failed else counts.inf,
                index not in failed,
            )
        )
    return found


def _feed(leaf_scans: list[LeafScan]) -> Callable[[chunks.Box, np.ndarray], None]:
    def feed(box: chunks.Box, values: np.ndarray) -> None:
        for leaf_scan in leaf_scans:
            leaf_scan.update(box, values)

    return feed


def _raw_array(
    target: VerifyTarget, active: list[Check], array: StoredArray, state: PyTreeState
) -> rawread.RawArray | None:
    """``array`` as raw chunks, if it is stored so and has saved checksums to check it by."""
    checksum = next((c for c in active if isinstance(c, ChecksumCheck)), None)
    tree, contents = state.tree, state.contents
    if checksum is None or tree is None or contents is None or not (tree.ocdbt and tree.zarr3):
        return None
    records = checksum.records.get(array.checkpointable)
    record = None if records is None else records.get(array.key)
    if record is None or record.kind != checksums.ARRAY or record.shape != array.info.shape:
        return None
    try:
        dtype = arrays.numpy_dtype(array.info.dtype)
    except TypeError:
        return None
    if record.dtype != str(dtype):
        return None
    path = pytree.storage_path(array.param)
    metadata = contents.other.get((path + names.ZARR3_METADATA).encode("utf-8"))
    if not isinstance(metadata, bytes):
        return None
    stored = contents.chunks.get(path)
    return rawread.plan(
        tree.directory, metadata, stored, path, dtype, array.info.shape, target.files
    )


def _matched(scans: list[LeafScan]) -> bool:
    """Whether an array's checksum scan found every recorded piece as saved."""
    for leaf_scan in scans:
        if isinstance(leaf_scan, _ChecksumScan):
            bad, unchecked = leaf_scan.check.results()
            return not bad and not unchecked
    return False


def _nonfinite(active: list[Check], array: StoredArray) -> ValueCounts | None:
    for check in active:
        if isinstance(check, NonFiniteCheck):
            return check.counts.get((array.checkpointable, array.key))
    return None
