"""Loads that read, decode, check and transfer side by side, at the host's speed.

Orbax's restore reads each part of an array a device needs into a new zero-filled
NumPy array (through tensorstore, which decodes each chunk into a buffer of its own
and copies it in), then copies that to the device: every byte is copied two or
three times through freshly mapped memory, and one thread decodes each chunk.
Here the parts of every array of a checkpointable are read at once on a pool of
``THREADS`` threads (``tinax._format.chunkload``: uncompressed chunks straight into
place, zstd chunks decoded straight into place), each part's checksums are checked
on the host as soon as it is whole, and it is put on its devices right away, so
that reading, decoding, checking and the transfers overlap.

Host memory: on an accelerator the parts are read into slices of one reused
buffer of ``DEVICE_HOST_BUFFER_BYTES`` (512 MiB), each taken back once its
transfers have completed (waited for on threads of their own, so that the reading
threads go on reading); a part larger than that waits for the buffer to be idle and
gets memory of its own. On a CPU the buffer a part is read into becomes the array
itself (``jax.device_put`` aliases 64-byte aligned host memory there), so the load
holds the state and no copy of it; parts being read hold at most
``HOST_BUFFER_BYTES`` (256 MiB, or one part) at a time. Beyond that each of the
``THREADS`` reading threads holds one compressed chunk it is decoding (up to
16 MiB: a tinax chunk is at most 8 MiB, and longer ones are streamed 1 MiB at a
time) and, when parts cut stored chunks (a load onto another mesh), one decoded
chunk; on ``gs://`` a task holds the stored bytes it fetched for its parts (at most
one part's, or 8 MiB of small parts').

A Python ``int``, ``float`` or ``bool`` target comes back as the stored 0-d value's
own Python type (``.item()``, as Orbax's scalar handler gives it), when the stored
dtype is of the target's kind. A typed PRNG key target is read as its stored key
data on the host, made a key with the implementation Orbax recorded for it
(``array_metadatas``), which must be the target's, and put on the target's sharding.

What it cannot read byte for byte it leaves to Orbax (``load`` says which): a
checkpointable with other leaves (strings, say), targets without a sharding or with
a layout or memory kind of their own, a dtype or shape other than the stored one,
codecs other than ``bytes`` and ``zstd``, chunks not stored,
checksum pieces that the parts to read cut across, several processes. A part
whose checksum does not match, or a chunk that does not decode, sends its
checkpointable to Orbax too, whose load reports the damage as every load does
(``CorruptDataError`` naming the leaf).
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

from tinax._format import arrays, checksums, chunkload, chunks, fit, names, pytree, words
from tinax._format.checksums import Bounds, LeafRecord
from tinax._format.keys import format_key, key_parts
from tinax._format.pools import ProcessPool
from tinax._format.rawread import Box, Unsupported
from tinax._format.storage import Location
from tinax._targets import NumpyTarget, is_key_dtype
from tinax.checkpointing._host_buffers import HostBuffers, aligned

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


@dataclasses.dataclass
class _Leaf:
    """One array leaf to load: where it is stored and what its target asks for."""

    key: str
    stored: chunkload.StoredArray
    reader: chunkload.BoxReader
    record: LeafRecord | None
    # For a jax.Array target its sharding, else None (a NumPy array).
    sharding: jax.sharding.Sharding | None
    # Each distinct part to read, with the devices that hold it.
    parts: list[tuple[Box, list[Any]]]
    values: dict[Any, Any] = dataclasses.field(default_factory=dict)
    # What the bytes read on the host become: for a Python scalar target its value
    # (``SCALAR``), for a typed PRNG key target the key its data makes, put where
    # the target's sharding says (``KEY``); otherwise the array itself.
    becomes: str = ""
    key_target: jax.ShapeDtypeStruct | None = None


@dataclasses.dataclass
class _Plan:
    """One checkpointable to load: its leaves and the target's structure."""

    name: str
    directory: Location
    treedef: Any
    leaves: list[_Leaf]
    files: chunkload.Files
    failed: BaseException | None = None


def _box(index: tuple[slice, ...], shape: tuple[int, ...]) -> Box:
    return tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape, strict=True))


def _bounds(box: Box) -> Bounds:
    return tuple((s.start, s.stop) for s in box)


def _inside(outer: Bounds, inner: Bounds) -> bool:
    return all(o0 <= i0 and i1 <= o1 for (o0, o1), (i0, i1) in zip(outer, inner, strict=True))


def _overlaps(a: Bounds, b: Bounds) -> bool:
    return all(max(a0, b0) < min(a1, b1) for (a0, a1), (b0, b1) in zip(a, b, strict=True))


# What a leaf's bytes become besides an array: a Python scalar, a typed PRNG key.
SCALAR = "scalar"
KEY = "key"
# A Python scalar target comes back as the stored 0-d value's own Python type: the
# stored dtype's kind must be the target's (a number saved for a bool is Orbax's).
_SCALAR_KINDS = {bool: "b", int: "iu", float: "f"}


