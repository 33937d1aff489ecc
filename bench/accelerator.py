"""tinax against raw Orbax on whatever JAX backend this process finds (TPU, GPU or CPU).

The workload is a flax NNX transformer and its optax adamw state, trained by a
jitted step that donates both. Each round saves it with raw Orbax V1's defaults
(``save_checkpointables_async``) and with tinax (``save_checkpointables``, checksums
on), in alternation (each round starting with the next system), in the same
process, on the same disk, while the training loop goes on; then loads it back onto
the same shardings. One untimed save and load of each system come first. Printed for
each, Orbax beside tinax (medians of the rounds):

- step time lost (the headline): the sum of each training step's excess, while the
  save runs after its call returned, over the median of the steps trained just before
  it; and of it the steps' dispatch (the jitted call) and the wait for their results;
- blocking: seconds until the save call returns, and of those the device-to-host
  copy Orbax makes (both systems make it the same way) and the rest of the call;
- slowest step: the longest training step while the save runs in the background;
- save and load MB/s (the state's bytes over the time until the save commits, or
  the load returns);
- host RSS peak: resident memory above its level before the save, sampled;
- the floors: ``jax.device_get`` of the state, and ``dd`` writing as many bytes
  with ``conv=fsync``.

It also checks what a user relies on: every leaf restored bit-identical onto its
device and sharding, and a flipped byte refused (``CorruptDataError``).

On an accelerator the state is 2.8 GB (4 blocks of width 2048, a bf16 embedding of
32768 x 2048); on a CPU a small one. ``--smoke`` (``make test``) runs the smallest
size and checks correctness only. Exit status 1 when a goal is missed:

- accelerator: step time lost <= 0.8x Orbax's, slowest step <= 1.2x Orbax's,
  blocking <= 1.1x Orbax's (not with ``--step-s``, whose state is left unchanged
  between saves), save >= 1.2x and load >= 2x Orbax's MB/s;
- CPU: save and load >= 1.5x Orbax's MB/s.

Three configurations: the model's own step (the state pure dicts of the parameters and
optax's state); ``--step-s 0.02``, a short step of its own while each save runs, the
saved state left alone; ``--donated``, the model and an ``nnx.Optimizer`` split into
``nnx.State`` trees, as a flax NNX loop holds and saves them, donated by the jitted
step. ``--kill-check`` SIGKILLs a job training the configuration's loop during a save
and resumes it from the newest committed checkpoint.

On an accelerator tinax saves with zstd by default (``default_compression``); the
``tinax uncompressed`` and ``orbax uncompressed`` systems write the same state
uncompressed, ``tinax pinned`` copies it to the host through pinned host memory.

``--diagnose`` samples, from a separate process (``bench/_kernel_sampler.py``),
every thread's kernel state and wait channel and the kernel's dirty-page and
reclaim counters, and prints what they were during each training step slower than
0.3 s, beside a probe thread that measures how late a 1 ms sleep wakes (the GIL
held, or the whole process stalled); and for each save, where the loop waited
(``where_the_loop_waited``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from orbax.checkpoint import v1 as ocp

import tinax.checkpointing as tc
from tinax.checkpointing import _context as tc_context

SIZES = {
    # width, blocks, vocabulary
    "smoke": (64, 1, 256),
    "cpu": (1024, 2, 16384),
    "accelerator": (2048, 4, 32768),
}


class Block(nnx.Module):
    def __init__(self, width: int, rngs: nnx.Rngs) -> None:
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.q = nnx.Linear(width, width, rngs=rngs)
        self.k = nnx.Linear(width, width, rngs=rngs)
        self.v = nnx.Linear(width, width, rngs=rngs)
        self.o = nnx.Linear(width, width, rngs=rngs)
        self.up = nnx.Linear(width, 4 * width, rngs=rngs)
        self.down = nnx.Linear(4 * width, width, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.norm(x)
        att = jax.nn.softmax(self.q(h) @ self.k(h).T / np.sqrt(h.shape[-1]), axis=-1)
        x = x + self.o(att @ self.v(h))
        return x + self.down(jax.nn.gelu(self.up(x)))


class Transformer(nnx.Module):
    def __init__(self, width: int, blocks: int, vocabulary: int, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(vocabulary, width, param_dtype=jnp.bfloat16, rngs=rngs)
        self.blocks = nnx.List([Block(width, rngs) for _ in range(blocks)])

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens).astype(jnp.float32)
        for block in self.blocks:
            x = block(x)
        return x @ self.embed.embedding[...].astype(jnp.float32).T


def make_state(size: str) -> tuple[Any, Any, Any]:
    width, blocks, vocabulary = SIZES[size]
    model = Transformer(width, blocks, vocabulary, nnx.Rngs(0))
    graph, params = nnx.split(model)
    params = params.to_pure_dict()
    optimizer = optax.adamw(1e-4)
    opt_state = optimizer.init(params)

    def loss(p: Any, tokens: jax.Array) -> jax.Array:
        # Each token predicts the next: a bounded loss, so that the state stays finite
        # (and as incompressible as a real one) however many steps the rounds take.
        logits = nnx.merge(graph, p)(tokens)
        labels = (tokens + 1) % vocabulary
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def step(p: Any, o: Any, tokens: jax.Array) -> tuple[Any, Any, jax.Array]:
        value, grads = jax.value_and_grad(loss)(p, tokens)
        updates, o = optimizer.update(grads, o, p)
        return optax.apply_updates(p, updates), o, value

    return params, opt_state, jax.jit(step, donate_argnums=(0, 1))


def make_nnx_state(size: str) -> tuple[Any, Any, Any]:
    """The third configuration's state and step: the model and an ``nnx.Optimizer``
    (adamw) split into ``nnx.State`` trees, as a flax NNX loop holds and saves them,
    and a jitted step that donates both (``jax.jit(step, donate_argnums=(0, 1))``)
    and returns them changed."""
    width, blocks, vocabulary = SIZES[size]
    model = Transformer(width, blocks, vocabulary, nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-4), wrt=nnx.Param)
    model_graph, model_state = nnx.split(model)
    optimizer_graph, optimizer_state = nnx.split(optimizer)

    def step(m: Any, o: Any, tokens: jax.Array) -> tuple[Any, Any, jax.Array]:
        live, opt = nnx.merge(model_graph, m), nnx.merge(optimizer_graph, o)

        def loss(module: Transformer) -> jax.Array:
            labels = (tokens + 1) % vocabulary
            return optax.softmax_cross_entropy_with_integer_labels(module(tokens), labels).mean()

        value, grads = nnx.value_and_grad(loss)(live)
        opt.update(live, grads)
        return nnx.state(live), nnx.state(opt), value

    return model_state, optimizer_state, jax.jit(step, donate_argnums=(0, 1))


# The state's two parts, as each configuration names them: pure dicts of the model's
# parameters and optax's state, or the NNX states (``--donated``).
KEYS = ("params", "opt")


def build_state(size: str, donated: bool) -> tuple[dict[str, Any], Any]:
    """The configuration's state (two parts, named by ``KEYS``) and its step."""
    global KEYS
    KEYS = ("model", "optimizer") if donated else ("params", "opt")
    a, b, step = (make_nnx_state if donated else make_state)(size)
    return dict(zip(KEYS, (a, b), strict=True)), step


