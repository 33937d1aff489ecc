"""What a training run keeps and why, from the record ``TrainingRun`` writes at its root."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from tinax import _paths
from tinax._format.naming import names
from tinax._format.records import tiers
from tinax._format.records.runrecord import read_run_record
from tinax._format.storage.location import Location
from tinax.explore import _listing

if TYPE_CHECKING:
    import pandas as pd

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


def _reasons(
    record: dict[str, Any] | None, run: tiers.TwoTierRun | None
) -> list[tuple[str, int, str, float | None]]:
    """``retention_table``'s rows, from a run's record ``record`` (and, for a tier of the
    two-tier run ``run``, both tiers' records, the durable one's reasons first)."""
    records = [record] if run is None else [run.durable_record, run.local_record]
    reasons_by_step: dict[int, list[str]] = {}
    metric_by_step: dict[int, float] = {}
    for one in records:
        kept = {} if one is None else one.get("kept")
        metrics = {} if one is None else one.get("metrics")
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
    return rows


def retention_table(root: str | os.PathLike[str] | Location) -> pd.DataFrame:
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
    where = _paths.listed_directory(root)
    record = read_run_record(where)
    return kept_table(record, None if record is None else tiers.two_tier_run(where, record))


def kept_table(record: dict[str, Any] | None, run: tiers.TwoTierRun | None) -> pd.DataFrame:
    """``retention_table`` from a run's record read already (and the two-tier run it is a
    tier of, if any: ``_listing.RunListing`` holds both)."""
    import pandas as pd

    rows = _reasons(record, run)
    dtypes = ("string", "Int64", "string")
    cells = list(zip(*rows, strict=True)) if rows else [() for _ in RETENTION_COLUMNS]
    table = {
        name: pd.array(list(cells[i]), dtype=dtypes[i])
        for i, name in enumerate(RETENTION_COLUMNS[:-1])
    }
    return pd.DataFrame({**table, "metric": logged_floats(list(cells[-1]))})


def logged_floats(values: list[float | None]) -> pd.arrays.FloatingArray:
    """Metric values as a ``Float64`` column in which a NaN that was logged stays NaN
    and only a value not recorded (``None``) is ``<NA>``: pandas would take both for
    missing."""
    import numpy as np
    import pandas as pd

    numbers = np.array([math.nan if v is None else v for v in values], dtype=np.float64)
    return pd.arrays.FloatingArray(numbers, np.array([v is None for v in values], dtype=bool))


def run_listing(
    root: str | os.PathLike[str] | Location,
    *,
    cache: _listing.ListingCache | None = None,
    deep: bool | None = None,
) -> pd.DataFrame:
    """``list_checkpoints(root)`` with what a ``TrainingRun`` recorded of each checkpoint:
    the run is listed once, and its record read through that listing.

    Args:
      root: A run directory or a checkpoint (local or ``gs://``).
      cache, deep: As for ``list_checkpoints``.

    Returns:
      ``list_checkpoints``'s table with two more columns, ``metric`` (``Float64``:
      the ``best_by`` value saved with it, NaN where that was NaN, ``<NA>`` where
      none was recorded) and ``kept`` (``string``: why the run
      keeps it, as ``retention_table`` says; ``<NA>`` where the run has no record
      of it), and ``attrs["policy"]``: ``run_policy(root)`` (``None`` for a directory
      without a run record).

    Raises:
      TypeError: If ``root`` is not a path (as ``list_checkpoints``).
      FileNotFoundError: If ``root`` does not exist.
      ValueError: If ``root`` is not a directory.
    """
    import pandas as pd

    run = _listing.listed_run(_paths.listed_directory(root), cache, deep)
    table, record = run.table, run.record
    reasons = _reasons(record, run.tiers)
    by_name = {row[0]: row for row in reasons}
    names_ = [str(n) for n in table["name"]]
    joined = table.assign(
        metric=logged_floats([by_name[n][3] if n in by_name else None for n in names_]),
        kept=pd.array([by_name[n][2] if n in by_name else None for n in names_], "string"),
    )
    joined.attrs = dict(table.attrs)
    policy = None if record is None else record.get("policy")
    joined.attrs["policy"] = dict(policy) if isinstance(policy, dict) else None
    return joined
