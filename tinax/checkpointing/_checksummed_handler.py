"""Pytree checkpointables saved with checksums of their values, and checked when loaded.

(Over 500 lines: the save's digests from Orbax's host copies, the load's checks of
the parts Orbax read, and the pieces put together across meshes share one record
and one set of digest threads; apart, each would need the others' internals.)

``ChecksummedPyTreeHandler`` is Orbax's ``PyTreeHandler`` plus tinax's integrity
record (``tinax._format.integrity.checksums``): a save digests every value it writes and
puts the record in the checkpointable's directory before the checkpoint commits;
a load digests what Orbax read and refuses a value whose bytes differ, naming the
checkpoint, the checkpointable and the leaf.

Neither costs a transfer of its own. A save digests a JAX array from the host copy
Orbax makes to write it (``_orbax.observe_host_copies``), on tinax's digest
threads while Orbax writes, so the caller waits no longer than for Orbax alone and
no second host copy is made. A load checks each part of an array in host memory,
right after Orbax read it and before Orbax puts it on a device
(``_orbax.check_host_reads``); device arrays are never read back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import jax
import numpy as np
from orbax.checkpoint.experimental.v1 import handlers as ocp_handlers

from tinax._format.integrity import checksums
from tinax._format.integrity.checksums import Bounds, CorruptDataError, LeafRecord, Piece
from tinax._format.metadata import hostparts, pytree
from tinax._format.naming import names
from tinax._format.naming.keys import format_key, key_parts
from tinax._format.pools import ProcessPool
from tinax._format.storage import files
from tinax._format.storage.location import Location
from tinax._paths import location
from tinax._targets import is_key_dtype
from tinax.checkpointing import _host_copies, _loading_from, _orbax, _processes
from tinax.checkpointing._orbax import StatefulCheckpointableHandler


def _bounds(index: tuple[slice, ...], shape: tuple[int, ...]) -> Bounds:
    return tuple((s.indices(n)[0], s.indices(n)[1]) for s, n in zip(index, shape, strict=True))


@functools.cache
def _dtype_name(dtype: Any) -> str:
    return str(dtype)


def _array_data(value: jax.Array) -> jax.Array:
    # Orbax stores a typed PRNG key as its raw key data. (Looked up per dtype, not
    # per leaf: a load checks tens of thousands of leaves of a few dtypes.)
    if is_key_dtype(value.dtype):
        return jax.random.key_data(value)
    return value


def _host_parts(value: jax.Array, *, written_only: bool) -> list[tuple[Bounds, np.ndarray]]:
    """This process's parts of ``value`` as host arrays, one per distinct index.

    Only for what Orbax's host copies do not cover: typed PRNG keys (Orbax copies
    their key data, a new array, so the copy cannot be matched to the leaf; keys
    are a few bytes), and a loaded array whose reads tinax did not see. On an
    accelerator this is a device-to-host transfer. ``written_only`` keeps the
    replicas Orbax writes (replica 0).
    """
    if isinstance(value.sharding, jax.sharding.SingleDeviceSharding) and (
        value.is_fully_addressable
    ):
        return [(checksums.full_bounds(value.shape), np.asarray(value.addressable_data(0)))]
    parts: dict[Bounds, np.ndarray] = {}
    for shard in value.addressable_shards:
        if written_only and shard.replica_id != 0:
            continue
        bounds = _bounds(shard.index, value.shape)
        if bounds not in parts:
            parts[bounds] = np.asarray(shard.data)
    return list(parts.items())


def _is_scalar(leaf: Any) -> bool:
    return isinstance(leaf, int | float | complex | np.generic) and not isinstance(leaf, str)


# Digests of saved arrays run on these threads, beside Orbax's writes. xxhash
# releases the GIL while it hashes, so they do not hold up the caller's thread.
DIGEST_THREADS = 2
_digesters = ProcessPool(DIGEST_THREADS, "tinax-digest")
_registry_lock = threading.Lock()


class _SaveDigests:
    """The digests of one save's JAX arrays, made from the host copies Orbax writes.

    Each array is expected (by identity) before Orbax copies it; the copy's parts
    are kept as Orbax hands them over and digested on the digest threads once
    ``start`` is called, when the save call has returned: hashing beside the call
    took cores its caller was waiting on (Orbax's own copies, and on a shared host
    the other processes'), while Orbax's writes after the call, from the same host
    copies, last longer than the digests anyway. Arrays are known by their key path
    until ``finish``, which names them on the background thread.
    """

    def __init__(self) -> None:
        self.leaves: dict[int, tuple[Any, str, tuple[int, ...]]] = {}
        self.parts: dict[int, list[tuple[Bounds, concurrent.futures.Future[str]]]] = {}
        self.arrays: list[jax.Array] = []
        # Digests asked for before ``start``: each one's future and the values to digest.
        self._held: list[tuple[concurrent.futures.Future[str], Any]] | None = []
        self._lock = threading.Lock()

    def expect(self, path: Any, array: jax.Array) -> None:
        """Expects Orbax's host copy of ``array``, the leaf at key path ``path``."""
        key = len(self.leaves)
        self.leaves[key] = (path, _dtype_name(array.dtype), tuple(array.shape))
        self.arrays.append(array)
        with _registry_lock:
            _expected.setdefault(id(array), []).append((array, self, key))

    def copied(self, key: int, shape: tuple[int, ...], parts: Sequence[_orbax.HostPart]) -> None:
        seen = self.parts.setdefault(key, [])
        known = {bounds for bounds, _ in seen}
        with self._lock:
            for index, values in parts:
                bounds = _bounds(index, shape)
                if bounds not in known:
                    known.add(bounds)
                    seen.append((bounds, self._digest(values)))

    def _digest(self, values: Any) -> concurrent.futures.Future[str]:
        """The digest of ``values``, to come; held until ``start`` (under the lock)."""
        if self._held is None:
            return _digesters.executor().submit(checksums.digest, values)
        future: concurrent.futures.Future[str] = concurrent.futures.Future()
        self._held.append((future, values))
        return future

    def start(self) -> None:
        """Lets the digests run: those held, and every later one at once."""
        with self._lock:
            held, self._held = self._held, None
        if held:
            pool = _digesters.executor()
            for future, values in held:
                pool.submit(_settle, future, values)

    def forget(self) -> None:
        """Stops expecting this save's arrays (they were copied, or the save failed)."""
        with _registry_lock:
            for array in self.arrays:
                waiting = _expected.get(id(array))
                if waiting is None:
                    continue
                waiting[:] = [entry for entry in waiting if entry[1] is not self]
                if not waiting:
                    del _expected[id(array)]
        self.arrays = []

    def finish(self) -> dict[str, LeafRecord]:
        """Waits for the digests; the record of every array, by leaf key.

        Raises:
          RuntimeError: If Orbax wrote an array without the host copy tinax digests
            (an Orbax that works differently from the one tinax was written for).
        """
        self.start()
        self.forget()
        missing = sorted(_leaf_key(self.leaves[key][0]) for key in self.leaves.keys() - self.parts)
        if missing:
            raise RuntimeError(
                f"tinax could not checksum {len(missing)} array(s) ({', '.join(missing[:5])}): "
                "Orbax wrote them without the host copy tinax digests"
            )
        return {
            _leaf_key(path): LeafRecord(
                checksums.ARRAY,
                dtype,
                shape,
                tuple(Piece(bounds, digest.result()) for bounds, digest in self.parts[key]),
            )
            for key, (path, dtype, shape) in self.leaves.items()
        }


def _settle(future: concurrent.futures.Future[str], values: Any) -> None:
    """Digests ``values`` into ``future``."""
    try:
        future.set_result(checksums.digest(values))
    except BaseException as e:
        future.set_exception(e)


def _leaf_key(path: Any) -> str:
    """The key a leaf's record is filed under: its key path, spelt out."""
    return format_key(key_parts(path))


# Arrays a save expects Orbax to copy to the host, by identity (with the key of each
# in the save that expects it).
_expected: dict[int, list[tuple[jax.Array, _SaveDigests, int]]] = {}


def _on_host_copy(arrays: Sequence[Any], parts: Sequence[Sequence[_orbax.HostPart]]) -> None:
    """Orbax copied ``arrays`` to the host: hands each expected one's parts to its save."""
    for array, array_parts in zip(arrays, parts, strict=True):
        with _registry_lock:
            waiting = _expected.get(id(array))
            if not waiting or waiting[0][0] is not array:
                continue
            _, save, key = waiting.pop(0)
            if not waiting:
                del _expected[id(array)]
        save.copied(key, tuple(array.shape), array_parts)


def record_save(checkpointable: Any, *, primary: bool, own_storage: bool = False) -> SaveRecord:
    """Starts recording the checksums of a pytree being saved.

    Mutable values (NumPy arrays) and small ones are digested now, before the
    caller gets control back. JAX arrays are digested from the host copies Orbax
    makes to write them, on tinax's digest threads once the returned record's
    ``start_digests`` is called (when the save call has returned); call this before
    Orbax's save starts copying, and the returned record once Orbax has written the
    arrays.

    Args:
      checkpointable: The pytree being saved.
      primary: Whether this process writes the values Orbax writes once (NumPy
        arrays, scalars, strings): Orbax's primary host.
      own_storage: Whether this process saves to storage of its own (Orbax's
        ``primary_host=None``): it writes every shard it holds once, whatever its
        replica, not only replica 0.

    Returns:
      The record in the making; called, it finishes the digests and returns the
      record by leaf key. It must be called once, also when the save fails (it
      then raises).
    """
    _orbax.observe_host_copies(_on_host_copy)
    done: dict[str, LeafRecord] = {}
    arrays = _SaveDigests()
    try:
        for path, leaf in jax.tree_util.tree_flatten_with_path(checkpointable)[0]:
            if isinstance(leaf, jax.Array):
                if is_key_dtype(leaf.dtype):
                    data = _array_data(leaf)
                    pieces = tuple(
                        Piece(b, checksums.digest(v))
                        for b, v in _host_parts(data, written_only=not own_storage)
                    )
                    done[_leaf_key(path)] = LeafRecord(
                        checksums.ARRAY, _dtype_name(data.dtype), tuple(data.shape), pieces
                    )
                else:
                    arrays.expect(path, leaf)
                continue
            if not primary:
                continue
            key = _leaf_key(path)
            if isinstance(leaf, np.ndarray):
                piece = Piece(checksums.full_bounds(leaf.shape), checksums.digest(leaf))
                done[key] = LeafRecord(checksums.ARRAY, str(leaf.dtype), leaf.shape, (piece,))
            elif isinstance(leaf, str):
                piece = Piece((), checksums.string_digest(leaf))
                done[key] = LeafRecord(checksums.STRING, "", (), (piece,))
            elif _is_scalar(leaf):
                # Orbax stores a scalar as np.asarray of it.
                stored = np.asarray(leaf)
                piece = Piece((), checksums.digest(stored))
                done[key] = LeafRecord(checksums.ARRAY, str(stored.dtype), (), (piece,))
    except BaseException:
        arrays.forget()
        raise
    return SaveRecord(done, arrays)


class SaveRecord:
    """One save's checksum record in the making (``record_save``)."""

    def __init__(self, done: dict[str, LeafRecord], arrays: _SaveDigests) -> None:
        self._done = done
        self._arrays = arrays

    def start_digests(self) -> None:
        """Lets the digests of the JAX arrays' host copies run from now on."""
        self._arrays.start()

    def __call__(self) -> dict[str, LeafRecord]:
        """Waits for every digest; the record by leaf key.

        Raises:
          RuntimeError: If Orbax wrote an array without the host copy tinax digests.
        """
        self._done.update(self._arrays.finish())
        return self._done


def write_record(directory: str, record: dict[str, LeafRecord], process_index: int) -> None:
    """Writes one process's record into a checkpointable's directory, durably."""
    where = location(directory) / names.CHECKSUMS_DIR / names.checksum_file_name(process_index)
    where.write_new(checksums.encode(record, process_index))


def _loaded_parts(value: Any) -> tuple[list[tuple[Bounds, np.ndarray]], Any] | None:
    """The parts of a loaded array at hand, and its (data) array; ``None`` if not an array."""
    if isinstance(value, jax.Array):
        data = _array_data(value)
        return _host_parts(data, written_only=False), data
    if isinstance(value, np.ndarray):
        return [(checksums.full_bounds(value.shape), value)], value
    return None


def _check_leaf(key: str, record: LeafRecord, value: Any) -> str | None:
    """What is wrong with one loaded leaf, or ``None``."""
    loaded = _loaded_parts(value)
    if loaded is None:
        if checksums.check_value(record, value) is False:
            return f"leaf {key}: the stored value is corrupt: it does not match its checksum"
        return None
    parts, data = loaded
    if _dtype_name(data.dtype) != record.dtype or tuple(data.shape) != record.shape:
        return None  # converted on load at the target's request: not comparable
    bad, uncovered = checksums.check_pieces(record, parts)
    if uncovered and isinstance(data, jax.Array) and data.is_fully_addressable:
        # The load's shards cut across the pieces that were saved: check them whole.
        more, _ = checksums.check_pieces(
            LeafRecord(record.kind, record.dtype, record.shape, tuple(uncovered)),
            [(checksums.full_bounds(data.shape), np.asarray(data))],
        )
        bad += more
    # Pieces held by other processes are checked there.
    return checksums.mismatch_message(key, record, bad) if bad else None


def _corrupt(where: Location, problems: Sequence[str]) -> CorruptDataError:
    return CorruptDataError(
        f"checkpoint {str(where.parent)!r}: checkpointable {where.name!r}: " + "; ".join(problems)
    )


def _loaded_records(directory: str) -> tuple[Location, dict[str, LeafRecord] | None]:
    """Where Orbax loads a checkpointable from, and the checksums recorded for it
    (through its opened checkpoint where there is one)."""
    item = _loading_from.opened_item(directory)
    if item is None:
        where = location(directory)
        return where, checksums.read_directory_checksums(where)
    return item.directory, checksums.read_checksums(item)


def verify_loaded(directory: str, loaded: Any, checked: frozenset[str] = frozenset()) -> None:
    """Checks a loaded pytree against the checksums saved with it (if it has any).

    JAX arrays whose keys are in ``checked`` were checked on the host while Orbax
    read them (``_LoadCheck``) and are not looked at again; any other array is
    read back from its devices and checked here.

    Raises:
      CorruptDataError: If a value's bytes differ from what was saved, naming the
        checkpoint, the checkpointable and the leaf.
      ValueError: If the checksum record itself is unreadable.
    """
    where, records = _loaded_records(directory)
    if records is None:
        return
    problems = []
    for path, value in jax.tree_util.tree_flatten_with_path(loaded)[0]:
        key = format_key(key_parts(path))
        record = records.get(key)
        if record is None or (key in checked and isinstance(value, jax.Array)):
            continue
        problem = _check_leaf(key, record, value)
        if problem is not None:
            problems.append(problem)
    if problems:
        raise _corrupt(where, problems)


def _inside(outer: Bounds, inner: Bounds) -> bool:
    return all(o0 <= i0 and i1 <= o1 for (o0, o1), (i0, i1) in zip(outer, inner, strict=True))


def _overlap(a: Bounds, b: Bounds) -> Bounds | None:
    both = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b, strict=True))
    return both if all(lo < hi for lo, hi in both) else None


