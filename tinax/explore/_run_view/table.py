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
import json
import math
import os
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from tinax import _paths
from tinax._format import arrays, checksums, files, layout, names, pytree, savetimes, words
from tinax._format.storage import Location
from tinax.explore import _tiers
from tinax.explore._listing import list_checkpoints
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
)
# Column names a metric is not given (it is prefixed with its checkpointable instead).
_TAKEN = RUN_COLUMNS + _tiers.TIER_COLUMNS
# The checkpointable ``TrainingRun`` and ``save_training_checkpoint`` save auxiliary state
# in (``TrainingCheckpointNames().auxiliary``), and how they wrap it.
AUXILIARY = "auxiliary"
_WRAPPED = ("state", "step")
# Readers of a run's checkpoints at once (their files are small: latency bound).
_THREADS = 8


def _numeric(value: Any) -> float | None:
    """``value`` as a float when it is a real number (not a bool); else ``None``."""
    if isinstance(value, bool | np.bool_):
        return None
    if isinstance(value, int | float | np.integer | np.floating):
        return float(value)
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iuf":
        return float(value)
    return None


def _metric_name(path: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in path) or "(root)"


# -- a scalar decoded from the OCDBT manifest ------------------------------------------------


def _little_bytes_codec(codec: object) -> bool:
    if not isinstance(codec, dict) or codec.get("name") != "bytes":
        return False
    config = codec.get("configuration") or {}
    return isinstance(config, dict) and config.get("endian", "little") == "little"


def _inline_scalar(metadata: bytes, chunk: bytes | None) -> Any:
    """The value of a zarr3 scalar whose one chunk is stored inline; ``None`` when the
    array is not such a scalar (the caller then reads it through tensorstore)."""
    try:
        meta = json.loads(metadata)
    except (ValueError, RecursionError):
        return None
    if not isinstance(meta, dict) or meta.get("zarr_format") != 3 or meta.get("shape") != []:
        return None
    try:
        dtype = np.dtype(str(meta.get("data_type")))
    except TypeError:
        return None
    if dtype.kind not in "iufb":
        return None
    codecs = meta.get("codecs")
    if not isinstance(codecs, list) or len(codecs) != 1:
        return None
    codec = codecs[0]
    if chunk is None:
        fill = meta.get("fill_value")
        return dtype.type(fill) if isinstance(fill, int | float) else None
    if _little_bytes_codec(codec):
        data = chunk
    elif isinstance(codec, dict) and codec.get("name") == "sharding_indexed":
        config = codec.get("configuration") or {}
        inner, index = config.get("codecs"), config.get("index_codecs")
        if not (
            isinstance(inner, list)
            and len(inner) == 1
            and _little_bytes_codec(inner[0])
            and isinstance(index, list)
            and len(index) == 2
            and _little_bytes_codec(index[0])
            and index[1] == {"name": "crc32c"}
            and config.get("index_location", "end") == "end"
            and len(chunk) >= 20
        ):
            return None
        offset, nbytes = struct.unpack("<QQ", chunk[-20:-4])
        if offset == nbytes == 2**64 - 1:
            fill = meta.get("fill_value")
            return dtype.type(fill) if isinstance(fill, int | float) else None
        if offset + nbytes > len(chunk) - 20:
            return None
        data = chunk[offset : offset + nbytes]
    else:
        return None
    if len(data) != dtype.itemsize:
        return None
    return np.frombuffer(data, dtype=dtype)[0]


def _scalars(directory: Location) -> dict[tuple[Any, ...], Any]:
    """The scalar leaves of a pytree checkpointable, by key path: from the manifest where
    they are inline (checked against their checksums), else through tensorstore."""
    tree = pytree.read_layout(directory)
    scalars = [leaf for leaf in tree.leaves if leaf.kind == words.SCALAR and leaf.stored]
    if not scalars:
        return {}
    found: dict[tuple[Any, ...], Any] = {}
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
            value = _inline_scalar(metadata, chunk)
            if value is None:
                continue
            record = None if records is None else records.get(leaf.key)
            if record is not None and checksums.check_value(record, value) is False:
                raise ValueError(
                    f"{str(directory)!r}: leaf {leaf.key}: the stored value does not match "
                    "its checksum"
                )
            found[leaf.path] = value
    if len(found) < len(scalars):
        from tinax.explore import _checkpoint

        rows = _checkpoint.pytree_leaves(directory.name, tree, arrays.context(), values=True)
        for leaf, row in zip(tree.leaves, rows, strict=True):
            if leaf.kind == words.SCALAR and leaf.path not in found:
                found[leaf.path] = row.value
    return found


# -- one checkpoint --------------------------------------------------------------------------


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
                number = _numeric(value)
                if isinstance(key, str) and number is not None:
                    metrics[key] = number
    except (ValueError, OSError) as e:
        problem = str(e)
    # Orbax's MetricsHandler (V1 ``training.Checkpointer``, V0 ``CheckpointManager``)
    # writes them as a checkpointable of their own: ``metrics/metrics``.
    metrics_file = path / names.METRICS / names.METRICS
    if metrics_file.is_file():
        try:
            recorded = files.read_json_object(metrics_file, what="Orbax metrics")
            for key, value in recorded.items():
                number = _numeric(value)
                if number is not None:
                    metrics.setdefault(key, number)
        except (ValueError, OSError) as e:
            problem = str(e)
    aux = path / auxiliary
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
                number = _numeric(value)
                if number is not None:
                    metrics.setdefault(_metric_name(key_path), number)
    except (ValueError, OSError, KeyError, TypeError) as e:
        problem = f"{auxiliary}: {e}"
    return metrics, savetimes.read_save_times(path), problem


def run_table(root: str | os.PathLike[str], *, auxiliary: str = AUXILIARY) -> pd.DataFrame:
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
      run, ``tier`` and ``promotion`` as ``list_checkpoints`` gives them; then one float
      column per metric (NaN where a checkpoint has none), sorted by name: each numeric scalar of the ``auxiliary``
      checkpointable (dotted key paths, such as ``loss``; a training checkpoint's
      own ``step`` left out) and each number in Orbax's recorded ``metrics``.
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

    listing = list_checkpoints(root, deep=False)
    errors: dict[str, str] = dict(listing.attrs.get("errors", {}))
    complete = [
        (i, _paths.location(str(p)))
        for i, (p, s) in enumerate(zip(listing["path"], listing["status"], strict=True))
        if s == words.COMPLETE
    ]
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
    kept = retention_table(root)
    by_name = dict(zip(kept["name"], kept["kept"], strict=True))
    table["kept"] = pd.array([by_name.get(n) for n in table["name"]], dtype="string")
    for column, pick in (("save_blocked_s", 0), ("save_total_s", 1)):
        values = []
        for i in range(len(table)):
            times = facts.get(i, ({}, None, None))[1]
            values.append(None if times is None else times[pick])
        table[column] = np.array([math.nan if v is None else v for v in values], dtype=float)
    for name in metric_names:
        column = name if name not in _TAKEN else f"{auxiliary}.{name}"
        values = [facts.get(i, ({}, None, None))[0].get(name) for i in range(len(table))]
        table[column] = np.array([math.nan if v is None else v for v in values], dtype=float)
    for i, (_, _, problem) in facts.items():
        if problem is not None:
            errors[str(table["path"].iloc[i])] = problem
    table.attrs = {
        "metrics": [n if n not in _TAKEN else f"{auxiliary}.{n}" for n in metric_names],
        "errors": errors,
        "unchecked": listing.attrs.get("unchecked", []),
    }
    return table
