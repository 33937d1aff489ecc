"""What each storage choice does to a tinax save and load of a real training state.

The state is ``bench/accelerator.py``'s (a flax NNX transformer and its optax adamw
state after a few steps: 2.8 GB on an accelerator, 0.4 GB on a CPU). Each variant
saves it with tinax (checksums on) ``--rounds`` times and loads it back with tinax
and with Orbax alone, and prints the medians: blocking and total save seconds, save
and load MB/s, and the bytes on disk against the state's; beside them Python's
``read()`` of the checkpoint's data files into fresh buffers (one thread, eight
threads), which pays for touching new memory too and is no floor of a load
(``bench/accelerator.py`` measures ``cat``, ``dd`` and reused buffers); then
``jax.device_get`` and ``jax.device_put`` of the state.

Variants change the codec inside Orbax's zarr3 shards (the ``codecs`` of
``sharding_indexed``), the chunk size, and the size of OCDBT's data files:

    python bench/storage_levers.py [--smoke] [--rounds 2] [--variants a,b,...]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from orbax.checkpoint import v1 as ocp
from orbax.checkpoint._src.serialization import tensorstore_utils

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accelerator

import tinax.checkpointing as tc
from tinax.checkpointing import _context as tc_context

ZSTD = {"name": "zstd", "configuration": {"level": 3}}
VARIANTS: dict[str, dict[str, Any]] = {
    "uncompressed": {"codec": None},
    "zstd 3 (Orbax's)": {"codec": ZSTD},
    "zstd 1": {"codec": {"name": "zstd", "configuration": {"level": 1}}},
    "zstd 3 32 MiB chunks": {"codec": ZSTD, "chunk": 32 << 20},
    "zstd 3 2 MiB chunks": {"codec": ZSTD, "chunk": 2 << 20},
    "zstd 3 256 MiB files": {"codec": ZSTD, "files": 256 << 20},
    "blosc lz4 shuffle": {
        "codec": {
            "name": "blosc",
            "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle"},
        }
    },
    "blosc zstd 1 shuffle": {
        "codec": {
            "name": "blosc",
            "configuration": {"cname": "zstd", "clevel": 1, "shuffle": "shuffle"},
        }
    },
}


@contextlib.contextmanager
def variant(settings: dict[str, Any]) -> Iterator[None]:
    """Saves in this block store arrays as ``settings`` say."""
    original = tensorstore_utils._build_zarr3_metadata
    codec = settings.get("codec")

    def build(global_shape: Any, chunk_shape: Any, use_compression: bool) -> Any:
        metadata = original(global_shape, chunk_shape, False)
        if codec is not None:
            inner = metadata["codecs"][0]["configuration"]["codecs"]
            inner.append(codec)
        return metadata

    ctx = ocp.Context(tc_context.active_context())
    if "files" in settings:
        ctx.array.saving.ocdbt_target_data_file_size = settings["files"]
    chunk = settings.get("chunk", tc_context.CHUNK_BYTES)
    saved_chunk = tc_context.CHUNK_BYTES
    tensorstore_utils._build_zarr3_metadata = build
    tc_context.CHUNK_BYTES = chunk
    try:
        with ctx, tc.compression(codec is not None):
            yield
    finally:
        tensorstore_utils._build_zarr3_metadata = original
        tc_context.CHUNK_BYTES = saved_chunk


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def read_files(path: Path, threads: int) -> float:
    """Seconds to read every data file under ``path`` in 64 MiB reads on ``threads``,
    each into a fresh buffer: Python's ``read()``, which costs the touching of new
    memory too (``bench/accelerator.py`` measures ``cat``, ``dd`` and reused buffers)."""
    files = [p for p in path.rglob("*") if p.is_file() and p.parent.name == "d"]
    pieces = []
    for f in files:
        size = f.stat().st_size
        pieces += [(f, offset) for offset in range(0, size, 64 << 20)]

    def read(piece: tuple[Path, int]) -> int:
        f, offset = piece
        with open(f, "rb", buffering=0) as handle:
            handle.seek(offset)
            return len(handle.read(64 << 20))

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        sum(pool.map(read, pieces))
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    backend = jax.default_backend()
    size = "smoke" if args.smoke else ("accelerator" if backend != "cpu" else "cpu")
    params, opt, step = accelerator.make_state(size)
    tokens = jnp.arange(128 if backend != "cpu" else 8) % accelerator.SIZES[size][2]
    for _ in range(3):
        params, opt, _value = step(params, opt, tokens)
    state = {"params": params, "opt": opt}
    jax.block_until_ready(state)
    total = accelerator.nbytes(state)
    targets = accelerator.targets(state)
    print(f"backend {backend}, state {total / 1e9:.2f} GB in {len(jax.tree.leaves(state))} arrays")
    scratch = Path(tempfile.mkdtemp(prefix="tinax-levers-", dir=args.dir))
    rows = []
    try:
        for name in args.variants.split(","):
            settings = VARIANTS[name]
            figures: dict[str, list[float]] = {}
            for r in range(args.rounds):
                where = scratch / f"v{r}"
                with variant(settings):
                    start = time.perf_counter()
                    response = tc.save_checkpointables(where, state)
                    blocking = time.perf_counter() - start
                    response.result()
                    saved = time.perf_counter() - start
                start = time.perf_counter()
                jax.block_until_ready(tc.load_checkpointables(where, targets))
                loaded = time.perf_counter() - start
                # The same checkpoint through Orbax alone (no checksums checked).
                start = time.perf_counter()
                jax.block_until_ready(ocp.load_checkpointables(where, targets))
                orbax_loaded = time.perf_counter() - start
                stored = disk_bytes(where)
                one = {
                    "blocking_s": blocking,
                    "save_s": saved,
                    "save_mb_s": total / saved / 1e6,
                    "load_mb_s": total / loaded / 1e6,
                    "orbax_load_mb_s": total / orbax_loaded / 1e6,
                    "disk_ratio": stored / total,
                    "read_files_1_mb_s": stored / read_files(where, 1) / 1e6,
                    "read_files_8_mb_s": stored / read_files(where, 8) / 1e6,
                }
                for k, v in one.items():
                    figures.setdefault(k, []).append(v)
                shutil.rmtree(where)
            medians = {k: statistics.median(v) for k, v in figures.items()}
            rows.append((name, medians))
            print(
                f"{name:>24}: " + ", ".join(f"{k} {v:.3f}" for k, v in medians.items()), flush=True
            )
        start = time.perf_counter()
        host = jax.device_get(state)
        get = total / (time.perf_counter() - start) / 1e6
        start = time.perf_counter()
        jax.block_until_ready(jax.device_put(host, jax.tree.map(lambda x: x.sharding, state)))
        put = total / (time.perf_counter() - start) / 1e6
        print(
            f"floors: device_get {get:.0f} MB/s, device_put {put:.0f} MB/s, cores {os.cpu_count()}"
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
