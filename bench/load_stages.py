"""Where a tinax load's time goes, stage by stage, beside the machine's floors.

Saves ``bench/accelerator.py``'s state (the NNX transformer and its adamw state) with
tinax, zstd on (``--uncompressed`` for the bytes as they are, ``--zstd-level`` for
a level other than Orbax's 3), then times, on the
same checkpoint's stored chunks, each stage of a load alone and added up, on 1, 8
and the load's own number of threads, every thread with buffers of its own that it
reuses:

- ``read``: each stored chunk read by offset (``preadv``) into a reused buffer;
- ``+ decode``: and decoded (zstd) into a reused buffer;
- ``+ digest``: and its xxh3 digested, as a load checks checksums;
- ``+ put``: and ``jax.device_put`` on the first device, waited for;

then tinax's whole load (``load_checkpointables`` onto the state's shardings), and
the same load with its checks left out, with its transfers left out, with a new host
buffer rather than the one the load before kept, and on other numbers of threads;
beside the floors ``bench/accelerator.py`` measures (one
``cat``, ``dd``, 8 ``dd`` side by side, ``readinto``, fresh ``read()``) and
``device_put`` of the state's host copy (from ordinary memory, from memory registered
with the device's client for DMA, and from ``pinned_host`` arrays: the link's
floor, three ways), what new host memory costs, and the rate at which the host
copies bytes in memory on the load's threads, with the least a load moves through
memory at that rate; and the ceiling those set: a load perfectly overlapped takes as
long as its slowest stage alone, the host's (read, decode, digest) or the link's. Rates are MB/s of the state's bytes
(``state``) and of the bytes stored in the data files (``stored``), medians of
``--rounds``.

    python3 bench/load_stages.py [--size cpu|accelerator] [--rounds 3] [--zstd-level -1]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import mmap
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import xxhash
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accelerator as bench

import tinax.checkpointing as tc
from tinax._format.arraydata import chunkload
from tinax._format.pools import ProcessPool
from tinax._format.storage.location import local
from tinax.checkpointing import _fast_load, _host_buffers, _load_plan, open_checkpoint

# One stored chunk: its file, where its bytes lie, and how many bytes it decodes to.
Job = tuple[str, int, int, int]


def stored_chunks(checkpoint: Path, state: dict[str, Any]) -> tuple[list[Job], bool]:
    """Every stored chunk a load of ``state`` reads, and whether they are zstd's."""
    jobs: list[Job] = []
    zstd = False
    opened = open_checkpoint(local(checkpoint))
    for name, tree in state.items():
        found = _load_plan.plan(opened.get(name), bench.targets(tree))
        if isinstance(found, str):
            raise SystemExit(f"{name}: not read by tinax's engine: {found}")
        for leaf in found.leaves:
            zstd = zstd or leaf.stored.codec is not None
            for box, _ in leaf.parts:
                for chunk in leaf.stored.chunks_in(box):
                    held, start, length = leaf.reader._where(chunk.index, None)
                    if not isinstance(held, chunkload.ValueRef):
                        continue  # kept inline, in the store's manifest
                    path = str(checkpoint / name / held.file)
                    jobs.append((path, held.offset + start, length, leaf.stored.chunk_bytes))
        found.files.close()
    return jobs, zstd


