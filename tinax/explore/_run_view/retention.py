"""What a training run keeps and why, from the record ``TrainingRun`` writes at its root."""

from __future__ import annotations

import os
from typing import Any

import pandas as pd

from tinax import _paths
from tinax._format import names
from tinax._format.runrecord import read_run_record
from tinax._format.storage import Location

RETENTION_COLUMNS = ("name", "step", "kept", "metric")


def run_policy(root: str | os.PathLike[str] | Location) -> dict[str, Any] | None:
    """The policy of the training run at ``root``, as ``TrainingRun`` recorded it.

    Args:
      root: A run directory (local or ``gs://``).

    Returns:
      ``save_every``, ``keep``, ``keep_best``, ``best_by`` (the metric's name) and
      ``best_mode``; ``None`` if ``root`` holds no run record (a run not written by
      ``TrainingRun``, or a single checkpoint).

    Raises:
      TypeError: If ``root`` is not a path.
      FileNotFoundError: If ``root`` does not exist.
      ValueError: If ``root`` is not a directory.
    """
    record = read_run_record(_paths.listed_directory(root))
    if record is None or not isinstance(record.get("policy"), dict):
        return None
    return dict(record["policy"])


def retention_table(root: str | os.PathLike[str] | Location) -> pd.DataFrame:
    """Why the training run at ``root`` keeps each of its checkpoints.

    One row per checkpoint the run's record keeps, as of the run's last
    retention: ``name``, ``step`` (``Int64``), ``kept`` (the reasons, such as
    ``"newest 2"`` or ``"best loss"``, joined by ``", "``) and ``metric`` (the
    value of ``best_by`` saved with it, where the run has one). Joins
    ``list_checkpoints(root)`` on ``name``; a checkpoint the record does not
    mention has no row. Empty if ``root`` holds no run record.

    Raises:
      TypeError: If ``root`` is not a path.
      FileNotFoundError: If ``root`` does not exist.
      ValueError: If ``root`` is not a directory.
    """
    record = read_run_record(_paths.listed_directory(root))
    kept = {} if record is None else record.get("kept")
    metrics = {} if record is None else record.get("metrics")
    kept = kept if isinstance(kept, dict) else {}
    metrics = metrics if isinstance(metrics, dict) else {}
    rows = []
    for key, reasons in kept.items():
        if not (isinstance(key, str) and key.isdigit()) or not isinstance(reasons, list):
            continue
        step = int(key)
        metric = metrics.get(key)
        rows.append(
            (
                names.run_checkpoint_name(step),
                step,
                ", ".join(str(reason) for reason in reasons),
                float(metric) if isinstance(metric, int | float) else None,
            )
        )
    rows.sort(key=lambda row: row[1])
    dtypes = ("string", "Int64", "string", "Float64")
    cells = list(zip(*rows, strict=True)) if rows else [() for _ in RETENTION_COLUMNS]
    return pd.DataFrame(
        {
            name: pd.array(list(cells[i]), dtype=dtypes[i])
            for i, name in enumerate(RETENTION_COLUMNS)
        }
    )
