"""Two checkpoints, or a checkpoint and live state, leaf by leaf: what changed, and how much.

(Over 500 lines: the two sides' sources, the comparison and the one read pass
that decodes, compares and checks checksums are one job, kept in one place. How a
change is told for its kind and ranked lives in ``_ranking``.)

Arrays are read a region at a time (``tinax._format.arraydata.chunks``), so memory stays
bounded whatever the size of the checkpoints. Stored arrays whose zarr metadata and
chunks hold the same bytes in both checkpoints are recognised as the same from
those bytes, without decoding them.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pandas as pd
import tensorstore as ts

from tinax import _paths
from tinax._format.arraydata import chunks, rawread
from tinax._format.callbacks import Progress
from tinax._format.integrity import checksums, iterstate
from tinax._format.metadata import arrays, layout, pytree
from tinax._format.metadata.layout import Checkpoint
from tinax._format.naming import names, words
from tinax.explore import _checkpoint, _live, _raw_scan
from tinax.explore._leaf_rows import Leaf, frame
from tinax.explore._numeric import PairStats
from tinax.explore._ranking import (
    OTHER,
    nonfinite_change,
    sort_by_change,
    told_change,
    value_kind,
)
from tinax.explore._verify.integrity import PiecesCheck

DIFF_COLUMNS = (
    "checkpointable",
    "key",
    "status",
    "value_kind",
    "change",
    "delta",
    "kind_a",
    "kind_b",
    "shape_a",
    "shape_b",
    "dtype_a",
    "dtype_b",
    "max_abs_diff",
    "rel_change",
    "cosine",
    "norm_a",
    "norm_b",
    "norm_diff",
    "nan_a",
    "inf_a",
    "nan_b",
    "inf_b",
    "nonfinite",
    "decoded",
    "decided_by",
)

# How a row's status was decided (the ``decided_by`` column).
BY_METADATA = "metadata"
BY_CHECKSUM = "checksum"
BY_STORED_BYTES = "stored bytes"
BY_DATA = "data"


def _family(kind: str) -> str:
    # A stored array compares with a live one whichever kind of array each is.
    return "array" if kind in words.ARRAY_KINDS else kind


# -- where a side's values come from -----------------------------------------------------


class _StoredTree:
    """A pytree checkpointable being read: its layout, and its store's contents once needed."""

    def __init__(
        self, tree: pytree.PyTreeLayout, ctx: ts.Context, files: rawread.DataFiles
    ) -> None:
        self.tree = tree
        self.ctx = ctx
        self.files = files
        # The checksums saved with it (the load's preflight has read them already).
        self.records = None if tree.item is None else checksums.read_checksums(tree.item)
        self._contents: chunks.StoreContents | None = None
        self._contents_error = False

    def contents(self) -> chunks.StoreContents | None:
        """The OCDBT store's keys and where their values are; ``None`` if not OCDBT or unreadable."""
        if self._contents is None and not self._contents_error and self.tree.ocdbt:
            paths = [
                pytree.storage_path(leaf.param)
                for leaf in self.tree.leaves
                if leaf.kind in words.STORED_ARRAY_KINDS
            ]
            try:
                self._contents = chunks.store_contents(self.tree, paths, ctx=self.ctx)
            except (ValueError, KeyError, TypeError):
                # Telling identical chunks apart is a shortcut; decoding still works.
                self._contents_error = True
        return self._contents


@dataclasses.dataclass(frozen=True)
class _StoredArray:
    """An array leaf of a checkpoint."""

    owner: _StoredTree
    leaf: pytree.StoredLeaf
    chunk_shape: tuple[int, ...] | None

    def open(self) -> Any:
        return ts.open(self.owner.tree.array_spec(self.leaf), context=self.owner.ctx, read=True)

    def record(self) -> checksums.LeafRecord | None:
        """The checksums saved for this array, if any."""
        records = self.owner.records
        record = None if records is None else records.get(self.leaf.key)
        return record if record is not None and record.kind == checksums.ARRAY else None

    def raw(self, dtype: np.dtype, shape: tuple[int, ...]) -> rawread.RawArray | None:
        """The array as raw chunks in its data files, if it is stored so (``rawread``)."""
        tree = self.owner.tree
        if not (tree.ocdbt and tree.zarr3 and rawread.may_read(tree.directory)):
            return None
        stored = self.stored()
        if stored is None or not isinstance(stored[0], bytes):
            return None
        path = pytree.storage_path(self.leaf.param)
        return rawread.plan(
            tree.directory, stored[0], stored[1], path, dtype, shape, self.owner.files
        )

    def stored(self) -> tuple[chunks.StoredValue, dict[bytes, chunks.StoredValue]] | None:
        """The array's zarr metadata and chunks as stored, if the store can tell."""
        contents = self.owner.contents()
        if contents is None:
            return None
        path = pytree.storage_path(self.leaf.param)
        suffix = names.ZARR3_METADATA if self.owner.tree.zarr3 else names.ZARR2_METADATA
        metadata = contents.other.get((path + suffix).encode("utf-8"))
        if metadata is None:
            return None
        return metadata, contents.chunks.get(path, {})


