"""The Orbax V1 context tinax saves and loads in, and tinax's one storage switch."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import jax
from orbax.checkpoint import v1 as ocp
from orbax.checkpoint.experimental.v1 import handlers as ocp_handlers

from tinax.checkpointing._checksummed_handler import (
    ChecksummedPyTreeHandler,
    ChecksummedStatefulHandler,
)
from tinax.checkpointing._empty import EmptyPyTreeHandler
from tinax.checkpointing._orbax import StatefulCheckpointableHandler, active_context, chunk_shape
from tinax.checkpointing._switches import switched

# ``None``: the default for the backend (``default_compression``); a bool: what a
# ``with compression(...)`` block asked for.
_COMPRESS: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "tinax_compress_arrays", default=None
)
# Big arrays are stored in chunks of at most this many bytes (Orbax's default is one
# chunk per array, or per shard). Tensorstore then reads and writes the chunks of an
# array in parallel, in smaller buffers: 1 GiB in 16 arrays loads in 0.55-0.6 s
# instead of 0.8 s and saves a little faster too; arrays below the size are untouched
# (the guide "Storage settings", "Chunks": docs/guides/storage.md#chunks;
# bench/save_load.py measures it).
CHUNK_BYTES = 8 << 20
# Measuring what checksums cost needs saves without them (bench/save_load.py); users
# have no reason to turn them off, so this is not part of the API.
_CHECKSUMS: contextvars.ContextVar[bool] = contextvars.ContextVar("tinax_checksums", default=True)


@contextlib.contextmanager
def compression(enabled: bool = True) -> Iterator[None]:
    """Makes tinax saves in this block compress arrays (zstd), or not.

    Outside such a block tinax decides by JAX's default backend
    (``default_compression``): zstd on an accelerator, uncompressed on a CPU.
    Inside ``with compression():`` saves made by this thread (and by tasks it
    starts) use Orbax's zstd codec; inside ``with compression(False):`` they
    write arrays uncompressed. Loads read either kind whatever this says. Blocks
    nest; the innermost one wins.

    Orbax's own ``ArrayOptions.Saving.use_compression`` is not consulted: it is
    ``True`` by default, so a context you made active for other reasons could not
    be told from a request for compression. Every other Orbax option you set with
    ``with ocp.Context(...)`` stays in force.

    Args:
      enabled: Whether saves in the block compress arrays.

    Raises:
      TypeError: If ``enabled`` is not a ``bool``.
    """
    with switched(_COMPRESS, enabled, argument="enabled"):
        yield


@contextlib.contextmanager
def without_checksums() -> Iterator[None]:
    """Saves in this block record no checksums (for measuring their cost)."""
    with switched(_CHECKSUMS, False):
        yield


def checksumming() -> bool:
    """Whether a save started now records checksums."""
    return _CHECKSUMS.get()


def default_compression(backend: str) -> bool:
    """Whether saves compress arrays by default when JAX's default backend is ``backend``.

    On a CPU, no: a ``jax.Array``'s bytes are already in host memory, the disk
    is the limit, and zstd buys a few percent of disk on float weights at half or
    more of the save and load speed. On an accelerator, yes: there the host
    writes while the training loop runs, and the full-speed stream of an
    uncompressed state stalled the loop's steps for 1-2 s (raw Orbax's
    uncompressed saves alike), where zstd's smaller one did not, and saved and
    loaded faster (the guide "Storage settings", "Compression":
    docs/guides/storage.md#compression; ``bench/accelerator.py``).
    """
    return backend != "cpu"


def compressing() -> bool:
    """Whether a save started now compresses arrays."""
    chosen = _COMPRESS.get()
    return default_compression(jax.default_backend()) if chosen is None else chosen


class _NamedChecksummedPyTreeHandler(ChecksummedPyTreeHandler):
    """The checksummed pytree handler for a checkpointable Orbax names a handler for.

    A registry holds each handler type once; this one takes the named entry.
    """


_NamedChecksummedPyTreeHandler.__module__ = ChecksummedPyTreeHandler.__module__
_NamedChecksummedPyTreeHandler.__qualname__ = ChecksummedPyTreeHandler.__qualname__


# Orbax's handlers that tinax's checksummed subclasses, registered after them, take
# every checkpointable from (their ``is_handleable`` is the same).
_SHADOWED = (ocp_handlers.PyTreeHandler, StatefulCheckpointableHandler)


def context(*, directories_first: bool = False, saving: bool = False) -> ocp.Context:
    """The caller's active Orbax context, with tinax's handlers and storage choice.

    Options the caller set with ``with ocp.Context(...)`` stay in force, except
    array compression, which ``compression`` decides. Arrays are stored in chunks
    of at most ``CHUNK_BYTES`` unless the caller's context sets a
    ``chunk_byte_size``. The caller's context is copied, never changed.

    ``directories_first``: the save call makes the checkpoint's directories before
    it copies arrays to the host, instead of Orbax's background thread after it,
    so that arrays can be written while the next ones are copied (``_host_copies``).

    ``saving``: the context of a save, whose registry leaves out Orbax's unnamed
    pytree and stateful handlers where tinax's checksummed kinds of them come later:
    Orbax takes the last handler that fits, never those, yet builds each registered
    handler and asks it about the whole checkpointable, twice in a save call (a
    pytree handler's construction and its walk of every leaf are most of Orbax's
    work before it copies arrays). Loads pick handlers by the name a checkpoint
    records, which the subclasses share, and keep the full registry.
    """
    active = active_context()
    checksummed = _CHECKSUMS.get()
    registry = ocp.handlers.local_registry(include_global_registry=False)
    for handler, name in active.checkpointables.registry.get_all_entries():
        if saving and checksummed and name is None and handler in _SHADOWED:
            continue
        if checksummed and name is not None and handler is ocp_handlers.PyTreeHandler:
            # Orbax registers its pytree handler by name for "state": a checkpointable
            # of that name gets checksums too.
            handler = _NamedChecksummedPyTreeHandler
        registry.add(
            handler,
            checkpointable_name=name,
            secondary_typestrs=active.checkpointables.registry.get_secondary_typestrs(handler),
        )
    if checksummed:
        # Registered after Orbax's own, so it handles every pytree; loads check
        # checksums where a checkpoint has them, whoever wrote it.
        registry.add(ChecksummedPyTreeHandler)
        registry.add(ChecksummedStatefulHandler)
    # Last, so that pytrees without leaves go to it rather than to a pytree handler.
    registry.add(EmptyPyTreeHandler)
    ctx = ocp.Context(active)
    ctx.checkpointables.registry = registry
    ctx.array.saving.use_compression = compressing()
    if directories_first:
        ctx.async_options.create_directories_asynchronously = False
    storage = ctx.array.saving.storage_options
    if storage.chunk_byte_size is None and ctx.array.saving.scoped_storage_options_creator is None:
        # A chunk size the caller set stays in force.
        ctx.array.saving.scoped_storage_options_creator = _slab_chunks
    return ctx


def _slab_chunks(keypath: Any, value: Any) -> Any:
    """``CHUNK_BYTES`` chunks for a leaf whose chunks are slabs of whole rows, else none.

    Orbax splits the largest dimension first. Chunks that split only the first
    dimension are contiguous runs of the host copy Orbax writes from, which
    tensorstore writes as they are; chunks that split another dimension make
    tensorstore copy the whole array into chunk buffers first, held until the save's
    transaction commits: on an accelerator, host memory for those arrays twice over,
    every page of the second copy faulted in while the training loop runs. Such a
    leaf is stored as one chunk per shard, as Orbax stores it by default.
    """
    del keypath
    shape = tuple(getattr(value, "shape", ()))
    if not shape or not hasattr(value, "dtype"):
        return None
    sharding = getattr(value, "sharding", None)
    write = tuple(sharding.shard_shape(shape)) if sharding is not None else shape
    try:
        chunks = chunk_shape(shape, write, value.dtype, CHUNK_BYTES)
    except (TypeError, ValueError):
        return None  # typed PRNG keys: Orbax's default
    if chunks[1:] != tuple(max(1, n) for n in write[1:]):
        return None
    return ocp.options.ArrayOptions.Saving.StorageOptions(chunk_byte_size=CHUNK_BYTES)
