"""What a training run keeps and why, from the record ``TrainingRun`` writes at its root."""

from __future__ import annotations

import os
from typing import Any

import pandas as pd

from tinax import _paths
from tinax._format import names, tiers
from tinax._format.runrecord import read_run_record

RETENTION_COLUMNS = ("name", "step", "kept", "metric")


def run_policy(root: str | os.PathLike[str]) -> dict[str, Any] | None:
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
    record = read_run_record(_paths.existing_directory(root))
    if record is None or not isinstance(record.get("policy"), dict):
        return None
    return dict(record["policy"])


def retention_table(root: str | os.PathLike[str]) -> pd.DataFrame:
    """Why the training run at ``root`` keeps each of its checkpoints.

    One row per checkpoint the run's record keeps, as of the run's last
    retention: ``name``, ``step`` (``Int64``), ``kept`` (the reasons, such as
    ``"newest 2"`` or ``"best loss"``, joined by ``", "``) and ``metric`` (the
    value of ``best_by`` saved with it, where the run has one). Joins
    ``list_checkpoints(root)`` on ``name``; a checkpoint the record does not
    mention has no row. Empty if ``root`` holds no run record. For a two-tier run
    (either of its directories), the reasons of both tiers' records (``"newest 2
    local"``, ``"waiting for promotion"`` for the local tier's).

    Raises:
      TypeError: If ``root`` is not a path.
      FileNotFoundError: If ``root`` does not exist.
      ValueError: If ``root`` is not a directory.
    """
    where = _paths.existing_directory(root)
    record = read_run_record(where)
    run = None if record is None else tiers.two_tier_run(where, record)
    # A two-tier run keeps a record in each tier: the durable one's reasons come first.
    records = [record] if run is None else [run.durable_record, run.local_record]
    reasons_by_step: dict[int, list[str]] = {}
    metric_by_step: dict[int, float] = {}
    for record in records:
        kept = {} if record is None else record.get("kept")
        metrics = {} if record is None else record.get("metrics")
        kept = kept if isinstance(kept, dict) else {}
        metrics = metrics if isinstance(metrics, dict) else {}
        for key, reasons in kept.items():
            if not (isinstance(key, str) and key.isdigit()) or not isinstance(reasons, list):
                continue
            step = int(key)
            listed = reasons_by_step.setdefault(step, [])
            listed.extend(str(r) for r in reasons if str(r) not in listed)
            metric = metrics.get(key)
            if isinstance(metric, int | float) and not isinstance(metric, bool):
                metric_by_step.setdefault(step, float(metric))
    rows = [
        (
            names.run_checkpoint_name(step),
            step,
            ", ".join(reasons),
            metric_by_step.get(step),
        )
        for step, reasons in reasons_by_step.items()
    ]
    rows.sort(key=lambda row: row[1])
    dtypes = ("string", "Int64", "string", "Float64")
    cells = list(zip(*rows, strict=True)) if rows else [() for _ in RETENTION_COLUMNS]
    return pd.DataFrame(
        {
            name: pd.array(list(cells[i]), dtype=dtypes[i])
            for i, name in enumerate(RETENTION_COLUMNS)
        }
    )