class _Regions:
    """A live array as the read interface ``chunks.read_arrays`` takes."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __getitem__(self, box: chunks.Box) -> _Ready:
        return _Ready(np.asarray(self.value[box]))


class _Ready:
    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def read(self) -> _Ready:
        return self

    def result(self) -> np.ndarray:
        return self.values


@dataclasses.dataclass(frozen=True)
class _LiveArray:
    """An array leaf of live state."""

    value: Any
    chunk_shape: tuple[int, ...] | None = None

    def open(self) -> Any:
        return _Regions(self.value)


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One leaf of one side: its row, and its values (an array source, or the value)."""

    leaf: Leaf
    array: _StoredArray | _LiveArray | None = None
    corrupt: str | None = None


@dataclasses.dataclass
class _Side:
    label: str
    entries: dict[tuple[str, str], _Entry]
    # The data files its raw reads open, each once for the whole diff (or for as long as
    # the caller who handed them in reads the checkpoint), and whether the diff closes them.
    files: rawread.DataFiles = dataclasses.field(default_factory=rawread.DataFiles)
    owns_files: bool = True


def stored_side(
    checkpoint: Checkpoint,
    checkpointable: str | None = None,
    files: rawread.DataFiles | None = None,
) -> _Side:
    """One side of a diff: the leaves of an opened checkpoint (of its checkpointable
    ``checkpointable`` alone, if given), read through it; its data files opened in
    ``files`` (which the caller closes), else in the diff's own.

    Raises:
      ValueError: If the checkpointable's metadata cannot be read, or it has none
        of that name.
    """
    ctx = arrays.context_of(checkpoint)
    side = _Side(str(checkpoint.path), {})
    if files is not None:
        side.files, side.owns_files = files, False
    entries = side.entries
    items = (
        checkpoint.checkpointables if checkpointable is None else (checkpoint.get(checkpointable),)
    )
    for item in items:
        if item.layout != layout.PYTREE:
            problem = _damaged_files(item)
            for row in _checkpoint.checkpointable_leaves(item, ctx, True):
                entries[(row.checkpointable, row.key)] = _Entry(row, corrupt=problem)
            continue
        tree = pytree.read_layout(item)
        owner = _StoredTree(tree, ctx, side.files)
        rows = _checkpoint.pytree_leaves(item.name, tree, ctx, values=True)
        for stored, row in zip(tree.leaves, rows, strict=True):
            array = None
            if row.kind in words.ARRAY_KINDS and row.shape is not None and stored.stored:
                array = _StoredArray(owner, stored, row.chunk_shape)
            entries[(row.checkpointable, row.key)] = _Entry(
                row, array, _damaged_value(owner.records, row)
            )
    return side


def _damaged_files(item: layout.StoredCheckpointable) -> str | None:
    """What is wrong with the files a checkpointable's checksums record whole (iterator states)."""
    if item.layout != layout.ITERATOR:
        return None
    records = checksums.read_checksums(item)
    problems = [] if records is None else checksums.check_files(item, records)
    if not problems:
        # A state the load would refuse is no state to compare, whatever its checksum says.
        try:
            iterstate.check_states(item)
        except ValueError as e:
            problems.append(str(e))
    return "; ".join(problems) or None


def _damaged_value(records: dict[str, checksums.LeafRecord] | None, row: Leaf) -> str | None:
    """Whether a scalar or string value read for the table differs from its checksum."""
    if records is None or row.kind not in (words.SCALAR, words.STRING):
        return None
    record = records.get(row.key)
    if record is not None and checksums.check_value(record, row.value) is False:
        return f"leaf {row.key}: the stored value does not match its checksum"
    return None


