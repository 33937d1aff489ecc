"""The mutant campaign: hostile and damaged checkpoints against every read path.

Two healthy checkpoints written by tinax (a ``save_checkpointables`` one and a training
checkpoint) are damaged in every way a disk, a bug or a hostile user can: a flipped
byte anywhere in every file (array data files included), truncations, deleted files,
FIFOs, sockets, symbolic links into and out of the checkpoint, huge (sparse) and
deeply nested JSON, non-UTF-8 file contents and names. Each mutant sits in a run
next to a healthy checkpoint, and is read by the load (``load_checkpointables`` or
``load_training_checkpoint``), ``checkpoint_table``, ``read_leaf`` and
``list_checkpoints``. Each call's outcome is one of:

- ``ok``: it succeeded and what it returned equals the original (damage that does
  not matter, such as a flipped byte in ``commit_success.txt``);
- ``clean error``: a ``ValueError``, ``OSError`` or ``TypeError`` whose message names
  the mutant checkpoint (or the file in it);
- ``unclean error``: any other exception, or a message that does not name the path;
- ``wrong data``: it succeeded but returned values that differ from what was saved;
- ``hang``: it did not finish within the time limit;
- for ``list_checkpoints``: ``escaped`` when it raised at all, ``wrong data`` when the
  healthy sibling is not listed as complete.

The calls run in a worker process that the campaign kills and replaces when a call
hangs. Run the whole campaign (about 450 mutants, some minutes) with

    make mutants            # or: .venv/bin/python tests/mutants.py [--limit N] [--json FILE]

It prints a table of outcomes per call and exits 1 unless there are no hangs, no
wrong data, no exception escaping ``list_checkpoints`` and no unclean error.
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
CALLS = ("load", "checkpoint_table", "read_leaf", "list_checkpoints")
OUTCOMES = ("ok", "clean error", "unclean error", "wrong data", "hang", "escaped")
BASES = ("checkpointables", "training")

# -- the healthy checkpoints and what a load must give back -----------------------------------


def _model() -> dict[str, Any]:
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
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
    """The two healthy checkpoints, written by tinax."""
    from tinax.checkpointing import save_checkpointables, save_training_checkpoint

    paths = {base: directory / base / "step_1" for base in BASES}
    for path in paths.values():
        path.parent.mkdir(parents=True)
    save_checkpointables(
        paths["checkpointables"], {"model": _model(), "extra": {"scale": 2.0, "note": "x"}}
    ).result()
    model, optimizer, rng, auxiliary = _training_parts()
    save_training_checkpoint(
        paths["training"], 1, model, optimizer, rng, auxiliary, _iterator()
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
        else:
            fn = {"load": _load, "checkpoint_table": _table, "read_leaf": _read_leaf}[call]
            outcome, message = _outcome(lambda fn=fn, b=base, p=path: fn(b, p), path)
        sys.stdout.write(json.dumps({"outcome": outcome, "message": message[:500]}) + "\n")
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
    return [(base, desc, dmg) for base in BASES for desc, dmg in mutants(bases[base])]


def run_campaign(
    limit: int | None = None,
    sample: int | None = None,
    timeout: float = CALL_TIMEOUT,
    progress: bool = True,
) -> list[dict[str, str]]:
    """Builds the bases, damages copies, reads them; returns one record per call."""
    scratch = Path(tempfile.mkdtemp(prefix="tinax-mutants-"))
    records: list[dict[str, str]] = []
    worker_process = Worker()
    try:
        bases = write_bases(scratch / "bases")
        cases = all_mutants(bases)
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
        for n, (base, desc, damage) in enumerate(cases, 1):
            run = scratch / "runs" / f"{n:04d}"
            _copy(bases[base], run / "step_0")
            _copy(bases[base], run / "step_1")
            mutant = run / "step_1"
            damage(mutant)
            calls = (
                CALLS
                if base == "checkpointables"
                else ("load", "checkpoint_table", "list_checkpoints")
            )
            for call in calls:
                outcome, message = worker_process.call(base, str(mutant), call, timeout)
                records.append(
                    {
                        "base": base,
                        "mutant": desc,
                        "call": call,
                        "outcome": outcome,
                        "message": message,
                    }
                )
            shutil.rmtree(run, ignore_errors=True)
            for stray in (scratch / "runs").glob("outside-*"):
                shutil.rmtree(stray) if stray.is_dir() else stray.unlink()
            if progress and n % 25 == 0:
                print(f"  {n}/{len(cases)} mutants, {time.monotonic() - started:.0f} s", flush=True)
    finally:
        worker_process.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return records


def summary(records: list[dict[str, str]]) -> dict[str, collections.Counter[str]]:
    """Outcome counts per call."""
    table: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for record in records:
        table[record["call"]][record["outcome"]] += 1
    return table


def failures(records: list[dict[str, str]]) -> list[dict[str, str]]:
    """The records that break the campaign's rules."""
    bad = {"unclean error", "wrong data", "hang", "escaped"}
    return [r for r in records if r["outcome"] in bad]


def print_summary(records: list[dict[str, str]]) -> None:
    mutants_seen = {(r["base"], r["mutant"]) for r in records}
    print(f"{len(mutants_seen)} mutants, {len(records)} calls")
    counts = summary(records)
    print(f"{'call':20}" + "".join(f"{o:>15}" for o in OUTCOMES))
    for call in CALLS:
        print(f"{call:20}" + "".join(f"{counts[call][o]:15d}" for o in OUTCOMES))
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
    args = parser.parse_args()
    if args.worker:
        worker()
        return 0
    records = run_campaign(limit=args.limit, sample=args.sample, timeout=args.timeout)
    print_summary(records)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 1 if failures(records) else 0


if __name__ == "__main__":
    sys.exit(main())