def _why_not_target(leaf: Any) -> str | None:
    """Why a target leaf is left to Orbax, or ``None``."""
    if isinstance(leaf, NumpyTarget) or type(leaf) in _SCALAR_KINDS:
        return None
    if not isinstance(leaf, jax.ShapeDtypeStruct):
        return f"a {type(leaf).__name__} leaf"
    sharding = leaf.sharding
    if not isinstance(sharding, jax.sharding.Sharding):
        return "a target without a sharding"
    layout = getattr(getattr(leaf, "format", None), "layout", None)
    if layout is not None:
        return "a target with a layout of its own"
    if sharding.memory_kind not in (None, "device"):
        return f"a target in {sharding.memory_kind} memory"
    return None


def _is_key(leaf: Any) -> bool:
    return isinstance(leaf, jax.ShapeDtypeStruct) and is_key_dtype(leaf.dtype)


def plan(directory: Location, name: str, target: Any) -> _Plan | str:
    """What loading ``target`` from the checkpointable at ``directory`` would read, or
    why it is left to Orbax."""
    if jax.process_count() != 1:
        return "several processes"
    layout = pytree.read_layout(directory)
    if not (layout.ocdbt and layout.zarr3):
        return "not a zarr3 OCDBT store"
    flat, treedef = jax.tree_util.tree_flatten_with_path(target)
    wanted: dict[str, Any] = {}
    for path, leaf in flat:
        why = _why_not_target(leaf)
        if why is not None:
            return why
        wanted[format_key(key_parts(path))] = leaf
    stored = {leaf.key: leaf for leaf in layout.leaves if leaf.kind != words.EMPTY}
    if set(stored) != set(wanted):
        return "the target's leaves are not the stored ones"
    for key, leaf in stored.items():
        scalar = type(wanted[key]) in _SCALAR_KINDS
        kinds = (words.SCALAR,) if scalar else (words.JAX_ARRAY, words.NUMPY_ARRAY)
        if leaf.kind not in kinds or not leaf.stored:
            return f"leaf {key}: stored as a {leaf.kind}, not as its target"
    impls = fit.key_impls(directory) if any(map(_is_key, wanted.values())) else None
    paths = {key: pytree.storage_path(leaf.param) for key, leaf in stored.items()}
    contents = chunks.store_contents(
        directory, sorted(set(paths.values())), zarr3=True, ctx=arrays.context()
    )
    records = checksums.read_checksums(directory)
    files = chunkload.Files(directory)
    leaves = []
    for key, target_leaf in wanted.items():
        storage = paths[key]
        metadata = contents.other.get((storage + names.ZARR3_METADATA).encode("utf-8"))
        if not isinstance(metadata, bytes):
            return f"leaf {key}: metadata not inline"
        array = chunkload.plan(directory, metadata, contents.chunks.get(storage, {}), storage)
        if array is None:
            return f"leaf {key}: stored in a way not read here"
        becomes, key_target = "", None
        if type(target_leaf) in _SCALAR_KINDS:
            if array.shape != () or array.dtype.kind not in _SCALAR_KINDS[type(target_leaf)]:
                return f"leaf {key}: stored as {array.dtype} {array.shape}, not as its target"
            becomes = SCALAR
        elif _is_key(target_leaf):
            impl = target_leaf.dtype._impl.name
            data = jax.eval_shape(jax.random.key_data, target_leaf)
            if (
                impls is None
                or impls.get(stored[key].param) != impl
                or array.shape != tuple(data.shape)
                or array.dtype != np.dtype(data.dtype)
            ):
                return f"leaf {key}: not the data of a {impl} key of the target's shape"
            becomes, key_target = KEY, target_leaf
        elif array.shape != tuple(target_leaf.shape) or array.dtype != np.dtype(target_leaf.dtype):
            return f"leaf {key}: the target asks for another shape or dtype"
        record = None
        if records is not None:
            record = records.get(key)
            if (
                record is None
                or record.kind != checksums.ARRAY
                or (record.dtype, record.shape) != (str(array.dtype), array.shape)
            ):
                return f"leaf {key}: no checksum for it"
        # A scalar and a key's data are read on the host: a key is made, then put.
        sharding = None if becomes or isinstance(target_leaf, NumpyTarget) else target_leaf.sharding
        if sharding is None:
            parts: list[tuple[Box, list[Any]]] = [(tuple(slice(0, n) for n in array.shape), [None])]
        else:
            # Keyed by bounds: slices are not hashable before Python 3.12.
            by_box: dict[Bounds, tuple[Box, list[Any]]] = {}
            for device, index in sharding.addressable_devices_indices_map(array.shape).items():
                box = _box(index, array.shape)
                by_box.setdefault(_bounds(box), (box, []))[1].append(device)
            parts = list(by_box.values())
        if record is not None:
            boxes = [_bounds(box) for box, _ in parts]
            for piece in record.pieces:
                if any(_overlaps(b, piece.bounds) and not _inside(b, piece.bounds) for b in boxes):
                    return f"leaf {key}: its parts cut across the pieces it was saved in"
        leaves.append(
            _Leaf(
                key,
                array,
                chunkload.BoxReader(array, files),
                record,
                sharding,
                parts,
                becomes=becomes,
                key_target=key_target,
            )
        )
    return _Plan(name, directory, treedef, leaves, files)


