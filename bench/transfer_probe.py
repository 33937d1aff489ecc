"""How transfers to the chip and host work share one process, measured apart.

A load reads, decodes and digests on every core while it puts the parts read on the
device; a training loop dispatches steps while a save compresses and writes on the
host. Each probe here times one kind of work alone and beside another:

- ``gil``: a Python thread counting while another thread calls ``jax.device_put``
  (from ordinary memory, from ``pinned_host`` arrays), copies a device array to the
  host, or decodes zstd: its count during the call, of its count when alone, says
  whether the call holds the GIL;
- ``overlap``: host work (read from memory, zstd decode, xxh3 digest, on N threads,
  GIL released) and transfers of the same bytes (one thread putting 64 MiB parts,
  each waited for) alone and side by side, with the transfers from ordinary memory
  and from ``pinned_host`` arrays, and with the host work on one thread fewer;
- ``loop``: a jitted step of about 20 ms that donates its state, timed step by
  step alone, beside a Python thread that never sleeps (the GIL contended), beside
  N threads of zstd compression (the cores busy), and beside both.

    python3 bench/transfer_probe.py [--gb 2.8] [--threads N]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import xxhash
import zstandard

from tinax._format.arraydata import chunkload

MIB = 1 << 20


def counted(call: Callable[[], Any]) -> tuple[float, float]:
    """Seconds ``call`` takes (its result waited for), and a counting thread's rate
    during it as a fraction of its rate alone (1: the GIL was free)."""
    stop = threading.Event()
    count = [0]

    def counter() -> None:
        while not stop.is_set():
            count[0] += 1

    thread = threading.Thread(target=counter, daemon=True)
    thread.start()
    time.sleep(0.05)
    c0, t0 = count[0], time.perf_counter()
    time.sleep(0.1)
    alone = (count[0] - c0) / (time.perf_counter() - t0)
    c0, t0 = count[0], time.perf_counter()
    jax.block_until_ready(call())
    seconds = time.perf_counter() - t0
    during = (count[0] - c0) / seconds
    stop.set()
    thread.join()
    return seconds, during / alone if alone else float("nan")


def host_work(chunks: list[bytes], threads: int, rounds: int) -> float:
    """Seconds for ``threads`` threads to decode and digest ``chunks`` ``rounds`` times,
    each into a reused buffer of its own."""
    size = max(len(zstandard.ZstdDecompressor().decompress(chunks[0])), 1)
    local = threading.local()
    # Each thread's decoder and buffers, as the load engine keeps them.
    scratch = chunkload.Scratch()

    def one(chunk: bytes) -> None:
        out = getattr(local, "out", None)
        if out is None:
            out = local.out = np.empty(size, np.uint8)
        # Decoded as the load engine decodes a chunk read whole.
        chunkload._decompress_into(scratch, memoryview(chunk), out)
        xxhash.xxh3_64_hexdigest(out.data)

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, chunks * rounds))
    return time.perf_counter() - start


def transfers(parts: list[Any], device: Any) -> float:
    """Seconds for one thread to put every part on ``device``, each waited for."""
    start = time.perf_counter()
    on_chip = jax.sharding.SingleDeviceSharding(device)
    for part in parts:
        jax.device_put(part, on_chip).block_until_ready()
    return time.perf_counter() - start


def side_by_side(
    chunks: list[bytes], threads: int, rounds: int, parts: list[Any], device: Any
) -> tuple[float, float, float]:
    """Host work and transfers started together: seconds for each and for both."""
    ends: dict[str, float] = {}
    start = time.perf_counter()

    def host() -> None:
        host_work(chunks, threads, rounds)
        ends["host"] = time.perf_counter() - start

    def link() -> None:
        transfers(parts, device)
        ends["link"] = time.perf_counter() - start

    workers = [threading.Thread(target=host), threading.Thread(target=link)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return ends["host"], ends["link"], time.perf_counter() - start


def loop(step: Any, state: Any, seconds: float) -> tuple[list[float], Any]:
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        state = step(state)
        state.block_until_ready()
        times.append(time.perf_counter() - t)
    return times, state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.8)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    device = jax.devices()[0]
    threads = args.threads
    print(f"{device.device_kind} ({jax.default_backend()}), {os.cpu_count()} cores", flush=True)
    count = max(4, int(args.gb * 1e9) // (64 * MIB))
    rng = np.random.default_rng(0)
    # Values as incompressible as a model's: random float32 of a narrow range.
    sample = rng.normal(size=16 * MIB // 4).astype(np.float32).view(np.uint8)
    raw = [np.empty(64 * MIB, np.uint8) for _ in range(count)]
    for i, p in enumerate(raw):
        p[:] = np.tile(np.roll(sample, i * 4097), 4)
    # Shaped as the state's largest leaves (an MLP kernel of 2048 x 8192 float32): a
    # chip stores arrays in tiles of its own, and 1-D uint8 arrays went over the link
    # at 6 GB/s where the state's leaves go at 13.7.
    parts = [p.view(np.float32).reshape(2048, -1) for p in raw]
    total = sum(p.nbytes for p in parts)
    compressor = zstandard.ZstdCompressor(level=3)
    # 8 MiB chunks, as a load's tasks; as many bytes as the parts.
    one = [compressor.compress(sample[i * 8 * MIB : (i + 1) * 8 * MIB].tobytes()) for i in (0, 1)]
    del raw
    chunks = one * (total // (16 * MIB))
    print(
        f"{count} parts of 64 MiB ({total / 1e9:.2f} GB); {len(chunks)} zstd chunks of 8 MiB "
        f"stored at {len(one[0]) / (8 * MIB):.2f}",
        flush=True,
    )
    pinned_kind = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
    # A pinned_host array goes to the chip by a sharding of the device's own memory.
    on_chip = jax.sharding.SingleDeviceSharding(device)
    try:
        if jax.default_backend() == "cpu":
            raise ValueError("a CPU's arrays are in host memory already")
        pinned = [jax.device_put(p, pinned_kind) for p in parts]
        jax.block_until_ready(pinned)
        jax.block_until_ready(jax.device_put(pinned[0], on_chip))
    except (jax.errors.JaxRuntimeError, ValueError) as e:
        print(f"no pinned_host arrays here: {e}")
        pinned = []
    on_device = jax.device_put(parts[0], device)

    print("\n# gil: seconds, and a counting thread's rate during the call of its rate alone")
    probes: list[tuple[str, Callable[[], Any]]] = [
        ("device_put 64 MiB, ordinary memory", lambda: jax.device_put(parts[1], device)),
        ("device_put 64 MiB x 16, ordinary memory", lambda: jax.device_put(parts[:16], device)),
        ("np.asarray of a 64 MiB device array", lambda: np.asarray(on_device + 0)),
        ("zstd decode of 8 MiB", lambda: zstandard.ZstdDecompressor().decompress(one[0])),
    ]
    if pinned:
        probes += [
            ("device_put 64 MiB, pinned_host array", lambda: jax.device_put(pinned[1], on_chip)),
            ("device_put 64 MiB x 16, pinned_host", lambda: jax.device_put(pinned[:16], on_chip)),
            ("device_put 64 MiB into pinned_host", lambda: jax.device_put(parts[2], pinned_kind)),
        ]
    for name, call in probes:
        try:
            call()
        except (jax.errors.JaxRuntimeError, ValueError) as e:
            print(f"{name}: {type(e).__name__}: {e}")
            continue
        seen = [counted(call) for _ in range(args.rounds)]
        print(
            f"{name:45} {statistics.median(s for s, _ in seen):.4f} s, counter at "
            f"{statistics.median(f for _, f in seen):.2f} of its rate alone",
            flush=True,
        )
    # The call alone, then its result waited for: does the call return before the
    # transfer has ended?
    for name, source in [("ordinary", parts[3]), *([("pinned_host", pinned[3])] if pinned else [])]:
        t = time.perf_counter()
        a = jax.device_put(source, on_chip)
        call = time.perf_counter() - t
        a.block_until_ready()
        print(
            f"device_put 64 MiB from {name}: returns after {call:.4f} s, ready after "
            f"{time.perf_counter() - t:.4f} s",
            flush=True,
        )

    print("\n# overlap: seconds, medians")
    rounds = 1

    def median(f: Callable[[], Any]) -> Any:
        f()
        got = [f() for _ in range(args.rounds)]
        if isinstance(got[0], tuple):
            return tuple(statistics.median(x[i] for x in got) for i in range(len(got[0])))
        return statistics.median(got)

    alone = median(lambda: host_work(chunks, threads, rounds))
    link = median(lambda: transfers(parts, device))
    print(f"host work alone, {threads} threads         {alone:.3f}")
    print(f"transfers alone, ordinary memory          {link:.3f}")
    if pinned:
        print(
            f"transfers alone, pinned_host              {median(lambda: transfers(pinned, device)):.3f}"
        )
    for label, n, source in [
        ("ordinary memory", threads, parts),
        (f"ordinary memory, host on {threads - 1} threads", threads - 1, parts),
        *([("pinned_host", threads, pinned)] if pinned else []),
    ]:
        host_s, link_s, both = median(
            lambda n=n, source=source: side_by_side(chunks, n, rounds, source, device)
        )
        print(
            f"side by side, {label:45} host {host_s:.3f}, transfers {link_s:.3f}, both {both:.3f}",
            flush=True,
        )

    print("\n# loop: a donated step of about 20 ms, medians and sums of excess")
    x = jnp.ones((256 * MIB // 4,), jnp.float32)
    w = jnp.ones((2048, 2048), jnp.float32) * 1e-3

    def body(v: jax.Array, reps: int) -> jax.Array:
        m = v[: 2048 * 2048].reshape(2048, 2048)
        m = jax.lax.fori_loop(0, reps, lambda i, a: jnp.tanh(a @ w), m)
        return v.at[: 2048 * 2048].set(m.reshape(-1)) * 1.0000001

    reps = 8
    while True:
        step = jax.jit(lambda v, r=reps: body(v, r), donate_argnums=0)
        x = step(x)
        x.block_until_ready()
        t = time.perf_counter()
        for _ in range(5):
            x = step(x)
        x.block_until_ready()
        took = (time.perf_counter() - t) / 5
        if took >= 0.018 or reps > 4096:
            break
        reps = int(reps * 0.02 / max(took, 1e-4)) + 1
    base, x = loop(step, x, 1.0)
    typical = statistics.median(base)
    print(f"step alone: median {typical:.4f} s over {len(base)} steps", flush=True)
    stop = threading.Event()

    def spinner() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    def compressors() -> None:
        data = parts[0].view(np.uint8).reshape(-1)[: 8 * MIB].tobytes()
        c = zstandard.ZstdCompressor(level=3)
        while not stop.is_set():
            c.compress(data)

    for label, workers in [
        ("beside a spinning Python thread", [spinner]),
        (f"beside {threads} zstd compressors", [compressors] * threads),
        (f"beside {threads - 2} zstd compressors", [compressors] * (threads - 2)),
        ("beside both", [spinner] + [compressors] * threads),
    ]:
        stop.clear()
        running = [threading.Thread(target=f, daemon=True) for f in workers]
        for r in running:
            r.start()
        times, x = loop(step, x, 2.0)
        stop.set()
        for r in running:
            r.join()
        lost = sum(max(0.0, s - typical) for s in times)
        print(
            f"{label:40} median {statistics.median(times):.4f} s, slowest {max(times):.4f} s, "
            f"{len(times)} steps, lost {lost:.3f} s ({lost / 2.0:.2f} of the time)",
            flush=True,
        )


if __name__ == "__main__":
    main()
