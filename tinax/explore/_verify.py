"""Whether a checkpoint is whole and loadable: findings, and a verdict.

``verify`` runs a list of checks. Each looks at the checkpoint's structure (commit
state, metadata, array stores, iterator files) and, when data is read, may follow
every leaf's values region by region. The checks below are the defaults; another
check plugs in by subclassing ``Check`` and passing it in ``checks``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import tensorstore as ts

from tinax import _paths
from tinax._format import (
    arrays,
    chunks,
    files,
    jsonitems,
    layout,
    names,
    preflight,
    pytree,
    words,
)
from tinax._format.layout import Checkpoint, StoredCheckpointable
from tinax._format.storage import DIRECTORY, FILE, LINK, Location
from tinax.explore._checks import Check, Finding, LeafScan, PyTreeState, StoredArray, Target
from tinax.explore._integrity import ChecksumCheck
from tinax.explore._leaves import frame
from tinax.explore._numeric import ValueCounts

FINDING_COLUMNS = ("part", "severity", "message")
LEAF_COLUMNS = ("checkpointable", "key", "dtype", "nbytes", "nan_count", "inf_count", "read")

Progress = Callable[[int, int], None]


def _message(error: BaseException) -> str:
    return arrays.message(error) if isinstance(error, ValueError) else f"{error}"


# -- the default checks ------------------------------------------------------------------


class CommitCheck(Check):
    """The checkpoint committed: not a temporary directory, recorded, marked, not being deleted."""

    def structure(self, target: Target) -> Iterable[Finding]:
        path = target.path
        if names.is_temporary_name(path.name):
            yield Finding(
                "",
                words.ERROR,
                "an Orbax temporary directory: a save that has not committed (still in "
                "progress, or interrupted); it is not a checkpoint",
            )
        if (path / names.DELETION_MARKER).exists():
            yield Finding(names.DELETION_MARKER, words.ERROR, "the checkpoint is being deleted")
        if not (path / names.CHECKPOINT_METADATA).exists():
            yield Finding(
                names.CHECKPOINT_METADATA,
                words.ERROR,
                "missing: Orbax writes it when a save finishes, so this save never did",
            )
        else:
            try:
                target.record = layout.read_checkpoint_record(path)
            except ValueError as e:
                yield Finding(names.CHECKPOINT_METADATA, words.ERROR, str(e))
            else:
                if target.record.committed_nsecs is None:
                    yield Finding(
                        names.CHECKPOINT_METADATA, words.WARNING, "records no commit time"
                    )
        marker = path / names.COMMIT_SUCCESS
        if not marker.exists():
            if path.storage.commits_by_rename:
                yield Finding(
                    names.COMMIT_SUCCESS,
                    words.INFO,
                    "absent; on a local disk the final rename is what commits a save",
                )
            else:
                yield Finding(
                    names.COMMIT_SUCCESS,
                    words.ERROR,
                    "missing: on an object store a save commits by writing it last",
                )
        elif not marker.is_file():
            yield Finding(names.COMMIT_SUCCESS, words.ERROR, "is not a regular file")


class SafetyCheck(Check):
    """Nothing under the checkpoint leads out of it: no outward link, no FIFO or device."""

    def structure(self, target: Target) -> Iterable[Finding]:
        for where, entry in target.path.walk():
            if entry.kind == LINK:
                if not target.path.storage.inside(entry.link_target or "", target.path.path):
                    target.safe = False
                    yield Finding(
                        target.relative(where),
                        words.ERROR,
                        f"a symbolic link to {entry.link_target!r}, outside the checkpoint",
                    )
            elif entry.kind not in (FILE, DIRECTORY):
                target.safe = False
                yield Finding(
                    target.relative(where),
                    words.ERROR,
                    "neither a regular file nor a directory; a checkpoint holds nothing else",
                )
        if not target.safe:
            yield Finding(
                "", words.INFO, "array stores not read: the checkpoint is not safe to read"
            )


class PreflightCheck(Check):
    """Every file passes the check every load passes first (``tinax._format.preflight``).

    A checkpoint a load refuses is never sound: the same parse of every metadata
    file, the same size caps, the same refusals, in the same words. The other
    checks still run to say more (the array store's bookkeeping is size-checked
    again before tensorstore reads it); the refusal itself is reported when no
    other check found what is wrong.
    """

    def structure(self, target: Target) -> Iterable[Finding]:
        if not target.safe or names.is_temporary_name(target.path.name):
            return
        if not (target.path / names.CHECKPOINT_METADATA).exists():
            return  # reported by CommitCheck; nothing else can be opened
        try:
            preflight.check(target.path)
        except (ValueError, OSError) as e:
            target.refused = str(e)
        return ()


class CheckpointablesCheck(Check):
    """The checkpointables recorded are the ones present, and each is in a known layout."""

    def structure(self, target: Target) -> Iterable[Finding]:
        reported = False
        for finding in self._listed(target):
            reported = reported or finding.severity == words.ERROR
            yield finding
        if not target.safe:
            return
        path = target.path
        try:
            target.checkpoint = layout.open_checkpoint(path)
        except (ValueError, OSError) as e:
            # An unreadable record, a temporary name or a missing directory is reported already.
            unreadable_record = (
                target.record is None and (path / names.CHECKPOINT_METADATA).exists()
            )
            if not (reported or unreadable_record or names.is_temporary_name(path.name)):
                yield Finding("", words.ERROR, f"cannot be opened: {e}")
            target.checkpoint = self._present(target)
            if target.checkpoint is None:
                return
        for item in target.checkpoint.checkpointables:
            if item.layout == layout.PYTREE:
                target.trees[item.name] = PyTreeState(item)
            elif item.layout == layout.UNKNOWN:
                yield Finding(
                    item.name or ".",
                    words.WARNING,
                    "stored in a layout tinax does not know; its contents are not checked",
                )

    @staticmethod
    def _present(target: Target) -> Checkpoint | None:
        """The recorded checkpointables that are there, so that they are still checked."""
        record = target.record
        if record is None or not isinstance(record.item_handlers, dict):
            return None
        items = tuple(
            StoredCheckpointable(
                name, target.path / name, layout.classify(target.path / name) or layout.UNKNOWN
            )
            for name in record.item_handlers
            if (target.path / name).is_dir()
        )
        try:
            scan = files.scan(target.path)
        except ValueError:
            return None
        return Checkpoint(target.path, items, record.committed_nsecs, scan, record.checksummed)

    @staticmethod
    def _listed(target: Target) -> Iterable[Finding]:
        path = target.path
        recorded = target.record.item_handlers if target.record is not None else None
        present = {
            name
            for name, entry in path.entries().items()
            if entry.kind == DIRECTORY and layout.classify(path / name) is not None
        }
        if isinstance(recorded, dict):
            for name in recorded:
                if not (path / name).is_dir():
                    yield Finding(
                        name,
                        words.ERROR,
                        f"listed in {names.CHECKPOINT_METADATA} but has no directory",
                    )
            for name in sorted(present - set(recorded)):
                yield Finding(
                    name,
                    words.WARNING,
                    f"a checkpointable directory not listed in {names.CHECKPOINT_METADATA}; "
                    "a load does not see it",
                )


class PyTreeCheck(Check):
    """Each pytree's metadata reads, and agrees with its array store, whose data files are whole."""

    def structure(self, target: Target) -> Iterable[Finding]:
        for state in target.trees.values():
            yield from self._check(target, state)

    def _check(self, target: Target, state: PyTreeState) -> Iterable[Finding]:
        directory = state.item.directory
        where = target.relative(directory)
        try:
            tree = state.tree = pytree.read_layout(directory)
        except ValueError as e:
            yield Finding(f"{where}/{names.PYTREE_METADATA}".lstrip("/"), words.ERROR, str(e))
            return
        in_store = [
            leaf for leaf in tree.leaves if leaf.stored and leaf.kind in words.STORED_ARRAY_KINDS
        ]
        yield from self._strings_and_shardings(target, tree)
        written = yield from self._written(target, directory)
        if not in_store:
            state.readable = True
            return
        try:
            preflight.check_store_files(directory)
        except ValueError as e:
            yield Finding(where, words.ERROR, str(e))
            return
        if tree.ocdbt:
            paths = [pytree.storage_path(leaf.param) for leaf in in_store]
            try:
                state.contents = chunks.store_contents(
                    directory, paths, zarr3=tree.zarr3, ctx=target.ctx
                )
            except (ValueError, KeyError, TypeError) as e:
                # Without its index nothing in the store can be found: one finding says it.
                yield Finding(
                    f"{where}/{names.OCDBT_MANIFEST}".lstrip("/"),
                    words.ERROR,
                    f"the array store's manifest or index cannot be read: {_message(e)}",
                )
                return
        try:
            infos = pytree.array_infos(tree, in_store, target.ctx)
        except ValueError as e:
            # The bulk read stops at the first bad array; name every one.
            infos, bad = {}, []
            for leaf in in_store:
                try:
                    infos.update(pytree.array_infos(tree, [leaf], target.ctx))
                except ValueError as e2:
                    bad.append(Finding(f"{state.item.name} {leaf.key}", words.ERROR, _message(e2)))
            yield from bad or [Finding(where, words.ERROR, _message(e))]
        for leaf in in_store:
            info = infos.get(leaf.param)
            if info is None:
                continue
            array = StoredArray(state.item.name, leaf.key, leaf.param, info)
            yield from self._array(array, leaf, info, written)
            state.arrays.append(array)
        if state.contents is not None:
            yield from self._store(target, state, state.contents)
        else:
            state.readable = True

    @staticmethod
    def _strings_and_shardings(target: Target, tree: pytree.PyTreeLayout) -> Iterable[Finding]:
        where = target.relative(tree.directory)
        strings = [leaf.param for leaf in tree.leaves if leaf.kind == words.STRING]
        if strings:
            try:
                pytree.read_strings(tree, strings)
            except ValueError as e:
                yield Finding(f"{where}/{names.STRINGS}", words.ERROR, str(e))
        try:
            pytree.read_shardings(tree, [leaf.param for leaf in tree.leaves])
        except ValueError as e:
            yield Finding(f"{where}/{names.SHARDINGS}", words.ERROR, str(e))

    @staticmethod
    def _written(target: Target, directory: Location) -> Any:
        try:
            return pytree.read_written_arrays(directory)
        except ValueError as e:
            yield Finding(
                f"{target.relative(directory)}/{names.ARRAY_METADATAS}", words.ERROR, str(e)
            )
            return {}

    @staticmethod
    def _array(
        array: StoredArray,
        leaf: pytree.StoredLeaf,
        info: pytree.ArrayInfo,
        written: dict[str, list[pytree.WrittenArray]],
    ) -> Iterable[Finding]:
        if info.itemsize is None:
            yield Finding(array.part, words.ERROR, f"stored with dtype {info.dtype!r}, unknown")
        if leaf.kind == words.SCALAR and info.shape != ():
            yield Finding(
                array.part,
                words.ERROR,
                f"a scalar in the metadata, but stored with shape {info.shape}",
            )
        for process, records in written.items():
            for record in records:
                if record.param != leaf.param or record.write_shape is None:
                    continue
                shape = record.write_shape
                if len(shape) != len(info.shape) or any(
                    w > s for w, s in zip(shape, info.shape, strict=False)
                ):
                    yield Finding(
                        array.part,
                        words.ERROR,
                        f"{process} recorded writing a {shape} part of it, but the array "
                        f"store holds shape {info.shape}",
                    )

    @staticmethod
    def _store(
        target: Target, state: PyTreeState, contents: chunks.StoreContents
    ) -> Iterable[Finding]:
        tree = state.tree
        assert tree is not None
        where = target.relative(tree.directory)
        paths = {pytree.storage_path(a.param): a for a in state.arrays}
        refs: dict[str, list[StoredArray]] = {}
        all_refs = []
        for path, stored in contents.chunks.items():
            if path not in paths:
                continue
            for value in stored.values():
                if isinstance(value, arrays.ValueRef):
                    all_refs.append(value)
                    refs.setdefault(value.file, []).append(paths[path])
        broken = chunks.missing_data(tree.directory, all_refs)
        for file, problem in broken.items():
            state.damaged.update(a.key for a in refs.get(file, []))
            owners = sorted({a.part for a in refs.get(file, [])})
            shown = ", ".join(owners[:3]) + (
                f" and {len(owners) - 3} more" if len(owners) > 3 else ""
            )
            yield Finding(
                f"{where}/{file}".lstrip("/"),
                words.ERROR,
                f"a data file of the array store {problem}; it holds chunks of {shown}",
            )
        for path, array in paths.items():
            expected = chunks.expected_chunk_count(array.info.shape, array.info.grid_shape)
            found = len(contents.chunks.get(path, {}))
            if found < expected and tree.all_chunks_stored:
                yield Finding(
                    array.part,
                    words.ERROR,
                    f"{expected - found} of its {expected} chunks are missing from the array store",
                )
            elif found > expected:
                yield Finding(
                    array.part,
                    words.WARNING,
                    f"the array store holds {found} chunks for it; its shape needs {expected}",
                )
        state.readable = True


