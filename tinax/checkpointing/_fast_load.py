"""Loads that read, decode, check and transfer side by side, at the host's speed.

(Over 500 lines: reading, checking, counting NaN and Inf, placing and handing back
each part are steps of one pipeline whose threads pass parts to one another; apart,
each step would need the part's bookkeeping again.)

Orbax's restore reads each part of an array a device needs into a new zero-filled
NumPy array (through tensorstore, which decodes each chunk into a buffer of its own
and copies it in), then copies that to the device: every byte is copied two or
three times through freshly mapped memory, and one thread decodes each chunk.
Here the parts of every array of a checkpointable are read at once on a pool of
``THREADS`` threads (``tinax._format.arraydata.chunkload``: uncompressed chunks straight into
place, zstd chunks decoded straight into place), each part's checksums are checked
on the host as soon as it is whole, and it is put on its devices right away, so
that reading, decoding, checking and the transfers overlap.

Host memory: on an accelerator the parts are read into slices of one reused
buffer of ``DEVICE_HOST_BUFFER_BYTES`` (512 MiB), each taken back once its
transfers have completed (waited for on threads of their own, so that the reading
threads go on reading); a part larger than that waits for the buffer to be idle and
gets memory of its own. The buffer outlives the load by ``KEEP_SECONDS`` (60 s, see
``_host_buffers``), so that loads in a row reuse its pages rather than fault in new
ones. On a CPU the buffer a part is read into becomes the array
itself (``jax.device_put`` aliases 64-byte aligned host memory there), so the load
holds the state and no copy of it; parts being read hold at most
``HOST_BUFFER_BYTES`` (256 MiB, or one part) at a time. Beyond that each of the
``THREADS`` reading threads holds one compressed chunk it is decoding (up to
16 MiB: a tinax chunk is at most 8 MiB, and longer ones are streamed 1 MiB at a
time) and, when parts cut stored chunks (a load onto another mesh), one decoded
chunk; on ``gs://`` a task holds the stored bytes it fetched for its parts (at most
one part's, or 8 MiB of small parts').

Which leaves it reads, and how each becomes a value, ``_load_plan`` says; the restore
plan (``_restore_plan``) makes those plans, and sizes the arena to the load's budget.

In a job of several processes each process reads the parts its own devices need,
and nothing else; a load onto another mesh than the one saved reads, for a device
whose part cuts across a piece the array was saved (and checksummed) in, the pieces
it overlaps whole, so that every byte it takes is checked (``_load_plan``). On a CPU
such a box is read a piece at a time into each device's window (``_piece_reads``):
no buffer of the whole box is held.

A leaf whose target asks for another float dtype than the stored one (``bfloat16``
from ``float32``, ``float32`` from ``float64``…) is read as stored, its checksums
checked and its NaN and Inf counted on the stored values, then cast on the host as
Orbax's load casts it (``_casts``: tensorstore's conversion, every bit the same): on
a CPU into the buffer that becomes its array, the stored part being a buffer of its
own that goes once it is cast, so that the load holds the restored values in the
target's dtype and the parts being read in the stored one; read piece by piece,
each piece is cast into its windows.

What it cannot read byte for byte it leaves to Orbax (``load`` says which): a
checkpointable with other leaves, targets without a sharding or with a layout or
memory kind of their own, a shape other than the stored one, a cast other than
between float dtypes, codecs other than ``bytes`` and ``zstd``, chunks not stored.
A part whose checksum does not match, or a chunk that does not decode, sends its
checkpointable to Orbax too, whose load reports the damage as every load does
(``CorruptDataError`` naming the leaf); with several processes, on every process
(``load``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from tinax._format.arraydata import chunkload, nonfinite
from tinax._format.arraydata.rawread import Box
from tinax._format.integrity import checksums
from tinax._format.integrity.checksums import Bounds
from tinax._format.metadata.layout import Checkpoint
from tinax._format.pools import ProcessPool
from tinax.checkpointing import _orbax, _processes
from tinax.checkpointing._casts import cast_into
from tinax.checkpointing._host_buffers import HostBuffers, aligned
from tinax.checkpointing._load_plan import Leaf, Plan, bounds_of, inside
from tinax.checkpointing._nonfinite import LoadCounts
from tinax.checkpointing._piece_reads import (
    Mismatch,
    PieceBuffers,
    pieces_of,
    read_piece,
    window_arrays,
)

_log = logging.getLogger(__name__)

# Reading threads: each reads, decodes, copies and digests with the GIL released.
# Enough for the page cache or a disk's queue on a small machine, and for the
# round trips of an object store; a large host decodes on up to 32 cores.
THREADS = min(32, max(8, os.cpu_count() or 1))
# Host memory for parts being read; on an accelerator (one reused buffer) more: 256 MiB
# held too few 64-128 MiB parts to keep the threads busy (``bench/load_stages.py``).
HOST_BUFFER_BYTES = 256 << 20
DEVICE_HOST_BUFFER_BYTES = 512 << 20
# Chunks of one part read by one task: parts of big arrays are read on several threads.
TASK_BYTES = 8 << 20


_loaders = ProcessPool(THREADS, "tinax-load")
# What a part's values become once its devices hold them.
_NOTHING = np.empty(0, np.uint8)
# Whether transfers from reused buffers are waited for on threads of their own.
WAIT_APART = True
_waiters = ProcessPool(2, "tinax-load-wait")


@dataclasses.dataclass(eq=False)
class _Part:
    """One part being read: its buffer, and the tasks still reading into it."""

    plan: Plan
    leaf: Leaf
    box: Box
    devices: list[Any]
    # The part's values: a view of its buffer, shaped as its box.
    values: np.ndarray
    token: Any
    # Reading tasks still to end.
    left: int
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    fetched: chunkload.FileRanges | None = None
    # The wait for its transfers to end, where another thread waits.
    waiting: concurrent.futures.Future[None] | None = None
    # Read piece by piece (``_read_piece``): for each distinct window its devices take
    # (by its bounds within the part), its bounds in the array and its values.
    windows: dict[Bounds, tuple[Bounds, np.ndarray]] | None = None


def _read(
    part: _Part,
    group: Sequence[chunkload.Chunk],
    buffers: HostBuffers,
    scratch: chunkload.Scratch,
) -> None:
    plan = part.plan
    try:
        if plan.failed is None:
            if part.fetched is None and not plan.files.local:
                # A large part of a remote file: its own requests.
                part.fetched = part.leaf.reader.fetch(part.box)
            part.leaf.reader.read(group, part.values, scratch, part.fetched)
    except BaseException as e:
        if plan.failed is None:
            plan.failed = e
    _task_done(part, buffers)


def _read_piece(
    part: _Part,
    piece: checksums.Piece,
    buffers: HostBuffers,
    scratch: chunkload.Scratch,
    shared: PieceBuffers | None,
) -> None:
    """Reads one saved piece of a part read piece by piece (``_piece_reads``)."""
    plan = part.plan
    try:
        if plan.failed is None:
            assert part.windows is not None
            # A cast leaf's NaN and Inf are counted here, on the stored values.
            counts = plan.counts if part.leaf.cast is not None else None
            nan, inf = read_piece(
                part.leaf, piece, part.windows, scratch, count=counts is not None, shared=shared
            )
            if counts is not None:
                counts.add(plan.name, part.leaf.key, nan, inf)
    except BaseException as e:
        if plan.failed is None:
            plan.failed = e
    _task_done(part, buffers)


def _task_done(part: _Part, buffers: HostBuffers) -> None:
    """One of the part's reading tasks has ended; the last checks and places it."""
    plan = part.plan
    with part.lock:
        part.left -= 1
        last = part.left == 0
    if not last:
        return
    placed: list[jax.Array] = []
    try:
        if plan.failed is None:
            _check(part)
            cast = part.leaf.cast
            if plan.counts is not None and (part.windows is not None) != (cast is not None):
                # Read piece by piece (its windows are about to become the arrays), or
                # about to be cast: counted as stored. (A cast read piece by piece was
                # counted piece by piece.)
                _count(part, plan.counts)
            if cast is not None and part.windows is None:
                part.values = _cast(part.values, cast)
            placed = _place(part, alias=not buffers.reuse)
    except BaseException as e:
        if plan.failed is None:
            plan.failed = e
    finally:
        part.fetched = None
    if placed and buffers.reuse and WAIT_APART:
        # The transfers end on a thread of their own, which then hands the buffer
        # back: this one goes on reading.
        part.waiting = _waiters.executor().submit(_release, part, placed, buffers)
    else:
        _release(part, placed, buffers)


