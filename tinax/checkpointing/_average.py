"""A new checkpoint that is the weighted mean of several checkpoints of one structure."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from tinax._format.arraydata import chunks
from tinax._format.callbacks import Progress
from tinax._format.metadata import layout
from tinax._format.metadata.layout import Checkpoint
from tinax._format.naming import dtypes, names, words
from tinax._format.records import lineage
from tinax._format.safetensors import is_floating
from tinax._format.storage import files
from tinax._format.writing import streaming, treeplan
from tinax._format.writing.copy_source import PyTreeSource
from tinax._format.writing.new_checkpoint import NewCheckpoint
from tinax._format.writing.streaming import SourceArray
from tinax.checkpointing import _surgery, _surgery_health
from tinax.checkpointing._surgery import ArrayJob, OpenedSource


def check_weights(weights: object, count: int) -> list[float]:
    """The weights of ``count`` sources, as floats (all ``1.0`` when ``None``).

    Raises:
      TypeError: If ``weights`` is not a sequence of numbers (booleans are not).
      ValueError: If it has another length than the sources, a weight is negative
        or not finite, or they sum to zero.
    """
    if weights is None:
        return [1.0] * count
    if isinstance(weights, np.ndarray):
        if weights.dtype.kind == "b" or weights.ndim != 1:
            raise TypeError("weights must be a 1-d sequence of numbers (booleans are not weights)")
        values: list[object] = list(weights.tolist())
    elif isinstance(weights, list | tuple):
        values = list(weights)
    else:
        raise TypeError(f"weights must be a list of numbers, got {type(weights).__name__}")
    if len(values) != count:
        raise ValueError(f"weights has {len(values)} values for {count} sources")
    out = []
    for i, value in enumerate(values):
        if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.number):
            raise TypeError(
                f"weights[{i}] is {type(value).__name__}; a weight is a number (booleans are not)"
            )
        number = float(value)  # type: ignore[arg-type]
        if not math.isfinite(number):
            raise ValueError(f"weights[{i}] is {number}; a weight is finite")
        if number < 0:
            raise ValueError(f"weights[{i}] is {number}; a weight is not negative")
        out.append(number)
    if sum(out) <= 0:
        raise ValueError("weights sum to zero; at least one source needs a positive weight")
    return out


def _accumulator(dtype: np.dtype) -> np.dtype:
    """Float64 for 32- and 64-bit floats, float32 for narrower ones (bfloat16, float8):
    enough that the mean is rounded once, into the leaf's dtype."""
    return np.dtype(np.float64) if dtype.itemsize >= 4 else np.dtype(np.float32)


def _mean(dtype: np.dtype, weights: list[float], where: str) -> _surgery.Combine:
    acc_dtype = _accumulator(dtype)
    total = math.fsum(weights)
    equal = len(set(weights)) == 1

    def combine(
        values: list[np.ndarray], scratch: streaming.Scratch, into: np.ndarray | None
    ) -> np.ndarray:
        shape = np.shape(values[0])
        acc = scratch.get("sum", shape, acc_dtype)
        # Each pass reads the sources as they are and widens them on the way (numpy
        # casts in small blocks): three passes for an equal mean of three.
        if equal:
            np.add(values[0], values[1], out=acc, dtype=acc_dtype)
            for value in values[2:]:
                np.add(acc, value, out=acc, dtype=acc_dtype)
        else:
            wide = scratch.get("weighted", shape, acc_dtype)
            np.multiply(values[0], acc_dtype.type(weights[0]), out=acc, dtype=acc_dtype)
            for weight, value in zip(weights[1:], values[1:], strict=True):
                if weight:
                    np.multiply(value, acc_dtype.type(weight), out=wide, dtype=acc_dtype)
                    acc += wide
        out = scratch.get("mean", shape, dtype) if into is None else into
        # Divided at the full width, rounded once into the leaf's dtype.
        np.divide(acc, acc_dtype.type(len(weights) if equal else total), out=acc)
        dtypes.convert_into(out, acc)
        return out

    return combine


def _agree(wheres: list[str]) -> _surgery.Combine:
    def combine(
        values: list[np.ndarray], scratch: streaming.Scratch, into: np.ndarray | None
    ) -> np.ndarray:
        first = values[0]
        for where, value in zip(wheres[1:], values[1:], strict=True):
            if not np.array_equal(first, value):
                raise ValueError(
                    f"{where}: its values differ from those of {wheres[0].split(': checkpointable')[0]}; "
                    "only floating-point leaves are averaged, the others must be equal in "
                    "every source (leave it out with keys=… or checkpointables=[…])"
                )
        if into is None:
            return first
        np.copyto(into, first)
        return into

    return combine