def _live_side(state: Mapping[str, Any]) -> _Side:
    import jax

    from tinax.checkpointing import NumpyTarget

    entries: dict[tuple[str, str], _Entry] = {}
    for row, obj in _live.live_leaves(state):
        array = None
        if row.kind in words.ARRAY_KINDS:
            if isinstance(obj, jax.ShapeDtypeStruct | NumpyTarget):
                raise ValueError(
                    f"live leaf {row.key} of {row.checkpointable!r} is an abstract target "
                    f"({type(obj).__name__}); diff_table compares values"
                )
            if jax.dtypes.issubdtype(obj.dtype, jax.dtypes.prng_key):
                obj = jax.random.key_data(obj)
            value = obj if isinstance(obj, jax.Array) else np.asarray(obj)
            row = row._replace(shape=tuple(int(d) for d in value.shape), dtype=value.dtype.name)
            array = _LiveArray(value)
        elif row.kind == words.SCALAR:
            row = row._replace(dtype=np.asarray(row.value).dtype.name)
        entries[(row.checkpointable, row.key)] = _Entry(row, array)
    return _Side("live state", entries)


def _side(value: object, which: str) -> _Side:
    if isinstance(value, Mapping):
        return _live_side(value)
    if not isinstance(value, str | os.PathLike | Checkpoint):
        raise TypeError(
            f"{which} must be a checkpoint path or a mapping of name to pytree, "
            f"got {type(value).__name__}"
        )
    return stored_side(_paths.open_checkpoint(value))


# -- comparing ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Row:
    name: str
    key: str
    status: str
    a: Leaf | None
    b: Leaf | None
    stats: PairStats | None = None
    decoded: bool | None = None
    decided_by: str = BY_METADATA

    def value_kind(self) -> str:
        leaf = self.a if self.a is not None else self.b
        if leaf is None or leaf.kind not in (*words.ARRAY_KINDS, words.SCALAR):
            return OTHER
        return value_kind(self.name, self.key, leaf.dtype, leaf.shape)

    def record(self) -> tuple[Any, ...]:
        sides: list[Any] = []
        for field in ("kind", "shape", "dtype"):
            sides += [getattr(self.a, field, None), getattr(self.b, field, None)]
        kind = self.value_kind()
        numbers, counts, change, delta = told_change(kind, self.status, self.stats, self.a)
        return (
            self.name,
            self.key,
            self.status,
            kind,
            change,
            delta,
            *sides,
            *numbers,
            *counts,
            nonfinite_change(self.stats),
            self.decoded,
            self.decided_by,
        )


def _scalar_stats(a: Leaf, b: Leaf) -> PairStats:
    left = np.asarray(a.value, dtype=a.dtype)
    right = np.asarray(b.value, dtype=b.dtype)
    stats = PairStats(left.dtype)
    stats.update(left, right)
    return stats


def _same_value(a: Any, b: Any) -> bool:
    try:
        return bool(type(a) is type(b) and a == b)
    except (TypeError, ValueError):
        return False


def _compare(name: str, key: str, a: _Entry | None, b: _Entry | None) -> _Row:
    if a is None or b is None:
        status = words.ONLY_IN_B if a is None else words.ONLY_IN_A
        return _Row(name, key, status, getattr(a, "leaf", None), getattr(b, "leaf", None))
    la, lb = a.leaf, b.leaf
    if a.corrupt or b.corrupt:
        return _Row(name, key, words.CORRUPT, la, lb, decided_by=BY_CHECKSUM)
    if _family(la.kind) != _family(lb.kind):
        return _Row(name, key, words.KIND_DIFFERS, la, lb)
    if la.kind in words.ARRAY_KINDS or la.kind == words.SCALAR:
        if la.shape != lb.shape:
            return _Row(name, key, words.SHAPE_DIFFERS, la, lb)
        if la.dtype != lb.dtype:
            return _Row(name, key, words.DTYPE_DIFFERS, la, lb)
        if la.kind == words.SCALAR:
            stats = _scalar_stats(la, lb)
            status = words.SAME if stats.equal else words.CHANGED
            return _Row(name, key, status, la, lb, stats, True, BY_DATA)
        if a.array is None or b.array is None:
            # Nothing stored for an array Orbax was told to skip: nothing to compare.
            return _Row(name, key, words.SAME if a.array is b.array else words.CHANGED, la, lb)
        # Compared in a second pass, region by region.
        return _Row(name, key, words.CHANGED, la, lb)
    status = words.SAME if _same_value(la.value, lb.value) else words.CHANGED
    return _Row(name, key, status, la, lb, decoded=True, decided_by=BY_DATA)


