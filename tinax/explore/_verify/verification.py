"""Whether a checkpoint is whole and loadable: findings, and a verdict.

``verify`` runs a list of checks. Each looks at the checkpoint's structure (commit
state, metadata, array stores, iterator files) and, when data is read, may follow
every leaf's values region by region. The checks below are the defaults; another
check plugs in by subclassing ``Check`` and passing it in ``checks``.

This module is the facade: the result type and the driver. The checks live beside
it (``structure``: commit, safety, preflight, checkpointables, iterators;
``pytree``: metadata against the array store; ``integrity``: checksums;
``data``: the data pass and NaN/Inf counts), their shared types in ``checks``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from tinax import _paths
from tinax._format.callbacks import Progress
from tinax._format.integrity import health
from tinax._format.metadata import arrays, logged
from tinax._format.metadata.layout import Checkpoint
from tinax._format.naming import names, words
from tinax._format.records import runrecord
from tinax._format.storage import files
from tinax._format.storage.location import Location
from tinax.explore._leaf_rows import frame
from tinax.explore._verify.array_store import PyTreeCheck
from tinax.explore._verify.checks import (
    Check,
    Finding,
    LeafScan,
    StoredArray,
    VerifyTarget,
)
from tinax.explore._verify.data import NonFiniteCheck, read_data
from tinax.explore._verify.integrity import ChecksumCheck
from tinax.explore._verify.structure import (
    CheckpointablesCheck,
    CommitCheck,
    IteratorCheck,
    PreflightCheck,
    SafetyCheck,
)

__all__ = [
    "DEFAULT_CHECKS",
    "FINDING_COLUMNS",
    "LEAF_COLUMNS",
    "Check",
    "CheckpointablesCheck",
    "CommitCheck",
    "Finding",
    "IteratorCheck",
    "LeafScan",
    "NonFiniteCheck",
    "PreflightCheck",
    "PyTreeCheck",
    "SafetyCheck",
    "StoredArray",
    "Verification",
    "VerifyTarget",
    "verify",
]

FINDING_COLUMNS = ("part", "severity", "message")
LEAF_COLUMNS = ("checkpointable", "key", "dtype", "nbytes", "nan_count", "inf_count", "read")


def _message(error: BaseException) -> str:
    return arrays.message(error) if isinstance(error, ValueError) else f"{error}"


DEFAULT_CHECKS: tuple[type[Check], ...] = (
    CommitCheck,
    SafetyCheck,
    PreflightCheck,
    CheckpointablesCheck,
    PyTreeCheck,
    IteratorCheck,
    ChecksumCheck,
    NonFiniteCheck,
)


# -- the result --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Verification:
    """What ``verify`` found, and its verdict.

    Attributes:
      path: The checkpoint verified.
      ok: Whether the checkpoint is sound: no finding is an ``error`` and (with
        data read) its model and optimizer state hold no NaN or Inf (``status``).
      findings: One row per finding: ``part``, ``severity``, ``message``; errors
        first.
      leaves: With data read, one row per array leaf: ``checkpointable``, ``key``,
        ``dtype``, ``nbytes``, ``nan_count``, ``inf_count`` and ``read``
        (whether every region decoded); empty otherwise.
      data: Whether array data was read.
      health: Whether a run can go on from it (``tinax._format.integrity.health.Health``):
        ``healthy``, ``diverged`` or ``not yet known``, and why, with the NaN and
        Inf counts where data was read. Without data, what its logged metrics and
        its run's record say.
    """

    path: str
    ok: bool
    findings: pd.DataFrame
    leaves: pd.DataFrame
    data: bool
    health: health.Health = dataclasses.field(default_factory=lambda: health.judge(metrics=None))

    @property
    def errors(self) -> pd.DataFrame:
        """The findings that are errors."""
        return self.findings[self.findings["severity"] == words.ERROR].reset_index(drop=True)

    @property
    def nonfinite_leaves(self) -> pd.DataFrame:
        """The leaves (rows of ``leaves``) holding NaN or Inf; empty without data."""
        if self.leaves.empty:
            return self.leaves
        nan = self.leaves["nan_count"].fillna(0)
        inf = self.leaves["inf_count"].fillna(0)
        return self.leaves[(nan > 0) | (inf > 0)].reset_index(drop=True)

    @property
    def unread_leaves(self) -> pd.DataFrame:
        """The leaves (rows of ``leaves``) whose data could not all be read: counted
        apart from NaN and Inf, which are values that were read."""
        if self.leaves.empty:
            return self.leaves
        return self.leaves[~self.leaves["read"].fillna(False).astype(bool)].reset_index(drop=True)

    @property
    def diverged(self) -> bool:
        """Whether its health is ``diverged``: its model or optimizer state (data
        read) holds NaN or Inf, or a metric it logged is NaN or infinite."""
        return self.health.verdict == words.DIVERGED

    @property
    def integrity(self) -> str:
        """``sound`` or ``damaged`` (an error finding; ``incomplete`` for a save that
        has not committed), as ``tinax.vocabulary`` spells them."""
        if not (self.findings["severity"] == words.ERROR).any():
            return words.SOUND
        name = os.path.basename(self.path.rstrip("/"))
        return words.INCOMPLETE if names.is_temporary_name(name) else words.DAMAGED

    @property
    def status(self) -> str:
        """``sound``, ``diverged`` (it loads, but its state or a logged metric holds NaN
        or Inf) or ``not sound`` (an error finding), as ``tinax.vocabulary`` spells
        them."""
        if (self.findings["severity"] == words.ERROR).any():
            return words.NOT_SOUND
        return words.DIVERGED if self.diverged else words.SOUND

    @property
    def verdict(self) -> str:
        """One line: ``sound``, ``diverged`` or ``not sound``, and why."""
        counts = self.findings["severity"].value_counts()
        errors, warnings = int(counts.get(words.ERROR, 0)), int(counts.get(words.WARNING, 0))
        scope = "metadata and data" if self.data else "metadata"
        status = self.status
        if status == words.SOUND:
            extra = f", {warnings} warning{'s' * (warnings != 1)}" if warnings else ""
            if self.health.verdict == words.HEALTHY:
                return f"sound and healthy ({scope} checked{extra})"
            return f"sound ({scope} checked{extra}), health {self.health.verdict}"
        if status == words.DIVERGED:
            return f"diverged: {self.health.reason} ({scope} checked; it loads)"
        first = self.errors.iloc[0]
        where = f"{first['part']}: " if first["part"] else ""
        more = f" (and {errors - 1} more)" if errors > 1 else ""
        return f"not sound: {errors} error{'s' * (errors != 1)}; {where}{first['message']}{more}"

    def __str__(self) -> str:
        return f"{self.path}: {self.verdict}"


_ORDER = {words.ERROR: 0, words.WARNING: 1, words.INFO: 2}


def verify(
    path: str | os.PathLike[str] | Checkpoint | Location,
    *,
    data: bool = False,
    progress: Progress | None = None,
    checks: Sequence[Check] | None = None,
) -> Verification:
    """Checks that a checkpoint is whole and loadable, and says what is wrong if not.

    Without ``data``, metadata only: the commit state (not a temporary
    directory, ``_CHECKPOINT_METADATA`` readable, commit marker, no deletion in
    progress), nothing that leads out of the checkpoint, the checkpointables
    recorded against those present, each pytree's ``_METADATA``, strings and
    shardings, every array's zarr metadata in its store (a known dtype, a shape
    that holds what each process recorded writing, scalars 0-d), the array
    store's manifest and B+tree, every data file it refers to present and long
    enough, every chunk there, and every Grain iterator file present for the
    process count in their names and valid JSON, and the checksums tinax records
    with a save readable, covering every array, and matching the files recorded
    whole (Grain iterator states). With ``data``, every chunk of
    every array is also read and decoded, region by region (at most
    ``chunks.IN_FLIGHT_BYTES`` of decoded regions in flight: well under 128 MiB
    of resident memory whatever the checkpoint's size, unless single stored
    chunks are larger), checked against its recorded checksums (so a flipped
    byte anywhere in array data is found and the leaf named), and NaN and
    infinite values are counted.

    A damaged checkpoint gives findings, never an exception.

    Args:
      path: A checkpoint directory (an Orbax temporary directory is reported as
        not committed), or a checkpoint ``open_checkpoint`` opened.
      data: Also read and decode every array's data.
      progress: Called as ``progress(bytes_done, bytes_total)`` while data is read
        (decoded bytes).
      checks: The checks to run, in order; by default a fresh instance of each of
        ``DEFAULT_CHECKS``. Pass ``[*(c() for c in DEFAULT_CHECKS), MyCheck()]``
        to add one.

    NaN and Inf are warnings (the checkpoint loads), but a checkpoint whose model or
    optimizer state holds them is never called sound: its ``status`` is
    ``diverged`` and ``ok`` is false. NaN in the auxiliary state alone (a metric)
    stays a warning. Leaves whose data could not be read are errors, apart from
    NaN and Inf (``unread_leaves``, ``nonfinite_leaves``).

    Returns:
      A ``Verification``: ``ok``, ``status`` (``sound``, ``diverged``, ``not
      sound``), ``verdict``, ``findings`` and, with data, ``leaves``.

    Raises:
      TypeError: If an argument has the wrong type.
      FileNotFoundError: If nothing exists at ``path``.
    """
    if not isinstance(data, bool):
        raise TypeError(f"data must be a bool, got {type(data).__name__}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable, got {type(progress).__name__}")
    if isinstance(path, Checkpoint):
        where = path.path
    elif isinstance(path, Location):
        where = path  # within a run's listing (``scan_run``): listed already
    else:
        where = _paths.location(path)
        # Listed once (one request per thousand objects on a bucket): every check
        # looks at the same listing, and the metadata files it reads are kept.
        listed = where.snapshot()
        if listed.is_dir():
            where = listed
        elif not where.exists():
            raise FileNotFoundError(f"path {str(where)!r} does not exist")
    active = [c() for c in DEFAULT_CHECKS] if checks is None else list(checks)
    for check in active:
        if not isinstance(check, Check):
            raise TypeError(f"checks must be Check instances, got {type(check).__name__}")
    target = VerifyTarget(where, data)
    if isinstance(path, Checkpoint):
        # Opened (and checked) already: its walk and what it has read serve every check.
        target.listing = {**path.scan.listing(), where.path: path.entries(where)}
        target.scan, target.record, target.checkpoint = path.scan, path.record, path
        target.ctx = arrays.context_of(path)
    elif where.is_dir():
        # Listed once, whatever is there: every check looks at this listing.
        target.listing = files.walk(where)
        with contextlib.suppress(ValueError):
            target.scan = files.scan(where, listed=target.listing)
    found: list[Finding] = []
    leaves: list[tuple[Any, ...]] = []
    if not where.is_dir():
        found.append(Finding("", words.ERROR, "not a directory"))
    else:
        for check in active:
            found.extend(_guarded(_structure(check, target), type(check).__name__))
        if data:
            try:
                found.extend(_guarded(lambda: read_data(target, active, progress, leaves), "data"))
            finally:
                target.files.close()
        if target.refused is not None and not any(f.severity == words.ERROR for f in found):
            found.append(Finding("", words.ERROR, f"a load refuses it: {target.refused}"))
    found.sort(key=lambda f: _ORDER.get(f.severity, 3))
    findings = frame(FINDING_COLUMNS, (dataclasses.astuple(f) for f in found))
    table = frame(LEAF_COLUMNS, leaves)
    judged = _health(target, where, table if data else None)
    result = Verification(str(where), False, findings, table, data, judged)
    return dataclasses.replace(result, ok=result.status == words.SOUND)


def _health(target: VerifyTarget, where: Location, leaves: pd.DataFrame | None) -> health.Health:
    """The checkpoint's health: from the leaves read (remembered for the views that
    come next), else from what its metadata and its run's record say."""
    record = target.record
    metrics = logged.logged(record)
    committed = None if record is None else record.committed_nsecs
    if leaves is None:
        own = logged.own_health(record)
        return health.known(where, committed, metrics, runrecord.recorded_health(where), own)
    counted = [
        health.LeafCount(
            str(row.checkpointable),
            str(row.key),
            0 if pd.isna(row.nan_count) else int(row.nan_count),
            0 if pd.isna(row.inf_count) else int(row.inf_count),
        )
        for row in leaves.itertuples(index=False)
        if row.read
    ]
    unread = (
        len(counted) < len(leaves)
        or not target.trees
        or any(state.tree is None or not state.readable for state in target.trees.values())
    )
    read = [name for name, state in target.trees.items() if state.tree is not None]
    judged = health.judge(
        metrics=metrics,
        counts=health.counts_of(counted, read),
        leaves=counted,
        complete=not unread,
    )
    health.remember(where, committed, judged)
    return judged


def _structure(check: Check, target: VerifyTarget) -> Callable[[], list[Finding]]:
    return lambda: list(check.structure(target))


def _guarded(run: Callable[[], list[Finding]], name: str) -> list[Finding]:
    """A check's findings; a check that fails reports that, and the others still run."""
    try:
        return run()
    except Exception as e:  # A damaged checkpoint must give findings, never a traceback.
        return [Finding("", words.ERROR, f"{name} failed: {type(e).__name__}: {_message(e)}")]