_loaders = ProcessPool(THREADS, "tinax-load")
# Whether transfers from reused buffers are waited for on threads of their own.
WAIT_APART = True
_waiters = ProcessPool(2, "tinax-load-wait")


class _Mismatch(Unsupported):
    """A part that does not match its checksums: the Orbax load reports it."""


@dataclasses.dataclass(eq=False)
class _Part:
    """One part being read: its buffer, and the tasks still reading into it."""

    plan: _Plan
    leaf: _Leaf
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
    with part.lock:
        part.left -= 1
        last = part.left == 0
    if not last:
        return
    placed: list[jax.Array] = []
    try:
        if plan.failed is None:
            _check(part)
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
        buffers.give(part.token, keep=keep)


def _check(part: _Part) -> None:
    record = part.leaf.record
    if record is None:
        return
    box = _bounds(part.box)
    bad = []
    for piece in record.pieces:
        if not _inside(box, piece.bounds):
            continue
        window = tuple(
            slice(p0 - b0, p1 - b0) for (b0, _), (p0, p1) in zip(box, piece.bounds, strict=True)
        )
        found = checksums.digest(part.values[window] if window else part.values)
        if found != piece.digest:
            bad.append(checksums.Mismatch(piece.bounds, piece.digest, found))
    if bad:
        raise _Mismatch(checksums.mismatch_message(part.leaf.key, record, bad))


def _place(part: _Part, *, alias: bool) -> list[jax.Array]:
    """Puts the part on its devices; returns the arrays, whose transfers from its host
    buffer may still be under way (``block_until_ready`` says when they have ended).

    With ``alias`` the first device on a CPU keeps the buffer itself as its array
    (``jax.device_put`` aliases aligned host memory there); other CPU devices get
    copies of their own."""
    leaf = part.leaf
    if part.devices == [None]:
        leaf.values[None] = part.values
        return []
    sharding = leaf.sharding
    assert sharding is not None
    placed = []
    for i, device in enumerate(part.devices):
        single = jax.sharding.SingleDeviceSharding(device, memory_kind=sharding.memory_kind)
        values = part.values
        if device.platform == "cpu" and not (alias and i == 0):
            # A CPU array aliases aligned host memory whatever ``may_alias`` says: each
            # further device (a replica) and a reused buffer's part get copies.
            values = aligned(part.values.nbytes).view(values.dtype).reshape(values.shape)
            np.copyto(values, part.values)
        placed.append(jax.device_put(values, single))
    for device, value in zip(part.devices, placed, strict=True):
        leaf.values[device] = value
    return placed


def _copied_to_devices(plans: Sequence[_Plan]) -> bool:
    """Whether the parts are copied to their devices (host buffers may be reused), not
    kept as the arrays themselves (every device a CPU)."""
    return not all(
        device is None or device.platform == "cpu"
        for p in plans
        for leaf in p.leaves
        for _, devices in leaf.parts
        for device in devices
    )


def _run(plans: Sequence[_Plan]) -> None:
    """Reads every part of every plan; a plan that fails has ``failed`` set."""
    reuse = _copied_to_devices(plans)
    buffers = HostBuffers(DEVICE_HOST_BUFFER_BYTES if reuse else HOST_BUFFER_BYTES, reuse=reuse)
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
    # Each thread's scratch buffers, freed with the load.
    scratch = chunkload.Scratch()
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
            taken = buffers.take(nbytes, own=own, wait=False)
            if taken is None:
                # Parts held back to be fetched together go first: the wait may be
                # for their memory.
                if together:
                    futures.append(pool.submit(_read_together, together, buffers, scratch))
                    together, together_bytes = [], 0
                taken = buffers.take(nbytes, own=own)
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


def _order(plan: _Plan, leaf: _Leaf, box: Box) -> tuple[Any, ...]:
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


def load(src: Location, targets: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpointables of ``targets`` this engine loads, restored; the others
    (see the module's docstring) are left out, for Orbax to load.

    ``targets`` are abstract (``abstract_restore_target``) and already judged
    against the checkpoint (``check_targets``).
    """
    plans = []
    for name, target in targets.items():
        try:
            found = plan(src / name, name, target)
        except (ValueError, OSError, TypeError, KeyError) as e:
            found = f"{type(e).__name__}: {e}"
        if isinstance(found, str):
            _log.debug("checkpointable %r left to Orbax: %s", name, found)
        else:
            plans.append(found)
    if not plans:
        return {}
    try:
        _run(plans)
    except Exception:
        pass  # every plan is marked failed: Orbax loads them
    finally:
        for p in plans:
            p.files.close()
    restored = {}
    for p in plans:
        if p.failed is not None:
            _log.debug("checkpointable %r left to Orbax: %s", p.name, p.failed)
            continue
        values = []
        for leaf in p.leaves:
            if leaf.becomes == SCALAR:
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
    return restored