class IteratorCheck(Check):
    """Every process's iterator state file is there, for the process count recorded, and reads."""

    def structure(self, target: Target) -> Iterable[Finding]:
        if target.checkpoint is None:
            return
        for item in target.checkpoint.checkpointables:
            if item.layout == layout.ITERATOR:
                yield from self._iterator(target, item)
            elif item.layout == layout.JSON:
                try:
                    jsonitems.read_json_item(item.directory)
                except ValueError as e:
                    yield Finding(target.relative(item.directory), words.ERROR, str(e))
            elif item.layout == layout.EMPTY:
                try:
                    jsonitems.read_empty_record(item.directory)
                except ValueError as e:
                    yield Finding(
                        f"{target.relative(item.directory)}/{names.EMPTY_PYTREE}".lstrip("/"),
                        words.ERROR,
                        str(e),
                    )

    @staticmethod
    def _iterator(target: Target, item: StoredCheckpointable) -> Iterable[Finding]:
        where = target.relative(item.directory)
        found = jsonitems.iterator_files(item.directory)
        counts = sorted({count for _, count, _ in found})
        if len(counts) > 1:
            yield Finding(
                where,
                words.ERROR,
                f"iterator files disagree on the process count: {', '.join(map(str, counts))}",
            )
        for count in counts:
            present = {index for index, n, _ in found if n == count}
            for index in range(count):
                if index not in present:
                    name = names.iterator_file_name(index, count)
                    yield Finding(
                        f"{where}/{name}".lstrip("/"),
                        words.ERROR,
                        f"missing: the state of process {index} of {count}",
                    )
            for index in sorted(present - set(range(count))):
                yield Finding(
                    f"{where}/{names.iterator_file_name(index, count)}".lstrip("/"),
                    words.ERROR,
                    f"names process {index} of only {count}",
                )
        for _, _, name in found:
            try:
                files.read_json(item.directory / name, what="Grain iterator state")
            except ValueError as e:
                yield Finding(f"{where}/{name}".lstrip("/"), words.ERROR, str(e))


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

    def leaf(self, target: Target, array: StoredArray) -> LeafScan | None:
        counts = ValueCounts(pytree.numpy_dtype(array.info.dtype))
        self.counts[(array.checkpointable, array.key)] = counts
        return _NonFiniteScan(array, counts)


