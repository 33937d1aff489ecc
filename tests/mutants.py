"""The mutant campaign: hostile and damaged checkpoints against every read path.

(Over 500 lines: a campaign script, its families of damage and its worker in one
file, so that ``python tests/mutants.py`` runs alone.)

Two healthy checkpoints written by tinax (a ``save_checkpointables`` one and a training
checkpoint) are damaged in every way a disk, a bug or a hostile user can: a flipped
byte anywhere in every file (array data files included), truncations, deleted files,
FIFOs, sockets, symbolic links into and out of the checkpoint, huge (sparse) and
deeply nested JSON, non-UTF-8 file contents and names; and, by family: memory bombs
(array metadata rewritten in its store to claim 10¹² elements, in its shape, its
chunk or both, or far more than its bytes), stripped checksums (the record deleted,
or one leaf's entry, then a data byte flipped), swaps (array bytes, ``_sharding``,
the checksum record, ``_strings.json`` or an iterator state taken from another
checkpoint of the same structure), rewrites of a Grain iterator's state that no
iterator resumes from (``next_index`` negative, beyond 64 bits, a string, ``NaN``…)
with its checksum rewritten to match, hard links of the array data file (to the
healthy sibling's, to another checkpoint's), 50 GB sparse files (``manifest.ocdbt``,
``_METADATA``, array data) and 100,000 nested objects in metadata. Each mutant sits in
a run next to a healthy checkpoint, and is read by the load
(``load_checkpointables`` or ``load_training_checkpoint``), ``checkpoint_table``,
``read_leaf``, ``list_checkpoints``, ``verify(data=True)`` and ``diff_table`` (against
the healthy sibling, which holds the same values). Each call's outcome is one of:

- ``ok``: it succeeded and what it returned equals the original (damage that does
  not matter, such as a flipped byte in ``commit_success.txt``); for ``verify``, the
  verdict was sound; for ``diff_table``, no leaf came out ``changed``;
- ``clean error``: a ``ValueError``, ``OSError`` or ``TypeError`` whose message names
  the mutant checkpoint (or the file in it); for ``verify``, a verdict of not sound;
- ``unclean error``: any other exception, or a message that does not name the path;
- ``wrong data``: it succeeded but returned values that differ from what was saved
  (for ``diff_table``: a leaf reported ``changed``, damage that went unseen);
- ``weaker than load``: ``verify`` called sound a mutant the load refused;
- ``hang``: it did not finish within the time limit;
- for ``list_checkpoints``: ``escaped`` when it raised at all, ``wrong data`` when the
  healthy sibling is not listed as complete.

Beside the mutants, a list of misuse calls (``misuse``: saves of colliding, empty or
non-string keys, empty arrays, steps outside int64, wrong argument types) must each
be refused with a ``TypeError``, ``ValueError`` or ``FileNotFoundError`` before
anything is written.

A rewrite that changes data and its checksum record together (self-consistent) is
outside the threat model: nothing in the checkpoint can tell it from a save.

The calls run in a worker process that the campaign kills and replaces when a call
hangs. Run the whole campaign (about 980 mutants, some minutes) with

    make mutants            # or: .venv/bin/python tests/mutants.py [--limit N] [--json FILE]
                            #     [--family bomb --family swap ...]

It prints a table of outcomes per call and per family, and exits 1 unless there are
no hangs, no wrong data, no weaker verdicts, no exception escaping
``list_checkpoints`` and no unclean error.
``tests/test_mutants.py`` runs a sample of it in ``make test``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CALL_TIMEOUT = 60.0
CALLS = ("load", "checkpoint_table", "read_leaf", "list_checkpoints", "verify", "diff_table")
OUTCOMES = (
    "ok",
    "clean error",
    "unclean error",
    "wrong data",
    "hang",
    "escaped",
    "weaker than load",
    "memory blow-up",
)
# A call that leaves the worker's peak resident memory above this blew up: the
# checkpoints are a few hundred KiB, and a read holds a few tens of MiB beyond JAX.
MAX_RSS_BYTES = 2 << 30
# Misuse of the API by a careless caller: each must be refused with a TypeError or
# ValueError naming what is wrong, before anything is written.
MISUSE = "misuse"
BASES = ("checkpointables", "training")

# -- the healthy checkpoints and what a load must give back -----------------------------------


def _model(seed: int = 0) -> dict[str, Any]:
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    return {
        "dense": {
            "w": jnp.asarray(rng.standard_normal((64, 64)), jnp.float32),
            "b": rng.standard_normal(64).astype(np.float32),
        },
        "emb": jnp.asarray(rng.standard_normal((32, 16)), jnp.bfloat16),
        "layers": [np.full((4,), i, np.int32) for i in range(3)],
        "step": 7,
        "lr": 0.25,
        "name": "tiny",
    }


def _dataset() -> Any:
    import grain

    return grain.MapDataset.range(1_000).shuffle(seed=3).batch(4).to_iter_dataset()


def _iterator(skip: int = 3) -> Any:
    iterator = iter(_dataset())
    for _ in range(skip):
        next(iterator)
    return iterator


def _training_parts() -> tuple[Any, Any, Any, Any]:
    import jax
    import jax.numpy as jnp

    model = _model()
    optimizer = ({"mu": {"w": jnp.zeros((64, 64))}, "count": jnp.asarray(3)}, ())
    rng = jax.random.key_data(jax.random.key(5))
    auxiliary = {"loss": 0.5, "tag": "run-a"}
    return model, optimizer, rng, auxiliary


def write_bases(directory: Path) -> dict[str, Path]:
    """The two healthy checkpoints, written by tinax, and beside each (``other``) one of
    the same structure holding other values, for damage that swaps files between them."""
    from tinax.checkpointing import save_checkpointables, save_training_checkpoint

    paths = {base: directory / base / "step_1" for base in BASES}
    for path in paths.values():
        path.parent.mkdir(parents=True)
    for name, seed, note in (("step_1", 0, "x"), ("other", 1, "y")):
        save_checkpointables(
            paths["checkpointables"].parent / name,
            {"model": _model(seed), "extra": {"scale": 2.0 + seed, "note": note}},
        ).result()
    model, optimizer, rng, auxiliary = _training_parts()
    save_training_checkpoint(
        paths["training"], 1, model, optimizer, rng, auxiliary, _iterator()
    ).result()
    save_training_checkpoint(
        paths["training"].parent / "other",
        1,
        _model(1),
        optimizer,
        rng,
        {"loss": 0.75, "tag": "run-b"},
        _iterator(skip=5),
    ).result()
    return paths


# -- damage ------------------------------------------------------------------------------------

Damage = Callable[[Path], None]


def _flip(relative: str, where: float) -> Damage:
    def damage(root: Path) -> None:
        path = root / relative
        data = bytearray(path.read_bytes())
        if data:
            i = min(len(data) - 1, int(len(data) * where))
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))

    return damage


def _flip_bit(relative: str, where: float) -> Damage:
    def damage(root: Path) -> None:
        path = root / relative
        data = bytearray(path.read_bytes())
        if data:
            i = min(len(data) - 1, int(len(data) * where))
            data[i] ^= 0x01
        path.write_bytes(bytes(data))

    return damage


def _truncate(relative: str, keep: float) -> Damage:
    def damage(root: Path) -> None:
        path = root / relative
        size = path.stat().st_size
        os.truncate(path, int(size * keep))

    return damage


def _remove(relative: str) -> Damage:
    def damage(root: Path) -> None:
        path = root / relative
        shutil.rmtree(path) if path.is_dir() else path.unlink()

    return damage


def _fifo(relative: str) -> Damage:
    def damage(root: Path) -> None:
        (root / relative).unlink()
        os.mkfifo(root / relative)

    return damage


def _socket(relative: str) -> Damage:
    def damage(root: Path) -> None:
        path = root / relative
        path.unlink()
        # A socket's path is limited to ~100 bytes: bind from within its directory.
        cwd = os.getcwd()
        os.chdir(path.parent)
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.bind(path.name)
        finally:
            os.chdir(cwd)

    return damage


def _link_out(relative: str) -> Damage:
    def damage(root: Path) -> None:
        path = root / relative
        outside = root.parent.parent / f"outside-{path.name}-{os.getpid()}"
        shutil.move(path, outside)
        os.symlink(outside, path)

    return damage


def _link_in(relative: str, to: str) -> Damage:
    def damage(root: Path) -> None:
        path = root / relative
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        os.symlink(root / to, path)

    return damage


def _link_to_sibling_checkpoint(relative: str) -> Damage:
    """A checkpointable replaced by a link to the same one in the healthy sibling."""

    def damage(root: Path) -> None:
        path = root / relative
        shutil.rmtree(path)
        os.symlink(root.parent / "step_0" / relative, path)

    return damage


def _huge(relative: str) -> Damage:
    def damage(root: Path) -> None:
        path = root / relative
        with open(path, "r+b") as f:
            f.truncate(1 << 30)  # sparse: large to a reader, nothing on disk

    return damage


def _write(relative: str, data: bytes) -> Damage:
    def damage(root: Path) -> None:
        (root / relative).write_bytes(data)

    return damage


def _extra(relative: str, data: bytes) -> Damage:
    def damage(root: Path) -> None:
        (root / os.fsdecode(relative.encode("utf-8", "surrogateescape"))).write_bytes(data)

    return damage


def _rename_non_utf8(relative: str) -> Damage:
    def damage(root: Path) -> None:
        path = root / relative
        path.rename(path.parent / os.fsdecode(path.name.encode() + b"-\xff"))

    return damage


# -- the families of damage beyond single files --------------------------------------------


def _data_file(root: Path, checkpointable: str = "model") -> Path:
    """The largest file of a checkpointable's array store: where its array bytes are."""
    files = [p for p in (root / checkpointable).rglob("*") if p.is_file() and p.parent.name == "d"]
    return max(files, key=lambda p: (p.stat().st_size, p.name))