def average_checkpoints(
    sources: Sequence[str | os.PathLike[str] | Checkpoint],
    destination: str | os.PathLike[str],
    *,
    weights: Sequence[float] | None = None,
    checkpointables: str | Sequence[str] | None = None,
    keys: str | re.Pattern[str] | None = None,
    progress: Progress | None = None,
    allow_diverged: bool = False,
) -> None:
    """Write a new checkpoint whose floating-point leaves are the weighted mean of several.

    For averaging the last checkpoints of a run (LAWA, model soups, an EMA after the
    fact). Every source must have the same structure: the same checkpointables,
    leaves, shapes and dtypes (the first difference is named). Floating-point
    leaves are averaged, accumulated in float64 (float32 for 16-bit and narrower
    floats) and stored in each leaf's own dtype; every other leaf (integers such as
    step counters, PRNG keys, strings, a Grain iterator's state) must be equal in
    every source, or the call is refused naming the leaf: pass ``checkpointables``
    to leave such parts out.

    The sources are streamed region by region, side by side, checked against their
    saved checksums, so memory holds at most one leaf of each source and one more
    (usually a few regions). The result is a normal, checksummed checkpoint,
    written atomically, with its lineage (``tinax.explore.lineage``): each source's
    path, step, normalised weight and the digest of its checksum records.

    Args:
      sources: At least two checkpoint directories, local or ``gs://``.
      destination: The new checkpoint's directory (local or ``gs://``); must not exist.
      weights: One non-negative weight per source (normalised to sum to 1); equal
        weights by default.
      checkpointables: Only these checkpointables (a name or a list of names); all
        by default.
      keys: Only the leaves whose dotted key this regular expression finds, as for
        ``derive_checkpoint`` (an NNX model's Dropout keeps an RNG counter that
        differs from step to step: ``keys=r"^(?!.*\\.rngs\\.)"`` leaves it out).
        Checkpointables left without a leaf are left out, and so are iterators and
        JSON records unless ``checkpointables`` names them.
      progress: ``progress(done, total)`` in bytes read (all sources), as they are read.
      allow_diverged: Average sources that diverged all the same.

    A source that diverged is refused as ``derive_checkpoint`` refuses one (a NaN
    would spread to every average it is in), naming it and its leaves; the lineage
    records each source's verdict. The new checkpoint keeps none of the metrics its
    sources logged.

    Raises:
      TypeError: If an argument has the wrong type (a weight that is a bool too).
      FileNotFoundError: If a source does not exist, or ``destination``'s parent
        does not.
      FileExistsError: If ``destination`` exists (refused before anything is read),
        or a live process is writing it.
      ValueError: If fewer than two sources are given, a source is not a readable
        checkpoint, the weights do not fit (count, negative, zero sum), the sources'
        structures differ, or a leaf that is not floating-point differs between
        them, naming the leaf.
      CorruptDataError: A ``ValueError``: a source's data does not match its
        checksums (or does not decode), naming it and the leaf. Nothing is left at
        ``destination``.
      DivergedCheckpointError: A ``ValueError``: a source diverged, without
        ``allow_diverged``. Nothing is left at ``destination``.
    """
    progress = _surgery.check_progress(progress)
    allow = _surgery_health.check_argument(allow_diverged)
    if isinstance(sources, str | bytes | os.PathLike) or not isinstance(sources, Sequence):
        raise TypeError(f"sources must be a list of checkpoint paths, got {type(sources).__name__}")
    paths = list(sources)
    if len(paths) < 2:
        raise ValueError(
            f"an average needs at least two sources, got {len(paths)} (derive_checkpoint "
            "copies one)"
        )
    raw_weights = check_weights(weights, len(paths))
    pattern = treeplan.compile_keys(keys)
    dest = _surgery.check_destination(destination)
    with files.paused_gc():
        opened = [_surgery.open_source(path) for path in paths]
        _surgery.check_not_inside(dest, opened)
        _surgery_health.refuse_known(opened, "average", allow)
        names = _surgery.selected_names(checkpointables, opened[0])
        _check_same_checkpointables(opened, names, explicit=checkpointables is not None)
        pytrees: dict[str, list[PyTreeSource]] = {}
        kept: dict[str, list[int]] = {}
        for name in list(names):
            if opened[0].checkpoint.get(name).layout != layout.PYTREE:
                if pattern is not None and checkpointables is None:
                    names.remove(name)  # an iterator's state has no keys to match
                else:
                    _check_same_files(opened, name)
                continue
            trees = [_surgery.pytree_source(source, name) for source in opened]
            _check_same_tree(trees)
            indices = _kept(trees[0], pattern)
            if pattern is not None and not indices:
                names.remove(name)
                continue
            pytrees[name], kept[name] = trees, indices
        if not names:
            raise ValueError(
                f"checkpoint {str(opened[0].path)!r}: no leaf has a dotted key that keys "
                f"{pattern.pattern if pattern else ''!r} finds"
            )
    ctx = _surgery.new_context()
    jobs = {name: _jobs(trees, kept[name], raw_weights, ctx) for name, trees in pytrees.items()}
    total = sum(
        chunks.box_size(box) * sum(s.dtype.itemsize for s in job.sources)
        for by_key in jobs.values()
        for job in by_key.values()
        for _, box in job.boxes
    )
    counter = _surgery.ProgressCounter(progress, total)
    normalised = [w / math.fsum(raw_weights) for w in raw_weights]
    counts = _surgery_health.SourceCounts(opened)

    def fill(new: NewCheckpoint) -> dict[str, str | None]:
        handlers: dict[str, str | None] = {}
        for name in names:
            if name in pytrees:
                first = pytrees[name][0]
                leaves = [(first.leaves[i].path, i) for i in kept[name]]
                _surgery.write_pytree(
                    new, first, leaves, jobs[name], ctx, counter, counts.counter(name)
                )
            else:
                _surgery.copy_checkpointable(new, opened[0].checkpoint.get(name))
            found = opened[0].record.item_handlers
            handlers[name] = found.get(name) if isinstance(found, dict) else None
        counts.read(list(pytrees))
        counts.refuse("average", allow)
        return handlers

    arguments: dict[str, Any] = {
        "checkpointables": None if checkpointables is None else names,
        "keys": None if pattern is None else pattern.pattern,
        "weights": normalised,
    }

    def made() -> lineage.Lineage:
        sources = zip(opened, normalised, counts.healths(), strict=True)
        return _surgery.made_now(
            lineage.AVERAGE,
            arguments,
            [source.lineage_source(weight, found) for source, weight, found in sources],
        )

    def custom() -> dict[str, Any]:
        # A mean of finite values is finite; a NaN or Inf in a source spreads to it.
        made_health = counts.made(list(pytrees))
        return _surgery_health.custom_metadata(
            opened[0].custom_metadata, names, False, made_health, True
        )

    try:
        _surgery.write_checkpoint(dest, fill, custom, made)
    finally:
        for trees in pytrees.values():
            for tree in trees:
                tree.close()