def _release(part: _Part, placed: Sequence[jax.Array], buffers: HostBuffers) -> None:
    """Waits for the part's transfers from a reused buffer to end, then gives the
    buffer back."""
    plan = part.plan
    try:
        counted = part.windows is not None or part.leaf.cast is not None
        if plan.counts is not None and plan.failed is None and not counted:
            # While the transfers run: NaN and Inf, counted once per part read.
            _count(part, plan.counts)
        if buffers.reuse:
            for value in placed:
                value.block_until_ready()
    except BaseException as e:
        if plan.failed is None:
            plan.failed = e
    finally:
        # A buffer that became a NumPy result, or whose transfers may not have ended
        # (the load failed), is not handed out again.
        keep = plan.failed is None and part.devices != [None]
        if part.token is not None:
            buffers.give(part.token, keep=keep)
        # Its values live on in its devices' arrays (or as the NumPy result); memory of
        # its own (a part larger than the arena, one read to cover whole pieces) goes
        # now, not with the load.
        part.values = _NOTHING


def _count(part: _Part, counts: LoadCounts) -> None:
    """Adds the part's NaN and Inf to its leaf's (float leaves only): of its values, or
    of each distinct window where it was read piece by piece (a replica's window is
    the same one, counted once)."""
    if part.windows is None:
        arrays = [part.values]
    else:
        arrays = [values for _, values in part.windows.values()]
    if arrays and nonfinite.is_floating(arrays[0].dtype):
        nan = inf = 0
        for values in arrays:
            more_nan, more_inf = nonfinite.count(values)
            nan, inf = nan + more_nan, inf + more_inf
        counts.add(part.plan.name, part.leaf.key, nan, inf)