def _inflate(param: str, *, shape: list[int] | None, chunk: list[int] | None) -> Damage:
    """The array metadata of ``param`` rewritten in its OCDBT store to claim other sizes."""

    def damage(root: Path) -> None:
        import tensorstore as ts

        store = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{root / 'model'}"}).result()
        key = f"{param}/zarr.json"
        meta = json.loads(store.read(key).result().value)
        if shape is not None:
            meta["shape"] = shape
            meta["chunk_grid"]["configuration"]["chunk_shape"] = shape
        if chunk is not None:
            meta["codecs"][0]["configuration"]["chunk_shape"] = chunk
        store.write(key, json.dumps(meta).encode()).result()

    return damage


def _strip_checksums(then: Damage | None) -> Damage:
    def damage(root: Path) -> None:
        for record in root.glob("*/tinax_checksums"):
            shutil.rmtree(record)
        if then is not None:
            then(root)

    return damage


def _drop_leaf_record(key: str, then: Damage | None) -> Damage:
    """One leaf's entry removed from the checksum record (the record stays valid JSON)."""

    def damage(root: Path) -> None:
        for record in (root / "model" / "tinax_checksums").glob("*.json"):
            document = json.loads(record.read_bytes())
            document["leaves"].pop(key, None)
            record.write_text(json.dumps(document))
        if then is not None:
            then(root)

    return damage


