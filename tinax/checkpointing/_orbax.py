"""The private Orbax modules tinax relies on, each behind one function.

(Over 500 lines: every reach into Orbax's private modules is here and nowhere else,
so that a new Orbax release is checked against one file.)

Orbax's public V1 API has no way to read the active context, to ask whether a
leaf type has a standard handler, or to learn how long its processes wait for each
other, and does not export the handler of stateful checkpointables (Grain
iterators); it has no hook on the host copies it saves from or the host reads it
loads from, and no way to start writing before the whole state is on the host;
a save of one process of a job to a directory of its own is refused, NumPy arrays
and scalars are written by process 0 alone whatever the primary host, and the merge
of the processes' array stores is not exposed. These are the only places tinax
reaches into Orbax's private modules.
``pyproject.toml`` bounds Orbax to the minor release they were written against.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
from orbax.checkpoint import v1 as ocp
from orbax.checkpoint.experimental.v1._src.handlers.stateful_checkpointable_handler import (
    StatefulCheckpointableHandler,
)

__all__ = [
    "StatefulCheckpointableHandler",
    "active_context",
    "allow_own_directories",
    "check_host_reads",
    "coordination_timeout",
    "current_operation",
    "encode_threads",
    "has_standard_leaf_handler",
    "merge_process_stores",
    "observe_host_copies",
    "recorded_sharding",
    "wait_for_writers",
    "write_host_values_under",
    "write_while_copying",
]


def active_context() -> ocp.Context:
    """The Orbax context the caller made active with ``with ocp.Context(...)``, or a default one."""
    from orbax.checkpoint.experimental.v1._src.context import context

    return context.get_context()


@functools.cache
def _standard_leaf_handlers() -> Any:
    from orbax.checkpoint.experimental.v1._src.serialization import registry

    return registry.StandardLeafHandlerRegistry()


def has_standard_leaf_handler(leaf_type: type) -> bool:
    """Whether Orbax's standard leaf handlers store leaves of ``leaf_type``."""
    return bool(_standard_leaf_handlers().is_handleable(leaf_type))


def recorded_sharding(record: str) -> Any:
    """The ``jax.sharding`` Orbax's ``_sharding`` record of an array describes (its JSON
    string), as Orbax restores a target without one; ``None`` if it names devices or a
    kind of sharding this process does not have."""
    from orbax.checkpoint._src.metadata import sharding as sharding_metadata

    try:
        return sharding_metadata.from_serialized_string(record).to_jax_sharding()
    except Exception:
        return None


def coordination_timeout() -> float:
    """Seconds Orbax's processes wait for each other at a barrier before giving up.

    Read at every call: tinax's own cross-process waits use the same bound, so a
    job that lowers Orbax's lowers tinax's too.
    """
    from orbax.checkpoint.experimental.v1._src.synchronization import multihost

    return float(multihost.coordination_timeout())


# A saved array's part on the host: its index in the global array and its values.
HostPart = tuple[tuple[slice, ...], np.ndarray]
_hooks_lock = threading.Lock()