def _cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``values`` cast to ``dtype`` (``_casts``) in fresh aligned memory, which a CPU
    device's array aliases."""
    out = aligned(values.size * dtype.itemsize).view(dtype).reshape(values.shape)
    cast_into(out, values)
    return out


def _check(part: _Part) -> None:
    record = part.leaf.record
    if record is None or part.windows is not None:
        return  # read piece by piece: each piece was checked as it was read
    box = bounds_of(part.box)
    bad = []
    for piece in record.pieces:
        if not inside(box, piece.bounds):
            continue
        window = tuple(
            slice(p0 - b0, p1 - b0) for (b0, _), (p0, p1) in zip(box, piece.bounds, strict=True)
        )
        found = checksums.digest(part.values[window] if window else part.values)
        if found != piece.digest:
            bad.append(checksums.Mismatch(piece.bounds, piece.digest, found))
    if bad:
        raise Mismatch(checksums.mismatch_message(part.leaf.key, record, bad))


def _place(part: _Part, *, alias: bool) -> list[jax.Array]:
    """Puts the part on its devices; returns the arrays, whose transfers from its host
    buffer may still be under way (``block_until_ready`` says when they have ended).

    With ``alias`` the first device on a CPU that takes the whole part keeps the
    buffer itself as its array (``jax.device_put`` aliases aligned host memory
    there); other CPU devices get copies of their own, of their window of the part
    where they take less than all of it."""
    leaf = part.leaf
    if part.devices == [None]:
        leaf.values[None] = part.values
        return []
    sharding = leaf.sharding
    assert sharding is not None
    placed = []
    if part.windows is not None:
        # Read piece by piece: each window is an array; a second device taking the
        # same window (a replica) gets a copy of its own.
        taken: set[Bounds] = set()
        for device in part.devices:
            own = bounds_of(leaf.windows[device])
            values = part.windows[own][1]
            if own in taken:
                copy = aligned(values.nbytes).view(values.dtype).reshape(values.shape)
                np.copyto(copy, values)
                values = copy
            taken.add(own)
            single = jax.sharding.SingleDeviceSharding(device, memory_kind=sharding.memory_kind)
            placed.append(jax.device_put(values, single))
        for device, value in zip(part.devices, placed, strict=True):
            leaf.values[device] = value
        part.windows = {}
        return placed
    aliased = not alias
    for device in part.devices:
        single = jax.sharding.SingleDeviceSharding(device, memory_kind=sharding.memory_kind)
        window = leaf.windows.get(device)
        values = part.values if window is None else part.values[window]
        if device.platform == "cpu" and (aliased or window is not None):
            # A CPU array aliases aligned host memory whatever ``may_alias`` says: each
            # further device (a replica), a window, and a reused buffer's part get
            # copies.
            copy = aligned(values.nbytes).view(values.dtype).reshape(values.shape)
            np.copyto(copy, values)
            values = copy
        elif device.platform == "cpu":
            aliased = True
        placed.append(jax.device_put(values, single))
    for device, value in zip(part.devices, placed, strict=True):
        leaf.values[device] = value
    return placed