def _flip_data(root: Path) -> None:
    path = _data_file(root)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _swap_data(other: Path) -> Damage:
    """The array bytes replaced by those of another checkpoint of the same structure."""

    def damage(root: Path) -> None:
        _data_file(root).write_bytes(_data_file(other).read_bytes())

    return damage


def _swap_file(relative: str, other: Path) -> Damage:
    def damage(root: Path) -> None:
        (root / relative).write_bytes((other / relative).read_bytes())

    return damage


def _rewrite_iterator_state(text: bytes) -> Damage:
    """Every Grain iterator state file rewritten to ``text``, and its checksum with it:
    a rewrite the checksums cannot see, of a state no Grain iterator resumes from."""

    def damage(root: Path) -> None:
        from tinax._format.integrity import checksums

        for state in (root / "iterator").glob("process_*-of-*.json"):
            state.write_bytes(text)
        for record in (root / "iterator" / "tinax_checksums").glob("*.json"):
            document = json.loads(record.read_bytes())
            for name, leaf in document["leaves"].items():
                if names_iterator(name):
                    leaf["pieces"] = [[[], checksums.digest(text)]]
            record.write_text(json.dumps(document))

    return damage


# Iterator states a rewrite may leave, each self-consistent with its checksum.
ITERATOR_REWRITES = {
    "next_index -1": b'{"next_index": -1}',
    "next_index 10^20": b'{"next_index": 100000000000000000000}',
    "next_index 2^70": b'{"next_index": 1180591620717411303424}',
    "next_index a string": b'{"next_index": "12"}',
    "next_index NaN": b'{"next_index": NaN}',
    "next_index Infinity": b'{"next_index": Infinity}',
    "next_index 2.5": b'{"next_index": 2.5}',
    "next_index true": b'{"next_index": true}',
    "next_index null": b'{"next_index": null}',
    "a list, not an object": b"[3]",
    "a NaN beside next_index": b'{"next_index": 3, "extra": NaN}',
}


def _hard_link_data(other: Path | None) -> Damage:
    """The array data file replaced by a hard link to the sibling's (identical) file, or
    to the bytes of another checkpoint of the same structure."""

    def damage(root: Path) -> None:
        mine = _data_file(root)
        source = (
            root.parent / "step_0" / mine.relative_to(root) if other is None else _data_file(other)
        )
        mine.unlink()
        os.link(source, mine)

    return damage