def observe_host_copies(
    observer: Callable[[Sequence[Any], Sequence[Sequence[HostPart]]], None],
) -> None:
    """Hands ``observer`` every host copy Orbax makes of the arrays it saves.

    Orbax copies each array it saves from its devices to the host once
    (``replica_slices.transfer_arrays_to_host``), and writes from those copies;
    ``observer(arrays, parts)`` is called right after each such copy, with the
    arrays copied and, for each, the parts this process writes (each part's index
    in the global array and its host values). Installed once per process; a second
    call with the same observer does nothing.
    """
    from orbax.checkpoint._src.serialization import replica_slices

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def transfer(arrays: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
            on_host = original(arrays, *args, **kwargs)
            observer(
                arrays,
                [
                    [(tuple(part.index), part.unsliced_data) for part in slices.replica_slices]
                    for slices in on_host
                ],
            )
            return on_host

        return transfer

    _replace(replica_slices, "transfer_arrays_to_host", "tinax_observer", observer, wrap)


def _replace(owner: Any, name: str, marker: str, value: object, wrap: Callable[[Any], Any]) -> None:
    """Puts ``wrap(original)`` in place of Orbax's ``owner.name``, tagged with ``value``
    under ``marker``: once per value (the same value again does nothing), and always
    around Orbax's own function, never around an earlier wrapper of tinax's."""
    with _hooks_lock:
        current = getattr(owner, name)
        if getattr(current, marker, None) is value:
            return
        wrapper = wrap(getattr(current, "__wrapped__", current))
        setattr(wrapper, marker, value)
        setattr(owner, name, wrapper)


class HostReads(Protocol):
    """What sees the reads of arrays Orbax loads (``check_host_reads``).

    ``path`` is the stored array's path: its directory, or the OCDBT store's
    directory plus its name in the store.
    """

    def starting(self, path: str) -> None:
        """A read of the array at ``path`` is starting, in the current task; what
        this raises fails the read without reading."""

    async def check(
        self,
        path: str,
        shape: tuple[int, ...],
        bounds: tuple[tuple[int, int], ...],
        values: np.ndarray,
    ) -> None:
        """A part of the array (of stored ``shape``) was read: ``bounds`` of it, as
        stored; what this raises fails the read."""

    def unreadable(self, path: str, error: BaseException) -> BaseException | None:
        """The error to raise instead of ``error`` (tensorstore's), a read that
        failed, or ``None`` to raise it as it is."""

    async def failing(self, path: str, error: BaseException) -> None:
        """The read is about to fail with ``error``."""


def _array_path(t: Any) -> str | None:
    """The path of the stored array ``t`` reads (see ``HostReads``)."""
    kvstore = t.kvstore
    if kvstore is None:
        return None
    return str(kvstore.path if kvstore.base is None else kvstore.base.path + kvstore.path)


def check_host_reads(hooks: HostReads) -> None:
    """Has ``hooks`` see every part of an array Orbax reads, on the host, before
    Orbax puts it on a device.

    Orbax reads each part of an array a device needs into host memory
    (``serialization._read_shard``), then copies it to the device. Each read
    tells ``hooks.starting`` first; ``hooks.check`` then sees the part read, on
    the bytes as stored (before a cast the restore target asked for; a read that
    tensorstore converts is checked from a second read of the stored bytes), and
    what it raises fails the load. A read that fails (a chunk that does not
    decode) fails with what ``hooks.unreadable`` makes of it, if anything. Before
    any read fails, ``hooks.failing`` is awaited. Installed once per process.
    """
    from orbax.checkpoint._src.serialization import serialization

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        async def read_shard(t: Any, *, dtype: Any, **kwargs: Any) -> np.ndarray:
            path = _array_path(t)
            if path is None:
                return await original(t, dtype=dtype, **kwargs)
            try:
                hooks.starting(path)
            except Exception as e:
                await hooks.failing(path, e)
                raise
            try:
                values = await original(t, dtype=None, **kwargs)
            except Exception as e:
                instead = hooks.unreadable(path, e)
                await hooks.failing(path, instead or e)
                if instead is not None:
                    raise instead from e
                raise
            requested, restricted = kwargs["requested_domain"], kwargs["restricted_domain"]
            if requested == restricted:
                stored, checked = t, values
                base = getattr(t, "base", None)
                try:
                    if base is not None and base.dtype != t.dtype and base.domain == t.domain:
                        # The target asked for another dtype, which tensorstore
                        # converts as it reads: the stored bytes are read again to
                        # be checked.
                        stored = base
                        checked = await base[restricted].read()
                    stored_path = _array_path(stored)
                    if stored_path is not None:
                        bounds = tuple(
                            zip(requested.inclusive_min, requested.exclusive_max, strict=True)
                        )
                        await hooks.check(stored_path, tuple(stored.shape), bounds, checked)
                except Exception as e:
                    await hooks.failing(path, e)
                    raise
            if dtype is not None and values.dtype != dtype:
                values = await asyncio.to_thread(values.astype, dtype, copy=False)
            return values

        return read_shard

    _replace(serialization, "_read_shard", "tinax_hooks", hooks, wrap)


# Orbax asks for every leaf's storage options twice per save, in the save call;
# a model repeats a few shapes many times.
@functools.lru_cache(maxsize=4096)
def chunk_shape(
    global_shape: tuple[int, ...], write_shape: tuple[int, ...], dtype: Any, target_bytes: int
) -> tuple[int, ...]:
    """The chunk shape Orbax chooses for a shard of ``write_shape`` and a chunk size."""
    from orbax.checkpoint._src.arrays import subchunking

    return tuple(
        subchunking.choose_chunk_shape(global_shape, write_shape, np.dtype(dtype), target_bytes)
    )


# The bytes of arrays a save hands to its writer at a time (``write_while_copying``),
# or ``None``: Orbax's own order, every array on the host before the first write.
_WRITE_BATCH_BYTES: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "tinax_write_batch_bytes", default=None
)