def _same_records(a: checksums.LeafRecord | None, b: checksums.LeafRecord | None) -> bool | None:
    """Whether two arrays' saved checksums say they hold the same bytes; ``None`` if they cannot tell.

    They can when both were checksummed in pieces with the same bounds (the same
    sharding on save): equal digests mean equal bytes, a differing one a change.
    """
    if a is None or b is None or (a.dtype, a.shape) != (b.dtype, b.shape):
        return None
    pieces_a = {p.bounds: p.digest for p in a.pieces}
    pieces_b = {p.bounds: p.digest for p in b.pieces}
    if pieces_a.keys() != pieces_b.keys():
        return None
    return pieces_a == pieces_b


def _identical_on_disk(a: _StoredArray, b: _StoredArray) -> bool:
    """Whether two stored arrays have byte-identical zarr metadata and chunks."""
    if a.owner.tree.zarr3 != b.owner.tree.zarr3:
        return False
    left, right = a.stored(), b.stored()
    if left is None or right is None:
        return False
    (meta_a, chunks_a), (meta_b, chunks_b) = left, right
    dir_a, dir_b = a.owner.tree.directory, b.owner.tree.directory
    prefix_a = len(pytree.storage_path(a.leaf.param))
    prefix_b = len(pytree.storage_path(b.leaf.param))
    by_name_a = {key[prefix_a:]: value for key, value in chunks_a.items()}
    by_name_b = {key[prefix_b:]: value for key, value in chunks_b.items()}
    if by_name_a.keys() != by_name_b.keys():
        return False
    try:
        if not chunks.same_stored_value(dir_a, meta_a, dir_b, meta_b):
            return False
        return all(
            chunks.same_stored_value(dir_a, value, dir_b, by_name_b[name])
            for name, value in by_name_a.items()
        )
    except OSError:
        return False


def _lcm_chunks(
    shape: tuple[int, ...], a: tuple[int, ...] | None, b: tuple[int, ...] | None
) -> tuple[int, ...]:
    """Chunks that are whole chunks on both sides (whole-dimension where unknown)."""
    out = []
    for d, size in enumerate(shape):
        ca = a[d] if a is not None and len(a) == len(shape) else None
        cb = b[d] if b is not None and len(b) == len(shape) else None
        known = [c for c in (ca, cb) if c]
        out.append(min(size, math.lcm(*known)) if known else 1)
    return tuple(out)


def _host_values(array: _StoredArray | _LiveArray | None) -> np.ndarray | None:
    """A live array's values as NumPy without a copy: a NumPy array, or a JAX array on
    one CPU device (whose buffer NumPy can view); ``None`` for anything else."""
    if not isinstance(array, _LiveArray):
        return None
    value = array.value
    if isinstance(value, np.ndarray):
        return value
    devices = getattr(getattr(value, "sharding", None), "device_set", None)
    if devices is None or len(devices) != 1 or next(iter(devices)).platform != "cpu":
        return None
    return np.asarray(value)


def _location(side: _Side, row: _Row) -> str:
    return f"leaf {row.key} of {row.name!r} in {side.label}"