def _window(bounds: Bounds, within: Bounds) -> tuple[slice, ...]:
    return tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(bounds, within, strict=True))


class _LoadCheck:
    """Checks the arrays of one checkpointable's load part by part, as Orbax reads them.

    A saved piece that lies within a part read is digested there. A piece that
    the load's parts cut across (a checkpoint saved on one mesh and loaded onto
    another) is put together from the parts that cover it, in a buffer of the
    piece's size, and digested when it is whole. A piece that does not match
    fails the load before the part that completes it reaches a device.
    """

    def __init__(
        self, where: Location, tree: pytree.PyTreeLayout, records: dict[str, LeafRecord]
    ) -> None:
        self.where = where
        self.arrays: dict[str, tuple[str, LeafRecord]] = {}
        base = str(where).rstrip("/")
        for leaf in tree.leaves:
            record = records.get(leaf.key)
            if record is not None and record.kind == checksums.ARRAY and record.pieces:
                path = f"{base}/{pytree.storage_path(leaf.param)}".rstrip("/")
                self.arrays[path] = (leaf.key, record)
        self.checked: set[str] = set()
        self._lock = threading.Lock()
        # The tasks that read this checkpointable's arrays (on the load's event loop),
        # and what failed the load, once something did.
        self.tasks: set[asyncio.Task[Any]] = set()
        self.failed: BaseException | None = None
        self._failing: set[asyncio.Task[Any]] = set()
        # Pieces being put together: (key, bounds) -> (buffer, elements still missing).
        self._partial: dict[tuple[str, Bounds], tuple[np.ndarray, int]] = {}

    def check(self, path: str, shape: tuple[int, ...], bounds: Bounds, values: np.ndarray) -> None:
        """Checks one part read (``bounds`` of the stored array at ``path``)."""
        found = self.arrays.get(path.rstrip("/"))
        if found is None:
            return
        key, record = found
        if record.shape != shape or _dtype_name(values.dtype) != record.dtype:
            return
        bad: list[checksums.Mismatch] = []
        for piece in record.pieces:
            if _inside(bounds, piece.bounds):
                digest = checksums.digest(values[_window(piece.bounds, bounds)])
                if digest != piece.digest:
                    bad.append(checksums.Mismatch(piece.bounds, piece.digest, digest))
                continue
            common = _overlap(bounds, piece.bounds)
            if common is None:
                continue
            whole = self._fill(key, piece, common, values[_window(common, bounds)])
            if whole is not None:
                digest = checksums.digest(whole)
                if digest != piece.digest:
                    bad.append(checksums.Mismatch(piece.bounds, piece.digest, digest))
        with self._lock:
            self.checked.add(key)
        if bad:
            raise _corrupt(self.where, [checksums.mismatch_message(key, record, bad)])

    def starting(self) -> None:
        """A read of one of the arrays is starting, in the current task.

        Raises:
          RuntimeError: If the load has failed already: the read is not made. The
            load's first failure is chained to it, so that whichever read's error
            Orbax reports, what failed the load is in it.
        """
        task = asyncio.current_task()
        if task is not None:
            with self._lock:
                self.tasks.add(task)
        if self.failed is not None:
            raise RuntimeError(f"not read: the load failed: {self.failed}") from self.failed

    async def settle(self, error: BaseException) -> None:
        """A read is failing with ``error`` (the first sets what failed the load):
        returns once no read still under way on its event loop is one that has not
        failed.

        Orbax stops waiting for the other reads once one fails and closes their
        event loop with them suspended; each then printed a traceback ("Exception
        ignored in coroutine", "Event loop is closed") after the error itself.
        Reads that have not started fail at once (``starting``) and settle too;
        those under way are waited for, so the load fails once, cleanly, whichever
        read's failure Orbax sees first.
        """
        me, loop = asyncio.current_task(), asyncio.get_running_loop()
        with self._lock:
            if self.failed is None:
                self.failed = error
            if me is not None:
                self._failing.add(me)
        while True:
            # Reads scheduled but not yet started get to start, and fail.
            for _ in range(3):
                await asyncio.sleep(0)
            with self._lock:
                running = [
                    t
                    for t in self.tasks
                    if t not in self._failing and not t.done() and t.get_loop() is loop
                ]
            if not running:
                return
            await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)

    def unreadable(self, path: str, error: BaseException) -> CorruptDataError | None:
        """The error for a read of the array at ``path`` that failed: a chunk that does
        not decode is the leaf's corruption; any other failure is reported as it is."""
        found = self.arrays.get(path.rstrip("/"))
        if found is None:
            return None
        complaint = checksums.undecodable(str(error))
        if complaint is None:
            return None
        return _corrupt(self.where, [checksums.undecodable_message(found[0], complaint)])

    def _fill(
        self, key: str, piece: Piece, common: Bounds, values: np.ndarray
    ) -> np.ndarray | None:
        """Copies ``values`` into the piece's buffer; the buffer once the piece is whole."""
        with self._lock:
            buffer, missing = self._partial.get((key, piece.bounds), (None, 0))
            if buffer is None:
                buffer = np.empty([b - a for a, b in piece.bounds], values.dtype)
                self._partial[(key, piece.bounds)] = (buffer, buffer.size)
        # Parts of one array do not overlap: each writes its own region, and counts
        # it only once it is written, so the last to count finds the piece whole.
        buffer[_window(common, piece.bounds)] = values
        with self._lock:
            held, missing = self._partial[(key, piece.bounds)]
            missing -= values.size
            if missing != 0:
                self._partial[(key, piece.bounds)] = (held, missing)
                return None
            del self._partial[(key, piece.bounds)]
            return held