@contextlib.contextmanager
def write_while_copying(batch_bytes: int | None) -> Iterator[None]:
    """Has Orbax's saves started in this block (this task and the tasks it starts)
    write each batch of about ``batch_bytes`` of arrays as soon as that batch is on
    the host, while the next batches are still being copied.

    Orbax's save call copies every array it saves from its devices to the host, and
    only once the whole state is there does its background thread start writing.
    Here the background thread starts with the call, and writes batch after batch
    (each its own OCDBT transaction, as Orbax writes arrays it copies in the
    background) while the call goes on copying. The call still returns only once
    every array is on the host, so a training step may donate the arrays as soon as
    it has returned, and what is written is what Orbax writes. The writes wait for
    the checkpoint's directories: for them to run during the copy, the save's
    context must make the directories in the call (``async_options.
    create_directories_asynchronously`` off). ``None`` (or a save that copies some
    arrays in the background, through pinned host memory, or through a dispatcher)
    keeps Orbax's own order.
    """
    if batch_bytes is not None and batch_bytes <= 0:
        raise ValueError(f"batch_bytes must be positive, got {batch_bytes}")
    _install_write_while_copying()
    token = _WRITE_BATCH_BYTES.set(batch_bytes)
    try:
        yield
    finally:
        _WRITE_BATCH_BYTES.reset(token)


def _install_write_while_copying() -> None:
    from orbax.checkpoint._src.serialization import jax_array_handlers

    with _hooks_lock:
        current = jax_array_handlers._serialize_arrays_batches_without_dispatcher
        if getattr(current, "tinax_batches", False):
            return
        original = current
        signature = inspect.signature(original)

        @functools.wraps(original)
        def serialize(*args: Any, **kwargs: Any) -> Any:
            batch_bytes = _WRITE_BATCH_BYTES.get()
            given = signature.bind(*args, **kwargs).arguments
            if (
                batch_bytes is None
                or not given["prioritized"]
                or given["deprioritized"]
                or given["enable_pinned_host_transfer"]
            ):
                return original(*args, **kwargs)
            return _serialize_while_copying(batch_bytes, given)

        serialize.tinax_batches = True  # type: ignore[attr-defined]
        jax_array_handlers._serialize_arrays_batches_without_dispatcher = serialize


def batch_bounds(sizes: Sequence[int], batch_bytes: int) -> list[tuple[int, int]]:
    """Consecutive ``(start, stop)`` runs of items whose ``sizes`` add up to at least
    ``batch_bytes`` each (the last one to what is left)."""
    bounds: list[tuple[int, int]] = []
    start = total = 0
    for i, size in enumerate(sizes):
        total += size
        if total >= batch_bytes:
            bounds.append((start, i + 1))
            start, total = i + 1, 0
    if start < len(sizes):
        bounds.append((start, len(sizes)))
    return bounds


# What the save call hands its writer after the last batch, or when its copying failed.
_COPIED = object()
_COPY_FAILED = object()


