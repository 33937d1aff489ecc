"""What the save campaigns share: a training state that identifies itself, saved and
loaded by tinax or by Orbax alone, and a writer process driven over a pipe.

A state is built from a *seed*: every array's bits, the RNG key, the auxiliary values
and the Grain iterator's position are fixed functions of it, so a loaded checkpoint
can be checked bit for bit, and a checkpoint mixing two writers' parts is caught:
each part names the seed it came from.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
from orbax.checkpoint import v1 as ocp

from tinax.checkpointing import (
    abstract_restore_target,
    load_training_checkpoint,
    save_training_checkpoint,
)

MIB = 1 << 20
SIDES = ("tinax", "orbax")
_LAYERS = 4
_BATCH = 32


def _bits(seed: int, leaf: int, count: int) -> np.ndarray:
    """``count`` float32 values whose bits are a fixed, well-mixed function of the inputs."""
    x = np.arange(count, dtype=np.uint32)
    x *= np.uint32(2654435761)
    x ^= np.uint32((seed * 1_000_003 + leaf * 7_919 + 1) & 0xFFFFFFFF)
    x *= np.uint32(2246822519)
    x ^= x >> np.uint32(13)
    return x.view(np.float32)


def _layers(seed: int, first_leaf: int, per_layer: int) -> dict[str, np.ndarray]:
    return {
        f"layer_{i}": _bits(seed, first_leaf + i, per_layer).reshape(-1, 256)
        for i in range(_LAYERS)
    }


def dataset() -> Any:
    return grain.MapDataset.range(1 << 30).batch(_BATCH).to_iter_dataset()


def iterator_at(batches: int) -> Any:
    iterator = iter(dataset())
    for _ in range(batches):
        next(iterator)
    return iterator


def host_state(seed: int, nbytes: int) -> dict[str, Any]:
    """The state of ``seed`` as NumPy values (the iterator as its position).

    A third of the bytes are the model, two thirds Adam's two moments.
    """
    per_layer = max(256, nbytes // 3 // _LAYERS // 4 // 256 * 256)
    return {
        "model": _layers(seed, 0, per_layer),
        "mu": _layers(seed, _LAYERS, per_layer),
        "nu": _layers(seed, 2 * _LAYERS, per_layer),
        "count": np.asarray(seed, np.int32),
        "rng": np.asarray(jax.random.key_data(jax.random.key(seed))),
        "auxiliary": {"seed": seed, "loss": 1.0 / (seed + 1)},
        "position": seed % 97,
    }


def live_state(seed: int, nbytes: int) -> dict[str, Any]:
    """The checkpointables of a training checkpoint of ``seed``, as live JAX values."""
    host = host_state(seed, nbytes)
    model = jax.tree.map(jnp.asarray, host["model"])
    adam = optax.ScaleByAdamState(
        count=jnp.asarray(host["count"]),
        mu=jax.tree.map(jnp.asarray, host["mu"]),
        nu=jax.tree.map(jnp.asarray, host["nu"]),
    )
    return {
        "model": model,
        "optimizer": (adam, optax.EmptyState()),
        "rng": jnp.asarray(host["rng"]),
        "auxiliary": host["auxiliary"],
        "iterator": iterator_at(host["position"]),
    }


def save(side: str, path: Path, seed: int, state: dict[str, Any]) -> None:
    """Saves ``state`` (of ``seed``) as one training checkpoint and waits for the commit."""
    if side == "tinax":
        save_training_checkpoint(
            path,
            seed,
            state["model"],
            state["optimizer"],
            state["rng"],
            state["auxiliary"],
            state["iterator"],
        ).result()
    else:
        parts = dict(state, auxiliary={"step": seed, "state": state["auxiliary"]})
        ocp.save_checkpointables(path, parts)


def load(side: str, path: Path, nbytes: int) -> dict[str, Any]:
    """Loads a training checkpoint into targets built from a state of the same shapes."""
    shapes = live_state(0, nbytes)
    model, optimizer, rng = (
        abstract_restore_target(shapes[k]) for k in ("model", "optimizer", "rng")
    )
    auxiliary = {"seed": 0, "loss": 0.0}
    iterator = iter(dataset())
    if side == "tinax":
        ckpt = load_training_checkpoint(path, model, optimizer, rng, auxiliary, iterator)
        return {
            "step": ckpt.step,
            "model": ckpt.model,
            "optimizer": ckpt.optimizer,
            "rng": ckpt.rng,
            "auxiliary": ckpt.auxiliary,
            "iterator": ckpt.iterator,
        }
    out = ocp.load_checkpointables(
        path,
        {
            "model": model,
            "optimizer": optimizer,
            "rng": rng,
            "auxiliary": {"step": 0, "state": auxiliary},
            "iterator": iterator,
        },
    )
    return {**out, "step": out["auxiliary"]["step"], "auxiliary": out["auxiliary"]["state"]}


def _same_bits(a: Any, b: np.ndarray) -> bool:
    a = np.asarray(a)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def sources(loaded: dict[str, Any], seeds: list[int], nbytes: int) -> dict[str, int | None]:
    """Which of ``seeds`` each part of ``loaded`` equals bit for bit (``None``: none)."""
    found: dict[str, int | None] = {}
    hosts = {seed: host_state(seed, nbytes) for seed in seeds}

    def match(part: str, test: Any) -> None:
        found[part] = next((seed for seed in seeds if test(hosts[seed])), None)

    adam = loaded["optimizer"][0]
    match("model", lambda h: all(_same_bits(loaded["model"][k], v) for k, v in h["model"].items()))
    match("mu", lambda h: all(_same_bits(adam.mu[k], v) for k, v in h["mu"].items()))
    match("nu", lambda h: all(_same_bits(adam.nu[k], v) for k, v in h["nu"].items()))
    match("count", lambda h: _same_bits(adam.count, h["count"]))
    match("rng", lambda h: _same_bits(loaded["rng"], h["rng"]))
    match("step", lambda h: loaded["step"] == h["count"])
    match("auxiliary", lambda h: loaded["auxiliary"] == h["auxiliary"])
    batch = np.asarray(next(loaded["iterator"]))
    match(
        "iterator",
        lambda h: np.array_equal(batch, np.arange(_BATCH) + h["position"] * _BATCH),
    )
    return found


def exact(loaded: dict[str, Any], seed: int, nbytes: int) -> bool:
    """Whether every part of ``loaded`` is the state of ``seed``, bit for bit."""
    return set(sources(loaded, [seed], nbytes).values()) == {seed}


# -- a writer process, driven over its stdin and stdout -------------------------------


def writer(side: str, nbytes: int, seed: int) -> None:
    """Serves save commands, one JSON object a line, until stdin closes.

    Each command is ``{"path": ..., "at": <time.time() to start at>}``; the state of
    ``seed`` is built once, before the first command. Each reply is
    ``{"ok": bool, "error": type name, "message": text, "seconds": float}``.
    """
    state = live_state(seed, nbytes)
    jax.block_until_ready(state)
    print(json.dumps({"ready": seed}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        while time.time() < command["at"]:
            pass  # spin: a sleep would blur the start by a scheduler tick
        start = time.perf_counter()
        reply: dict[str, Any] = {"ok": True, "error": None, "message": ""}
        try:
            # A fresh iterator each time: a save captures the iterator's position.
            save(side, Path(command["path"]), seed, dict(state, iterator=iterator_at(seed % 97)))
        except Exception as e:
            reply = {"ok": False, "error": type(e).__name__, "message": str(e)[:500]}
        reply["seconds"] = time.perf_counter() - start
        print(json.dumps(reply), flush=True)


# The JAX platforms of the jobs the campaigns start and kill (``--child-platforms``);
# None: this process's own.
_child_platforms: str | None = None
# ``--write-batch-mib``, handed to the jobs in their environment.
_WRITE_BATCH = "TINAX_CAMPAIGN_WRITE_BATCH_BYTES"
_write_batch_bytes: int | None = None


def child_env() -> dict[str, str]:
    """The environment of a job a campaign starts: this process's, on the platforms
    ``--child-platforms`` named, writing in the batches ``--write-batch-mib`` asked for."""
    env = dict(os.environ)
    if _child_platforms is not None:
        env["JAX_PLATFORMS"] = _child_platforms
    if _write_batch_bytes is not None:
        env[_WRITE_BATCH] = str(_write_batch_bytes)
    return env


# The batches each checkpointable's arrays were written in, in this job.
_batches: list[int] = []


def _write_in_batches() -> None:
    """In a job started with ``--write-batch-mib``: has tinax write every save in
    batches of that size, each while the next is copied to the host, as it does for a
    state on an accelerator (a CPU's arrays are otherwise saved in Orbax's order)."""
    size = os.environ.get(_WRITE_BATCH)
    if size is None:
        return
    from tinax.checkpointing import _host_copies, _orbax

    _host_copies.write_batch_bytes = lambda checkpointable: int(size)
    split = _orbax.batch_bounds

    def counted(sizes: Any, batch_bytes: int) -> list[tuple[int, int]]:
        bounds = split(sizes, batch_bytes)
        _batches.append(len(bounds))
        return bounds

    _orbax.batch_bounds = counted


def batches_written() -> int:
    """How many batches this job's saves have written their arrays in (0: none was
    written in batches)."""
    return sum(_batches)


_write_in_batches()


def quiet_logs() -> None:
    """Keeps Orbax's and absl's informational logging out of the campaign's output."""
    import logging

    logging.getLogger("absl").setLevel(logging.ERROR)
    logging.getLogger("tinax").setLevel(logging.ERROR)