# The loads in progress, by the path of each array they check.
_loads: dict[str, _LoadCheck] = {}


class _ReadHooks:
    """Hands each read Orbax makes of an array to the load that checks it, if any."""

    @staticmethod
    def _load(path: str) -> _LoadCheck | None:
        with _registry_lock:
            return _loads.get(path.rstrip("/"))

    def starting(self, path: str) -> None:
        load = self._load(path)
        if load is not None:
            load.starting()

    async def check(
        self, path: str, shape: tuple[int, ...], bounds: Bounds, values: np.ndarray
    ) -> None:
        load = self._load(path)
        if load is not None:
            await asyncio.to_thread(load.check, path, shape, bounds, values)

    def unreadable(self, path: str, error: BaseException) -> BaseException | None:
        load = self._load(path)
        return None if load is None else load.unreadable(path, error)

    async def failing(self, path: str, error: BaseException) -> None:
        load = self._load(path)
        if load is not None:
            await load.settle(error)


_READ_HOOKS = _ReadHooks()


def _start_load_check(directory: str) -> _LoadCheck | None:
    """Starts checking the arrays Orbax reads from a checkpointable (if it has checksums)."""
    where, records = _loaded_records(directory)
    if records is None:
        return None
    _orbax.check_host_reads(_READ_HOOKS)
    item = _loading_from.opened_item(directory)
    load = _LoadCheck(
        where, pytree.parse_layout(where) if item is None else pytree.read_layout(item), records
    )
    with _registry_lock:
        for path in load.arrays:
            _loads[path] = load
    return load


