"""The private Orbax modules tinax relies on, each behind one function.

Orbax's public V1 API has no way to read the active context, to ask whether a
leaf type has a standard handler, or to learn how long its processes wait for each
other, and does not export the handler of stateful checkpointables (Grain
iterators); these are the only places tinax reaches into
``orbax.checkpoint.experimental.v1._src``. ``pyproject.toml`` bounds
Orbax to the minor release they were written against.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
from orbax.checkpoint import v1 as ocp
from orbax.checkpoint.experimental.v1._src.handlers.stateful_checkpointable_handler import (
    StatefulCheckpointableHandler,
)

__all__ = [
    "StatefulCheckpointableHandler",
    "active_context",
    "check_host_reads",
    "coordination_timeout",
    "has_standard_leaf_handler",
    "observe_host_copies",
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

    with _hooks_lock:
        current = replica_slices.transfer_arrays_to_host
        if getattr(current, "tinax_observer", None) is observer:
            return
        original = getattr(current, "__wrapped__", current)

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

        transfer.tinax_observer = observer  # type: ignore[attr-defined]
        replica_slices.transfer_arrays_to_host = transfer


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

    with _hooks_lock:
        current = serialization._read_shard
        if getattr(current, "tinax_hooks", None) is hooks:
            return
        original = getattr(current, "__wrapped__", current)

        @functools.wraps(original)
        async def read_shard(t: Any, *, dtype: Any, **kwargs: Any) -> np.ndarray:
            path = _array_path(t)
            if path is None:
                return await original(t, dtype=dtype, **kwargs)
            hooks.starting(path)
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

        read_shard.tinax_hooks = hooks  # type: ignore[attr-defined]
        serialization._read_shard = read_shard


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