def _decode_pairs(
    pairs: list[tuple[_Row, _Entry, _Entry]],
    sides: tuple[_Side, _Side],
    progress: Progress | None,
    done: int,
    total: int,
) -> None:
    """Reads every pair region by region, both sides in step, and fills in their stats.

    A stored side that is uncompressed and has saved checksums is read straight
    from its data files (``rawread``): when the other side is too, or is live values
    in host memory, on every core (``_raw_scan``). A pair with such a side that
    cannot be read so, or does not match its checksums, is compared again through
    tensorstore, which then says what is wrong.
    """
    pool = rawread.BufferPool(keep=8)
    raw: dict[tuple[int, int], rawread.RawArray] = {}
    checks: dict[tuple[int, int], PiecesCheck] = {}

    def add_checks(index: int) -> None:
        # The saved checksums of each stored side, digested in the same pass.
        row, ea, eb = pairs[index]
        for which, entry in enumerate((ea, eb)):
            if isinstance(entry.array, _StoredArray):
                record = entry.array.record()
                if record is not None and record.shape == (row.a.shape if row.a else None):
                    checks[(index, which)] = PiecesCheck(record, _numpy_dtype(row))

    for index, (row, ea, eb) in enumerate(pairs):
        add_checks(index)
        dtype = _numpy_dtype(row)
        for which, entry in enumerate((ea, eb)):
            check = checks.get((index, which))
            if check is None or check.record.dtype != str(dtype) or row.a is None:
                continue
            assert isinstance(entry.array, _StoredArray) and row.a.shape is not None
            found = entry.array.raw(dtype, row.a.shape)
            if found is not None:
                raw[(index, which)] = found

    def reads(which: int, indices: list[int], direct: bool) -> Iterator[chunks.ArrayRead]:
        for index in indices:
            row, ea, eb = pairs[index]
            entry = (ea, eb)[which]
            assert entry.array is not None and ea.array is not None and eb.array is not None
            shape = row.a.shape if row.a is not None and row.a.shape is not None else ()
            itemsize = np.dtype(_numpy_dtype(row)).itemsize
            grid = _lcm_chunks(shape, ea.array.chunk_shape, eb.array.chunk_shape)
            boxes = chunks.regions(shape, grid, itemsize, chunks.REGION_BYTES)
            found = raw.get((index, which)) if direct else None
            if found is None:
                opened = entry.array.open()
            else:
                # Its checksums are digested on the reading threads, in order.
                digest = digests[(index, which)] = rawread.Digest(checks[(index, which)].update)
                opened = rawread.PooledArray(found, pool, digest)
            yield chunks.ArrayRead(index, opened, boxes, itemsize)

    stats: dict[int, PairStats] = {}
    again: set[int] = set()
    digests: dict[tuple[int, int], rawread.Digest] = {}

    def run(indices: list[int], direct: bool) -> None:
        nonlocal done
        # Two sides are read at once, so each takes half of one read's budget: the
        # whole budget each measured 170-195 MiB of growth against 105-125 MiB, for
        # a few percent of speed.
        ahead = chunks.IN_FLIGHT_BYTES // 2
        for (index, box, left), (_, _, right) in zip(
            chunks.read_arrays(reads(0, indices, direct), in_flight_bytes=ahead),
            chunks.read_arrays(reads(1, indices, direct), in_flight_bytes=ahead),
            strict=True,
        ):
            if index in again:
                continue
            row = pairs[index][0]
            for which, (side, values) in enumerate(zip(sides, (left, right), strict=True)):
                if not isinstance(values, chunks.ReadFailure):
                    continue
                if direct and (index, which) in raw:
                    again.add(index)
                else:
                    raise ValueError(f"cannot read {_location(side, row)}: {values.message}")
            if index in again:
                continue
            pair = stats.get(index)
            if pair is None:
                for earlier in stats.values():
                    earlier.done()  # regions come array after array
                pair = stats[index] = PairStats(np.asarray(left).dtype)
            left, right = np.asarray(left), np.asarray(right)
            for which, values in enumerate((left, right)):
                check = checks.get((index, which))
                if check is not None and not (direct and (index, which) in digests):
                    check.update(box, values)
            pair.update(left, right)
            done += 2 * chunks.box_size(box) * pair.dtype.itemsize
            if progress is not None:
                progress(min(done, total), total)

    # Pairs raw on both sides: every region's work on the thread that read it.
    # So are pairs of a raw side and live values in host memory.
    scans: dict[int, _raw_scan.RawScan] = {}
    for index, (row, ea, eb) in enumerate(pairs):
        left, right = raw.get((index, 0)), raw.get((index, 1))
        shape = row.a.shape if row.a is not None and row.a.shape is not None else ()
        if left is not None and right is not None:
            grid = _lcm_chunks(shape, left.unit, right.unit)
            boxes = chunks.regions(shape, grid, left.dtype.itemsize, rawread.REGION_BYTES)
            digest_left, digest_right = checks[(index, 0)].update, checks[(index, 1)].update
            scans[index] = _raw_scan.RawScan(left, boxes, digest_left, right, digest_right)
            continue
        for which, found, other in ((0, left, eb), (1, right, ea)):
            values = _host_values(other.array)
            if found is None or values is None:
                continue
            if values.dtype != found.dtype or values.shape != found.shape:
                continue
            grid = _lcm_chunks(shape, found.unit, None)
            boxes = chunks.regions(shape, grid, found.dtype.itemsize, rawread.REGION_BYTES)
            stored_check = checks[(index, which)].update
            scans[index] = _raw_scan.RawScan(
                found, boxes, stored_check, values=values, swapped=which == 1
            )
    if scans:
        start = done

        def scanned(nbytes: int) -> None:
            if progress is not None:
                progress(min(start + nbytes, total), total)

        _raw_scan.scan(list(scans.values()), scanned)
        done += sum(2 * _nbytes(pairs[index][0]) for index in scans)
        for index, scan in scans.items():
            if scan.stats is not None:
                stats[index] = scan.stats
    run([i for i in range(len(pairs)) if i not in scans], direct=True)
    for index, which in raw:
        bad, unchecked = checks[(index, which)].results()
        if index in scans:
            failed = scans[index].failed
        else:
            digest = digests.get((index, which))
            failed = digest is None or digest.failed
        if bad or unchecked or failed:
            again.add(index)
    if again:
        redo = sorted(again)
        for index in redo:
            stats.pop(index, None)
            checks.pop((index, 0), None)
            checks.pop((index, 1), None)
            add_checks(index)
        again.clear()
        run(redo, direct=False)
    for index, (row, _, _) in enumerate(pairs):
        pair = stats.get(index)
        row.decided_by = BY_DATA
        if pair is None:  # No elements at all.
            row.status = words.SAME
            continue
        row.stats = pair
        row.decoded = True
        row.status = words.SAME if pair.equal else words.CHANGED
        if any(checks[(index, w)].results()[0] for w in (0, 1) if (index, w) in checks):
            row.status = words.CORRUPT