def _sparse(relative: str, size: int) -> Damage:
    def damage(root: Path) -> None:
        with open(root / relative, "r+b") as f:
            f.truncate(size)

    return damage


def _sparse_data(size: int) -> Damage:
    def damage(root: Path) -> None:
        with open(_data_file(root), "r+b") as f:
            f.truncate(size)

    return damage


def _nested_objects(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


def families(base: Path, kind: str) -> Iterator[tuple[str, Damage]]:
    """Damage beyond single files: memory bombs, stripped checksums, files swapped with
    another checkpoint's, hard links, huge sparse files and deep nesting."""
    other = base.parent / "other"
    param = "dense.w"
    big = 10**6
    yield "bomb: shape claims 10^12 elements", _inflate(param, shape=[big, big], chunk=None)
    yield "bomb: chunk claims 10^12 elements", _inflate(param, shape=None, chunk=[big, big])
    yield (
        "bomb: shape and chunk claim 10^12 elements",
        _inflate(param, shape=[big, big], chunk=[big, big]),
    )
    yield "bomb: shape claims 1000x its bytes", _inflate(param, shape=[64, 64_000], chunk=None)
    yield "bomb: chunk claims 100x its shape", _inflate(param, shape=None, chunk=[6400, 64])
    yield "strip: checksums removed", _strip_checksums(None)
    yield "strip: checksums removed, then a data byte flipped", _strip_checksums(_flip_data)
    yield (
        "strip: one leaf's checksum removed, then a data byte flipped",
        _drop_leaf_record("['dense']['w']", _flip_data),
    )
    yield "swap: array data from another checkpoint", _swap_data(other)
    yield "swap: _sharding from another checkpoint", _swap_file("model/_sharding", other)
    yield (
        "swap: checksums from another checkpoint",
        _swap_file("model/tinax_checksums/process_0.json", other),
    )
    for relative in _files(base):
        name = Path(relative).name
        if name == "_strings.json" or names_iterator(name):
            yield f"swap: {relative} from another checkpoint", _swap_file(relative, other)
    if kind == "training":
        for label, text in ITERATOR_REWRITES.items():
            yield (
                f"rewrite: iterator state {label}, its checksum to match",
                _rewrite_iterator_state(text),
            )
    yield "hard link: data file to the sibling's", _hard_link_data(None)
    yield "hard link: data file to another checkpoint's", _hard_link_data(other)
    yield "sparse: 50 GB manifest.ocdbt", _sparse("model/manifest.ocdbt", 50 << 30)
    yield "sparse: 50 GB _METADATA", _sparse("model/_METADATA", 50 << 30)
    yield "sparse: 50 GB array data file", _sparse_data(50 << 30)
    yield (
        "deep nesting: 100k objects in _METADATA",
        _write("model/_METADATA", _nested_objects(100_000)),
    )
    yield (
        "deep nesting: 100k objects in _sharding",
        _write("model/_sharding", _nested_objects(100_000)),
    )
    yield (
        "deep nesting: 100k objects in the checksums",
        _write("model/tinax_checksums/process_0.json", _nested_objects(100_000)),
    )
    yield (
        "deep nesting: 100k objects in _CHECKPOINT_METADATA",
        _write("_CHECKPOINT_METADATA", _nested_objects(100_000)),
    )


BOMB = b"[" * 100_000 + b"]" * 100_000
DEEP = b"[" * 500 + b"]" * 500
NON_UTF8 = b'{"a": "\xff\xfe"}'
JSON_NAMES = {
    "_CHECKPOINT_METADATA",
    "_METADATA",
    "_sharding",
    "_strings.json",
    "process_0",
    "process_0.json",
    "process_0-of-1.json",
}


def _files(base: Path) -> list[str]:
    return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())


def _dirs(base: Path) -> list[str]:
    return sorted(str(p.relative_to(base)) for p in base.iterdir() if p.is_dir())


