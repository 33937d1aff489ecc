"""A checkpoint's integrity and health as table columns, and as one value.

The verdict itself is ``tinax._format.integrity.health``'s, decided there once; this module
puts it into the tables (``list_checkpoints``, ``run_table``, ``scan_run``) under the
same column names everywhere, and gives it for one checkpoint
(``checkpoint_health``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from tinax import _paths
from tinax._format.integrity import health
from tinax._format.integrity.health import Health
from tinax._format.metadata import layout, logged
from tinax._format.naming import names, words
from tinax._format.records import runrecord
from tinax._format.storage.location import Location

# The columns every table of checkpoints gives the verdict in.
HEALTH_COLUMNS = ("integrity", "health", "health_reason", "nan", "inf")
# The listing's ``attrs`` member holding each row's ``Health``, by path.
HEALTHS = "health"


def columns(healths: Sequence[Health], integrities: Sequence[str]) -> dict[str, Any]:
    """``HEALTH_COLUMNS`` for rows of these verdicts, typed as every table types them."""
    import pandas as pd

    return {
        "integrity": pd.array(list(integrities), dtype="string"),
        "health": pd.array([h.verdict for h in healths], dtype="string"),
        "health_reason": pd.array([h.reason for h in healths], dtype="string"),
        "nan": pd.array([h.nan for h in healths], dtype="Int64"),
        "inf": pd.array([h.inf for h in healths], dtype="Int64"),
    }


def row_health(
    path: str,
    step: int | None,
    status: str,
    committed_ns: int | None,
    metrics: Mapping[str, float] | None,
    record: dict[str, Any] | None,
    own: object = None,
) -> Health:
    """The health of one listed checkpoint: known for a complete one from its logged
    ``metrics``, what this process read of it, what its writer recorded in it
    (``own``) and what its run's ``record`` says."""
    if status not in (words.COMPLETE, words.ABANDONED):
        return health.judge()
    recorded = None if step is None else runrecord.recorded_health_of(record, step)
    return health.known(path, committed_ns, metrics, recorded, own)


def add_health(
    rows: list[dict[str, Any]],
    logged_metrics: Mapping[str, dict[str, float]],
    directory: Location,
    record: dict[str, Any] | None,
    own: Mapping[str, object] | None = None,
) -> dict[str, Health]:
    """Gives each listing row of ``directory`` its ``HEALTH_COLUMNS``
    (``logged_metrics``: each checkpoint's logged metrics, ``record``: the run's record
    as the listing read it, ``own``: the health its writer recorded in it, by path,
    where its commit record was read); returns each row's ``Health`` by path."""
    found: dict[str, Health] = {}
    for row in rows:
        path, step = str(row["path"]), row["step"]
        run = record
        if path == str(directory):
            # The listing of one checkpoint: its run's record is beside it.
            entry = runrecord.recorded_health(directory)
            run = None if step is None else {names.RUN_RECORD_HEALTH: {str(step): entry}}
        judged = row_health(
            path,
            step,
            str(row["status"]),
            row["committed"],
            logged_metrics.get(path),
            run,
            (own or {}).get(path),
        )
        row.update(
            integrity=health.integrity_of_status(str(row["status"])),
            health=judged.verdict,
            health_reason=judged.reason,
            nan=judged.nan,
            inf=judged.inf,
        )
        found[path] = judged
    return found


def checkpoint_health(
    path: str | os.PathLike[str] | layout.Checkpoint, *, data: bool = False
) -> Health:
    """Whether a run can go on from a checkpoint: ``healthy``, ``diverged`` or ``not yet
    known``, why, and the NaN and Inf counts where its data was read.

    Without ``data``, its metadata alone: the metrics its save logged (a NaN loss
    makes it diverged), what this process found when it read its data before
    (``verify(path, data=True)``, ``scan_run``, a load), and what its training run
    recorded when it did. With ``data``, every array is read (``verify(path,
    data=True)``) and NaN and Inf counted once per leaf.

    Args:
      path: A checkpoint directory (local or ``gs://``), or one ``open_checkpoint``
        opened.
      data: Read and count its data.

    Returns:
      A ``Health``: ``verdict``, ``reason``, ``source``, the non-finite logged
      ``metrics``, and ``counts`` by checkpointable, ``nan``, ``inf`` and
      ``nonfinite_leaves`` (``None`` where no data was read).

    Raises:
      TypeError: If ``path`` is not a path or ``data`` not a bool.
      FileNotFoundError: If nothing exists at ``path``.
      ValueError: If its commit record cannot be read.
    """
    if not isinstance(data, bool):
        raise TypeError(f"data must be a bool, got {type(data).__name__}")
    if data:
        from tinax.explore._verify.verification import verify

        return verify(path, data=True).health
    if isinstance(path, layout.Checkpoint):
        where = path.path
        committed, metrics, own = (
            path.committed_nsecs,
            logged.logged(path.record),
            logged.own_health(path.record),
        )
    else:
        where = _paths.location(path)
        if not where.exists():
            raise FileNotFoundError(f"path {str(where)!r} does not exist")
        record = layout.read_checkpoint_record(where)
        committed, metrics, own = (
            record.committed_nsecs,
            logged.logged(record),
            logged.own_health(record),
        )
    return health.known(where, committed, metrics, runrecord.recorded_health(where), own)
