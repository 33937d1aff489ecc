"""A new checkpoint derived from one: some checkpointables, some leaves, cast, renamed."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tinax._format.arraydata import chunks
from tinax._format.callbacks import Progress
from tinax._format.metadata.layout import Checkpoint
from tinax._format.naming import dtypes, words
from tinax._format.records import lineage
from tinax._format.storage import files
from tinax._format.writing import streaming, treeplan
from tinax._format.writing.copy_source import PyTreeSource
from tinax._format.writing.new_checkpoint import NewCheckpoint
from tinax._format.writing.treeplan import PlannedLeaf
from tinax.checkpointing import _surgery, _surgery_health
from tinax.checkpointing._surgery import ArrayJob, OpenedSource


def _combine(dtype: np.dtype, cast: bool) -> _surgery.Combine:
    def combine(
        values: list[np.ndarray], scratch: streaming.Scratch, out: np.ndarray | None
    ) -> np.ndarray:
        value = np.asarray(values[0])
        if out is None:
            if not cast:
                return value
            out = scratch.get("cast", value.shape, dtype)
        dtypes.convert_into(out, value)
        return out

    return combine


def derive_checkpoint(
    source: str | os.PathLike[str] | Checkpoint,
    destination: str | os.PathLike[str],
    *,
    checkpointables: str | Sequence[str] | None = None,
    keys: str | re.Pattern[str] | None = None,
    cast: str | np.dtype | type | None = None,
    rename: Sequence[tuple[str, str]] | Mapping[str, str] | None = None,
    progress: Progress | None = None,
    allow_diverged: bool = False,
) -> None:
    """Write a new checkpoint made from one: some checkpointables, some leaves, cast, renamed.

    The arrays are streamed a region at a time from the source, checked against the
    checksums saved with them, and written into the new checkpoint, so memory holds
    at most two leaves (and usually a few regions) whatever the checkpoint's size.
    The result is a normal checkpoint: checksummed as a tinax save, loadable by
    ``load_checkpointables`` (through its restore verdict) and by Orbax alone, and
    atomic (nothing is at ``destination`` until it is whole; a failure leaves
    nothing). It records its lineage (``tinax.explore.lineage``): the source, its
    step, the digest of its checksum records, and these arguments.

    An array kept as it is (no cast) is copied as the chunks it is stored in, checked
    on the way. On a local disk, a data file of the source whose chunks the new
    checkpoint keeps nine tenths of or more (a checkpointable kept whole, say) is
    hard-linked into it rather than written again (every chunk is still read and
    checked before the new checkpoint commits): committed checkpoints never change,
    the two share the file's blocks, and either may be removed without the other
    (the space goes with the last). Where the file system refuses a link (another
    one), the bytes are copied.

    Keys are matched and rewritten as ``tinax.explore.display`` shows them: dotted,
    NNX's trailing ``value`` left out (``blocks.0.up.kernel``), the tree rebuilt
    from the new keys (a part that was a sequence index stays one).

    Args:
      source: A checkpoint directory, local or ``gs://``.
      destination: The new checkpoint's directory (local or ``gs://``); must not exist.
      checkpointables: Only these checkpointables (a name or a list of names); all by
        default.
      keys: Only the leaves whose dotted key this regular expression finds
        (``re.search``; anchor it with ``^…$`` for whole keys). Checkpointables left
        without a leaf are left out, and so are those that are not pytrees (a Grain
        iterator) unless ``checkpointables`` names them. An empty leaf (``None``, an
        optax ``EmptyState``) that a kept tuple needs to stay whole is kept.
      cast: A floating-point dtype or its name (``"bfloat16"``): floating-point
        arrays are stored in it; integer arrays, PRNG keys and Python scalars keep
        theirs.
      rename: ``(regex, replacement)`` pairs applied in turn to each dotted key
        (``re.sub``; ``\\1`` refers to a group), or a mapping of regex to replacement.
      progress: ``progress(done, total)`` in bytes read, called as arrays are read.
      allow_diverged: Make it from a source that diverged all the same.

    A source that diverged is refused (``DivergedCheckpointError``): at once where
    that is known before reading it (a metric its save logged is NaN or infinite;
    a read found NaN or Inf before), else once its values, counted as they stream,
    show NaN or Inf, before anything commits, naming the leaves. The lineage records
    the source's verdict, and the new checkpoint records its own health (it was
    read whole); it keeps the metrics its source logged only where it holds them as
    they were (its auxiliary state kept whole, no ``keys`` or ``rename``).

    Raises:
      TypeError: If an argument has the wrong type.
      FileNotFoundError: If ``source`` does not exist, or ``destination``'s parent
        does not.
      FileExistsError: If ``destination`` exists (refused before anything is read),
        or a live process is writing it.
      ValueError: If ``source`` is not a readable checkpoint, a checkpointable is
        not in it, ``keys`` or a rename pattern is not a regular expression, no leaf
        matches ``keys``, ``cast`` is not a floating-point dtype, or the new keys do
        not make a tree (two leaves under one key, a leaf that is also a subtree, a
        tuple with a hole), naming the leaves.
      CorruptDataError: A ``ValueError``: the source's data does not match its
        checksums (or does not decode), naming the checkpoint, checkpointable and
        leaf. Nothing is left at ``destination``.
      DivergedCheckpointError: A ``ValueError``: the source diverged, without
        ``allow_diverged``. Nothing is left at ``destination``.
    """
    progress = _surgery.check_progress(progress)
    allow = _surgery_health.check_argument(allow_diverged)
    pattern = treeplan.compile_keys(keys)
    renames = treeplan.compile_rename(rename)
    dtype = treeplan.compile_cast(cast)
    dest = _surgery.check_destination(destination)
    with files.paused_gc():
        opened = _surgery.open_source(source)
        _surgery.check_not_inside(dest, [opened])
        _surgery_health.refuse_known([opened], "derive", allow)
        plan = _plan(opened, checkpointables, pattern, renames)
    counts = _surgery_health.SourceCounts([opened])
    ctx = _surgery.new_context()
    jobs_by_name = {
        name: _jobs(tree, planned, dtype, ctx) for name, (tree, planned) in plan.pytrees.items()
    }
    total = sum(
        chunks.box_size(box) * job.sources[0].dtype.itemsize
        for jobs in jobs_by_name.values()
        for job in jobs.values()
        for _, box in job.boxes
    )
    counter = _surgery.ProgressCounter(progress, total)
    arguments: dict[str, Any] = {
        "checkpointables": None if checkpointables is None else list(plan.order),
        "keys": None if pattern is None else pattern.pattern,
        "cast": None if dtype is None else dtype.name,
        "rename": [[p.pattern, r] for p, r in renames],
    }

    def fill(new: NewCheckpoint) -> dict[str, str | None]:
        handlers: dict[str, str | None] = {}
        for name in plan.order:
            item = opened.checkpoint.get(name)
            if name in plan.pytrees:
                tree, planned = plan.pytrees[name]
                index = {id(leaf): i for i, leaf in enumerate(tree.leaves)}
                leaves = [(leaf.path, index[id(leaf.source)]) for leaf in planned]
                _surgery.write_pytree(
                    new, tree, leaves, jobs_by_name[name], ctx, counter, counts.counter(name)
                )
            else:
                _surgery.copy_checkpointable(new, item)
            handlers[name] = _handler(opened, name)
        counts.read(list(plan.pytrees))
        counts.refuse("derive", allow)
        return handlers

    def custom() -> dict[str, Any]:
        held = list(plan.pytrees)
        kept_whole = pattern is None and not renames and dtype is None
        made_health = counts.made(held)
        return _surgery_health.custom_metadata(
            opened.custom_metadata, plan.order, kept_whole, made_health, dtype is None
        )

    def made() -> lineage.Lineage:
        found = counts.healths()[0]
        return _surgery.made_now(lineage.DERIVE, arguments, [opened.lineage_source(None, found)])

    try:
        _surgery.write_checkpoint(dest, fill, custom, made)
    finally:
        for tree, _ in plan.pytrees.values():
            tree.close()


def _handler(opened: OpenedSource, name: str) -> str | None:
    handlers = opened.record.item_handlers
    return handlers.get(name) if isinstance(handlers, dict) else None


class _Plan:
    """The checkpointables kept, in order, and each pytree's leaves with new keys."""

    def __init__(self, order: list[str]) -> None:
        self.order = order
        self.pytrees: dict[str, tuple[PyTreeSource, list[PlannedLeaf]]] = {}