def mutants(base: Path) -> Iterator[tuple[str, Damage]]:
    """Every mutant of the checkpoint ``base``: ``(description, damage)``."""
    rng = random.Random(0)
    files = _files(base)
    for rel in files:
        positions = (0.0, 0.5, 0.999, rng.random())
        for where in positions:
            yield f"flip byte at {where:.2f} of {rel}", _flip(rel, where)
        yield f"flip one bit at 0.5 of {rel}", _flip_bit(rel, 0.5)
        yield f"truncate {rel} to half", _truncate(rel, 0.5)
        yield f"truncate {rel} to empty", _truncate(rel, 0.0)
        yield f"remove {rel}", _remove(rel)
        yield f"FIFO as {rel}", _fifo(rel)
        yield f"symlink out as {rel}", _link_out(rel)
        other = next((f for f in files if f != rel), rel)
        yield f"symlink in: {rel} -> {other}", _link_in(rel, other)
        if Path(rel).name in JSON_NAMES:
            yield f"huge (1 GiB sparse) {rel}", _huge(rel)
            yield f"nesting bomb as {rel}", _write(rel, BOMB)
            yield f"deep nesting as {rel}", _write(rel, DEEP)
            yield f"non-UTF-8 JSON as {rel}", _write(rel, NON_UTF8)
    yield f"socket as {files[0]}", _socket(files[0])
    dirs = _dirs(base)
    for rel in dirs:
        yield (
            f"checkpointable {rel} linked to the sibling checkpoint's",
            (_link_to_sibling_checkpoint(rel)),
        )
        yield f"checkpointable {rel} linked out", _link_out(rel)
        other = next((d for d in dirs if d != rel), rel)
        yield f"checkpointable {rel} linked to {other}", _link_in(rel, other)
        yield f"checkpointable {rel} removed", _remove(rel)
        yield f"checkpointable {rel} renamed to a non-UTF-8 name", _rename_non_utf8(rel)
    yield "a file with a non-UTF-8 name added", _extra(f"{dirs[0]}/x-\udcff", b"x")
    yield "a stray file added at the root", _extra("notes.txt", b"hello")


# -- the worker: reads one mutant, reports each call's outcome ---------------------------------


def _same(a: Any, b: Any) -> bool:
    import jax
    import numpy as np

    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    if ta != tb or len(la) != len(lb):
        return False
    for x, y in zip(la, lb, strict=True):
        if isinstance(x, jax.Array | np.ndarray) or isinstance(y, jax.Array | np.ndarray):
            x, y = np.asarray(x), np.asarray(y)
            if x.dtype != y.dtype or x.shape != y.shape:
                return False
            if not np.array_equal(x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8)):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def _load(base: str, path: str) -> bool:
    import numpy as np

    from tinax.checkpointing import (
        abstract_restore_target,
        load_checkpointables,
        load_training_checkpoint,
    )

    if base == "checkpointables":
        want = {"model": _model(), "extra": {"scale": 2.0, "note": "x"}}
        got = load_checkpointables(path, {k: abstract_restore_target(v) for k, v in want.items()})
        return _same(got, want)
    model, optimizer, rng, auxiliary = _training_parts()
    targets = [abstract_restore_target(x) for x in (model, optimizer, rng)]
    fresh = iter(_dataset())
    ckpt = load_training_checkpoint(path, *targets, {"loss": 0.0, "tag": ""}, fresh)
    expected_next = next(_iterator())
    return (
        ckpt.step == 1
        and _same(ckpt.model, model)
        and _same(ckpt.optimizer, optimizer)
        and _same(ckpt.rng, rng)
        and ckpt.auxiliary == auxiliary
        and bool(np.array_equal(next(ckpt.iterator), expected_next))
    )


def _table(base: str, path: str) -> bool:
    import tinax.explore as ex

    table = ex.checkpoint_table(path)
    shapes = dict(zip(table["key"], table["shape"], strict=False))
    return shapes.get("['dense']['w']") == (64, 64) and shapes.get("['emb']") == (32, 16)


def _read_leaf(base: str, path: str) -> bool:
    import numpy as np

    import tinax.explore as ex

    value = ex.read_leaf(path, "model", "['dense']['w']")
    return bool(np.array_equal(value, np.asarray(_model()["dense"]["w"])))


def _listing(run: str, path: str) -> tuple[str, str]:
    import tinax.explore as ex

    try:
        table = ex.list_checkpoints(run, cache=None)
        # The quick listing reads less, and must refuse nothing more loudly.
        quick = ex.list_checkpoints(run, cache=None, deep=False)
    except Exception as e:
        return "escaped", f"{type(e).__name__}: {e}"
    if list(quick[quick["name"] == "step_0"]["status"]) != ["complete"]:
        return "wrong data", "healthy sibling not complete in the quick listing"
    healthy = table[table["name"] == "step_0"]
    if list(healthy["status"]) != ["complete"]:
        return "wrong data", f"healthy sibling listed as {list(healthy['status'])}"
    mine = table[table["path"] == path]
    status = list(mine["status"])
    return "ok", f"listed as {status or 'nothing'}"