def _numpy_dtype(row: _Row) -> np.dtype:
    assert row.a is not None and row.a.dtype is not None
    return arrays.numpy_dtype(row.a.dtype)


def _nbytes(row: _Row) -> int:
    if row.a is None or row.a.shape is None:
        return 0
    return math.prod(row.a.shape) * np.dtype(_numpy_dtype(row)).itemsize


def diff_table(
    a: str | os.PathLike[str] | Checkpoint | Mapping[str, Any],
    b: str | os.PathLike[str] | Checkpoint | Mapping[str, Any],
    *,
    sort: bool = True,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Every leaf of two checkpoints (or a checkpoint and live state) and how it changed.

    Arrays are compared region by region, so that peak memory stays bounded
    whatever the checkpoints' size: each side reads ahead at most half of
    ``chunks.IN_FLIGHT_BYTES`` (8 MiB) of decoded regions of at most
    ``chunks.REGION_BYTES`` (4 MiB), and the statistics work in blocks of a few
    MiB. With tensorstore's read and decode buffers for those regions this is
    about 100-130 MiB of growth in resident memory (``tests/test_explore_memory.py``
    holds it under 192 MiB for two 256 MiB checkpoints). A stored chunk is the
    unit the store decodes, so a checkpoint whose single chunks are larger than
    a region needs a few such chunks per side on top.

    Stored arrays whose checksums, saved with each checkpoint, agree piece for
    piece are ``same`` without reading them (``decided_by`` is ``checksum``): the
    same bytes were saved on both sides, and damage to them since is for
    ``verify(data=True)`` or a load to find. Without checksums, arrays whose zarr
    metadata and chunks are byte-identical on disk are ``same`` from those bytes
    (``stored bytes``). Any other pair is decoded and compared bit for bit
    (``data``), each stored side checked against its checksums in the same pass:
    a leaf whose bytes (or whose scalar, string or iterator state) do not match
    what was saved is ``corrupt``, never ``changed``.

    Args:
      a: A checkpoint directory, or live state as a mapping of checkpointable
        name to pytree of concrete values (as ``state_table`` takes it).
      b: The same, for the other side.
      sort: Order rows by change (``sort_by_change``); ``False`` keeps the stored
        order, ``a``'s leaves first and then those only in ``b``.
      progress: Called as ``progress(bytes_done, bytes_total)`` as array bytes
        (decoded bytes of both sides) are compared.

    Returns:
      A DataFrame with columns ``checkpointable``, ``key``, ``status`` (``same``
      bit for bit, ``changed``, ``only in a``, ``only in b``, ``shape differs``,
      ``dtype differs``, ``kind differs``, ``corrupt``); ``value_kind`` (``float``,
      ``integer``, ``bool``, ``PRNG key``, ``other``: see ``value_kind``);
      ``change``, the change told for its kind (``1.23 %`` relative for a float
      array, ``+150`` for a counter, ``changed`` for a PRNG key, else the
      status); ``delta``, ``b - a`` of a one-element integer leaf; ``kind``,
      ``shape`` and ``dtype`` of each side (suffixed ``_a`` and ``_b``; a live typed PRNG key as its stored
      key data); for changed floating-point leaves ``norm_a`` and ``norm_b``, the
      norm of each side's own finite values (the leaf's true norm when it holds
      no NaN or Inf; NaN when it holds no finite value at all), and
      ``max_abs_diff``, ``rel_change`` (‖b − a‖ / ‖a‖, infinite if ``a`` is zero),
      ``cosine`` and ``norm_diff`` (‖b − a‖) over the elements finite on both
      sides, NaN where no number measures the change: where some element is
      finite on one side only (a leaf that became NaN), NaN on one and infinite
      on the other, or where no element is finite on both sides (integer leaves
      only ``max_abs_diff``; PRNG keys none); ``nan_a``, ``inf_a``, ``nan_b``,
      ``inf_b`` for every leaf whose values were decoded; ``nonfinite``, for a
      decoded leaf holding NaN or Inf on either side, how that changed
      (``became non-finite``: finite everywhere in ``a``, not in ``b``;
      ``non-finite in both``; ``became finite``; ``tinax.vocabulary``'s
      ``NONFINITE_CHANGES``), ``<NA>`` where both sides are finite or the values
      were not read; ``decoded``; and ``decided_by`` (``metadata``,
      ``checksum``, ``stored bytes`` or ``data``: what settled the status). A
      changed leaf with a ``nonfinite`` state has that word as its ``change``
      and ranks first (``sort_by_change``).

    Raises:
      TypeError: If ``a`` or ``b`` is neither a path nor a mapping.
      FileNotFoundError: If a path does not exist.
      ValueError: If a checkpoint cannot be read (naming it and the leaf), or
        live state holds abstract targets instead of values.
    """
    return diff_sides(_side(a, "a"), _side(b, "b"), progress=progress, sort=sort)


def diff_sides(
    a: _Side, b: _Side, *, progress: Progress | None = None, sort: bool = True
) -> pd.DataFrame:
    """``diff_table`` of two sides made already (``stored_side`` of opened checkpoints).

    Raises:
      ValueError: As ``diff_table``.
    """
    try:
        return _diff(a, b, progress=progress, sort=sort)
    finally:
        for side in (a, b):
            if side.owns_files:
                side.files.close()


def _diff(a: _Side, b: _Side, *, progress: Progress | None, sort: bool) -> pd.DataFrame:
    sides = (a, b)
    entries_a, entries_b = sides[0].entries, sides[1].entries
    keys = list(entries_a) + [key for key in entries_b if key not in entries_a]
    rows: list[_Row] = []
    pairs: list[tuple[_Row, _Entry, _Entry]] = []
    total = done = 0
    for key in keys:
        ea, eb = entries_a.get(key), entries_b.get(key)
        row = _compare(key[0], key[1], ea, eb)
        rows.append(row)
        if (
            row.status == words.CHANGED
            and row.decoded is None
            and ea is not None
            and eb is not None
            and ea.array is not None
            and eb.array is not None
        ):
            pairs.append((row, ea, eb))
            total += 2 * _nbytes(row)
    to_decode = []
    for row, ea, eb in pairs:
        both_stored = isinstance(ea.array, _StoredArray) and isinstance(eb.array, _StoredArray)
        records = (
            (ea.array.record(), eb.array.record())  # type: ignore[union-attr]
            if both_stored
            else (None, None)
        )
        if _same_records(*records):
            # The saved checksums agree: the same bytes were saved on both sides.
            row.status, row.decoded, row.decided_by = words.SAME, False, BY_CHECKSUM
            done += 2 * _nbytes(row)
        elif (
            both_stored and records == (None, None) and _identical_on_disk(ea.array, eb.array)  # type: ignore[arg-type]
        ):
            row.status, row.decoded, row.decided_by = words.SAME, False, BY_STORED_BYTES
            done += 2 * _nbytes(row)
        else:
            to_decode.append((row, ea, eb))
    if progress is not None:
        progress(done, total)
    _decode_pairs(to_decode, sides, progress, done, total)
    table = frame(DIFF_COLUMNS, (row.record() for row in rows))
    return sort_by_change(table) if sort else table
