"""Checkpoints for the tinax.explore tests, written by Orbax itself, and ways to damage them."""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Any

import grain
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp0
import tensorstore as ts
from orbax.checkpoint import v1 as ocp

AdamLike = collections.namedtuple("AdamLike", ["mu", "nu"])

# Large enough that OCDBT keeps the chunk out of its B+tree nodes, in a data file.
BIG = (64, 64)


def iterator(skip: int = 3) -> Any:
    """A Grain ``DatasetIterator`` advanced by ``skip`` elements."""
    it = iter(grain.MapDataset.range(100).shuffle(seed=1).to_iter_dataset())
    for _ in range(skip):
        next(it)
    return it


def model_state() -> dict[str, Any]:
    """A small model with array, scalar, string, None and list leaves."""
    return {
        "dense": {
            "w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4),
            "b": np.linspace(0, 1, 4, dtype=np.float32),
        },
        "big": np.random.default_rng(0).standard_normal(BIG).astype(np.float32),
        "emb": jnp.ones((5, 2), jnp.bfloat16),
        "layers": [np.full((2,), i, np.int32) for i in range(12)],
        "step": 7,
        "lr": 0.25,
        "flag": True,
        "name": "tiny",
        "nothing": None,
    }


def optimizer_state() -> Any:
    """An optax-like state: a tuple holding a namedtuple and an empty tuple."""
    return (
        AdamLike(mu={"w": jnp.zeros((3, 4))}, nu={"w": jnp.ones((3, 4))}),
        (),
    )


def save_v1(path: Path, checkpointables: dict[str, Any]) -> Path:
    """Orbax V1 ``save_checkpointables``."""
    ocp.save_checkpointables(path, checkpointables)
    return path


def save_v1_run(root: Path, steps: tuple[int, ...] = (0, 5)) -> Path:
    """An Orbax V1 ``training.Checkpointer`` run: ``root/<step>/...``."""
    it = iterator()
    with ocp.training.Checkpointer(root) as checkpointer:
        for step in steps:
            next(it)
            checkpointer.save_checkpointables(
                step, {"pytree": {"w": jnp.full((2, 2), step), "step": step}, "iterator": it}
            )
    return root


def save_v0_run(root: Path, steps: tuple[int, ...] = (0, 10)) -> Path:
    """An Orbax V0 ``CheckpointManager`` run with ``Composite`` items, as grain documents it."""
    it = iterator()
    root.mkdir(parents=True, exist_ok=True)
    with ocp0.CheckpointManager(root) as manager:
        for step in steps:
            next(it)
            manager.save(
                step=step,
                args=ocp0.args.Composite(
                    model=ocp0.args.StandardSave(
                        {"layer1": 1.0, "layer2": float(step), "w": np.arange(6.0).reshape(2, 3)}
                    ),
                    data_iter=grain.checkpoint.CheckpointSave(item=it),
                ),
            )
        manager.wait_until_finished()
    return root


def _locations(directory: Path) -> dict[bytes, str]:
    """Every key of the OCDBT store in ``directory``: ``inline`` or its value location."""
    base = ts.KvStore.open({"driver": "file", "path": str(directory) + "/"}).result()
    manifest = ts.ocdbt.dump(base).result()
    out: dict[bytes, str] = {}
    level = [(b"", manifest["versions"][-1]["root"]["location"])]
    while level:
        nodes = [(prefix, ts.ocdbt.dump(base, loc).result()) for prefix, loc in level]
        level = []
        for prefix, node in nodes:
            for entry in node["entries"]:
                if "location" in entry:
                    level.append(
                        (prefix + entry.get("subtree_common_prefix", b""), entry["location"])
                    )
                else:
                    out[prefix + entry["key"]] = entry.get("indirect_value", "inline")
    return out


def _file_of(location: str) -> str:
    """The file of an OCDBT location ``<kind>:<base path>:<file>:<offset>:<length>``."""
    _, base_path, name, _, _ = location.split(":")
    return base_path + name


def _node_files(directory: Path) -> set[str]:
    """Files holding the B+tree nodes reachable from the manifest."""
    base = ts.KvStore.open({"driver": "file", "path": str(directory) + "/"}).result()
    manifest = ts.ocdbt.dump(base).result()
    files = set()
    level = [manifest["versions"][-1]["root"]["location"]]
    while level:
        nodes = []
        for loc in level:
            files.add(_file_of(loc))
            nodes.append(ts.ocdbt.dump(base, loc).result())
        level = [e["location"] for node in nodes for e in node["entries"] if "location" in e]
    return files


def chunk_locations(directory: Path, *, keep: str | None = None) -> list[tuple[Path, int, int]]:
    """Where OCDBT stores array chunks out of line: ``(file, offset, length)``.

    Args:
      directory: A pytree checkpointable written with OCDBT.
      keep: An Orbax parameter name (``dense.w``) whose chunks are left out.
    """
    found = []
    for key, location in _locations(directory).items():
        if location == "inline" or key.endswith((b"zarr.json", b".zarray")):
            continue
        if keep is not None and key.startswith(keep.encode() + b"/"):
            continue
        _, _, _, offset, length = location.split(":")
        found.append((directory / _file_of(location), int(offset), int(length)))
    return found


def corrupt_chunks(directory: Path, *, keep: str | None = None) -> int:
    """Overwrites every out-of-line array chunk (except ``keep``'s); returns how many."""
    locations = chunk_locations(directory, keep=keep)
    for path, offset, length in locations:
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(b"\xa5" * length)
    return len(locations)


def delete_chunk_files(directory: Path) -> list[Path]:
    """Deletes the files holding array chunks; they must hold no B+tree node."""
    files = sorted({path for path, _, _ in chunk_locations(directory)})
    nodes = {str(directory / name) for name in _node_files(directory)}
    assert files and not nodes & {str(p) for p in files}, (files, nodes)
    for path in files:
        os.remove(path)
    return files
