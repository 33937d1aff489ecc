"""Pytree checkpointables saved with checksums of their values, and checked when loaded.

``ChecksummedPyTreeHandler`` is Orbax's ``PyTreeHandler`` plus tinax's integrity
record (``tinax._format.checksums``): a save digests every value it writes, while
Orbax writes it, and puts the record in the checkpointable's directory before the
checkpoint commits; a load digests what Orbax read and refuses a value whose bytes
differ, naming the checkpoint, the checkpointable and the leaf.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import jax
import numpy as np
from orbax.checkpoint.experimental.v1 import handlers as ocp_handlers

from tinax._format import checksums, files, names
from tinax._format.checksums import Bounds, CorruptDataError, LeafRecord, Piece
from tinax._format.keys import format_key, key_parts
from tinax._paths import location
from tinax._targets import is_key_dtype
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

    ``written_only`` keeps the replicas Orbax writes (replica 0). On CPU the host
    arrays are views of the device buffers, and JAX does not reuse a buffer a view
    holds, so digesting them later is safe even if the caller donates the array.
    Each is read through a new array, so a host copy (off CPU) is not cached on the
    caller's.
    """
    if isinstance(value.sharding, jax.sharding.SingleDeviceSharding) and (
        value.is_fully_addressable
    ):
        # One device holds all of it: the common case, and three times cheaper to
        # ask for than its shards (a save or load of 10,000 leaves asks 10,000 times).
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


def record_save(checkpointable: Any, *, primary: bool) -> Callable[[], dict[str, LeafRecord]]:
    """Starts recording the checksums of a pytree being saved.

    Mutable values (NumPy arrays) and small ones are digested now, before the
    caller gets control back; JAX arrays, which cannot change, are taken as host
    views now and digested by the returned function, while Orbax writes.

    Args:
      checkpointable: The pytree being saved.
      primary: Whether this process writes the values Orbax writes once (NumPy
        arrays, scalars, strings): Orbax's primary host.

    Returns:
      A function that finishes the digests and returns the record by leaf key.
    """
    done: dict[str, LeafRecord] = {}
    later: list[tuple[str, str, tuple[int, ...], list[tuple[Bounds, np.ndarray]]]] = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(checkpointable)[0]:
        key = format_key(key_parts(path))
        if isinstance(leaf, jax.Array):
            data = _array_data(leaf)
            parts = _host_parts(data, written_only=True)
            later.append((key, _dtype_name(data.dtype), tuple(data.shape), parts))
        elif not primary:
            continue
        elif isinstance(leaf, np.ndarray):
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

    def finish() -> dict[str, LeafRecord]:
        for key, dtype, shape, parts in later:
            pieces = tuple(Piece(b, checksums.digest(values)) for b, values in parts)
            done[key] = LeafRecord(checksums.ARRAY, dtype, shape, pieces)
        return done

    return finish


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


def verify_loaded(directory: str, loaded: Any) -> None:
    """Checks a loaded pytree against the checksums saved with it (if it has any).

    Raises:
      CorruptDataError: If a value's bytes differ from what was saved, naming the
        checkpoint, the checkpointable and the leaf.
      ValueError: If the checksum record itself is unreadable.
    """
    where = location(directory)
    records = checksums.read_checksums(where)
    if records is None:
        return
    problems = []
    for path, value in jax.tree_util.tree_flatten_with_path(loaded)[0]:
        key = format_key(key_parts(path))
        record = records.get(key)
        if record is None:
            continue
        problem = _check_leaf(key, record, value)
        if problem is not None:
            problems.append(problem)
    if problems:
        raise CorruptDataError(
            f"checkpoint {str(where.parent)!r}: checkpointable {where.name!r}: "
            + "; ".join(problems)
        )


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
    where = location(directory)
    records = checksums.read_checksums(where)
    if records is None:
        return
    problems = checksums.check_files(where, records)
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
        await asyncio.to_thread(verify_files, str(directory))
        return await super().load(directory, abstract_checkpointable)


class ChecksummedPyTreeHandler(ocp_handlers.PyTreeHandler):
    """Orbax's pytree handler, with tinax's checksums written on save and checked on load."""

    async def save(self, directory: Any, checkpointable: Any) -> Awaitable[None]:
        finish = record_save(
            checkpointable,
            primary=jax.process_index() == (self._multiprocessing_options.primary_host or 0),
        )
        inner = await super().save(directory, checkpointable)

        async def _complete() -> None:
            record = await asyncio.to_thread(finish)
            path = await directory.await_creation()
            # Written before Orbax's final barrier and commit: as atomic as the rest.
            await asyncio.to_thread(write_record, str(path), record, jax.process_index())
            await inner

        return _complete()

    async def load(self, directory: Any, abstract_checkpointable: Any = None) -> Awaitable[Any]:
        # Orbax awaits each checkpointable's load in turn and drops the rest when one
        # fails: nothing is made until the load is awaited, so a dropped one leaves no
        # coroutine that was never awaited behind.
        self.validate_abstract_leaves_handleable(abstract_checkpointable)
        start = super().load

        async def _checked() -> Any:
            loaded = await (await start(directory, abstract_checkpointable))
            await asyncio.to_thread(verify_loaded, str(directory), loaded)
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