def _copied_to_devices(plans: Sequence[Plan]) -> bool:
    """Whether the parts are copied to their devices (host buffers may be reused), not
    kept as the arrays themselves (every device a CPU)."""
    return not all(
        device is None or device.platform == "cpu"
        for p in plans
        for leaf in p.leaves
        for _, devices in leaf.parts
        for device in devices
    )


def _run(
    plans: Sequence[Plan],
    *,
    arena_bytes: int | None = None,
    reading_bytes: int | None = None,
    piece_readers: int | None = None,
) -> None:
    """Reads every part of every plan; a plan that fails has ``failed`` set.
    ``arena_bytes``: the reused host buffer on an accelerator; ``reading_bytes``: on
    a CPU, what the parts being read hold at once; ``piece_readers``: how many pieces
    are read at once (``_piece_reads``), ``None`` for one per thread."""
    reuse = _copied_to_devices(plans)
    if reuse:
        limit = DEVICE_HOST_BUFFER_BYTES if arena_bytes is None else arena_bytes
    else:
        limit = HOST_BUFFER_BYTES if reading_bytes is None else reading_bytes
    buffers = HostBuffers(limit, reuse=reuse)
    work = [
        (i, p, leaf, box, devices)
        for i, p in enumerate(plans)
        for leaf in p.leaves
        for box, devices in leaf.parts
    ]
    # The largest parts first, so that the threads end together; where files are
    # remote, the small ones then in the order of their bytes in the files, fetched
    # together (``_read_together``).
    work.sort(key=lambda w: _order(w[1], w[2], w[3]))
    pool = _loaders.executor()
    # Each thread's scratch buffers, freed with the load; under a budget, fewer piece
    # buffers than threads, shared.
    scratch = chunkload.Scratch()
    shared = None
    if piece_readers is not None and piece_readers < THREADS:
        shared = PieceBuffers(piece_readers)
    futures: list[concurrent.futures.Future[None]] = []
    parts: list[_Part] = []
    together: list[_Part] = []
    together_bytes = 0
    try:
        for _, p, leaf, box, devices in work:
            if p.failed is not None:
                continue
            stored = leaf.stored
            found = stored.chunks_in(box)
            nbytes = math.prod(s.stop - s.start for s in box) * stored.dtype.itemsize
            small = not p.files.local and nbytes < TASK_BYTES
            if together and (
                not small or together[0].plan is not p or together_bytes >= TASK_BYTES
            ):
                futures.append(pool.submit(_read_together, together, buffers, scratch))
                together, together_bytes = [], 0
            if p.files.local:
                per_task = max(1, TASK_BYTES // max(1, stored.chunk_bytes))
                groups = [found[i : i + per_task] for i in range(0, len(found), per_task)]
            else:
                groups = [found]
            own = devices == [None]
            # A box grown to cover whole saved pieces, of which each device takes a
            # window (a copy): its buffer becomes no array.
            grown = not own and all(device in leaf.windows for device in devices)
            pieces = pieces_of(leaf, box) if grown and not buffers.reuse and p.files.local else []
            # Nor does a part read to be cast: its cast values do.
            apart = grown or leaf.cast is not None
            if pieces:
                # On a CPU its windows are the arrays: it is read a piece at a time.
                part = _Part(
                    p,
                    leaf,
                    box,
                    devices,
                    _NOTHING,
                    None,
                    len(pieces),
                    windows=window_arrays(leaf, box, devices),
                )
                parts.append(part)
                futures += [
                    pool.submit(_read_piece, part, pc, buffers, scratch, shared) for pc in pieces
                ]
                continue
            taken = buffers.take(nbytes, own=own, wait=False, apart=apart)
            if taken is None:
                # Parts held back to be fetched together go first: the wait may be
                # for their memory.
                if together:
                    futures.append(pool.submit(_read_together, together, buffers, scratch))
                    together, together_bytes = [], 0
                taken = buffers.take(nbytes, own=own, apart=apart)
            assert taken is not None
            buf, token = taken
            shape = [s.stop - s.start for s in box]
            values = buf[:nbytes].view(leaf.stored.dtype).reshape(shape)
            part = _Part(p, leaf, box, devices, values, token, len(groups))
            parts.append(part)
            if small:
                together.append(part)
                together_bytes += nbytes
                continue
            futures += [pool.submit(_read, part, group, buffers, scratch) for group in groups]
        if together:
            futures.append(pool.submit(_read_together, together, buffers, scratch))
    except BaseException as e:
        for p in plans:
            if p.failed is None:
                p.failed = e
        raise
    finally:
        # Nothing is left reading from files about to be closed, nor being copied
        # from buffers about to be freed.
        concurrent.futures.wait(futures)
        concurrent.futures.wait([p.waiting for p in parts if p.waiting is not None])
        buffers.close()


def _order(plan: Plan, leaf: Leaf, box: Box) -> tuple[Any, ...]:
    nbytes = math.prod(s.stop - s.start for s in box) * leaf.stored.dtype.itemsize
    if plan.files.local or nbytes >= TASK_BYTES:
        return (0, -nbytes)
    first = next(iter(leaf.reader.refs(box)), None)
    return (1, id(plan), ("", 0) if first is None else (first.file, first.offset))


def _read_together(
    parts: Sequence[_Part], buffers: HostBuffers, scratch: chunkload.Scratch
) -> None:
    """Reads small parts of one remote checkpointable whose shards were fetched together:
    one request per run of adjacent bytes, whichever arrays they belong to."""
    plan = parts[0].plan
    fetched = None
    try:
        if plan.failed is None:
            refs = [ref for part in parts for ref in part.leaf.reader.refs(part.box)]
            fetched = chunkload.FileRanges(plan.files, refs)
    except BaseException as e:
        if plan.failed is None:
            plan.failed = e
    for part in parts:
        part.fetched = fetched
        _read(part, part.leaf.stored.chunks_in(part.box), buffers, scratch)


def load(
    checkpoint: Checkpoint,
    planned: Mapping[str, Plan | None],
    *,
    arena_bytes: int | None = None,
    reading_bytes: int | None = None,
    piece_readers: int | None = None,
    counts: LoadCounts | None = None,
) -> dict[str, Any]:
    """The checkpointables this engine loads, restored; the others (see the module's
    docstring) are left out, for Orbax to load.

    Args:
      checkpoint: The opened checkpoint.
      planned: Each checkpointable to load by name, with the engine's plan of it
        (``_load_plan.plan``, made with the restore plan), ``None`` for one left
        to Orbax.
      arena_bytes: The reused host buffer on an accelerator (the restore plan sizes
        it to the load's budget); ``None``: ``DEVICE_HOST_BUFFER_BYTES``.
      reading_bytes: On a CPU, what the parts being read hold at once (likewise);
        ``None``: ``HOST_BUFFER_BYTES``.
      piece_readers: How many saved pieces are read at once into buffers of their
        own, on a CPU (likewise); ``None``: one per reading thread.
      counts: Where the NaN and Inf of every float leaf read are counted, if
        anywhere; each checkpointable loaded whole is named there as counted.

    In a job of several processes each process reads what its own devices need, and
    the processes then agree on what goes to Orbax: a checkpointable one process
    could not read (a part that failed its checksum there) is loaded through Orbax's
    load on every process, whose barriers would otherwise wait for the processes
    that never call it.
    """
    plans = [p for p in planned.values() if p is not None]
    for p in plans:
        p.counts = counts
    restored = _read_own(plans, arena_bytes, reading_bytes, piece_readers)
    left = sorted(set(planned) - set(restored))
    options = _orbax.active_context().multiprocessing_options
    everywhere = _processes.gather(
        left,
        what=f"the load of {str(checkpoint.path)!r}",
        timeout=_processes.timeout_of(_orbax.coordination_timeout()),
        active_processes=sorted(options.active_processes or ()) or None,
    )
    for name in {name for found in everywhere for name in found}:
        if restored.pop(name, None) is not None and counts is not None:
            counts.forget(name)  # Orbax loads it: counted there
    return restored


def _read_own(
    plans: Sequence[Plan],
    arena_bytes: int | None,
    reading_bytes: int | None,
    piece_readers: int | None,
) -> dict[str, Any]:
    """What this process reads of ``plans`` itself (see ``load``)."""
    if not plans:
        return {}
    try:
        _run(
            plans,
            arena_bytes=arena_bytes,
            reading_bytes=reading_bytes,
            piece_readers=piece_readers,
        )
    except Exception:
        pass  # every plan is marked failed: Orbax loads them
    finally:
        for p in plans:
            p.files.close()
    restored = {}
    for p in plans:
        if p.failed is not None:
            _log.debug("checkpointable %r left to Orbax: %s", p.name, p.failed)
            if p.counts is not None:
                p.counts.forget(p.name)  # parts read before it failed: Orbax's load counts
            continue
        values: list[Any] = []
        arrays = iter(p.leaves)
        for position in range(len(p.leaves) + len(p.strings) + len(p.left_out)):
            if position in p.left_out:
                values.append(...)
                continue
            if position in p.strings:
                values.append(p.strings[position])
                continue
            leaf = next(arrays)
            if leaf.scalar:
                values.append(leaf.values[None].item())
            elif leaf.key_target is not None:
                impl = leaf.key_target.dtype._impl.name
                made = jax.random.wrap_key_data(leaf.values[None], impl=impl)
                values.append(jax.device_put(made, leaf.key_target.sharding))
            elif leaf.sharding is None:
                values.append(leaf.values[None])
            else:
                shape = leaf.stored.shape
                singles = [
                    leaf.values[d] for d in leaf.sharding.addressable_devices_indices_map(shape)
                ]
                values.append(
                    jax.make_array_from_single_device_arrays(shape, leaf.sharding, singles)
                )
        restored[p.name] = jax.tree_util.tree_unflatten(p.treedef, values)
        if p.counts is not None:
            # Every leaf read was counted; the load is whole where none was left out.
            p.counts.counted(p.name, whole=not p.left_out)
    return restored
