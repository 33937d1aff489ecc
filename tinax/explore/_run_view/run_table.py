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
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from tinax import _paths
from tinax._format.integrity import checksums
from tinax._format.metadata import arrays, layout, pytree
from tinax._format.metadata.layout import Checkpoint
from tinax._format.naming import names, words
from tinax._format.records import metrics as metrics_record
from tinax._format.records import savetimes
from tinax._format.storage import files
from tinax._format.storage.location import Location
from tinax.explore import _listing, _tiers
from tinax.explore._run_view.retention import retention_table

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
_TAKEN = RUN_COLUMNS + _tiers.TIER_COLUMNS
# The checkpointable ``TrainingRun`` and ``save_training_checkpoint`` save auxiliary state
# in (``TrainingCheckpointNames().auxiliary``), and how they wrap it.
AUXILIARY = "auxiliary"
_WRAPPED = ("state", "step")
# Readers of a run's checkpoints at once (their files are small: latency bound).
_THREADS = 8
# Leaves that may hold a metric: Python numbers, and 0-d arrays.
_VALUE_KINDS = frozenset({words.SCALAR, *words.ARRAY_KINDS})


# -- a scalar decoded from the OCDBT manifest ------------------------------------------------


def _scalars(directory: Location) -> dict[tuple[Any, ...], Any]:
    """The scalar leaves of a pytree checkpointable, by key path: from the manifest where
    they are inline (checked against their checksums), else through tensorstore."""
    tree = pytree.read_layout(directory)
    # Python numbers, and arrays that may be 0-d (jnp.float32(…), np.float32(…) saved
    # as a 0-d array, bfloat16): their shapes are in their zarr metadata.
    scalars = [leaf for leaf in tree.leaves if leaf.kind in _VALUE_KINDS and leaf.stored]
    if not scalars:
        return {}
    found: dict[tuple[Any, ...], Any] = {}
    skipped: set[tuple[Any, ...]] = set()  # arrays that are not 0-d
    if tree.ocdbt and tree.zarr3:
        ctx = arrays.context()
        stored = dict(arrays.walk_ocdbt(directory, ctx))
        try:
            records = checksums.read_checksums(directory)
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

        ctx = arrays.context()
        rows = _checkpoint.pytree_leaves(directory.name, tree, ctx, values=True)
        for leaf, row in zip(tree.leaves, rows, strict=True):
            if leaf.path in found or leaf.path in skipped or not leaf.stored:
                continue
            if leaf.kind == words.SCALAR:
                found[leaf.path] = row.value
            elif leaf.kind in words.ARRAY_KINDS and row.shape == ():
                # A 0-d array not inline in the manifest (compressed, say): one read.
                found[leaf.path] = _read_whole(directory, tree, leaf, ctx)
    return found


def _read_whole(
    directory: Location, tree: pytree.PyTreeLayout, leaf: pytree.StoredLeaf, ctx: Any
) -> Any:
    """A small stored array, read and checked against its checksum."""
    from tinax.explore._array_read import array_record, read_array

    value, checked = read_array(tree, leaf, ctx, array_record(directory, leaf.key))
    problem = None if checked else checksums.check_read_value(directory, leaf.key, value)
    if problem is not None:
        raise ValueError(f"{str(directory)!r}: {problem}")
    return value


# -- one checkpoint --------------------------------------------------------------------------


def _fact_files(path: Location, auxiliary: str) -> list[str]:
    """The small files ``_checkpoint_facts`` reads of the checkpoint ``path``, as listed:
    its auxiliary state's only where its commit record (read with the listing) does
    not hold the metrics."""
    candidates = [path / names.METRICS / names.METRICS, path / names.SAVE_TIMES]
    try:
        meta = files.read_json_object(
            path / names.CHECKPOINT_METADATA, what="Orbax checkpoint metadata"
        )
    except (ValueError, OSError):
        meta = {}
    if metrics_record.recorded(meta.get("custom_metadata"), auxiliary) is None:
        aux = path / auxiliary
        candidates.append(aux / names.PYTREE_METADATA)
        candidates.extend(
            aux / names.CHECKSUMS_DIR / name for name in (aux / names.CHECKSUMS_DIR).entries()
        )
    return [where.path for where in candidates]


def _checkpoint_facts(
    path: Location, auxiliary: str
) -> tuple[dict[str, float], savetimes.SaveTimes | None, str | None]:
    """A checkpoint's metrics and save times, and what could not be read (or ``None``)."""
    metrics: dict[str, float] = {}
    problem = None
    try:
        meta = files.read_json_object(
            path / names.CHECKPOINT_METADATA, what="Orbax checkpoint metadata"
        )
        recorded = meta.get(names.METRICS)
        if isinstance(recorded, Mapping):
            for key, value in recorded.items():
                number = metrics_record.numeric(value)
                if isinstance(key, str) and number is not None:
                    metrics[key] = number
    except (ValueError, OSError) as e:
        problem = str(e)
        meta = {}
    logged = metrics_record.recorded(meta.get("custom_metadata"), auxiliary)
    # Orbax's MetricsHandler (V1 ``training.Checkpointer``, V0 ``CheckpointManager``)
    # writes them as a checkpointable of their own: ``metrics/metrics``.
    metrics_file = path / names.METRICS / names.METRICS
    if metrics_file.is_file():
        try:
            recorded = files.read_json_object(metrics_file, what="Orbax metrics")
            for key, value in recorded.items():
                number = metrics_record.numeric(value)
                if number is not None:
                    metrics.setdefault(key, number)
        except (ValueError, OSError) as e:
            problem = str(e)
    aux = path / auxiliary
    if logged is not None:
        # Recorded by the save with its commit: the auxiliary state is not read.
        for key, number in logged.items():
            metrics.setdefault(key, number)
        return metrics, savetimes.read_save_times(path), problem
    try:
        if aux.is_dir() and layout.classify(aux) == layout.PYTREE:
            values = _scalars(aux)
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
    return metrics, savetimes.read_save_times(path), problem


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
      column of such a row means no value was recorded); then one float column
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

    directory, listing = _listing.run_listing(root)
    errors: dict[str, str] = dict(listing.attrs.get("errors", {}))
    # Read through the run's listing: nothing is listed again, and on an object store
    # the files read are fetched side by side first.
    complete = [
        (i, _paths.listed_in(directory, name, p))
        for i, (name, p, s) in enumerate(
            zip(listing["name"], listing["path"], listing["status"], strict=True)
        )
        if s == words.COMPLETE
    ]
    if directory.storage.parallel_reads:
        directory.storage.prefetch(
            [path for _, where in complete for path in _fact_files(where, auxiliary)],
            files.MAX_METADATA_BYTES,
        )
    facts: dict[int, tuple[dict[str, float], savetimes.SaveTimes | None, str | None]] = {}
    if complete:
        with concurrent.futures.ThreadPoolExecutor(min(_THREADS, len(complete))) as pool:
            futures = {i: pool.submit(_checkpoint_facts, where, auxiliary) for i, where in complete}
            facts = {i: future.result() for i, future in futures.items()}
    metric_names = sorted({name for m, _, _ in facts.values() for name in m})
    table = listing[["name", "path", "step", "status", "nbytes", "committed"]].copy()
    for column in _tiers.TIER_COLUMNS:
        if column in listing.columns:
            table[column] = listing[column]
    kept = retention_table(directory)
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
