"""Every checkpoint of a run read whole: where NaN or Inf appeared first, and where to
roll back to.

Each complete checkpoint is checked by ``verify(data=True)`` (every array read raw and
checked against its checksums, NaN and Inf counted), once: what a scan found is kept
in memory, keyed by the checkpoint's path, commit time and size, so a checkpoint
already scanned is not read again.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pandas as pd

from tinax._format import callbacks
from tinax._format.callbacks import Cancel, Progress
from tinax._format.integrity import health
from tinax._format.lru import LruCache
from tinax._format.metadata.layout import Checkpoint
from tinax._format.naming import words
from tinax._format.storage.location import Location
from tinax.explore import _health, _listing
from tinax.explore._verify.verification import verify

SCAN_COLUMNS = ("name", "path", "step", "status", "nan", "inf", "nonfinite_leaves", "verdict")
# A checkpoint's verdict (``words.SCAN_VERDICTS``).
FINITE = words.FINITE
NONFINITE = words.NONFINITE
DIVERGED = words.DIVERGED
NOT_SOUND = words.NOT_SOUND
NOT_COMPLETE = words.NOT_COMPLETE
NOT_SCANNED = words.NOT_SCANNED
_KEEP = 4096


@dataclasses.dataclass(frozen=True)
class _Scanned:
    nan: int
    inf: int
    status: str  # verify's: sound, diverged or not sound
    verdict: str  # verify's line
    leaves: tuple[tuple[str, str, int, int], ...]  # (checkpointable, key, nan, inf) non-finite
    health: health.Health
    integrity: str


# What the scan of each checkpoint found, kept by the process: the result of reading all
# of its data, not metadata. Why: the run timeline and the explorer scan a run again when
# it is refreshed, and only its new checkpoints need reading; nothing else keeps them.
# Keyed by the checkpoint's path, commit time and size (a committed checkpoint does not
# change; one written again at the same path commits anew); bounded by ``_KEEP``
# checkpoints (a few hundred bytes each), the least recently used going first.
_scanned: LruCache[tuple[str, str, int], _Scanned] = LruCache(_KEEP)


def _scan(path: str | Location | Checkpoint) -> _Scanned:
    found = verify(path, data=True)
    table = found.leaves
    nan = inf = 0
    leaves = []
    if len(table):
        for row in table.itertuples(index=False):
            n = 0 if pd.isna(row.nan_count) else int(row.nan_count)
            i = 0 if pd.isna(row.inf_count) else int(row.inf_count)
            nan, inf = nan + n, inf + i
            if n or i:
                leaves.append((str(row.checkpointable), str(row.key), n, i))
    return _Scanned(
        nan, inf, found.status, found.verdict, tuple(leaves), found.health, found.integrity
    )


def _cached_scan(row: Any, run: _listing.RunListing) -> _Scanned:
    identity = (str(row["path"]), str(row["committed"]), int(row["nbytes"]))
    return _scanned.get_or_compute(identity, lambda: _scan(_opened(row, run)))


def _opened(row: Any, run: _listing.RunListing) -> Checkpoint | Location:
    """A checkpoint of the run, opened from what the listing read of it; where it does not
    open, its place (``verify`` then says what is wrong, in findings)."""
    try:
        return run.open(row)
    except (ValueError, OSError):
        return run.where(row)


def scanned_checkpoints() -> int:
    """How many checkpoints' scans this process keeps."""
    return len(_scanned)