def batch(size: str) -> jax.Array:
    """The tokens every step trains on: a short batch on a CPU, where the step's matrix
    work would otherwise take longer than a save."""
    return jnp.arange(128 if jax.default_backend() != "cpu" else 8) % SIZES[size][2]


def nbytes(tree: Any) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree) if hasattr(x, "nbytes"))


def release_free_memory() -> None:
    """Collects garbage and hands the allocator's free pages back to the system, so
    that each save's RSS peak is measured from the same kind of start (not from a
    heap the previous save or load left full of free pages)."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    if name is not None:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(name).malloc_trim(0)


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Probe:
    """Samples RSS and how late a thread that sleeps 1 ms wakes (the GIL held, or the
    process's cores busy): the latest wake, and every wake's lateness added up; and
    times Python's cycle collections (the longest, in whichever thread it ran)."""

    def __init__(self) -> None:
        import gc

        self.base = rss()
        self.peak = self.base
        self.late = 0.0
        self.late_total = 0.0
        self.gc_pause = 0.0
        self._gc_start = 0.0
        self._gc = gc
        gc.callbacks.append(self._collecting)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.perf_counter()
            time.sleep(0.001)
            late = time.perf_counter() - t - 0.001
            self.late = max(self.late, late)
            # Lateness beyond 1 ms: a busy machine's ordinary jitter left out.
            self.late_total += max(0.0, late - 0.001)
            self.peak = max(self.peak, rss())

    def _collecting(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_pause = max(self.gc_pause, time.perf_counter() - self._gc_start)

    def stop(self) -> tuple[float, float]:
        self._stop.set()
        self._thread.join()
        self._gc.callbacks.remove(self._collecting)
        return (self.peak - self.base) / 1e6, self.late


# With --step-s: the short step trained while saves run (the second configuration).
SHORT_STEP: list[Any] = []


def short_step(seconds: float, tokens: jax.Array) -> Any:
    """A jitted step of about ``seconds`` on this backend: a small model's matrix work
    (repeated products of a 256 x 256 matrix), calibrated here. The saved state is
    not touched, so the saves run beside a loop whose steps are as short as a large
    model's on an accelerator."""
    x = jnp.ones((256, 256), jnp.float32)
    reps = 4
    while True:

        def run(t: jax.Array, n: int = reps) -> jax.Array:
            start = x + t[0].astype(jnp.float32) * 0
            return jax.lax.fori_loop(0, n, lambda i, v: jnp.tanh(v @ v) * 0.5, start).mean()

        fn = jax.jit(run)
        fn(tokens).block_until_ready()
        begin = time.perf_counter()
        for _ in range(5):
            fn(tokens).block_until_ready()
        took = (time.perf_counter() - begin) / 5
        if took >= seconds or reps >= 1 << 16:
            return fn
        reps = max(reps + 1, int(reps * seconds / max(took, 1e-6)))


STACKS: Any = None
# Training steps slower than SLOW_S: (system, round, start, end), perf_counter times.
SLOW_S = 0.3
SLOW_STEPS: list[tuple[str, int, float, float]] = []


class Watchdog:
    """Writes every thread's Python stack to ``STACKS`` when a step runs over 0.3 s."""

    def __init__(self, system: str) -> None:
        self.system = system
        self.started = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import traceback

        dumped = None
        while not self._stop.wait(0.05):
            started = self.started
            if time.perf_counter() - started > 0.3 and dumped != started:
                dumped = started
                names = {t.ident: t.name for t in threading.enumerate()}
                lines = [f"=== {self.system}: step running {time.perf_counter() - started:.2f} s"]
                for ident, frame in sys._current_frames().items():
                    stack = "".join(traceback.format_stack(frame)[-8:])
                    lines.append(f"--- thread {names.get(ident, ident)}\n{stack}")
                STACKS.write("\n".join(lines) + "\n")
                STACKS.flush()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class CopyClock:
    """Times Orbax's device-to-host copy inside each save call (both systems make it
    through ``replica_slices.transfer_arrays_to_host``), so that a save call's
    blocking time splits into the copy and everything else.

    tinax starts the copies earlier in its call, so for tinax this is only the time
    spent waiting for them there, and the rest of its call includes the copies
    made meanwhile."""

    def __init__(self) -> None:
        from orbax.checkpoint._src.serialization import replica_slices

        from tinax.checkpointing import _checksummed_handler as _checksums

        # tinax's observer first, so that it keeps observing under the clock.
        _checksums._orbax.observe_host_copies(_checksums._on_host_copy)
        self.seconds = 0.0
        inner = replica_slices.transfer_arrays_to_host

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        # Keeps the attributes tinax recognises its own hook by.
        timed.__dict__.update(inner.__dict__)
        timed.__wrapped__ = getattr(inner, "__wrapped__", inner)  # type: ignore[attr-defined]
        replica_slices.transfer_arrays_to_host = timed

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


COPIES: CopyClock | None = None


class ZstdLevel:
    """Has saves store arrays with zstd at ``level`` (Orbax's is 3) until ``undo``.

    Orbax builds each array's zarr3 codecs in the background part of the save, so
    the level stays in force until the save has finished."""

    def __init__(self, level: int) -> None:
        from orbax.checkpoint._src.serialization import tensorstore_utils

        self._module = tensorstore_utils
        self._original = original = tensorstore_utils._build_zarr3_metadata

        def build(global_shape: Any, chunk_shape: Any, use_compression: bool) -> Any:
            metadata = original(global_shape, chunk_shape, use_compression)
            for codec in metadata["codecs"][0]["configuration"]["codecs"]:
                if codec["name"] == "zstd":
                    codec["configuration"]["level"] = level
            return metadata

        tensorstore_utils._build_zarr3_metadata = build

    def undo(self) -> None:
        self._module._build_zarr3_metadata = self._original


@contextlib.contextmanager
def TsLimit(resource: str, limit: int) -> Iterator[None]:
    """Saves started in the block run on at most ``limit`` threads of tensorstore's
    ``resource``: ``file_io_concurrency`` (its file writes; Orbax's default 128) or
    ``data_copy_concurrency`` (its encoding, zstd's compression among it; by default
    one thread a core).

    Orbax makes each save's tensorstore context in the save call: the block may end
    when the call returns."""
    from orbax.checkpoint._src.serialization import tensorstore_utils

    contexts = (tensorstore_utils._BASE_TS_CONTEXT, tensorstore_utils._DEFAULT_OCDBT_TS_CONTEXT)
    originals = [c.get(resource) for c in contexts]
    for c in contexts:
        c[resource] = {"limit": limit}
    try:
        yield
    finally:
        for c, original in zip(contexts, originals, strict=True):
            if original is None:
                c.pop(resource, None)
            else:
                c[resource] = original


@contextlib.contextmanager
def Batches(count: int | None) -> Iterator[None]:
    """Has tinax's save calls in the block hand the state to the writer in ``count``
    batches (``None``: Orbax's order, the whole state copied before the first write).

    Only the save call reads the setting: the block may end when it returns."""
    from tinax.checkpointing import _host_copies

    original, batches = _host_copies.write_batch_bytes, _host_copies.WRITE_BATCHES
    if count is None:
        _host_copies.write_batch_bytes = lambda checkpointable: None  # type: ignore[assignment]
    else:
        _host_copies.WRITE_BATCHES = count
    try:
        yield
    finally:
        _host_copies.write_batch_bytes, _host_copies.WRITE_BATCHES = original, batches


@contextlib.contextmanager
def EncodeThreads(count: str) -> Iterator[None]:
    """Has tinax's save calls in the block compress on ``count`` threads (``all``:
    tensorstore's default, one a core) rather than on all but
    ``_host_copies.FREE_CORES`` of the cores.

    Only the save call reads the setting: the block may end when it returns."""
    from tinax.checkpointing import _host_copies

    original = _host_copies.encode_threads
    threads = None if count == "all" else int(count)
    _host_copies.encode_threads = lambda checkpointable: threads  # type: ignore[assignment]
    try:
        yield
    finally:
        _host_copies.encode_threads = original  # type: ignore[assignment]


def targets(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _nothing() -> None:
    pass


def start_save(system: str, where: Path, state: Any) -> tuple[Any, Callable[[], None]]:
    """Starts ``system``'s save of ``state``; returns its response and what undoes the
    system's settings once the save has finished."""
    undo: Callable[[], None] = _nothing
    response: Any
    if system == "orbax":
        response = ocp.save_checkpointables_async(where, state)
    elif system == "orbax uncompressed":
        ctx = ocp.Context()
        ctx.array.saving.use_compression = False
        with ctx:
            response = ocp.save_checkpointables_async(where, state)
    elif system == "tinax compressed":
        with tc.compression():
            response = tc.save_checkpointables(where, state)
    elif system == "tinax uncompressed":
        with tc.compression(False):
            response = tc.save_checkpointables(where, state)
    elif system.startswith("tinax uncompressed io "):
        with tc.compression(False), TsLimit("file_io_concurrency", int(system.rsplit(" ", 1)[1])):
            response = tc.save_checkpointables(where, state)
    elif system == "tinax 8 MiB chunks":
        ctx = ocp.Context()
        ctx.array.saving.storage_options.chunk_byte_size = 8 << 20
        with ctx:
            response = tc.save_checkpointables(where, state)
    elif system == "tinax one chunk":
        ctx = ocp.Context()
        ctx.array.saving.scoped_storage_options_creator = lambda keypath, value: None
        with ctx:
            response = tc.save_checkpointables(where, state)
    elif system == "tinax pinned":
        ctx = ocp.Context()
        ctx.array.saving.enable_pinned_host_transfer = True
        with ctx:
            response = tc.save_checkpointables(where, state)
    elif system == "tinax no checksums":
        with tc_context.without_checksums():
            response = tc.save_checkpointables(where, state)
    elif system.startswith("tinax zstd "):
        level = ZstdLevel(int(system.rsplit(" ", 1)[1]))
        undo = level.undo
        with tc.compression():
            response = tc.save_checkpointables(where, state)
    elif system.startswith("tinax compressors "):
        with EncodeThreads(system.rsplit(" ", 1)[1]):
            response = tc.save_checkpointables(where, state)
    elif system == "tinax switch 0.5 ms":
        # The GIL handed over every 0.5 ms (Python's default: 5 ms) until the save ends.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(0.0005)
        response = tc.save_checkpointables(where, state)
        undo = functools.partial(sys.setswitchinterval, interval)
    elif system == "tinax copy first":
        with Batches(None):
            response = tc.save_checkpointables(where, state)
    elif system.startswith("tinax batches "):
        with Batches(int(system.rsplit(" ", 1)[1])):
            response = tc.save_checkpointables(where, state)
    else:
        response = tc.save_checkpointables(where, state)
    return response, undo


# Steps trained before each save, without one: the step time a save's steps are
# measured against.
BASE_STEPS = 20
# Each save's window: (system, round, start, end), perf_counter times.
SAVE_WINDOWS: list[tuple[str, int, float, float]] = []


def save_round(
    system: str, where: Path, state: dict[str, Any], step: Any, tokens: jax.Array, r: int = 0
) -> tuple[dict[str, Any], dict[str, float]]:
    """Trains ``BASE_STEPS`` steps, then saves ``state`` while training goes on until
    the save has committed; returns the new state and the figures.

    Each step is timed in two parts: its dispatch (the jitted call, which needs the
    GIL and a core) and the wait for its result (the device's work, and the GIL
    taken back). The step time lost is the sum of each step's excess over the
    median step before the save, and likewise for each part."""
    short = SHORT_STEP[0] if SHORT_STEP else None
    a, b = (state[k] for k in KEYS)

    def one() -> tuple[float, float]:
        nonlocal a, b
        t = time.perf_counter()
        if short is not None:
            # The second configuration: a short step, the saved state left alone.
            value = short(tokens)
        else:
            a, b, value = step(a, b, tokens)
        dispatched = time.perf_counter()
        value.block_until_ready()
        return dispatched - t, time.perf_counter() - dispatched

    before = [one() for _ in range(BASE_STEPS)]
    state = dict(zip(KEYS, (a, b), strict=True))
    jax.block_until_ready(state)
    base = statistics.median(d + w for d, w in before)
    base_dispatch = statistics.median(d for d, _ in before)
    base_wait = statistics.median(w for _, w in before)
    total = nbytes(state)
    release_free_memory()
    probe = Probe()
    if COPIES is not None:
        COPIES.take()
    start = time.perf_counter()
    response, undo = start_save(system, where, state)
    blocking = time.perf_counter() - start
    copy = COPIES.take() if COPIES is not None else 0.0
    del state
    done = threading.Event()
    response.on_complete(lambda _: done.set())
    steps: list[tuple[float, float]] = []
    watch = Watchdog(system) if STACKS is not None else None
    while not done.is_set():
        t = time.perf_counter()
        if watch is not None:
            watch.started = t
        steps.append(one())
        took = sum(steps[-1])
        if took > SLOW_S:
            SLOW_STEPS.append((system, r, t, t + took))
    if watch is not None:
        watch.stop()
    response.result()
    end = time.perf_counter()
    seconds = end - start
    SAVE_WINDOWS.append((system, r, start + blocking, end))
    undo()
    rss_peak, late = probe.stop()
    times = [d + w for d, w in steps]
    figures = {
        # The headline: training time the save cost the loop after its call returned.
        "step_lost_s": sum(max(0.0, x - base) for x in times),
        "dispatch_lost_s": sum(max(0.0, d - base_dispatch) for d, _ in steps),
        "wait_lost_s": sum(max(0.0, w - base_wait) for _, w in steps),
        "step_s": base,
        "blocking_s": blocking,
        # Of which Orbax's device-to-host copy, and the rest of the call.
        "device_copy_s": copy,
        "blocking_beyond_copy_s": blocking - copy,
        "slowest_step_s": max(times) if times else 0.0,
        "steps": float(len(steps)),
        "save_mb_s": total / seconds / 1e6,
        "rss_peak_mb": rss_peak,
        "probe_late_s": late,
        "probe_late_total_s": probe.late_total,
        "gc_pause_s": probe.gc_pause,
    }
    return dict(zip(KEYS, (a, b), strict=True)), figures


def load_round(system: str, where: Path, state: dict[str, Any]) -> tuple[Any, float]:
    want = targets(state)
    start = time.perf_counter()
    if system.startswith("orbax"):
        loaded = ocp.load_checkpointables(where, want)
    else:
        loaded = tc.load_checkpointables(where, want)
    jax.block_until_ready(loaded)
    return loaded, nbytes(state) / (time.perf_counter() - start) / 1e6


def identical(a: Any, b: Any) -> bool:
    for (path, x), y in zip(
        jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b), strict=True
    ):
        if not x.sharding.is_equivalent_to(y.sharding, x.ndim):
            print(f"  {jax.tree_util.keystr(path)}: sharding {x.sharding} != {y.sharding}")
            return False
        if np.asarray(x).tobytes() != np.asarray(y).tobytes():
            print(f"  {jax.tree_util.keystr(path)}: values differ")
            return False
    return True


def flip_a_byte(checkpoint: Path) -> None:
    data = max(
        (p for p in checkpoint.rglob("*") if p.parent.name == "d"), key=lambda p: p.stat().st_size
    )
    with open(data, "r+b") as f:
        f.seek(data.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))


def floors(state: Any, scratch: Path) -> dict[str, float]:
    total = nbytes(state)
    start = time.perf_counter()
    host = jax.device_get(state)
    device_get = total / (time.perf_counter() - start) / 1e6
    count = max(1, total >> 24)
    start = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={scratch / 'dd'}", "bs=16M", f"count={count}", "conv=fsync"],
        check=True,
        capture_output=True,
    )
    dd = (count << 24) / (time.perf_counter() - start) / 1e6
    (scratch / "dd").unlink()
    # Host to device: the state's host copy put back on its shardings in one call.
    shardings = jax.tree.map(lambda x: x.sharding, state)
    start = time.perf_counter()
    jax.block_until_ready(jax.device_put(host, shardings))
    device_put = total / (time.perf_counter() - start) / 1e6
    return {"device_get_mb_s": device_get, "device_put_mb_s": device_put, "dd_fsync_mb_s": dd}