def _end_load_check(load: _LoadCheck | None) -> None:
    if load is None:
        return
    with _registry_lock:
        for path in load.arrays:
            if _loads.get(path) is load:
                del _loads[path]


def record_files(directory: str) -> dict[str, LeafRecord]:
    """Checksums of the state files this process wrote into ``directory``."""
    index, count = jax.process_index(), jax.process_count()
    name = names.iterator_file_name(index, count)
    where = location(directory) / name
    if not where.is_file():
        return {}
    data = files.read_bytes(
        where, what="a Grain iterator state", max_bytes=files.MAX_METADATA_BYTES
    )
    return {name: LeafRecord(checksums.FILE, "", (), (Piece((), checksums.digest(data)),))}


def verify_files(directory: str) -> None:
    """Checks the state files of a checkpointable against its record, if it has one.

    Raises:
      CorruptDataError: If a recorded file is damaged, naming it.
    """
    where, records = _loaded_records(directory)
    if records is None:
        return
    item = _loading_from.opened_item(directory)
    problems = (
        checksums.check_directory_files(where, records)
        if item is None
        else checksums.check_files(item, records)
    )
    if problems:
        raise CorruptDataError(
            f"checkpoint {str(where.parent)!r}: checkpointable {where.name!r}: "
            + "; ".join(problems)
        )