def _serialize_while_copying(batch_bytes: int, given: dict[str, Any]) -> Any:
    """``_serialize_arrays_batches_without_dispatcher`` with the writes of each batch
    started while the next batches are copied (``write_while_copying``)."""
    from orbax.checkpoint._src.futures import future
    from orbax.checkpoint._src.multihost import multihost
    from orbax.checkpoint._src.serialization import jax_array_handlers as handlers
    from orbax.checkpoint._src.serialization import replica_slices, types
    from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils

    arrays, infos, args = (list(column) for column in zip(*given["prioritized"], strict=True))
    callback = given["callback"]
    use_replica_parallel = given["use_replica_parallel"]
    metadata_store = given["array_metadata_store"]
    batches = batch_bounds([int(a.nbytes) for a in arrays], batch_bytes)

    def copy(start: int, stop: int) -> Any:
        # Looked up at each call, like Orbax's own, so that observers see each copy.
        on_host = replica_slices.transfer_arrays_to_host(
            arrays[start:stop],
            given["replica_id"],
            use_replica_parallel,
            min_slice_bytes_for_replica_parallel=given["min_slice_bytes_for_replica_parallel"],
            max_replicas_for_replica_parallel=given["max_replicas_for_replica_parallel"],
        )
        handlers._on_batch_callback(infos[start:stop], callback.on_transfer_end)
        return on_host

    # Every copy starts now, as Orbax starts them; each batch then waits for its own.
    # Orbax's per-batch call asks again, and a copy under way is not made twice.
    for array in arrays:
        slices = replica_slices.get_replica_slices(
            array,
            given["replica_id"],
            use_replica_parallel,
            given["min_slice_bytes_for_replica_parallel"],
            given["max_replicas_for_replica_parallel"],
        )
        for piece in slices.replica_slices:
            if piece.slice_args is None:
                piece.data().copy_to_host_async()
    copied: queue.SimpleQueue[Any] = queue.SimpleQueue()

    async def write() -> None:
        raw_bytes_before = ts_utils.get_tensorstore_raw_bytes(types.IoDirection.WRITE)
        started = time.time()
        metadatas: list[Any] = []
        logical_bytes = 0
        while (batch := await asyncio.to_thread(copied.get)) is not _COPIED:
            if batch is _COPY_FAILED:
                return  # the save call raised; nothing commits this checkpoint
            on_host, start, stop = batch
            del batch
            logical_bytes += sum(v.nbytes for v in on_host)
            metadatas.extend(
                await handlers._async_serialize_replica_slices(
                    on_host,
                    infos[start:stop],
                    args[start:stop],
                    primary_host=given["primary_host"],
                    metadata_key=given["metadata_key"],
                    # Written once below: each write of the store reads and rewrites
                    # its file.
                    array_metadata_store=None,
                    enable_replica_parallel_separate_folder=given[
                        "enable_replica_parallel_separate_folder"
                    ],
                    use_replica_parallel=use_replica_parallel,
                    ext_metadata=given["ext_metadata"],
                )
            )
            del on_host
            handlers._on_batch_callback(infos[start:stop], callback.on_write_end)
        if metadata_store is not None:
            await metadata_store.write(
                checkpoint_dir=infos[0].parent_dir,
                array_metadatas=metadatas,
                process_index=multihost.process_index(),
            )
        handlers._log_io_metrics(
            direction=types.IoDirection.WRITE,
            logical_bytes=logical_bytes,
            start_time=started,
            parent_dir=infos[0].parent_dir,
            initial_raw_bytes=raw_bytes_before,
            metadatas=metadatas,
        )

    # The first batch is copied before the writer starts: a save whose copying
    # fails at once leaves no thread behind, as with Orbax's own order.
    first, *rest = batches
    copied.put((copy(*first), *first))
    writing = future.CommitFutureAwaitingContractedSignals(write(), name="array_type_handler")
    try:
        for start, stop in rest:
            copied.put((copy(start, stop), start, stop))
    except BaseException:
        copied.put(_COPY_FAILED)
        raise
    copied.put(_COPIED)
    return writing


# The threads a save's tensorstore context encodes arrays on (``encode_threads``), or
# ``None``: tensorstore's default, one a core.
_ENCODE_THREADS: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "tinax_encode_threads", default=None
)


@contextlib.contextmanager
def encode_threads(limit: int | None) -> Iterator[None]:
    """Has Orbax's saves started in this block (this task and the tasks it starts)
    encode arrays (copy them into chunks, compress them) on at most ``limit`` threads:
    tensorstore's ``data_copy_concurrency`` of the context Orbax makes in the save
    call, by default one thread a core. ``None`` keeps the default.
    """
    if limit is not None and limit <= 0:
        raise ValueError(f"limit must be positive, got {limit}")
    _install_encode_threads()
    token = _ENCODE_THREADS.set(limit)
    try:
        yield
    finally:
        _ENCODE_THREADS.reset(token)


def _install_encode_threads() -> None:
    from orbax.checkpoint._src.serialization import tensorstore_utils

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def get_ts_context(**kwargs: Any) -> Any:
            limit = _ENCODE_THREADS.get()
            if limit is not None and kwargs.get("data_copy_concurrency_limit") is None:
                kwargs["data_copy_concurrency_limit"] = limit
            return original(**kwargs)

        return get_ts_context

    _replace(tensorstore_utils, "get_ts_context", "tinax_encode_threads", _ENCODE_THREADS, wrap)


def current_operation() -> str:
    """The id of Orbax's latest save or load in this process (each call takes a new one)."""
    from orbax.checkpoint._src.futures import synchronization

    return str(synchronization.OperationIdGenerator.get_current_operation_id())


