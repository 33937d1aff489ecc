"""Derived and averaged checkpoints are not made from a diverged source unawares.

A source known to have diverged before a byte is read (a metric its save logged is
NaN or infinite, or what this process or its run read of it found NaN or Inf) is
refused at once; every other one has the NaN and Inf of every value read counted as
it streams (``tinax._format.arraydata.nonfinite``), and the new checkpoint is
refused before it commits if one turns out diverged, naming the leaves. With
``allow_diverged`` the checkpoint is made all the same. Either way its lineage
records each source's verdict, and the new checkpoint carries its own health (every
value it holds was read) in its commit record, where every view reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tinax._format.arraydata import nonfinite
from tinax._format.integrity import health
from tinax._format.metadata import logged
from tinax._format.naming import names, words
from tinax._format.naming.keys import parse_key
from tinax._format.records import runrecord
from tinax._format.writing import treeplan
from tinax.checkpointing._nonfinite import DivergedCheckpointError, LoadCounts
from tinax.checkpointing._surgery import ArrayJob, Count, OpenedSource

# At most this many leaves are named in a refusal.
_NAMED = 8


def check_argument(allow_diverged: object) -> bool:
    """Raises ``TypeError`` unless ``allow_diverged`` is a bool."""
    if not isinstance(allow_diverged, bool):
        raise TypeError(f"allow_diverged must be a bool, got {type(allow_diverged).__name__}")
    return allow_diverged


def known(
    source: OpenedSource, records: dict[str, dict[str, Any] | None] | None = None
) -> health.Health:
    """What is known of a source's health before it is read (``records``: the run
    records read so far, by run directory, so that sources of one run read it once)."""
    checkpoint = source.checkpoint
    return health.known(
        checkpoint.path,
        checkpoint.committed_nsecs,
        logged.logged(checkpoint.record),
        runrecord.recorded_health(checkpoint.path, records),
        logged.own_health(checkpoint.record),
    )


def _what(operation: str) -> str:
    call = "average_checkpoints" if operation == "average" else f"{operation}_checkpoint"
    return f"allow_diverged=True ({call}; tinax {operation} --allow-diverged)"


def refuse_known(sources: Sequence[OpenedSource], operation: str, allow: bool) -> None:
    """Refuses, before anything is read, a source known to have diverged.

    Raises:
      DivergedCheckpointError: Naming the source and why (its leaves where known).
    """
    if allow:
        return
    records: dict[str, dict[str, Any] | None] = {}
    for source in sources:
        found = known(source, records)
        if found.verdict == words.DIVERGED:
            raise DivergedCheckpointError(
                f"source checkpoint {str(source.path)!r} diverged: {found.reason}"
                f"{_leaves(found)}; {_what(operation)} makes the new checkpoint all the same"
            )


class SourceCounts:
    """The NaN and Inf of every value read of each source, leaf by leaf."""

    def __init__(self, sources: Sequence[OpenedSource]) -> None:
        self.sources = list(sources)
        self.counts = [LoadCounts() for _ in sources]

    def counter(self, checkpointable: str) -> Count:
        """What ``write_pytree`` is given for the checkpointable ``checkpointable``."""

        def count(job: ArrayJob, index: int, values: np.ndarray) -> None:
            if nonfinite.is_floating(values.dtype):
                nan, inf = nonfinite.count(values)
                self.counts[index].add(checkpointable, job.sources[index].key, nan, inf)
            else:
                self.counts[index].add(checkpointable, job.sources[index].key, 0, 0)

        return count

    def read(self, checkpointables: Sequence[str]) -> None:
        """Notes the pytree checkpointables read whole, in every source."""
        for counts in self.counts:
            for name in checkpointables:
                counts.counted(name)

    def healths(self) -> list[health.Health]:
        """Each source's health as far as it was read (its logged metrics judged too)."""
        return [
            counts.health(logged.logged(source.checkpoint.record))
            for source, counts in zip(self.sources, self.counts, strict=True)
        ]

    def made(self, held: Sequence[str]) -> health.Health:
        """The new checkpoint's health: NaN or Inf in a leaf it holds, read in a source."""
        leaves = {}
        for counts in self.counts:
            for leaf in counts.leaves():
                key = (leaf.checkpointable, leaf.key)
                if leaf.nan or leaf.inf or key not in leaves:
                    leaves[key] = leaf
        found = list(leaves.values())
        return health.judge(counts=health.counts_of(found, held), leaves=found)

    def refuse(self, operation: str, allow: bool) -> None:
        """Refuses, before the new checkpoint commits, a source found diverged as read.

        Raises:
          DivergedCheckpointError: Naming the source and the leaves that hold NaN or Inf.
        """
        if allow:
            return
        for source, found in zip(self.sources, self.healths(), strict=True):
            if found.verdict == words.DIVERGED:
                raise DivergedCheckpointError(
                    f"source checkpoint {str(source.path)!r} diverged: {found.reason}"
                    f"{_leaves(found)}; nothing was written; {_what(operation)} makes the "
                    "new checkpoint all the same"
                )


def _leaves(found: health.Health) -> str:
    """`` (model: blocks.0.kernel 4,096 NaN, …)``: the leaves that hold NaN or Inf."""
    bad = [leaf for leaf in found.leaves if leaf.nan or leaf.inf]
    if not bad:
        return ""
    shown = [
        f"{leaf.checkpointable} {treeplan.dotted_key(parse_key(leaf.key))} "
        + ", ".join(
            part
            for part in (
                f"{leaf.nan:,} NaN" if leaf.nan else "",
                f"{leaf.inf:,} Inf" if leaf.inf else "",
            )
            if part
        )
        for leaf in bad[:_NAMED]
    ]
    more = f", and {len(bad) - _NAMED:,} more" if len(bad) > _NAMED else ""
    return f" ({'; '.join(shown)}{more})"


def custom_metadata(
    custom: dict[str, Any] | None,
    held: Sequence[str],
    keep_metrics: bool,
    made: health.Health,
    as_read: bool,
) -> dict[str, Any]:
    """The new checkpoint's ``custom_metadata``: its source's, without the metrics its
    source logged unless it holds them as they were (the auxiliary state kept whole),
    and with its own health where its values are those read (``as_read``: not cast,
    where a narrower dtype may overflow to Inf)."""
    kept = dict(custom or {})
    kept.pop(names.HEALTH_RECORD, None)
    logged = kept.get(names.METRICS_RECORD)
    named = logged.get("checkpointable") if isinstance(logged, dict) else None
    if not keep_metrics or named not in held:
        kept.pop(names.METRICS_RECORD, None)
    if as_read and made.verdict != words.HEALTH_UNKNOWN:
        kept[names.HEALTH_RECORD] = health.record_entry(made, None)
    return kept