DEFAULT_CHECKS: tuple[type[Check], ...] = (
    CommitCheck,
    SafetyCheck,
    PreflightCheck,
    CheckpointablesCheck,
    PyTreeCheck,
    IteratorCheck,
    ChecksumCheck,
    NonFiniteCheck,
)


# -- the result --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Verification:
    """What ``verify`` found, and its verdict.

    Attributes:
      path: The checkpoint verified.
      ok: Whether the checkpoint is sound: no finding is an ``error``.
      findings: One row per finding: ``part``, ``severity``, ``message``; errors
        first.
      leaves: With data read, one row per array leaf: ``checkpointable``, ``key``,
        ``dtype``, ``nbytes``, ``nan_count``, ``inf_count`` and ``read``
        (whether every region decoded); empty otherwise.
      data: Whether array data was read.
    """

    path: str
    ok: bool
    findings: pd.DataFrame
    leaves: pd.DataFrame
    data: bool

    @property
    def errors(self) -> pd.DataFrame:
        """The findings that are errors."""
        return self.findings[self.findings["severity"] == words.ERROR].reset_index(drop=True)

    @property
    def verdict(self) -> str:
        """One line: ``sound`` or ``not sound``, and why."""
        counts = self.findings["severity"].value_counts()
        errors, warnings = int(counts.get(words.ERROR, 0)), int(counts.get(words.WARNING, 0))
        scope = "metadata and data" if self.data else "metadata"
        if self.ok:
            extra = f", {warnings} warning{'s' * (warnings != 1)}" if warnings else ""
            return f"sound ({scope} checked{extra})"
        first = self.errors.iloc[0]
        where = f"{first['part']}: " if first["part"] else ""
        more = f" (and {errors - 1} more)" if errors > 1 else ""
        return f"not sound: {errors} error{'s' * (errors != 1)}; {where}{first['message']}{more}"

    def __str__(self) -> str:
        return f"{self.path}: {self.verdict}"