def _verify(base: str, path: str) -> tuple[str, str]:
    """``verify(data=True)``: sound is ``ok``, not sound a refusal (a ``clean error``)."""
    import tinax.explore as ex

    try:
        result = ex.verify(path, data=True)
    except Exception as e:
        return "unclean error", f"{type(e).__name__}: {e}"
    if result.ok:
        return "ok", result.verdict
    return "clean error", result.verdict


def _diff(base: str, path: str) -> bool:
    """``diff_table`` of the healthy sibling against the mutant: both were saved with the
    same values, so a leaf ``changed`` is damage that went unseen."""
    import tinax.explore as ex

    table = ex.diff_table(os.path.join(os.path.dirname(path), "step_0"), path)
    return not (table["status"] == "changed").any()


def _misuse_calls(scratch: str) -> list[tuple[str, Callable[[], Any]]]:
    """Careless calls, each to be refused with a clear TypeError or ValueError."""
    import jax.numpy as jnp
    import numpy as np

    import tinax.explore as ex
    from tinax import checkpointing as ck

    x = np.ones(3, np.float32)
    some = os.path.join(scratch, "misuse")

    def save(tree: Any) -> Callable[[], Any]:
        return lambda: ck.save_checkpointables(some, {"m": tree}).result()

    return [
        ("save colliding keys", save({"a.b": x, "a": {"b": x}})),
        ("save a float dict key", save({1.5: x})),
        ("save a tuple dict key", save({(1, 2): x})),
        ("save an empty dict key", save({"": x})),
        ("save an empty array", save({"a": np.zeros((0, 4), np.float32)})),
        ("save a None checkpointable", lambda: ck.save_checkpointables(some, {"m": None})),
        ("save no checkpointables", lambda: ck.save_checkpointables(some, {})),
        ("save a list of checkpointables", lambda: ck.save_checkpointables(some, [x])),
        (
            "save to a temporary name",
            lambda: ck.save_checkpointables(some + ".orbax-checkpoint-tmp-1", {"m": x}),
        ),
        (
            "save step 10**20",
            lambda: ck.save_training_checkpoint(some, 10**20, {"w": x}, {}, jnp.zeros(2), {}, None),
        ),
        (
            "save step -1",
            lambda: ck.save_training_checkpoint(some, -1, {"w": x}, {}, jnp.zeros(2), {}, None),
        ),
        (
            "save step True",
            lambda: ck.save_training_checkpoint(some, True, {"w": x}, {}, jnp.zeros(2), {}, None),
        ),
        ("verify data='yes'", lambda: ex.verify(scratch, data="yes")),  # type: ignore[arg-type]
        ("verify a missing path", lambda: ex.verify(some + "-missing")),
        ("diff two numbers", lambda: ex.diff_table(1, 2)),  # type: ignore[arg-type]
        ("read_leaf with an int key", lambda: ex.read_leaf(scratch, "model", 3)),  # type: ignore[arg-type]
        ("checkpoint_table of None", lambda: ex.checkpoint_table(None)),  # type: ignore[arg-type]
        ("list_checkpoints of 5", lambda: ex.list_checkpoints(5)),  # type: ignore[arg-type]
        ("load into a list", lambda: ck.load_checkpointables(scratch, [x])),  # type: ignore[arg-type]
    ]


def misuse(scratch: str) -> list[dict[str, str]]:
    """Every misuse call's outcome: a TypeError/ValueError/FileNotFoundError that says what
    is wrong is ``clean error``; anything else (success included) breaks the rules."""
    records = []
    for description, call in _misuse_calls(scratch):
        try:
            call()
        except (TypeError, ValueError, FileNotFoundError) as e:
            outcome, message = "clean error", f"{type(e).__name__}: {e}"
            if not str(e) or isinstance(e, RecursionError):
                outcome = "unclean error"
        except Exception as e:
            outcome, message = "unclean error", f"{type(e).__name__}: {e}"
        else:
            outcome, message = "wrong data", "accepted"
        nothing_written = not os.path.exists(os.path.join(scratch, "misuse"))
        if not nothing_written:
            outcome, message = "wrong data", "something was written: " + message
            shutil.rmtree(os.path.join(scratch, "misuse"), ignore_errors=True)
        records.append(
            {
                "base": "-",
                "mutant": description,
                "call": MISUSE,
                "outcome": outcome,
                "message": message[:500],
            }
        )
    return records