def scan_run(
    root: str | os.PathLike[str],
    *,
    leaves: bool = False,
    progress: Progress | None = None,
    cancel: Cancel | None = None,
) -> pd.DataFrame:
    """NaN and Inf in every checkpoint of a run; the first non-finite step and the
    step to roll back to.

    Every complete checkpoint is verified with its data (``verify(path,
    data=True)``: every array read, checked against its checksums, NaN and Inf
    counted). Checkpoints already scanned by this process, unchanged since, are not
    read again.

    Args:
      root: A run directory (local or ``gs://``), or one checkpoint.
      leaves: Also give, in ``attrs["leaves"]``, one row per leaf holding NaN or Inf:
        ``name``, ``step``, ``checkpointable``, ``key``, ``nan``, ``inf``.
      progress: Called as ``progress(checkpoints_done, checkpoints_total)``.
      cancel: A ``threading.Event`` or a callable; once set (or returning true), no
        further checkpoint is read: the rest are ``not scanned`` and
        ``attrs["cancelled"]`` is true.

    Returns:
      A DataFrame in ``list_checkpoints`` order: ``name``, ``path``, ``step``,
      ``status``, ``nan`` and ``inf`` (counts over every array; ``<NA>`` where not
      read), ``nonfinite_leaves`` and ``verdict`` (``tinax.vocabulary``'s
      ``SCAN_VERDICTS``): ``finite``; ``diverged`` (it loads, but its model or
      optimizer state holds NaN or Inf: ``verify``'s status); ``non-finite``
      (NaN or Inf only in the auxiliary state: a metric); ``not sound`` (``verify`` found an error:
      its line is in ``attrs["problems"]``, by path); ``not complete`` (in
      progress, interrupted, invalid: never loadable); ``not scanned``. Then
      ``integrity``, ``health`` and ``health_reason`` as every table gives them
      (``tinax._format.integrity.health``; a checkpoint not scanned keeps what its metadata
      says, a NaN only in a logged metric makes it ``diverged`` too).
      ``attrs["first_nonfinite_step"]``: the step of the first checkpoint holding
      NaN or Inf (``None`` if none does); ``attrs["rollback_step"]``: the newest
      complete, sound and finite checkpoint before it (``None`` if there is no
      non-finite checkpoint, or no good one before it); ``attrs["health"]``: the
      ``Health`` of each checkpoint read, by path (its NaN and Inf by checkpointable).

    Raises:
      TypeError: If ``leaves`` is not a bool.
      FileNotFoundError: If ``root`` does not exist.
      ValueError: If ``root`` is not a directory.
    """
    if not isinstance(leaves, bool):
        raise TypeError(f"leaves must be a bool, got {type(leaves).__name__}")
    # Listed once: each checkpoint is verified through the run's listing.
    run = _listing.run_listing(root)
    listing = run.table
    rows = [row for _, row in listing.iterrows()]
    todo = [i for i, row in enumerate(rows) if row["status"] == words.COMPLETE]
    results: dict[int, _Scanned] = {}
    cancelled = False
    for done, index in enumerate(todo):
        if callbacks.cancelled(cancel):
            cancelled = True
            break
        row = rows[index]
        results[index] = _cached_scan(row, run)
        if progress is not None:
            progress(done + 1, len(todo))
    verdicts, problems = [], {}
    for i, row in enumerate(rows):
        found = results.get(i)
        if row["status"] != words.COMPLETE:
            verdicts.append(NOT_COMPLETE)
        elif found is None:
            verdicts.append(NOT_SCANNED)
        elif found.status == words.NOT_SOUND:
            verdicts.append(NOT_SOUND)
            problems[str(row["path"])] = found.verdict
        elif found.status == words.DIVERGED:
            verdicts.append(DIVERGED)
        else:
            verdicts.append(NONFINITE if found.nan or found.inf else FINITE)
    table = listing[["name", "path", "step", "status"]].copy()
    for column, pick in (
        ("nan", lambda s: s.nan),
        ("inf", lambda s: s.inf),
        ("nonfinite_leaves", lambda s: len(s.leaves)),
    ):
        table[column] = pd.array(
            [pick(results[i]) if i in results else None for i in range(len(rows))],
            dtype="Int64",
        )
    table["verdict"] = pd.array(verdicts, dtype="string")
    # The verdict every view shows: what the scan read, else what the listing knew.
    scanned = _health.columns(
        [results[i].health if i in results else health.judge() for i in range(len(rows))],
        [results[i].integrity if i in results else "" for i in range(len(rows))],
    )
    for column in ("integrity", "health", "health_reason"):
        table[column] = pd.array(
            [scanned[column][i] if i in results else row[column] for i, row in enumerate(rows)],
            dtype="string",
        )
    first = None
    for i, row in enumerate(rows):
        found = results.get(i)
        if found is not None and (found.nan or found.inf) and not pd.isna(row["step"]):
            step = int(row["step"])
            first = step if first is None else min(first, step)
    rollback = None
    if first is not None:
        good = [
            int(row["step"])
            for i, row in enumerate(rows)
            if verdicts[i] == FINITE and not pd.isna(row["step"]) and int(row["step"]) < first
        ]
        rollback = max(good, default=None)
    attrs: dict[str, Any] = {
        "first_nonfinite_step": first,
        "rollback_step": rollback,
        "problems": problems,
        "cancelled": cancelled,
        # Each checkpoint read's ``Health``, by path: its counts by checkpointable.
        _health.HEALTHS: {str(rows[i]["path"]): found.health for i, found in results.items()},
    }
    if leaves:
        detail = [
            (str(rows[i]["name"]), rows[i]["step"], name, key, nan, inf)
            for i, found in sorted(results.items())
            for name, key, nan, inf in found.leaves
        ]
        columns = ("name", "step", "checkpointable", "key", "nan", "inf")
        dtypes = ("string", "Int64", "string", "string", "Int64", "Int64")
        cells = list(zip(*detail, strict=True)) if detail else [() for _ in columns]
        attrs["leaves"] = pd.DataFrame(
            {c: pd.array(list(cells[k]), dtype=dtypes[k]) for k, c in enumerate(columns)}
        )
    table.attrs = attrs
    return table
