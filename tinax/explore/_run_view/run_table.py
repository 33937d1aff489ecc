"""A run at a glance, one row per checkpoint: status, size, commit time, why it is kept,
its metrics, and how long its save took. Metadata only.

Metrics come from a checkpoint's auxiliary state (the numeric scalars of a dict-like
``auxiliary`` checkpointable, as ``TrainingRun`` and ``save_training_checkpoint`` save
it) and from the ``metrics`` Orbax records in ``_CHECKPOINT_METADATA`` (V1
``training.Checkpointer``, V0 ``CheckpointManager``). A scalar stored inline in the
OCDBT manifest, as Orbax stores small ones, is decoded from the manifest's bytes and
checked against its saved checksum; any other is read through tensorstore.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
from typing import Any

import numpy as np
import pandas as pd

from tinax._format.integrity import checksums, health
from tinax._format.metadata import arrays, layout, pytree
from tinax._format.metadata.layout import Checkpoint, StoredCheckpointable
from tinax._format.naming import names, words
from tinax._format.records import metrics as metrics_record
from tinax._format.records import savetimes
from tinax._format.storage import files
from tinax._format.storage.location import DIRECTORY
from tinax.explore import _health, _listed, _listing, _tiers
from tinax.explore._run_view.retention import kept_table

RUN_COLUMNS = (
    "name",
    "path",
    "step",
    "status",
    "nbytes",
    "committed",
    "kept",
    "save_blocked_s",
    "save_total_s",
    "nonfinite_metrics",
)
# Column names a metric is not given (it is prefixed with its checkpointable instead).
_TAKEN = RUN_COLUMNS + _tiers.TIER_COLUMNS + _health.HEALTH_COLUMNS
# The checkpointable ``TrainingRun`` and ``save_training_checkpoint`` save auxiliary state
# in (``TrainingCheckpointNames().auxiliary``), and how they wrap it.
AUXILIARY = "auxiliary"
_WRAPPED = ("state", "step")
# Readers of a run's checkpoints at once (their files are small: latency bound).
_THREADS = 8
# Leaves that may hold a metric: Python numbers, and 0-d arrays.
_VALUE_KINDS = frozenset({words.SCALAR, *words.ARRAY_KINDS})


# -- a scalar decoded from the OCDBT manifest ------------------------------------------------


def _scalars(item: StoredCheckpointable) -> dict[tuple[Any, ...], Any]:
    """The scalar leaves of a pytree checkpointable, by key path: from the manifest where
    they are inline (checked against their checksums), else through tensorstore."""
    directory = item.directory
    tree = pytree.read_layout(item)
    # Python numbers, and arrays that may be 0-d (jnp.float32(…), np.float32(…) saved
    # as a 0-d array, bfloat16): their shapes are in their zarr metadata.
    scalars = [leaf for leaf in tree.leaves if leaf.kind in _VALUE_KINDS and leaf.stored]
    if not scalars:
        return {}
    found: dict[tuple[Any, ...], Any] = {}
    skipped: set[tuple[Any, ...]] = set()  # arrays that are not 0-d
    if tree.ocdbt and tree.zarr3:
        ctx = tree.context()
        stored = tree.walk_store(ctx).values
        try:
            records = checksums.read_checksums(item)
        except ValueError:
            records = None
        for leaf in scalars:
            path = pytree.storage_path(leaf.param)
            metadata = stored.get((path + names.ZARR3_METADATA).encode("utf-8"))
            chunk = stored.get((path + "c").encode("utf-8"))
            if not isinstance(metadata, bytes) or not isinstance(chunk, bytes | None):
                continue
            value = arrays.inline_scalar(metadata, chunk)
            if value is arrays.NOT_0D:
                skipped.add(leaf.path)
                continue
            if value is None:
                continue
            record = None if records is None else records.get(leaf.key)
            if record is not None and checksums.check_value(record, value) is False:
                raise ValueError(
                    f"{str(directory)!r}: leaf {leaf.key}: the stored value does not match "
                    "its checksum"
                )
            found[leaf.path] = value
    if len(found) + len(skipped) < len(scalars):
        from tinax.explore import _checkpoint

        ctx = tree.context()
        rows = _checkpoint.pytree_leaves(directory.name, tree, ctx, values=True)
        for leaf, row in zip(tree.leaves, rows, strict=True):
            if leaf.path in found or leaf.path in skipped or not leaf.stored:
                continue
            if leaf.kind == words.SCALAR:
                found[leaf.path] = row.value
            elif leaf.kind in words.ARRAY_KINDS and row.shape == ():
                # A 0-d array not inline in the manifest (compressed, say): one read.
                found[leaf.path] = _read_whole(item, tree, leaf, ctx)
    return found


def _read_whole(
    item: StoredCheckpointable, tree: pytree.PyTreeLayout, leaf: pytree.StoredLeaf, ctx: Any
) -> Any:
    """A small stored array, read and checked against its checksum."""
    from tinax.explore._array_read import array_record, read_array

    value, checked = read_array(tree, leaf, ctx, array_record(item, leaf.key))
    problem = None if checked else checksums.check_read_value(item, leaf.key, value)
    if problem is not None:
        raise ValueError(f"{str(item.directory)!r}: {problem}")
    return value


# -- one checkpoint --------------------------------------------------------------------------


def _fact_files(listed: _listed.Listed, auxiliary: str) -> list[str]:
    """The small files ``_checkpoint_facts`` reads of a checkpoint beyond what the listing
    read: Orbax's metrics file where there is one, and its auxiliary state's metadata only
    where its commit record does not hold the metrics."""
    path, candidates = listed.path, []
    if names.METRICS in listed.entries:
        candidates.append(path / names.METRICS / names.METRICS)
    if metrics_record.recorded(listed.record.custom_metadata, auxiliary) is None:
        aux = path / auxiliary
        candidates.append(aux / names.PYTREE_METADATA)
        candidates.extend(
            aux / names.CHECKSUMS_DIR / name for name in (aux / names.CHECKSUMS_DIR).entries()
        )
    return [where.path for where in candidates]


def _checkpoint_facts(
    listed: _listed.Listed, auxiliary: str
) -> tuple[dict[str, float], savetimes.SaveTimes | None, str | None]:
    """A checkpoint's metrics and save times, from what the listing read of it (its commit
    record, its save's record) and, where those do not hold the metrics, Orbax's metrics
    file or its auxiliary state; and what could not be read (or ``None``)."""
    path = listed.path
    metrics: dict[str, float] = {}
    problem = None
    for key, value in listed.record.metrics.items():
        number = metrics_record.numeric(value)
        if isinstance(key, str) and number is not None:
            metrics[key] = number
    logged = metrics_record.recorded(listed.record.custom_metadata, auxiliary)
    # Orbax's MetricsHandler (V1 ``training.Checkpointer``, V0 ``CheckpointManager``)
    # writes them as a checkpointable of their own: ``metrics/metrics``.
    if names.METRICS in listed.entries:
        metrics_file = path / names.METRICS / names.METRICS
        try:
            if metrics_file.is_file():
                recorded = files.read_json_object(metrics_file, what="Orbax metrics")
                for key, value in recorded.items():
                    number = metrics_record.numeric(value)
                    if number is not None:
                        metrics.setdefault(key, number)
        except (ValueError, OSError) as e:
            problem = str(e)
    if logged is not None:
        # Recorded by the save with its commit: the auxiliary state is not read.
        for key, number in logged.items():
            metrics.setdefault(key, number)
        return metrics, listed.save, problem
    try:
        aux = listed.entries.get(auxiliary)
        if aux is not None and aux.kind == DIRECTORY:
            # Its layout and walk, for its auxiliary state alone (metadata only).
            opened = layout.identify(path, None, listed.record)
            if opened.get(auxiliary).layout == layout.PYTREE:
                values = _scalars(opened.get(auxiliary))
                wrapped = {p[0] for p in values} <= set(_WRAPPED) and any(
                    p[:1] == ("state",) for p in values
                )
                for key_path, value in values.items():
                    if wrapped:
                        if key_path[:1] != ("state",):
                            continue  # the step the training checkpoint saves beside its state
                        key_path = key_path[1:]
                    number = metrics_record.numeric(value)
                    if number is not None:
                        metrics.setdefault(metrics_record.metric_name(key_path), number)
    except (ValueError, OSError, KeyError, TypeError) as e:
        problem = f"{auxiliary}: {e}"
    return metrics, listed.save, problem


def run_table(
    root: str | os.PathLike[str] | Checkpoint, *, auxiliary: str = AUXILIARY
) -> pd.DataFrame:
    """One row per checkpoint of a run: how it stands, what it measured, how its save went.

    Metadata only: no array is read. The checkpoints are those of
    ``list_checkpoints(root, deep=False)``, in its order (by step, then name).

    Args:
      root: A run directory (local or ``gs://``): written by ``TrainingRun``, by
        ``save_training_checkpoint`` or ``save_checkpointables``, by Orbax's V1
        ``training.Checkpointer`` or V0 ``CheckpointManager``; or one checkpoint.
      auxiliary: The checkpointable whose numeric scalars are metrics (``TrainingRun``
        saves its ``auxiliary`` there).

    Returns:
      A DataFrame with columns ``name``, ``path``, ``step`` (``Int64``), ``status``,
      ``nbytes``, ``committed`` (as ``list_checkpoints``); ``kept``, why a
      ``TrainingRun`` keeps it (``<NA>`` where the run has no record of it);
      ``save_blocked_s`` and ``save_total_s``, how long its save blocked the caller and
      took until it committed, where tinax recorded them (else NaN); for a two-tier
      run, ``tier`` and ``promotion`` as ``list_checkpoints`` gives them;
      ``nonfinite_metrics``, the metric columns whose value in that checkpoint is
      NaN or infinite, joined by ``", "`` (``<NA>`` where none: a NaN in a metric
      column of such a row means no value was recorded); ``integrity``, ``health``,
      ``health_reason``, ``nan`` and ``inf``, the verdict as ``list_checkpoints``
      gives it (a non-finite metric makes a checkpoint ``diverged``); then one float column
      per metric (NaN where a checkpoint has none), sorted by name: each numeric
      0-d value of the ``auxiliary`` checkpointable, as logged (Python numbers,
      NumPy scalars and 0-d arrays, JAX 0-d arrays, ``bfloat16``; nested
      mappings by their dotted key paths, such as ``eval.loss``; a training
      checkpoint's own ``step`` left out) and each number in Orbax's recorded
      ``metrics``.
      ``attrs["metrics"]`` lists the metric columns; ``attrs["errors"]`` maps the
      path of each checkpoint whose metadata could not be read to why;
      ``attrs["unchecked"]`` is the listing's.

    Raises:
      TypeError: If ``root`` is not a path or ``auxiliary`` not a string.
      FileNotFoundError: If ``root`` does not exist.
      ValueError: If ``root`` is not a directory.
    """
    if not isinstance(auxiliary, str):
        raise TypeError(f"auxiliary must be a checkpointable name, got {type(auxiliary).__name__}")

    run = _listing.run_listing(root)
    directory, listing = run.directory, run.table
    errors: dict[str, str] = dict(listing.attrs.get("errors", {}))
    # What the listing read of each complete checkpoint (its commit record and save
    # record): nothing is read again. On an object store, whose listing reads no file,
    # they are read here, fetched side by side first.
    # Column by column: a row as a Series would copy the listing's attrs each.
    complete = [
        (i, run.where({"name": name, "path": path}))
        for i, (name, path, status) in enumerate(
            zip(listing["name"], listing["path"], listing["status"], strict=True)
        )
        if status in (words.COMPLETE, words.ABANDONED)
    ]
    listed: dict[int, _listed.Listed] = {}
    unlisted = []
    for i, where in complete:
        found = run.listed.get(str(where))
        if found is None:
            unlisted.append((i, where))
        else:
            listed[i] = found
    if unlisted and directory.storage.parallel_reads:
        directory.storage.prefetch(
            [
                (where / name).path
                for _, where in unlisted
                for name in (names.CHECKPOINT_METADATA, names.SAVE_TIMES)
            ],
            files.MAX_METADATA_BYTES,
        )
    facts: dict[int, tuple[dict[str, float], savetimes.SaveTimes | None, str | None]] = {}
    for i, where in unlisted:
        read = _listed.read_listed(where, where.entries())
        if read is None:
            facts[i] = ({}, None, f"{str(where)!r}: its commit record cannot be read")
        else:
            listed[i] = read
    if directory.storage.parallel_reads:
        directory.storage.prefetch(
            [path for found in listed.values() for path in _fact_files(found, auxiliary)],
            files.MAX_METADATA_BYTES,
        )
    if listed:
        with concurrent.futures.ThreadPoolExecutor(min(_THREADS, len(listed))) as pool:
            futures = {
                i: pool.submit(_checkpoint_facts, found, auxiliary) for i, found in listed.items()
            }
            facts.update({i: future.result() for i, future in futures.items()})
    metric_names = sorted({name for m, _, _ in facts.values() for name in m})
    table = listing[["name", "path", "step", "status", "nbytes", "committed"]].copy()
    for column in _tiers.TIER_COLUMNS:
        if column in listing.columns:
            table[column] = listing[column]
    kept = kept_table(run.record, run.tiers)
    by_name = dict(zip(kept["name"], kept["kept"], strict=True))
    table["kept"] = pd.array([by_name.get(n) for n in table["name"]], dtype="string")
    for column, pick in (("save_blocked_s", 0), ("save_total_s", 1)):
        values = []
        for i in range(len(table)):
            times = facts.get(i, ({}, None, None))[1]
            values.append(None if times is None else times[pick])
        table[column] = np.array([math.nan if v is None else v for v in values], dtype=float)
    nonfinite: list[list[str]] = [[] for _ in range(len(table))]
    metric_columns: dict[str, np.ndarray] = {}
    for name in metric_names:
        column = name if name not in _TAKEN else f"{auxiliary}.{name}"
        values = [facts.get(i, ({}, None, None))[0].get(name) for i in range(len(table))]
        for i, value in enumerate(values):
            if value is not None and not math.isfinite(value):
                nonfinite[i].append(column)
        metric_columns[column] = np.array(
            [math.nan if v is None else v for v in values], dtype=float
        )
    # A NaN in a metric column is ambiguous (a NaN loss, or no loss recorded): this says which.
    table["nonfinite_metrics"] = pd.array(
        [", ".join(names) if names else None for names in nonfinite], dtype="string"
    )
    # The verdict every view shows: the one the listing gives, judged by every metric
    # read here (Orbax's metrics file and an auxiliary state read as data too).
    known = listing.attrs.get(_health.HEALTHS, {})
    healths = [
        health.with_metrics(known.get(str(path), health.judge()), facts.get(i, ({}, None, None))[0])
        for i, path in enumerate(table["path"])
    ]
    integrity = (
        listing["integrity"]
        if "integrity" in listing
        else table["status"].map(health.integrity_of_status)
    )
    for column, values in _health.columns(healths, list(integrity)).items():
        table[column] = values
    for column, numbers in metric_columns.items():
        table[column] = numbers
    for i, (_, _, problem) in facts.items():
        if problem is not None:
            errors[str(table["path"].iloc[i])] = problem
    table.attrs = {
        "metrics": [n if n not in _TAKEN else f"{auxiliary}.{n}" for n in metric_names],
        "errors": errors,
        "unchecked": listing.attrs.get("unchecked", []),
    }
    return table