def wait_for_writers(operation: str, timeout: float) -> None:
    """Waits up to ``timeout`` seconds for the background threads Orbax started for
    the save ``operation`` to end.

    Orbax starts each handler's writing thread during the save call. When the call
    fails after some of them started, with the checkpoint's directories already
    made (``write_while_copying``), those threads go on writing into the temporary
    directory: they must end before it is removed. They are not cancelled: a
    writer cancelled in the middle of a tensorstore write leaves that write to
    complete into an event loop already closed, which reports an error nobody can
    catch.
    """
    from orbax.checkpoint._src.futures import future

    deadline = time.monotonic() + timeout
    for t in threading.enumerate():
        if isinstance(t, future._SignalingThread) and t._operation_id == operation:
            # Thread's own join: Orbax's raises the thread's error, which is not ours.
            threading.Thread.join(t, max(0.0, deadline - time.monotonic()))


def allow_own_directories() -> None:
    """Lets a save whose only active process is the calling one name a directory of its
    own (each host of a job saving what it owns to its own storage).

    Orbax V1 refuses a save of a job of several processes whose processes name
    different directories, a check it makes over every process of the job (a
    collective over all of them) whatever the context's active processes. A save
    whose active processes are this process alone skips it; any other save checks as
    Orbax does. Installed once per process.
    """
    import jax
    from orbax.checkpoint.experimental.v1._src.saving import execution

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def check(directory: Any) -> Any:
            active = active_context().multiprocessing_options.active_processes
            if active is not None and set(active) == {jax.process_index()}:
                return None
            return original(directory)

        return check

    _replace(execution, "_check_directory_consistency", "tinax_own_directories", True, wrap)


def merge_process_stores(directory: Any) -> None:
    """Merges the OCDBT stores each process wrote under a pytree's ``directory``
    (``ocdbt.process_<i>``) into its root store, as Orbax's finalize of a save does.

    Args:
      directory: The pytree checkpointable's directory, as Orbax takes it.
    """
    from etils import epath
    from orbax.checkpoint._src import asyncio_utils
    from orbax.checkpoint._src.serialization import ocdbt_utils
    from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils

    asyncio_utils.run_sync(
        ocdbt_utils.merge_ocdbt_per_process_files(
            epath.Path(directory),
            ts_context=ts_utils.get_ts_context(use_ocdbt=True),
            use_zarr3=True,
            enable_validation=False,
        )
    )


# Directories under which each process writes the NumPy arrays and scalars it saves
# itself, not process 0 alone (``write_host_values_under``).
_own_roots: set[str] = set()
_WRITING_HOST_VALUES: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tinax_writing_host_values", default=False
)


class _AsProcessZero:
    """Orbax's ``multihost`` module as its NumPy handler sees it: process 0 while the
    handler writes a save under one of ``_own_roots``."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def process_index(self) -> int:
        return 0 if _WRITING_HOST_VALUES.get() else int(self._real.process_index())


def write_host_values_under(root: str) -> None:
    """Has every process write the NumPy arrays and scalars of its saves under ``root``
    (saves of each process to storage of its own), not process 0 alone.

    Orbax's NumPy (and scalar) handler writes on process 0 only, whatever the
    context's primary host: a process that saves to its own storage would keep none
    of them, and could not restore alone. Each process still writes into its own
    array store (``ocdbt.process_<i>``), so the parts of several processes merge as
    ever. Saves elsewhere are untouched. Installed once per process.
    """
    from orbax.checkpoint._src.serialization import type_handlers

    _own_roots.add(root.rstrip("/") + "/")
    with _hooks_lock:
        if not isinstance(type_handlers.multihost, _AsProcessZero):
            type_handlers.multihost = _AsProcessZero(type_handlers.multihost)

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        async def background(self: Any, values: Any, infos: Any, args: Any = None) -> Any:
            parent = str(infos[0].parent_dir) if infos else ""
            if not any(parent.startswith(own) for own in _own_roots):
                return await original(self, values, infos, args)
            token = _WRITING_HOST_VALUES.set(True)
            try:
                return await original(self, values, infos, args)
            finally:
                _WRITING_HOST_VALUES.reset(token)

        return background

    _replace(type_handlers.NumpyHandler, "_background_serialize", "tinax_host_values", True, wrap)