def _plan(
    opened: OpenedSource,
    checkpointables: object,
    pattern: re.Pattern[str] | None,
    renames: list[treeplan.Rename],
) -> _Plan:
    planned = treeplan.plan_checkpoint(opened.checkpoint, checkpointables, pattern, renames)
    plan = _Plan(planned.order)
    where = f"checkpoint {str(opened.path)!r}"
    for name in planned.order:
        if name in planned.leaves:
            plan.pytrees[name] = (_surgery.pytree_source(opened, name), planned.leaves[name])
        else:
            _surgery.checked_copy(opened.checkpoint.get(name), where)
    return plan


def _jobs(
    tree: PyTreeSource, planned: list[PlannedLeaf], cast: np.dtype | None, ctx: Any
) -> dict[str, ArrayJob]:
    """The array jobs of one pytree, by the new key."""
    if not any(p.source.kind in words.STORED_ARRAY_KINDS and p.source.stored for p in planned):
        return {}
    arrays_by_key = tree.arrays(ctx)
    jobs: dict[str, ArrayJob] = {}
    for leaf in planned:
        source = arrays_by_key.get(leaf.source.key)
        if source is None:
            continue
        dtype = treeplan.written_dtype(leaf.source, source.dtype, cast)
        jobs[leaf.key] = _surgery.plan_job(
            leaf.key,
            [source],
            [tree.where(leaf.source)],
            dtype,
            _combine(dtype, dtype != source.dtype),
        )
    return jobs