def _check_same_checkpointables(
    opened: list[OpenedSource], names: list[str], *, explicit: bool
) -> None:
    first = opened[0]
    for source in opened[1:]:
        held = [item.name for item in source.checkpoint.checkpointables]
        for name in names:
            if name not in held:
                raise ValueError(
                    f"the sources differ: checkpoint {str(source.path)!r} has no checkpointable "
                    f"{name!r}, which {str(first.path)!r} has"
                )
            if source.checkpoint.get(name).layout != first.checkpoint.get(name).layout:
                raise ValueError(
                    f"the sources differ: checkpointable {name!r} is stored as "
                    f"{source.checkpoint.get(name).layout!r} in {str(source.path)!r} and as "
                    f"{first.checkpoint.get(name).layout!r} in {str(first.path)!r}"
                )
        extra = [name for name in held if name not in names]
        if extra and not explicit:
            raise ValueError(
                f"the sources differ: checkpoint {str(source.path)!r} has checkpointable(s) "
                f"{extra} that {str(first.path)!r} has not; pass checkpointables=[…]"
            )


def _check_same_files(opened: list[OpenedSource], name: str) -> None:
    """A checkpointable copied file by file must be the same in every source."""
    first = opened[0]
    _surgery.checked_copy(first.checkpoint.get(name), f"checkpoint {str(first.path)!r}")
    expected = _file_bytes(first.checkpoint.get(name))
    for source in opened[1:]:
        item = source.checkpoint.get(name)
        _surgery.checked_copy(item, f"checkpoint {str(source.path)!r}")
        if _file_bytes(item) != expected:
            raise ValueError(
                f"checkpointable {name!r} ({item.layout}) differs between {str(first.path)!r} "
                f"and {str(source.path)!r}: only floating-point leaves are averaged; leave "
                "it out with checkpointables=[…]"
            )