def _outcome(call: Callable[[], bool], path: str) -> tuple[str, str]:
    try:
        same = call()
    except (ValueError, OSError, TypeError) as e:
        text = str(e)
        named = path in text or os.path.dirname(path) in text
        return ("clean error" if named else "unclean error"), f"{type(e).__name__}: {text}"
    except Exception as e:
        return "unclean error", f"{type(e).__name__}: {e}"
    return ("ok", "") if same else ("wrong data", "returned values differ from the saved ones")


def _peak_rss() -> int:
    """This process's peak resident memory so far, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def worker() -> None:
    """Reads ``{"base", "path", "call"}`` lines; writes one outcome line per request."""
    import logging

    logging.getLogger("absl").setLevel(logging.CRITICAL)
    import jax  # noqa: F401  (first import is slow: before the first timed call)

    for line in sys.stdin:
        request = json.loads(line)
        base, path, call = request["base"], request["path"], request["call"]
        if call == "list_checkpoints":
            outcome, message = _listing(os.path.dirname(path), path)
        elif call == "verify":
            outcome, message = _verify(base, path)
        elif call == MISUSE:
            records = misuse(path)
            sys.stdout.write(json.dumps({"records": records}) + "\n")
            sys.stdout.flush()
            continue
        else:
            fn = {
                "load": _load,
                "checkpoint_table": _table,
                "read_leaf": _read_leaf,
                "diff_table": _diff,
            }[call]
            outcome, message = _outcome(lambda fn=fn, b=base, p=path: fn(b, p), path)
        answer = {"outcome": outcome, "message": message[:500], "rss": _peak_rss()}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


class Worker:
    """A worker process; replaced when a call hangs."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        return subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )

    def call(self, base: str, path: str, call: str, timeout: float) -> tuple[str, str]:
        if self.process is None or self.process.poll() is not None:
            self.process = self._start()
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"base": base, "path": path, "call": call}) + "\n")
        self.process.stdin.flush()
        # The first call also pays for the worker's start-up.
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            self.stop()
            return "hang", f"no answer within {timeout:.0f} s"
        line = self.process.stdout.readline()
        if not line:
            self.stop()
            return "unclean error", "the worker process died"
        answer = json.loads(line)
        if "records" in answer:
            return "records", json.dumps(answer["records"])
        if answer.get("rss", 0) > MAX_RSS_BYTES:
            self.stop()  # a fresh worker, so that the next call's peak is its own
            return "memory blow-up", f"peak RSS {answer['rss'] >> 20} MiB: {answer['message']}"
        return answer["outcome"], answer["message"]

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


def _copy(source: Path, dest: Path) -> None:
    shutil.copytree(source, dest, symlinks=True)


def all_mutants(bases: dict[str, Path]) -> list[tuple[str, str, Damage]]:
    """``(base, description, damage)`` for every mutant of both bases."""
    return [
        (base, desc, dmg)
        for base in BASES
        for desc, dmg in [*mutants(bases[base]), *families(bases[base], base)]
    ]


def names_iterator(name: str) -> bool:
    """Whether ``name`` is a Grain iterator state file."""
    return name.startswith("process_") and name.endswith(".json") and "-of-" in name