def link_floors(host: Any, shardings: Any, rounds: int) -> dict[str, list[float] | str]:
    """Seconds to put the state's host copy on its devices from other kinds of host
    memory: one arena registered with the device's client for DMA
    (``Client.dma_map``), and arrays of the ``pinned_host`` memory kind; a sentence
    instead where the backend has no such memory."""
    found: dict[str, list[float] | str] = {}
    leaves = jax.tree.leaves(host)
    targets = jax.tree.leaves(shardings)
    client = next(iter(targets[0].device_set)).client
    offsets, size = [], 0
    for leaf in leaves:
        size = -(-size // 4096) * 4096
        offsets.append(size)
        size += leaf.nbytes
    arena = np.frombuffer(mmap.mmap(-1, max(size, 1)), np.uint8)
    views = []
    for leaf, at in zip(leaves, offsets, strict=True):
        view = arena[at : at + leaf.nbytes].view(leaf.dtype).reshape(leaf.shape)
        view[...] = leaf
        views.append(view)
    try:
        client.dma_map(arena.ctypes.data, arena.nbytes)  # type: ignore[union-attr]
    except jax.errors.JaxRuntimeError as e:
        found["from host memory registered for DMA"] = f"not possible here ({e})"
    else:
        try:
            found["from host memory registered for DMA"] = _puts(views, targets, rounds)
        finally:
            client.dma_unmap(arena.ctypes.data)  # type: ignore[union-attr]
    del views, arena
    pinned = [s.with_memory_kind("pinned_host") for s in targets]
    try:
        on_host = jax.block_until_ready(jax.device_put(leaves, pinned))
    except (jax.errors.JaxRuntimeError, ValueError) as e:
        found["from pinned_host arrays"] = f"not possible here ({e})"
    else:
        found["from pinned_host arrays"] = _puts(on_host, targets, rounds)
    return found


def _puts(values: Any, targets: Any, rounds: int) -> list[float]:
    """Seconds for each of ``rounds`` transfers of ``values`` (a tree) to ``targets``."""
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        jax.block_until_ready(jax.device_put(values, targets))
        seconds.append(time.perf_counter() - start)
    return seconds


class Stage:
    """One thread's reused buffers, and the stages it runs on a chunk."""

    def __init__(self, biggest_stored: int, biggest: int, fds: dict[str, int]) -> None:
        self.raw = np.empty(biggest_stored, np.uint8)
        self.out = np.empty(biggest, np.uint8)
        self.fds = fds
        self.decoder = zstandard.ZstdDecompressor()

    def read(self, job: Job) -> memoryview:
        path, offset, length, _ = job
        view = memoryview(self.raw)[:length]
        done = os.preadv(self.fds[path], [view], offset)
        assert done == length, (done, length)
        return view

    def decode(self, job: Job, zstd: bool) -> np.ndarray:
        """Reads and decodes the chunk into this thread's reused buffer."""
        return self.decode_into(job, zstd, self.out[: job[3]])

    def decode_into(self, job: Job, zstd: bool, out: np.ndarray) -> np.ndarray:
        """Reads and decodes the chunk into ``out`` (for a chunk stored as it is, its
        bytes where they were read)."""
        raw = self.read(job)
        if not zstd:
            return self.raw[: job[2]]
        reader = self.decoder.stream_reader(raw, read_size=len(raw))
        view = memoryview(out)
        done = 0
        while done < len(view):
            n = reader.readinto(view[done:])
            if not n:
                break
            done += n
        assert done == job[3]
        return out

    def digest(self, job: Job, zstd: bool) -> np.ndarray:
        out = self.decode(job, zstd)
        xxhash.xxh3_64_hexdigest(out.data)
        return out

    def put(self, job: Job, zstd: bool, device: Any) -> None:
        out = self.digest(job, zstd)
        jax.device_put(out, device).block_until_ready()


def timed_threads(jobs: list[Job], threads: int, work: Callable[[Stage, Job], Any]) -> float:
    """Seconds for ``threads`` threads to run ``work`` on every job, each thread with
    its own reused ``Stage``."""
    fds = {path: os.open(path, os.O_RDONLY) for path in {j[0] for j in jobs}}
    biggest_stored = max(j[2] for j in jobs)
    biggest = max(j[3] for j in jobs)
    local = threading.local()
    # Jobs handed out largest first, as the load does.
    order = sorted(jobs, key=lambda j: -j[3])

    def run(job: Job) -> None:
        stage = getattr(local, "stage", None)
        if stage is None:
            stage = local.stage = Stage(biggest_stored, biggest, fds)
        work(stage, job)

    try:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            # Warm the threads' buffers first: their first touch is not a stage's.
            list(pool.map(lambda _: time.sleep(0.01) or run(order[0]), range(threads)))
            start = time.perf_counter()
            list(pool.map(run, order, chunksize=1))
            return time.perf_counter() - start
    finally:
        for fd in fds.values():
            os.close(fd)


# A process of ``decoded_by_processes``: reads its share of the chunks (JSON on its
# first line of input), says it is ready, waits for a line, reads and decodes them
# into reused buffers, and says it is done.
_DECODER = r"""
import json, os, sys, zstandard
import numpy as np
jobs = json.loads(sys.stdin.readline())
fds = {p: os.open(p, os.O_RDONLY) for p in {j[0] for j in jobs}}
raw = np.ones(max([j[2] for j in jobs] + [1]), np.uint8)
out = np.ones(max([j[3] for j in jobs] + [1]), np.uint8)
decoder = zstandard.ZstdDecompressor()
print("ready", flush=True)
sys.stdin.readline()
for path, offset, length, size in jobs:
    view = memoryview(raw)[:length]
    assert os.preadv(fds[path], [view], offset) == length
    if zstd:
        reader = decoder.stream_reader(view, read_size=length)
        target = memoryview(out)[:size]
        done = 0
        while done < size:
            n = reader.readinto(target[done:])
            if not n:
                break
            done += n
        assert done == size
print("done", flush=True)
"""


def decoded_by_processes(jobs: list[Job], processes: int, zstd: bool) -> float:
    """Seconds for ``processes`` processes, each with its share of the chunks (dealt
    round, largest first), to read and decode them all: the same work as the
    ``read + decode`` stage, with no thread of one process beside another."""
    import json
    import subprocess

    shares: list[list[Job]] = [[] for _ in range(processes)]
    for i, job in enumerate(sorted(jobs, key=lambda j: -j[3])):
        shares[i % processes].append(job)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", f"zstd = {zstd!r}\n" + _DECODER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        for child, share in zip(children, shares, strict=True):
            assert child.stdin is not None
            child.stdin.write(json.dumps(share) + "\n")
            child.stdin.flush()
        for child in children:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        start = time.perf_counter()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children:
            assert child.stdout is not None and child.stdout.readline().strip() == "done"
        return time.perf_counter() - start
    finally:
        for child in children:
            child.kill()
            child.wait()


def decoded_into_ring(jobs: list[Job], threads: int, zstd: bool) -> float:
    """The ``read + decode`` stage with each chunk decoded into a 256 MiB ring by turn,
    as into the load's host buffer, not into a buffer its thread reuses."""
    size = _fast_load.HOST_BUFFER_BYTES
    ring = np.ones(size + max(j[3] for j in jobs), np.uint8)
    counter = iter(range(1 << 30))
    lock = threading.Lock()

    def cold(stage: Stage, job: Job) -> None:
        with lock:
            at = (next(counter) * (8 << 20)) % size
        out = ring[at : at + job[3]]
        if stage.decode_into(job, zstd, out) is not out:
            out[:] = stage.raw[: job[2]]  # stored as it is: copied in

    return timed_threads(jobs, threads, cold)


def populate_floor(nbytes: int, threads: int) -> dict[str, float]:
    """Seconds to make ``nbytes`` of fresh host memory usable: faulted in page by
    page by one thread, by ``threads`` threads, mapped at once (``MAP_POPULATE``),
    by ``threads`` threads with huge pages asked for (``MADV_HUGEPAGE``), and the
    same memory touched again (the pages a kept buffer saves)."""
    share = -(-nbytes // threads)

    def touched(memory: np.ndarray, value: int) -> float:
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(
                pool.map(
                    lambda i: memory[i * share : (i + 1) * share : 4096].fill(value),
                    range(threads),
                )
            )
        return time.perf_counter() - start

    figures = {}
    start = time.perf_counter()
    a = np.empty(nbytes, np.uint8)
    a[::4096] = 1
    figures["faulted, 1 thread"] = time.perf_counter() - start
    del a
    b = np.empty(nbytes, np.uint8)
    figures[f"faulted, {threads} threads"] = touched(b, 1)
    start = time.perf_counter()
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE
    c = np.frombuffer(mmap.mmap(-1, nbytes, flags=flags), np.uint8)
    c[::4096] = 1
    figures["MAP_POPULATE"] = time.perf_counter() - start
    del c
    huge = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        huge.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, AttributeError) as e:
        print(f"MADV_HUGEPAGE refused: {e}")
    else:
        figures[f"MADV_HUGEPAGE, {threads} threads"] = touched(np.frombuffer(huge, np.uint8), 1)
    figures[f"the same memory touched again, {threads} threads"] = touched(b, 2)
    return figures


def copy_floor(nbytes: int, threads: int) -> float:
    """Seconds for ``threads`` threads to copy ``nbytes`` in 8 MiB blocks between host
    buffers of their own (64 MiB each way, touched first, so larger than the caches):
    the machine's rate of moving bytes through memory, which a load's stages (read
    into memory, decode, digest, the transfer's copy) each pay once more."""
    block = 8 << 20
    count = -(-nbytes // block)
    held = threading.local()

    def one(i: int) -> None:
        pair = getattr(held, "pair", None)
        if pair is None:
            pair = held.pair = (np.ones(64 << 20, np.uint8), np.ones(64 << 20, np.uint8))
        at = (i % 8) * block
        np.copyto(pair[1][at : at + block], pair[0][at : at + block])

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: one(0), range(threads * 2)))
        start = time.perf_counter()
        list(pool.map(one, range(count), chunksize=1))
        return time.perf_counter() - start