def _file_bytes(item: layout.StoredCheckpointable) -> dict[str, bytes]:
    """Its state files (not its checksum record), by path within it."""
    found = {}
    for where, _ in item.checkpoint.files_under(item.directory):
        if f"/{names.CHECKSUMS_DIR}/" not in where.path:
            found[where.path[len(item.directory.path) :]] = item.checkpoint.read_bytes(
                where, what="a checkpointable's file", max_bytes=files.MAX_METADATA_BYTES
            )
    return found


def _check_same_tree(trees: list[PyTreeSource]) -> None:
    treeplan.check_same_leaves([(tree.where(), tree.leaves) for tree in trees])


def _kept(tree: PyTreeSource, pattern: re.Pattern[str] | None) -> list[int]:
    """The positions of the leaves an average keeps (all without ``keys``)."""
    if pattern is None:
        return list(range(len(tree.leaves)))
    planned = {id(p.source) for p in treeplan.plan_leaves(tree.name, tree.leaves, keys=pattern)}
    return [i for i, leaf in enumerate(tree.leaves) if id(leaf) in planned]


def _check_same_values(trees: list[PyTreeSource], kept: list[int]) -> None:
    """Strings and empty leaves, which are not averaged, must be the same in every source."""
    first = trees[0]
    for index in kept:
        leaf = first.leaves[index]
        if leaf.kind == words.STRING and leaf.stored:
            value = first.string(leaf)
            for tree in trees[1:]:
                if tree.string(tree.leaves[index]) != value:
                    raise ValueError(
                        f"{tree.where(leaf)}: the string differs from {first.checkpoint!r}'s; "
                        "only floating-point leaves are averaged (leave this checkpointable "
                        "out with checkpointables=[…])"
                    )
        elif leaf.kind == words.EMPTY:
            kind = first.value_metadata[index].get("value_type")
            for tree in trees[1:]:
                other = tree.value_metadata[index].get("value_type")
                if other != kind:
                    raise ValueError(
                        f"the sources differ: {first.where(leaf)} is {kind} but {other} in "
                        f"{tree.checkpoint!r}"
                    )


def _jobs(
    trees: list[PyTreeSource], kept: list[int], weights: list[float], ctx: Any
) -> dict[str, ArrayJob]:
    _check_same_values(trees, kept)
    first = trees[0]
    leaves = [first.leaves[i] for i in kept]
    if not any(leaf.kind in words.STORED_ARRAY_KINDS and leaf.stored for leaf in leaves):
        return {}
    per_source = [tree.arrays(ctx) for tree in trees]
    jobs: dict[str, ArrayJob] = {}
    for leaf in leaves:
        arrays: list[SourceArray] = [found[leaf.key] for found in per_source if leaf.key in found]
        if not arrays:
            continue
        if len(arrays) != len(trees):
            raise ValueError(
                f"the sources differ: {first.where(leaf)} is not stored in all of them"
            )
        wheres = [tree.where(leaf) for tree in trees]
        for array, where in zip(arrays[1:], wheres[1:], strict=True):
            if (array.shape, array.dtype) != (arrays[0].shape, arrays[0].dtype):
                raise ValueError(
                    f"the sources differ: {wheres[0]} is {arrays[0].dtype.name} "
                    f"{arrays[0].shape} but {where} is {array.dtype.name} {array.shape}"
                )
        dtype = arrays[0].dtype
        combine = _mean(dtype, weights, wheres[0]) if is_floating(dtype) else _agree(wheres)
        job = _surgery.plan_job(leaf.key, arrays, wheres, dtype, combine)
        for array, where in zip(arrays[1:], wheres[1:], strict=True):
            if streaming.tiled_pieces(array.record, array.shape) != job.pieces and array.record:
                # Pieced otherwise than the first: checked on its own first.
                _surgery.verify_alone(array, where)
                array.record = None
        jobs[leaf.key] = job
    return jobs