_ORDER = {words.ERROR: 0, words.WARNING: 1, words.INFO: 2}


def verify(
    path: str | os.PathLike[str],
    *,
    data: bool = False,
    progress: Progress | None = None,
    checks: Sequence[Check] | None = None,
) -> Verification:
    """Checks that a checkpoint is whole and loadable, and says what is wrong if not.

    Without ``data``, metadata only: the commit state (not a temporary
    directory, ``_CHECKPOINT_METADATA`` readable, commit marker, no deletion in
    progress), nothing that leads out of the checkpoint, the checkpointables
    recorded against those present, each pytree's ``_METADATA``, strings and
    shardings, every array's zarr metadata in its store (a known dtype, a shape
    that holds what each process recorded writing, scalars 0-d), the array
    store's manifest and B+tree, every data file it refers to present and long
    enough, every chunk there, and every Grain iterator file present for the
    process count in their names and valid JSON, and the checksums tinax records
    with a save readable, covering every array, and matching the files recorded
    whole (Grain iterator states). With ``data``, every chunk of
    every array is also read and decoded, region by region (at most
    ``chunks.IN_FLIGHT_BYTES`` of decoded regions in flight: well under 128 MiB
    of resident memory whatever the checkpoint's size, unless single stored
    chunks are larger), checked against its recorded checksums (so a flipped
    byte anywhere in array data is found and the leaf named), and NaN and
    infinite values are counted.

    A damaged checkpoint gives findings, never an exception.

    Args:
      path: A checkpoint directory (an Orbax temporary directory is reported as
        not committed).
      data: Also read and decode every array's data.
      progress: Called as ``progress(bytes_done, bytes_total)`` while data is read
        (decoded bytes).
      checks: The checks to run, in order; by default a fresh instance of each of
        ``DEFAULT_CHECKS``. Pass ``[*(c() for c in DEFAULT_CHECKS), MyCheck()]``
        to add one.

    Returns:
      A ``Verification``: ``ok``, ``verdict``, ``findings`` and, with data,
      ``leaves``.

    Raises:
      TypeError: If an argument has the wrong type.
      FileNotFoundError: If nothing exists at ``path``.
    """
    if not isinstance(data, bool):
        raise TypeError(f"data must be a bool, got {type(data).__name__}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable, got {type(progress).__name__}")
    where = _paths.location(path)
    if not where.exists():
        raise FileNotFoundError(f"path {str(where)!r} does not exist")
    active = [c() for c in DEFAULT_CHECKS] if checks is None else list(checks)
    for check in active:
        if not isinstance(check, Check):
            raise TypeError(f"checks must be Check instances, got {type(check).__name__}")
    target = Target(where, data)
    found: list[Finding] = []
    leaves: list[tuple[Any, ...]] = []
    if not where.is_dir():
        found.append(Finding("", words.ERROR, "not a directory"))
    else:
        for check in active:
            found.extend(_guarded(_structure(check, target), type(check).__name__))
        if data:
            found.extend(_guarded(lambda: _read_data(target, active, progress, leaves), "data"))
        if target.refused is not None and not any(f.severity == words.ERROR for f in found):
            found.append(Finding("", words.ERROR, f"a load refuses it: {target.refused}"))
    found.sort(key=lambda f: _ORDER.get(f.severity, 3))
    findings = frame(FINDING_COLUMNS, (dataclasses.astuple(f) for f in found))
    ok = not any(f.severity == words.ERROR for f in found)
    return Verification(str(where), ok, findings, frame(LEAF_COLUMNS, leaves), data)