# The load's host buffer registered with the device's client for DMA, made once
# (``registered_arena``), or empty where the backend registers no memory.
REGISTERED_ARENA: list[np.ndarray] = []


def registered_arena(nbytes: int) -> np.ndarray:
    """A host buffer of ``nbytes`` registered with the first device's client for DMA
    (``Client.dma_map``), made on first use and kept; says how long registering took."""
    if not REGISTERED_ARENA:
        arena = np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)
        arena[::4096] = 1
        start = time.perf_counter()
        jax.devices()[0].client.dma_map(arena.ctypes.data, arena.nbytes)  # type: ignore[attr-defined]
        print(
            f"registering a {nbytes >> 20} MiB host buffer for DMA: {time.perf_counter() - start:.3f} s"
        )
        REGISTERED_ARENA.append(arena)
    return REGISTERED_ARENA[0][:nbytes]


@contextlib.contextmanager
def engine(
    threads: int | None = None,
    check: bool = True,
    place: bool = True,
    buffer: int | None = None,
    wait_on_readers: bool = False,
    registered: bool = False,
) -> Iterator[None]:
    """tinax's load engine with ``threads``, its checks or its transfers left out, a
    host ``buffer`` of another size, the transfers waited for on the reading threads,
    or its host buffer registered with the device's client for DMA (``registered``:
    transfers then read it in place rather than through a copy of the runtime's)."""
    saved = _fast_load._loaders, _fast_load._check, _fast_load._place
    saved_size = _fast_load.DEVICE_HOST_BUFFER_BYTES
    saved_wait = _fast_load.WAIT_APART
    saved_arena = _host_buffers._arena
    if registered:
        arena = registered_arena(buffer or _fast_load.DEVICE_HOST_BUFFER_BYTES)
        _host_buffers._arena = lambda size: arena[:size]  # type: ignore[assignment]
    if buffer is not None:
        _fast_load.DEVICE_HOST_BUFFER_BYTES = buffer
    if wait_on_readers:
        _fast_load.WAIT_APART = False
    if threads is not None:
        _fast_load._loaders = ProcessPool(threads, "tinax-load-bench")
    if not check:
        _fast_load._check = lambda part: None  # type: ignore[assignment]
    if not place:
        _fast_load._place = lambda part, *, alias: []  # type: ignore[assignment]
    try:
        yield
    finally:
        _fast_load._loaders, _fast_load._check, _fast_load._place = saved
        _fast_load.DEVICE_HOST_BUFFER_BYTES = saved_size
        _fast_load.WAIT_APART = saved_wait
        _host_buffers._arena = saved_arena  # type: ignore[assignment]