def run_kill_campaign(
    *,
    description: str,
    default_mib: float,
    scratch_prefix: str,
    campaign: Any,
    child: Any,
    title: Any,
    rows: tuple[tuple[str, str], ...],
    goals: Any,
    notes: tuple[str, ...] = ("refusals",),
    default_sides: str = "tinax,orbax",
) -> int:
    """The command line both kill campaigns share: run each side, print a table, judge tinax.

    Args:
      description: The script's one-line description, for ``--help``.
      default_mib: The default size of a checkpoint.
      scratch_prefix: Prefix of the scratch directory made under ``--dir``.
      campaign: ``campaign(side, root, kills, mib, rng) -> counts`` (a dataclass).
      child: ``child(*args)``: what a writer process started with ``--child`` runs.
      title: ``title(kills, mib, seconds) -> str``: the first line printed.
      rows: ``(label, field)`` of the table, one row per field of the counts.
      goals: ``goals(counts) -> [(goal, how many times it was missed)]`` for tinax.
      notes: Fields of the counts holding lists of lines; the first three of each are shown.
      default_sides: What ``--sides`` is when not given (a campaign with no Orbax
        counterpart runs tinax alone).

    Returns:
      The exit status: 1 when a goal is missed.
    """
    import argparse
    import dataclasses
    import random
    import shutil
    import tempfile

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--mib", type=float, default=default_mib, help="size of a checkpoint")
    parser.add_argument("--sides", default=default_sides)
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--child-platforms",
        default=None,
        help="JAX_PLATFORMS of the jobs that are killed (e.g. tpu); this process, which "
        "lists, loads and resumes, stays on its own (the CPU), leaving the chip to them",
    )
    parser.add_argument(
        "--write-batch-mib",
        type=float,
        default=None,
        help="the killed jobs write each save in batches of this many MiB while the next "
        "is copied to the host, as tinax does from an accelerator (on a CPU, saves keep "
        "Orbax's order otherwise)",
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global _child_platforms, _write_batch_bytes
    _child_platforms = args.child_platforms
    if args.write_batch_mib is not None:
        _write_batch_bytes = max(1, int(args.write_batch_mib * MIB))
    if args.child:
        child(*args.child)
        return 0
    quiet_logs()
    sides = [s for s in args.sides.split(",") if s]
    assert set(sides) <= set(SIDES), sides
    scratch = Path(tempfile.mkdtemp(prefix=scratch_prefix, dir=args.dir))
    results: dict[str, Any] = {}
    started = time.monotonic()
    try:
        for side in sides:
            results[side] = campaign(
                side, scratch / side, args.kills, args.mib, random.Random(args.seed)
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(title(args.kills, args.mib, time.monotonic() - started))
    width = max(len(label) for label, _ in rows) + 2
    print(f"{'':{width}}" + "".join(f"{side:>10}" for side in sides))
    for label, field in rows:
        cells = [getattr(results[s], field) for s in sides]
        print(
            f"{label:{width}}"
            + "".join(f"{c:>10.2f}" if isinstance(c, float) else f"{c:>10}" for c in cells)
        )
    for side in sides:
        for field in notes:
            for line in getattr(results[side], field)[:3]:
                print(f"{side} {'refused: ' if field == 'refusals' else ''}{line}")
    print("RESULT " + json.dumps({s: dataclasses.asdict(c) for s, c in results.items()}))
    tinax = results.get("tinax")
    if tinax is None:
        return 0
    missed = [goal for goal, bad in goals(tinax) if bad]
    print("goals: " + ("all met" if not missed else "MISSED: " + "; ".join(missed)))
    return 1 if missed else 0