def _structure(check: Check, target: Target) -> Callable[[], list[Finding]]:
    return lambda: list(check.structure(target))


def _guarded(run: Callable[[], list[Finding]], name: str) -> list[Finding]:
    """A check's findings; a check that fails reports that, and the others still run."""
    try:
        return run()
    except Exception as e:  # A damaged checkpoint must give findings, never a traceback.
        return [Finding("", words.ERROR, f"{name} failed: {type(e).__name__}: {_message(e)}")]


def _read_data(
    target: Target, active: list[Check], progress: Progress | None, rows: list[tuple[Any, ...]]
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

    def reads() -> Iterable[chunks.ArrayRead]:
        for index, (array, state) in enumerate(work):
            assert state.tree is not None
            leaf = state.tree.find(array.key, name=array.checkpointable)
            spec = state.tree.array_spec(leaf)
            itemsize = array.info.itemsize or 1
            boxes = chunks.regions(
                array.info.shape, array.info.chunk_shape, itemsize, chunks.REGION_BYTES
            )
            yield chunks.ArrayRead(
                index, ts.open(spec, context=target.ctx, read=True), boxes, itemsize
            )

    scans: dict[int, list[LeafScan]] = {}
    failed: dict[int, str] = {}
    for index, box, values in chunks.read_arrays(reads()):
        if index not in scans:
            array = work[index][0]
            scans[index] = [s for c in active if (s := c.leaf(target, array)) is not None]
        if isinstance(values, chunks.ReadFailure):
            failed.setdefault(index, values.message)
        elif index not in failed:
            for scan in scans[index]:
                scan.update(box, values)
        done += chunks.box_size(box) * (work[index][0].info.itemsize or 0)
        if progress is not None:
            progress(done, total)
    for index, (array, _) in enumerate(work):
        counts = _nonfinite(active, array)
        if index in failed:
            found.append(
                Finding(array.part, words.ERROR, f"its data cannot be read: {failed[index]}")
            )
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


def _nonfinite(active: list[Check], array: StoredArray) -> ValueCounts | None:
    for check in active:
        if isinstance(check, NonFiniteCheck):
            return check.counts.get((array.checkpointable, array.key))
    return None