def run_campaign(
    limit: int | None = None,
    sample: int | None = None,
    timeout: float = CALL_TIMEOUT,
    progress: bool = True,
    only: tuple[str, ...] = (),
) -> list[dict[str, str]]:
    """Builds the bases, damages copies, reads them; returns one record per call."""
    scratch = Path(tempfile.mkdtemp(prefix="tinax-mutants-"))
    records: list[dict[str, str]] = []
    worker_process = Worker()
    try:
        bases = write_bases(scratch / "bases")
        cases = all_mutants(bases)
        if only:
            cases = [case for case in cases if family(case[1]) in only]
        if sample is not None:
            # Every kind of damage at least once, then an even spread over the rest.
            by_kind: dict[str, list[int]] = collections.defaultdict(list)
            for i, (_, desc, _) in enumerate(cases):
                by_kind[desc.split(" ")[0] + desc.split(" ")[1]].append(i)
            kinds = {v[len(v) // 2] for v in by_kind.values()}
            step = max(1, len(cases) // max(1, sample - len(kinds)))
            spread = [i for i in range(0, len(cases), step) if i not in kinds]
            picked = sorted(kinds | set(spread[: max(0, sample - len(kinds))]))
            cases = [cases[i] for i in picked]
        if limit is not None:
            cases = cases[:limit]
        started = time.monotonic()
        misuse_dir = scratch / "misuse-calls"
        _copy(bases["checkpointables"], misuse_dir)
        outcome, message = worker_process.call("-", str(misuse_dir), MISUSE, timeout * 3)
        if outcome == "records":
            records.extend(json.loads(message))
        else:
            records.append(
                {
                    "base": "-",
                    "mutant": "misuse calls",
                    "call": MISUSE,
                    "outcome": outcome,
                    "message": message,
                }
            )
        for n, (base, desc, damage) in enumerate(cases, 1):
            run = scratch / "runs" / f"{n:04d}"
            _copy(bases[base], run / "step_0")
            _copy(bases[base], run / "step_1")
            mutant = run / "step_1"
            damage(mutant)
            calls = (
                CALLS if base == "checkpointables" else tuple(c for c in CALLS if c != "read_leaf")
            )
            mine = []
            for call in calls:
                outcome, message = worker_process.call(base, str(mutant), call, timeout)
                mine.append(
                    {
                        "base": base,
                        "mutant": desc,
                        "call": call,
                        "outcome": outcome,
                        "message": message,
                    }
                )
            _cross_check(mine)
            records.extend(mine)
            shutil.rmtree(run, ignore_errors=True)
            for stray in (scratch / "runs").glob("outside-*"):
                shutil.rmtree(stray) if stray.is_dir() else stray.unlink()
            if progress and n % 25 == 0:
                print(f"  {n}/{len(cases)} mutants, {time.monotonic() - started:.0f} s", flush=True)
    finally:
        worker_process.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return records


def _cross_check(records: list[dict[str, str]]) -> None:
    """``verify`` calling sound, or ``diff_table`` reading it, a mutant the load refuses."""
    by_call = {r["call"]: r for r in records}
    load = by_call.get("load")
    if load is None or load["outcome"] != "clean error":
        return
    for call in ("verify", "diff_table"):
        record = by_call.get(call)
        if record is not None and record["outcome"] == "ok" and call == "verify":
            record["outcome"] = "weaker than load"
            record["message"] = f"sound, but the load refused: {load['message'][:300]}"


def summary(records: list[dict[str, str]]) -> dict[str, collections.Counter[str]]:
    """Outcome counts per call."""
    table: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for record in records:
        table[record["call"]][record["outcome"]] += 1
    return table


def family(description: str) -> str:
    """The family of a mutant, from its description (``flip``, ``bomb:``, ``swap:``…)."""
    head = description.split(" ")[0].rstrip(":")
    if head == "deep" or head == "hard":
        return " ".join(description.split(" ")[:2]).rstrip(":")
    return head


def failures(records: list[dict[str, str]]) -> list[dict[str, str]]:
    """The records that break the campaign's rules."""
    bad = {"unclean error", "wrong data", "hang", "escaped", "weaker than load", "memory blow-up"}
    return [r for r in records if r["outcome"] in bad]


def print_summary(records: list[dict[str, str]]) -> None:
    mutants_seen = {(r["base"], r["mutant"]) for r in records}
    print(f"{len(mutants_seen)} mutants, {len(records)} calls")
    counts = summary(records)
    print(f"{'call':20}" + "".join(f"{o:>17}" for o in OUTCOMES))
    for call in (*CALLS, MISUSE):
        print(f"{call:20}" + "".join(f"{counts[call][o]:17d}" for o in OUTCOMES))
    print("\nper family (outcomes of every call on its mutants):")
    families: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for record in records:
        families[family(record["mutant"]) if record["call"] != MISUSE else MISUSE][
            record["outcome"]
        ] += 1
    print(f"{'family':20}" + "".join(f"{o:>17}" for o in OUTCOMES))
    for name, counter in sorted(families.items()):
        print(f"{name:20}" + "".join(f"{counter[o]:17d}" for o in OUTCOMES))
    for record in failures(records)[:50]:
        print(
            f"  {record['outcome']}: {record['call']} on {record['base']}: {record['mutant']}: {record['message'][:200]}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=int, default=None, help="run only the first N mutants")
    parser.add_argument("--sample", type=int, default=None, help="run an even sample of N")
    parser.add_argument("--timeout", type=float, default=CALL_TIMEOUT, help="seconds per call")
    parser.add_argument("--json", default=None, help="also write every call's record here")
    parser.add_argument(
        "--family", action="append", default=[], help="run only this family (repeatable)"
    )
    args = parser.parse_args()
    if args.worker:
        worker()
        return 0
    records = run_campaign(
        limit=args.limit, sample=args.sample, timeout=args.timeout, only=tuple(args.family)
    )
    print_summary(records)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 1 if failures(records) else 0


if __name__ == "__main__":
    sys.exit(main())