def engine_alone(where: Path, want: dict[str, Any], fresh: bool = False) -> float:
    """Seconds for the engine to read, check and place every part (its plans made
    first, untimed; the arrays not assembled); ``fresh``: without the host buffer
    an earlier load kept."""
    if fresh:
        _host_buffers.drop_kept()
    plans = []
    opened = open_checkpoint(local(where))
    for name, target in want.items():
        found = _load_plan.plan(opened.get(name), target)
        assert not isinstance(found, str), found
        plans.append(found)
    start = time.perf_counter()
    try:
        _fast_load._run(plans)
        for p in plans:
            for leaf in p.leaves:
                jax.block_until_ready(list(leaf.values.values()))
        seconds = time.perf_counter() - start
    finally:
        for p in plans:
            p.files.close()
    failed = [p.failed for p in plans if p.failed is not None]
    assert not failed, failed
    return seconds


def print_ceiling(
    rows: list[tuple[str, float]], link: list[float], floors: dict[str, float], stored: int
) -> None:
    """Prints the ceiling the stages set and how close tinax's load came to it."""
    threads = _fast_load.THREADS
    # With every stage overlapped perfectly, a load takes as long as its slowest
    # stage alone: the host's (reading, decoding and digesting on all the load's
    # threads) or the link's (the fastest of the transfers above).
    host_s = dict(rows)[f"read + decode + digest, {threads} thread(s)"]
    ceiling = max(host_s, min(link))
    print(
        f"a load is no faster than its slowest stage: the host's {host_s:.3f} s "
        f"(read + decode + digest), the link's {min(link):.3f} s: at best "
        f"{stored / ceiling / floors['dd_8_parallel_mb_s'] / 1e6:.2f} of 8 parallel dd"
    )
    # The goal: a load overlapped so that it takes at most 1.25x its slowest stage (on
    # a CPU, where a transfer aliases host memory, the host's).
    loaded_s = dict(rows)["tinax load (load_checkpointables)"]
    print(
        f"tinax's load took {loaded_s:.3f} s: {loaded_s / ceiling:.2f}x its slowest stage "
        f"({ceiling:.3f} s) (goal <= 1.25x" + (")" if loaded_s <= 1.25 * ceiling else ": missed)")
    )