class ChecksummedStatefulHandler(StatefulCheckpointableHandler):
    """Orbax's handler of stateful checkpointables (Grain iterators), with checksums.

    The state files the object writes are digested after it wrote them, before the
    checkpoint commits; a load checks them before the object reads its state, so a
    damaged file leaves the caller's iterator untouched.
    """

    async def save(self, directory: Any, checkpointable: Any) -> Awaitable[None]:
        inner = await super().save(directory, checkpointable)

        async def _complete() -> None:
            await inner
            path = str(await directory.await_creation())
            record = await asyncio.to_thread(record_files, path)
            if record:
                await asyncio.to_thread(write_record, path, record, jax.process_index())

        return _complete()

    async def load(self, directory: Any, abstract_checkpointable: Any = None) -> Awaitable[Any]:
        # Nothing starts until the load is awaited (see ChecksummedPyTreeHandler.load).
        start = super().load

        async def _verified() -> Any:
            await asyncio.to_thread(verify_files, str(directory))
            return await (await start(directory, abstract_checkpointable))

        return _Deferred(_verified)


class ChecksummedPyTreeHandler(ocp_handlers.PyTreeHandler):
    """Orbax's pytree handler, with tinax's checksums written on save and checked on load."""

    async def save(self, directory: Any, checkpointable: Any) -> Awaitable[None]:
        primary_host = self._multiprocessing_options.primary_host
        finish = record_save(
            checkpointable,
            primary=_processes.is_primary(primary_host),
            own_storage=primary_host is None,
        )
        # Handed to _background_save, which writes the record at the right moment.
        self._records_to_write[id(directory)] = finish
        try:
            with (
                _orbax.write_while_copying(_host_copies.write_batch_bytes(checkpointable)),
                _orbax.encode_threads(_host_copies.encode_threads(checkpointable)),
            ):
                inner = await super().save(directory, checkpointable)
        except BaseException:
            self._records_to_write.pop(id(directory), None)
            with contextlib.suppress(RuntimeError):
                finish()
            raise

        async def _complete() -> None:
            try:
                await inner
            except BaseException:
                # Orbax's failure is the one to report; the digests end all the same.
                self._records_to_write.pop(id(directory), None)
                with contextlib.suppress(RuntimeError):
                    await asyncio.to_thread(finish)
                raise

        # Made when awaited: when another checkpointable's save call fails, Orbax
        # drops this one unawaited.
        return _Deferred(_complete)

    @property
    def _records_to_write(self) -> dict[int, SaveRecord]:
        """The saves started and not yet in the background, by their directory's id."""
        records: dict[int, SaveRecord] | None
        records = self.__dict__.get("_tinax_records")
        if records is None:
            records = self.__dict__["_tinax_records"] = {}
        return records

    async def _background_save(self, directory: Any, *, commit_futures: Any, **kwargs: Any) -> None:
        """Orbax's background save, with this process's record written before its
        commit barrier.

        Orbax's primary process commits (renames the temporary directory) as soon as
        its own handlers are done, right after every process has reached that
        barrier; a record another process wrote after the barrier would land in a
        directory already renamed away. So each process writes its record once its
        arrays are written (every one digested from its host copy) and before the
        barrier, which makes it as atomic as the rest of the checkpoint.
        """
        finish = self._records_to_write.pop(id(directory), None)
        if finish is not None:
            # The save call has handed control back: the digests run beside Orbax's
            # writes from here, not while the caller waits.
            finish.start_digests()
            try:
                await asyncio.gather(*(asyncio.to_thread(f.result) for f in commit_futures))
            except BaseException:
                pass  # Orbax's own wait below reports the failure and cleans up
            else:
                record = await asyncio.to_thread(finish)
                path = await directory.await_creation()
                await asyncio.to_thread(write_record, str(path), record, jax.process_index())
        await super()._background_save(directory, commit_futures=commit_futures, **kwargs)
        if self._multiprocessing_options.primary_host is None and _processes.process_count() > 1:
            # A host part (``tinax._format.hostparts``): this process's chunks alone are
            # stored, which its metadata says before the checkpoint commits.
            path = await directory.await_creation()
            await asyncio.to_thread(hostparts.mark_chunks, location(str(path)), False)

    async def load(self, directory: Any, abstract_checkpointable: Any = None) -> Awaitable[Any]:
        # Orbax awaits each checkpointable's load in turn and drops the rest once one
        # fails: nothing starts until the load is awaited, so a dropped one leaves no
        # coroutine that was never awaited and no check registered behind.
        start = super().load

        async def _checked() -> Any:
            check = await asyncio.to_thread(_start_load_check, str(directory))
            try:
                loaded = await (await start(directory, abstract_checkpointable))
            finally:
                _end_load_check(check)
            checked = frozenset(check.checked) if check is not None else frozenset()
            await asyncio.to_thread(verify_loaded, str(directory), loaded, checked)
            return loaded

        return _Deferred(_checked)


class _Deferred:
    """An awaitable whose coroutine is made when (and only if) it is awaited."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make

    def __await__(self) -> Any:
        return self._make().__await__()


# The checkpoint is Orbax's pytree format plus one directory Orbax ignores. Recording
# Orbax's handler name in _CHECKPOINT_METADATA keeps it loadable by Orbax alone, also
# without restore targets.
ChecksummedPyTreeHandler.__module__ = ocp_handlers.PyTreeHandler.__module__
ChecksummedPyTreeHandler.__qualname__ = ocp_handlers.PyTreeHandler.__qualname__
ChecksummedStatefulHandler.__module__ = StatefulCheckpointableHandler.__module__
ChecksummedStatefulHandler.__qualname__ = StatefulCheckpointableHandler.__qualname__