def data_files(checkpoint: Path) -> list[Path]:
    """The array data files of a checkpoint (OCDBT's ``d/`` folders)."""
    return sorted(
        p
        for p in checkpoint.rglob("*")
        if "d" in p.relative_to(checkpoint).parts[:-1] and p.is_file()
    )


def _mb_s(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e6


def file_floors(checkpoint: Path) -> dict[str, float]:
    """How fast this machine reads a checkpoint's data files, right after the save
    that wrote them, each way a reader might: one ``cat`` of them all, ``dd`` with
    64 MiB blocks, 8 ``dd`` processes side by side each reading an eighth of the
    bytes, Python's ``readinto`` a reused 64 MiB buffer, and Python's ``read()``
    of 64 MiB into a fresh buffer each time (what the memory costs to touch anew)."""
    files = data_files(checkpoint)
    total = sum(f.stat().st_size for f in files)
    figures = {}
    start = time.perf_counter()
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    figures["cat_mb_s"] = _mb_s(total, time.perf_counter() - start)
    start = time.perf_counter()
    for f in files:
        subprocess.run(["dd", f"if={f}", "of=/dev/null", "bs=64M"], check=True, capture_output=True)
    figures["dd_64m_mb_s"] = _mb_s(total, time.perf_counter() - start)
    # Eight readers, each a run of 1 MiB blocks of one file (the files cut in eighths).
    block = 1 << 20
    pieces = []
    share = -(-total // 8)
    for f in files:
        size = f.stat().st_size
        for offset in range(0, size, share):
            pieces.append((f, offset, min(share, size - offset)))
    start = time.perf_counter()
    readers = []
    for f, offset, length in pieces:
        readers.append(
            subprocess.Popen(
                [
                    "dd",
                    f"if={f}",
                    "of=/dev/null",
                    f"bs={block}",
                    f"skip={offset}",
                    f"count={length}",
                    "iflag=skip_bytes,count_bytes",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        if len(readers) >= 8:
            readers.pop(0).wait()
    for reader in readers:
        reader.wait()
    figures["dd_8_parallel_mb_s"] = _mb_s(total, time.perf_counter() - start)
    buffer = bytearray(64 << 20)
    start = time.perf_counter()
    for f in files:
        with open(f, "rb", buffering=0) as handle:
            while handle.readinto(buffer):
                pass
    figures["readinto_reused_mb_s"] = _mb_s(total, time.perf_counter() - start)
    start = time.perf_counter()
    for f in files:
        with open(f, "rb", buffering=0) as handle:
            while handle.read(64 << 20):
                pass
    figures["read_fresh_mb_s"] = _mb_s(total, time.perf_counter() - start)
    return figures


def read_floors(state: Any, scratch: Path) -> dict[str, float]:
    """A tinax checkpoint of the state read to the host leaf by leaf on 8 threads
    (``tinax.explore.read_leaf``: tensorstore, checksums checked), then put on the
    device in one call: what a load that does not go leaf by leaf through Orbax's
    reads could reach."""
    import concurrent.futures

    import tinax.explore as ex

    total = nbytes(state)
    where = scratch / "read-floor"
    tc.save_checkpointables(where, state).result()
    table = ex.checkpoint_table(where)
    rows = [(r.checkpointable, r.key) for r in table.itertuples() if r.kind == "jax.Array"]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        host = list(pool.map(lambda row: ex.read_leaf(where, *row), rows))
    read = time.perf_counter() - start
    put_start = time.perf_counter()
    jax.block_until_ready(jax.device_put(host, jax.devices()[0]))
    put = time.perf_counter() - put_start
    shutil.rmtree(where)
    return {
        "read_leaf_host_mb_s": total / read / 1e6,
        "read_leaf_then_put_mb_s": total / (read + put) / 1e6,
    }


def fresh_checkpoints(
    size: str | None, scratch: Path, systems: list[str], donated: bool
) -> tuple[str, dict[str, Path]]:
    """Has a process of its own make the state and save it with each system, then
    exit: the loads that follow start in fresh processes, and on an accelerator only
    one process may hold it at a time. Returns the state's size (``size``, or the
    one for that process's backend) and where each system saved it."""
    where = {system: scratch / f"fresh-{system.replace(' ', '_')}" for system in systems}
    command = [sys.executable, __file__, "--phase", "save", "--dir", str(scratch)]
    command += ["--systems", ",".join(systems)] + (["--size", size] if size else [])
    command += ["--donated"] if donated else []
    done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
    return done.stdout.strip().splitlines()[-1], where


def fresh_load(size: str, system: str, path: Path, donated: bool) -> float:
    """Load MB/s of ``path`` in a new process (imports and the state's shapes first,
    untimed): what a job restarting from a checkpoint waits for."""
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--phase",
            "load",
            "--size",
            size,
            "--dir",
            str(path),
            "--systems",
            system,
            *(["--donated"] if donated else []),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(done.stdout.strip().splitlines()[-1])


def phase(args: argparse.Namespace) -> int:
    """One side of ``fresh_checkpoints`` or ``fresh_load``, in its own process."""
    size = args.size or ("accelerator" if jax.default_backend() != "cpu" else "cpu")
    if args.phase == "train":
        return train_until_killed(args, size)
    if args.phase == "resume":
        return resume_after_kill(args, size)
    state, step = build_state(size, args.donated)
    a, b, _ = step(*state.values(), jnp.arange(8) % SIZES[size][2])
    state = dict(zip(KEYS, (a, b), strict=True))
    jax.block_until_ready(state)
    if args.phase == "save":
        for system in args.systems.split(","):
            where = Path(args.dir) / f"fresh-{system.replace(' ', '_')}"
            if system.startswith("orbax"):
                ocp.save_checkpointables(where, state)
            else:
                tc.save_checkpointables(where, state).result()
        print(size)
        return 0
    want, total = targets(state), nbytes(state)
    del state, a, b
    system = args.systems
    start = time.perf_counter()
    if system.startswith("orbax"):
        loaded = ocp.load_checkpointables(args.dir, want)
    else:
        loaded = tc.load_checkpointables(args.dir, want)
    jax.block_until_ready(loaded)
    print(_mb_s(total, time.perf_counter() - start))
    return 0


# The killed job saves every this many steps (TrainingRun's save_every).
KILL_SAVE_EVERY = 50


def train_until_killed(args: argparse.Namespace, size: str) -> int:
    """The job ``kill_during_save`` kills: the configuration's loop saving through
    ``TrainingRun`` every ``KILL_SAVE_EVERY`` steps, saying on its output each step's
    loss (its float's hex), each save started and each save committed."""
    import grain

    state, step = build_state(size, args.donated)
    a, b = state.values()
    tokens = batch(size)
    rng = jax.random.key(7)
    iterator = iter(grain.MapDataset.range(1 << 30).to_iter_dataset())
    # Saves commit on another thread: each line is written whole, under a lock.
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    with tc.TrainingRun(args.dir, save_every=KILL_SAVE_EVERY, keep=3) as run:
        for i in itertools.count():
            a, b, value = step(a, b, tokens)
            next(iterator)
            loss = float(value)
            say(f"loss {i} {loss.hex()}")
            response = run.save(i, a, b, rng, {"loss": loss}, iterator)
            if response is not None:
                say(f"saving {i}")
                response.on_complete(lambda _, i=i: say(f"committed {i}"))
    return 0


def resume_after_kill(args: argparse.Namespace, size: str) -> int:
    """A restarted job: restores the newest checkpoint of the killed job's run, trains
    one step from it and saves it; says what it found."""
    import grain

    state, step = build_state(size, args.donated)
    a, b = state.values()
    tokens = batch(size)
    iterator = iter(grain.MapDataset.range(1 << 30).to_iter_dataset())
    with tc.TrainingRun(args.dir, save_every=KILL_SAVE_EVERY, keep=3, must_exist=True) as run:
        listed = run.steps
        restored = run.restore(
            tc.abstract_restore_target(a),
            tc.abstract_restore_target(b),
            tc.abstract_restore_target(jax.random.key(7)),
            {"loss": 0.0},
            iterator,
        )
        assert restored is not None
        del a, b
        a, b, value = step(restored.model, restored.optimizer, tokens)
        position = next(iterator)
        run.save(
            restored.step + 1, a, b, restored.rng, {"loss": float(value)}, iterator, force=True
        )
        run.wait()
    print(
        json.dumps(
            {
                "listed": listed,
                "restored": restored.step,
                "next_loss": float(value).hex(),
                "iterator_at": int(position),
                "saved_after": run.steps,
            }
        ),
        flush=True,
    )
    return 0


def kill_during_save(size: str | None, scratch: Path, donated: bool, seed: int = 0) -> list[str]:
    """SIGKILLs a training job (``train_until_killed``, in a process of its own) during
    one of its saves after the first has committed, at a random moment of the save's
    background part, then resumes it in a fresh process (``resume_after_kill``).

    Returns what went wrong (nothing: the resumed job restored the newest committed
    checkpoint, the one of the step being saved only if it had committed, the next
    step's loss bit for bit the killed job's, and the iterator where it was)."""
    import random

    run = scratch / "killed-run"
    command = [sys.executable, __file__, "--dir", str(run)]
    command += (["--size", size] if size else []) + (["--donated"] if donated else [])
    errors = scratch / "killed-job.stderr"
    with open(errors, "w") as stderr:
        child = subprocess.Popen(
            [*command, "--phase", "train"], stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    assert child.stdout is not None
    losses: dict[int, str] = {}
    committed: list[int] = []
    saving = None
    # The first save's background part (from its call's return to its commit) sets
    # the range the kill of a later one is drawn from.
    first_started = first_took = None
    # The first save pays for compiling and warming up, and later ones' background
    # parts are shorter: a kill within its first half lands inside the next one.
    delay = random.Random(seed).uniform(0.05, 0.5)
    killed = threading.Event()

    def kill() -> None:
        child.kill()
        killed.set()

    for line in child.stdout:
        kind, _, rest = line.strip().partition(" ")
        now = time.perf_counter()
        if kind == "loss":
            n, value = rest.split()
            losses[int(n)] = value
        elif kind == "committed":
            committed.append(int(rest))
            if first_took is None and first_started is not None:
                first_took = now - first_started
        elif kind == "saving" and first_started is None:
            first_started = now
        elif kind == "saving" and first_took is not None and saving is None:
            saving = int(rest)
            delay *= first_took
            threading.Timer(delay, kill).start()
    child.wait()
    problems = []
    if saving is None or not killed.is_set():
        return [f"the training job ended before it was killed: {errors.read_text()[-2000:]}"]
    after = subprocess.run([*command, "--phase", "resume"], capture_output=True, text=True)
    if after.returncode != 0:
        return [f"the resumed job failed: {after.stderr[-2000:]}"]
    found = json.loads(after.stdout.strip().splitlines()[-1])
    newest = max(found["listed"])
    restored = found["restored"]
    seen = max(committed)
    if restored != newest:
        problems.append(f"resumed from step {restored}, not the newest committed ({newest})")
    if not seen <= restored <= saving:
        problems.append(
            f"resumed from step {restored}: neither the last save seen committed ({seen}) "
            f"nor the one killed ({saving})"
        )
    if restored + 1 in losses and losses[restored + 1] != found["next_loss"]:
        problems.append(
            f"the step after {restored} lost {found['next_loss']} resumed, "
            f"{losses[restored + 1]} before the kill"
        )
    if found["iterator_at"] != restored + 1:
        problems.append(f"the iterator resumed at {found['iterator_at']}, not {restored + 1}")
    if restored + 1 not in found["saved_after"]:
        problems.append(f"the resumed job's save of step {restored + 1} is not listed")
    state = "committed before the kill" if saving in found["listed"] else "left uncommitted"
    print(
        f"SIGKILL {delay:.2f} s into the background part of the save of step {saving} "
        f"(that save {state}; the last seen committed: {seen}): resumed from step "
        f"{restored}, the newest committed; the next step's loss "
        + ("bit-identical to the killed job's" if restored + 1 in losses else "not seen before")
        + f"; the iterator at {found['iterator_at']}",
        flush=True,
    )
    shutil.rmtree(run, ignore_errors=True)
    return problems


def start_sampler(scratch: Path) -> tuple[subprocess.Popen[bytes], Path]:
    out = scratch / "kernel-samples.jsonl"
    sampler = Path(__file__).resolve().parent / "_kernel_sampler.py"
    process = subprocess.Popen([sys.executable, str(sampler), str(os.getpid()), str(out)])
    return process, out


def _top(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda i: -i[1])[:6])


def explain_slow_steps(samples_file: Path, most: int = 12) -> list[str]:
    """What the kernel said the threads were doing during the slowest steps."""
    samples = [json.loads(line) for line in samples_file.read_text().splitlines() if line]
    main_tid = str(os.getpid())
    lines = []
    for system, r, start, end in sorted(SLOW_STEPS, key=lambda s: s[2] - s[3])[:most]:
        during = [x for x in samples if start <= x["t"] <= end]
        if not during:
            continue
        before = max((x for x in samples if x["t"] < start), key=lambda x: x["t"], default=None)
        first = before or during[0]
        last = during[-1]
        main: dict[str, int] = {}
        waiting: dict[str, int] = {}
        for x in during:
            for tid, name, state, wchan, *_ in x["threads"]:
                if tid == main_tid:
                    main[f"{state} {wchan}"] = main.get(f"{state} {wchan}", 0) + 1
                elif state == "D":
                    waiting[f"{name} {wchan}"] = waiting.get(f"{name} {wchan}", 0) + 1
        delta = {
            k: last.get(k, 0) - first.get(k, 0)
            for k in (
                "allocstall_normal",
                "allocstall_movable",
                "pgscan_direct",
                "compact_stall",
                "pgmajfault",
                "pgfault",
                "thp_fault_alloc",
            )
        }
        # The sampler is a process of its own that wakes every 10 ms: a long gap
        # between its samples means the whole machine (not this process) stalled.
        after = min((x for x in samples if x["t"] > end), key=lambda x: x["t"], default=last)
        times = [first["t"], *(x["t"] for x in during), after["t"]]
        gap = max(b - a for a, b in itertools.pairwise(times))
        dirty = max(x.get("dirty_kb", 0) for x in during) / 1024
        writeback = max(x.get("writeback_kb", 0) for x in during) / 1024
        threshold = last.get("nr_dirty_threshold", 0) * 4 / 1024
        lines.append(
            f"{system} round {r}: step of {end - start:.2f} s, {len(during)} samples, "
            f"the sampler's longest gap {gap:.2f} s; "
            f"main thread: {_top(main)}; threads in D: {_top(waiting) or 'none'}; "
            f"dirty up to {dirty:.0f} MiB, writeback up to {writeback:.0f} MiB "
            f"(dirty threshold {threshold:.0f} MiB); "
            + ", ".join(f"{k} +{v}" for k, v in delta.items() if v)
        )
    return lines


# What each save's window is measured by, from the sampler's samples (``--diagnose``).
WINDOW_FIGURES = (
    "cores_busy",
    "runnable_threads",
    "main_runnable",
    "sampler_late_s",
    "sampler_gap_s",
)


def explain_windows(samples_file: Path) -> dict[tuple[str, int], dict[str, float]]:
    """Each save's window after its call returned, as the sampler saw the process:

    - ``cores_busy``: the process's CPU time over the window's length (how many of
      the cores its threads kept busy);
    - ``runnable_threads``: its threads in state ``R`` per sample, on average;
    - ``main_runnable``: the share of samples with the main thread in ``R``;
    - ``sampler_late_s``: how late the sampler, a process of its own that sleeps
      10 ms between samples, woke, added up (cores busy with other work: the
      machine's, not this process's GIL);
    - ``sampler_gap_s``: its longest gap (the whole sandbox stalled, as writes at
      full speed made it)."""
    samples = [json.loads(line) for line in samples_file.read_text().splitlines() if line]
    if len(samples) < 3:
        return {}
    main_tid = str(os.getpid())
    tick = os.sysconf("SC_CLK_TCK")
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(samples)]
    usual = statistics.median(gaps)
    found = {}
    for system, r, start, end in SAVE_WINDOWS:
        inside = [i for i, x in enumerate(samples) if start <= x["t"] <= end]
        if len(inside) < 2:
            continue
        during = [samples[i] for i in inside]

        def ticks(x: dict[str, Any]) -> int:
            return sum(t[4] for t in x["threads"] if len(t) > 4)

        seconds = during[-1]["t"] - during[0]["t"]
        late = sum(max(0.0, gaps[i - 1] - usual) for i in inside[1:])
        found[(system, r)] = {
            "cores_busy": (ticks(during[-1]) - ticks(during[0])) / tick / max(seconds, 1e-9),
            "runnable_threads": statistics.mean(
                sum(1 for t in x["threads"] if t[2] == "R") for x in during
            ),
            "main_runnable": statistics.mean(
                any(t[0] == main_tid and t[2] == "R" for t in x["threads"]) for x in during
            ),
            "sampler_late_s": late,
            "sampler_gap_s": max(gaps[i - 1] for i in inside[1:]),
        }
    return found


def where_the_loop_waited(system: str, d: dict[str, float]) -> str:
    """One system's step time lost, split by where it was measured (``--diagnose``)."""
    text = (
        f"{system}: {d['step_lost_s']:.3f} s lost over {d['steps']:.0f} steps: "
        f"{d['dispatch_lost_s']:.3f} s dispatching (the GIL or a core), "
        f"{d['wait_lost_s']:.3f} s waiting for results (the device, or the GIL taken back); "
        f"a thread sleeping 1 ms woke {d['probe_late_total_s']:.3f} s late in all"
    )
    if "cores_busy" in d:
        text += (
            f"; the process kept {d['cores_busy']:.1f} of {os.cpu_count()} cores busy, "
            f"{d['runnable_threads']:.1f} threads runnable, the main thread runnable in "
            f"{d['main_runnable']:.0%} of samples; a process of its own woke "
            f"{d['sampler_late_s']:.3f} s late in all, its longest gap {d['sampler_gap_s']:.3f} s"
        )
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="smallest size; correctness only")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--size", choices=sorted(SIZES), default=None, help="default: by the backend"
    )
    parser.add_argument("--diagnose", action="store_true")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary dir)")
    parser.add_argument("--json", default=None, help="write the figures here too")
    parser.add_argument(
        "--systems",
        default="orbax,tinax",
        help="comma-separated, of: orbax, orbax uncompressed, tinax, tinax compressed, "
        "tinax uncompressed, tinax pinned, "
        "tinax no checksums, tinax one chunk, tinax 8 MiB chunks, "
        "tinax copy first (the whole state on the host before the first write, as "
        "Orbax does), tinax batches N (the state written in N batches while copied), "
        "tinax zstd LEVEL (zstd at LEVEL, Orbax's is 3; negative levels are zstd's fast ones), "
        "tinax uncompressed io N (uncompressed, written on at most N of tensorstore's threads), "
        "tinax compressors N|all (compressing on N threads, or one a core), "
        "tinax switch 0.5 ms (the GIL handed over every 0.5 ms while the save runs)",
    )
    parser.add_argument("--stacks", default=None, help="write threads' stacks of slow steps here")
    parser.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    parser.add_argument(
        "--no-floors", action="store_true", help="skip the floors (dd, device_get, file reads)"
    )
    parser.add_argument("--no-load", action="store_true", help="save only: load nothing back")
    parser.add_argument(
        "--fresh-rounds",
        type=int,
        default=None,
        help="loads of orbax's and tinax's checkpoints in fresh processes, each "
        "(default: --rounds; 0: none)",
    )
    parser.add_argument(
        "--step-s",
        type=float,
        default=None,
        help="the second configuration: while saves run, train a step of about this "
        "many seconds (0.02) instead of the model's own",
    )
    parser.add_argument(
        "--donated",
        action="store_true",
        help="the third configuration: the model and an nnx.Optimizer as nnx.State trees, "
        "trained by a jitted step that donates both",
    )
    parser.add_argument(
        "--kill-check",
        action="store_true",
        help="SIGKILL a job training the configuration's loop during a save, and resume it",
    )
    parser.add_argument(
        "--phase", choices=("save", "load", "train", "resume"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.phase is not None:
        return phase(args)
    global STACKS
    if args.stacks:
        STACKS = open(args.stacks, "w")  # noqa: SIM115

    rounds = 1 if args.smoke else args.rounds
    fresh_rounds = (1 if args.smoke else rounds) if args.fresh_rounds is None else args.fresh_rounds
    scratch = Path(tempfile.mkdtemp(prefix="tinax-bench-", dir=args.dir))
    sampler = None
    explained: list[str] = []
    fresh: dict[str, list[float]] = {"orbax": [], "tinax": []}
    problems: list[str] = []
    stored_fraction = float("nan")
    # The state's size is chosen by the child process's backend, unless given.
    given = args.size or ("smoke" if args.smoke else None)
    try:
        if args.kill_check:
            # Before this process starts the backend: one process holds an accelerator.
            problems += kill_during_save(given, scratch, args.donated)
        if fresh_rounds:
            fresh_size, paths = fresh_checkpoints(given, scratch, list(fresh), args.donated)
            for r in range(fresh_rounds):
                for system in list(fresh)[r % 2 :] + list(fresh)[: r % 2]:
                    fresh[system].append(
                        fresh_load(fresh_size, system, paths[system], args.donated)
                    )
            for path in paths.values():
                shutil.rmtree(path)
            print(
                "fresh-process loads (MB/s): "
                + "; ".join(f"{k} {', '.join(f'{v:.0f}' for v in vs)}" for k, vs in fresh.items()),
                flush=True,
            )
        backend = jax.default_backend()
        accelerator = backend != "cpu"
        size = args.size or ("smoke" if args.smoke else ("accelerator" if accelerator else "cpu"))
        if args.diagnose:
            sampler, samples = start_sampler(scratch)
        state, step = build_state(size, args.donated)
        tokens = batch(size)
        a, b, value = step(*state.values(), tokens)  # compiled before any timing
        if args.step_s is not None:
            SHORT_STEP.append(short_step(args.step_s, tokens))
        state = dict(zip(KEYS, (a, b), strict=True))
        del a, b
        jax.block_until_ready(state)
        total = nbytes(state)
        print(
            f"backend {backend} ({jax.devices()[0].device_kind}), state {total / 1e9:.2f} GB "
            f"in {len(jax.tree.leaves(state))} arrays, {rounds} round(s)",
            flush=True,
        )
        systems = args.systems.split(",")
        results: dict[str, list[dict[str, float]]] = {s: [] for s in systems}
        global COPIES
        COPIES = CopyClock()
        if not args.smoke:
            # One untimed save and load per system first: the first save of a process
            # pays for compiling, thread pools and imports.
            for system in systems:
                where = scratch / f"warmup-{system.replace(' ', '_')}"
                state, _ = save_round(system, where, state, step, tokens, -1)
                jax.block_until_ready(state)
                del SLOW_STEPS[:]
                if not args.no_load:
                    load_round(system, where, state)
                shutil.rmtree(where)
        for r in range(rounds):
            # Each round starts with the next system: none always follows the same
            # one (whose freed host memory, page cache or disk writes it would inherit).
            for system in systems[r % len(systems) :] + systems[: r % len(systems)]:
                where = scratch / f"{system.replace(' ', '_')}-{r}"
                state, figures = save_round(system, where, state, step, tokens, r)
                jax.block_until_ready(state)
                # What was saved is gone (donated): the load is compared with a fresh
                # save's source instead, in the first round only.
                if not args.no_load:
                    loaded, figures["load_mb_s"] = load_round(system, where, state)
                    del loaded
                if system == "tinax":
                    # The share of its bytes the state stores, from tinax's last save.
                    stored_fraction = sum(f.stat().st_size for f in data_files(where)) / total
                if r == 0 and not args.no_check:
                    check = scratch / f"check-{system.replace(' ', '_')}"
                    jax.block_until_ready(state)
                    keep = jax.tree.map(jnp.copy, state)
                    # Saved as the system saves, loaded as it loads.
                    response, undo = start_save(system, check, keep)
                    response.result()
                    undo()
                    if system.startswith("orbax"):
                        back = ocp.load_checkpointables(check, targets(keep))
                    else:
                        back = tc.load_checkpointables(check, targets(keep))
                    if not identical(back, keep):
                        problems.append(f"{system}: a restored leaf differs")
                    # A system that records no checksums has nothing to refuse it by.
                    if not system.startswith("orbax") and system != "tinax no checksums":
                        flip_a_byte(check)
                        try:
                            tc.load_checkpointables(check, targets(keep))
                            problems.append(f"{system}: a flipped byte was loaded")
                        except tc.CorruptDataError as e:
                            figures["flipped_byte_caught"] = 1.0
                            print(f"  flipped byte refused: {str(e)[:160]}...", flush=True)
                    del keep, back
                    shutil.rmtree(check)
                shutil.rmtree(where)
                results[system].append(figures)
                print(
                    f"round {r} {system:>20}: "
                    + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()),
                    flush=True,
                )
        # A state that diverged (inf, NaN) compresses to almost nothing and makes every
        # save and load figure meaningless.
        finite = all(
            bool(jnp.isfinite(x).all())
            for x in jax.tree.leaves(state)
            if jnp.issubdtype(x.dtype, jnp.floating)
        )
        if not finite:
            problems.append("the state is no longer finite: its saves and loads are not a model's")
        floor = {} if args.no_floors else floors(state, scratch)
        if not args.no_floors:
            # The data files of a tinax checkpoint of the state, read right after its save.
            where = scratch / "file-floor"
            tc.save_checkpointables(where, state).result()
            stored_fraction = sum(f.stat().st_size for f in data_files(where)) / total
            largest = sorted(
                (p for p in where.rglob("*") if p.is_file()), key=lambda p: -p.stat().st_size
            )[:3]
            print(
                "largest files of its checkpoint: "
                + ", ".join(f"{p.relative_to(where)} {p.stat().st_size:,}" for p in largest),
                flush=True,
            )
            floor.update(file_floors(where))
            shutil.rmtree(where)
            if args.diagnose:
                floor.update(read_floors(state, scratch))
        print(f"the state's checkpoint stores {stored_fraction:.3f} of its bytes", flush=True)
        if not args.smoke and stored_fraction < 0.25:
            problems.append(
                f"the state's checkpoint stores {stored_fraction:.3f} of its bytes: "
                "not a trained model's (a diverged state?)"
            )
        if sampler is not None:
            sampler.terminate()
            sampler.wait()
            explained = explain_slow_steps(samples)
            # Where the loop waited, save by save: the sampler's figures of each window.
            windows = explain_windows(samples)
            for system, runs in results.items():
                for r, figures in enumerate(runs):
                    figures.update(windows.get((system, r), {}))
    finally:
        if sampler is not None and sampler.poll() is None:
            sampler.kill()
            sampler.wait()
        shutil.rmtree(scratch, ignore_errors=True)

    medians = {
        system: {
            k: statistics.median(f[k] for f in runs if k in f)
            for k in dict.fromkeys(k for f in runs for k in f)
        }
        for system, runs in results.items()
    }
    config = (
        "the third configuration (NNX states, donated)"
        if args.donated
        else "the second configuration (a short step)"
        if args.step_s is not None
        else "the model's own step"
    )
    print(f"\nmedians of {rounds} round(s), {total / 1e9:.2f} GB on {backend}, {config}:")
    print(f"{'':22}{'orbax':>12}{'tinax':>12}{'ratio':>8}")
    for k in (
        "step_lost_s",
        "slowest_step_s",
        "blocking_s",
        "save_mb_s",
        "load_mb_s",
        "dispatch_lost_s",
        "wait_lost_s",
        "step_s",
        "steps",
        "device_copy_s",
        "blocking_beyond_copy_s",
        "rss_peak_mb",
        "probe_late_s",
        "probe_late_total_s",
        "gc_pause_s",
        *WINDOW_FIGURES,
    ):
        if k not in medians["orbax"] or k not in medians["tinax"]:
            continue
        o, t = medians["orbax"][k], medians["tinax"][k]
        print(f"{k:22}{o:12.3f}{t:12.3f}{t / o if o else float('nan'):8.2f}")
    for system, d in medians.items():
        if system not in ("orbax", "tinax"):
            print(f"{system}: " + ", ".join(f"{k} {v:.3f}" for k, v in d.items()))
    if args.diagnose:
        print("\nwhere the loop waited while each system's save ran (medians):")
        for system, d in medians.items():
            print("  " + where_the_loop_waited(system, d))
        print(f"\nthe slowest steps over {SLOW_S} s, as the kernel saw them:")
        for line in explained or ["none"]:
            print("  " + line)
    load_of_files = medians["tinax"].get("load_mb_s", 0.0) * stored_fraction
    if floor and not args.no_load:
        print("floors: " + ", ".join(f"{k} {v:.0f}" for k, v in floor.items()))
        print(
            f"tinax's load reads {stored_fraction:.3f} of the state's bytes: "
            f"{load_of_files:.0f} MB/s of its files, "
            f"{load_of_files / floor['dd_8_parallel_mb_s']:.2f} of 8 parallel dd's"
        )
    fresh_medians = {k: statistics.median(v) for k, v in fresh.items() if v}
    if fresh_medians:
        o, t = fresh_medians["orbax"], fresh_medians["tinax"]
        print(
            f"fresh-process load (medians of {fresh_rounds}): orbax {o:.0f} MB/s, "
            f"tinax {t:.0f} MB/s, ratio {t / o:.2f}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "backend": backend,
                    "bytes": total,
                    "rounds": results,
                    "medians": medians,
                    "floors": floor,
                    "stored_fraction": stored_fraction,
                    "fresh_load_mb_s": fresh,
                    "slow_steps": [list(x) for x in SLOW_STEPS],
                    "slow_steps_explained": explained,
                },
                indent=1,
            )
        )

    o, t = medians["orbax"], medians["tinax"]
    if not args.smoke:
        if accelerator:
            goals = [
                ("step time lost <= 0.8x Orbax's", t["step_lost_s"] <= 0.8 * o["step_lost_s"]),
                ("slowest step <= 1.2x Orbax's", t["slowest_step_s"] <= 1.2 * o["slowest_step_s"]),
                # With --step-s the saved state does not change between saves: JAX
                # keeps its host copy, and Orbax's call copies nothing.
                *(
                    [("blocking <= 1.1x Orbax", t["blocking_s"] <= 1.1 * o["blocking_s"])]
                    if args.step_s is None
                    else []
                ),
                ("save >= 1.2x Orbax", t["save_mb_s"] >= 1.2 * o["save_mb_s"]),
                *(
                    [
                        ("load >= 2x Orbax", t["load_mb_s"] >= 2 * o["load_mb_s"]),
                        *(
                            [
                                (
                                    "load >= 0.5x the parallel file-read rate",
                                    load_of_files >= 0.5 * floor["dd_8_parallel_mb_s"],
                                )
                            ]
                            if floor
                            else []
                        ),
                    ]
                    if not args.no_load
                    else []
                ),
            ]
            if fresh_medians:
                goals.append(
                    (
                        "fresh-process load >= 2x Orbax",
                        fresh_medians["tinax"] >= 2 * fresh_medians["orbax"],
                    )
                )
        else:
            goals = [
                ("save >= 1.5x Orbax", t["save_mb_s"] >= 1.5 * o["save_mb_s"]),
                *(
                    [
                        (
                            "slowest short step <= 1.5x Orbax's",
                            t["slowest_step_s"] <= 1.5 * o["slowest_step_s"],
                        )
                    ]
                    if args.step_s is not None
                    else []
                ),
                *(
                    [("load >= 1.5x Orbax", t["load_mb_s"] >= 1.5 * o["load_mb_s"])]
                    if not args.no_load
                    else []
                ),
            ]
            if fresh_medians:
                goals.append(
                    (
                        "fresh-process load >= 1.5x Orbax",
                        fresh_medians["tinax"] >= 1.5 * fresh_medians["orbax"],
                    )
                )
        problems += [f"goal missed: {name}" for name, met in goals if not met]
    for problem in problems:
        print("FAILED " + problem)
    print("all goals met" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