def goal_only(
    args: argparse.Namespace,
    where: Path,
    state: dict[str, Any],
    rows: list[tuple[str, float]],
    report: Callable[[str, list[float]], None],
    link: list[float],
    floors: dict[str, float],
    stored: int,
) -> int:
    """``--goal``: after the stages, tinax's load, its engine alone, with its transfers
    left out and with its host buffer registered for DMA, and the goal."""
    want = bench.targets(state)
    if jax.default_backend() != "cpu":
        with contextlib.suppress(jax.errors.JaxRuntimeError):
            registered_arena(_fast_load.DEVICE_HOST_BUFFER_BYTES)
    seconds = []
    for _ in range(args.rounds + 1):
        start = time.perf_counter()
        jax.block_until_ready(tc.load_checkpointables(where, want))
        seconds.append(time.perf_counter() - start)
    report("tinax load (load_checkpointables)", seconds[1:])
    loaded = tc.load_checkpointables(where, want)
    if not bench.identical(loaded, state):
        raise SystemExit("FAILED: a loaded leaf differs from the state")
    print("every leaf of a load bit-identical on its device and sharding")
    del loaded
    variants: list[tuple[str, dict[str, Any]]] = [
        ("engine alone", {}),
        ("engine, no transfers", {"place": False}),
    ]
    if REGISTERED_ARENA:
        variants.append(("engine, its host buffer registered for DMA", {"registered": True}))
    for label, settings in variants:
        seconds = []
        with engine(**settings):
            for _ in range(args.rounds + 1):
                seconds.append(engine_alone(where, want))
        report(label, seconds[1:])
    print_ceiling(rows, link, floors, stored)
    import shutil

    shutil.rmtree(where.parent, ignore_errors=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=tuple(bench.SIZES), default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--uncompressed", action="store_true")
    parser.add_argument(
        "--zstd-level", type=int, default=None, help="zstd at this level (Orbax's is 3)"
    )
    parser.add_argument("--dir", default=None)
    parser.add_argument("--quick", action="store_true", help="the load's own threads only")
    parser.add_argument(
        "--goal",
        action="store_true",
        help="only what the goal compares (the host's stage, the link, the load) and the "
        "engine with its transfers left out or its buffer registered for DMA",
    )
    args = parser.parse_args()
    size = args.size or ("accelerator" if jax.default_backend() != "cpu" else "cpu")
    params, opt, step = bench.make_state(size)
    tokens = jax.numpy.arange(8) % bench.SIZES[size][2]
    params, opt, _ = step(params, opt, tokens)
    state = {"params": params, "opt_state": opt}
    total = bench.nbytes(state)
    device = jax.devices()[0]
    threads = _fast_load.THREADS
    scratch = Path(tempfile.mkdtemp(dir=args.dir, prefix="load-stages-"))
    where = scratch / "ckpt"
    level = None if args.zstd_level is None else bench.ZstdLevel(args.zstd_level)
    with tc.compression(not args.uncompressed):
        tc.save_checkpointables(where, state).result()
    if level is not None:
        level.undo()
    jobs, zstd = stored_chunks(where, state)
    codec = f" (zstd level {3 if args.zstd_level is None else args.zstd_level})"
    stored = sum(j[2] for j in jobs)
    print(
        f"{total / 1e9:.2f} GB state on {jax.default_backend()} ({os.cpu_count()} cores), "
        f"{len(jobs)} chunks, {stored / 1e9:.2f} GB stored{codec if zstd else ''}; "
        f"the load's threads: {threads}"
    )
    rows: list[tuple[str, float]] = []

    def report(name: str, seconds: list[float]) -> None:
        s = statistics.median(seconds)
        rows.append((name, s))
        print(
            f"{name:40} {s:7.3f} s  state {total / s / 1e6:8.0f} MB/s  "
            f"stored {stored / s / 1e6:8.0f} MB/s",
            flush=True,
        )

    floors = bench.file_floors(where)
    print("floors: " + ", ".join(f"{k} {v:.0f}" for k, v in floors.items()))
    host = jax.device_get(state)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    report("device_put of the host copy", _puts(host, shardings, args.rounds))
    link = [rows[-1][1]]
    for name, seconds in ({} if args.goal else link_floors(host, shardings, args.rounds)).items():
        if isinstance(seconds, str):
            print(f"device_put {name}: {seconds}")
        else:
            report(f"device_put {name}", seconds)
            link.append(rows[-1][1])
    del host
    stages: list[tuple[str, Callable[[Stage, Job], Any]]] = [
        ("read", lambda s, j: s.read(j)),
        ("read + decode", lambda s, j: s.decode(j, zstd)),
        ("read + decode + digest", lambda s, j: s.digest(j, zstd)),
        ("read + decode + digest + put", lambda s, j: s.put(j, zstd, device)),
    ]
    for n in sorted({1, 8, threads}) if not args.quick else [threads]:
        for name, work in stages:
            report(
                f"{name}, {n} thread(s)",
                [timed_threads(jobs, n, work) for _ in range(args.rounds)],
            )
    if args.goal:
        return goal_only(args, where, state, rows, report, link, floors, stored)
    report(
        f"read + decode into a 256 MiB ring, {threads} threads",
        [decoded_into_ring(jobs, threads, zstd) for _ in range(args.rounds)],
    )
    for n in sorted({8, threads}) if not args.quick else []:
        report(
            f"read + decode, {n} processes",
            [decoded_by_processes(jobs, n, zstd) for _ in range(args.rounds)],
        )
    for how, took in populate_floor(_fast_load.HOST_BUFFER_BYTES, threads).items():
        print(f"{_fast_load.HOST_BUFFER_BYTES >> 20} MiB of fresh memory, {how}: {took:.3f} s")
    with contextlib.suppress(OSError):
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
        print(f"transparent huge pages: {thp}")
    report(
        f"copy of the state's bytes in memory, {threads} threads",
        [copy_floor(total, threads) for _ in range(args.rounds)],
    )
    copy_s = rows[-1][1]
    # What a load moves through memory at the least: the stored bytes read into memory
    # (the page cache read, a buffer written), decoded (read again, the state's bytes
    # written), digested (read), and copied by the transfer (read).
    moved = 3 * stored + 3 * total if zstd else 4 * total
    print(
        f"a load moves at least {moved / 1e9:.1f} GB through memory: "
        f"{moved / (2 * total) * copy_s:.3f} s at the copy's rate (a copy moves 2 bytes "
        f"a byte), {stored / (moved / (2 * total) * copy_s) / floors['dd_8_parallel_mb_s'] / 1e6:.2f} "
        "of 8 parallel dd"
    )
    if jax.default_backend() != "cpu":
        try:
            registered_arena(_fast_load.DEVICE_HOST_BUFFER_BYTES)
        except jax.errors.JaxRuntimeError as e:
            print(f"no host buffer registered for DMA: {e}")
    want = bench.targets(state)
    for fresh in (False, True):
        seconds = []
        for _ in range(args.rounds + 1):
            if fresh:
                _host_buffers.drop_kept()
            start = time.perf_counter()
            jax.block_until_ready(tc.load_checkpointables(where, want))
            seconds.append(time.perf_counter() - start)
        label = ", its host buffer new" if fresh else ""
        report(f"tinax load (load_checkpointables){label}", seconds[1:])
    loaded = tc.load_checkpointables(where, want)
    if not bench.identical(loaded, state):
        raise SystemExit("FAILED: a loaded leaf differs from the state")
    print("every leaf of a load bit-identical on its device and sharding")
    del loaded
    for label, settings, fresh in [
        ("engine alone", {}, False),
        ("engine, its host buffer new", {}, True),
        ("engine, no checks", {"check": False}, False),
        ("engine, no transfers", {"place": False}, False),
        ("engine, neither", {"check": False, "place": False}, False),
        ("engine, neither, its host buffer new", {"check": False, "place": False}, True),
        ("engine, transfers waited for on the readers", {"wait_on_readers": True}, False),
        (f"engine, {threads - 3} threads", {"threads": threads - 3}, False),
        ("engine, 2 GiB host buffer", {"buffer": 2 << 30}, False),
        *(
            [("engine, its host buffer registered for DMA", {"registered": True}, False)]
            if REGISTERED_ARENA
            else []
        ),
        ("engine, 256 MiB host buffer", {"buffer": 256 << 20}, False),
        ("engine, 1 GiB host buffer", {"buffer": 1 << 30}, False),
        *[
            (f"engine, {n} threads", {"threads": n}, False)
            for n in (8, 2 * threads)
            if not args.quick
        ],
    ]:
        seconds = []
        with engine(**settings):  # type: ignore[arg-type]
            for _ in range(args.rounds + 1):
                seconds.append(engine_alone(where, want, fresh))
        report(label, seconds[1:])
    print_ceiling(rows, link, floors, stored)
    best = min(s for name, s in rows if name.startswith(("tinax load", "engine alone")))
    print(
        f"tinax load at its best: {stored / best / floors['dd_8_parallel_mb_s'] / 1e6:.2f} of "
        f"8 parallel dd, {stored / best / floors['cat_mb_s'] / 1e6:.2f} of one cat"
    )
    import shutil

    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
