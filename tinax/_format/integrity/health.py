"""Whether a checkpoint is fit to resume from: its health, beside its integrity, decided once.

Two questions, answered here and nowhere else:

- *integrity*: are these the bytes that were saved? ``sound`` (committed, and every
  check made so far passed), ``damaged`` (something in the way of a load), or
  ``incomplete`` (a save in progress, interrupted, or being removed).
- *health*: can a run go on from here? ``diverged`` when its model or optimizer
  state (any checkpointable but the metric ones, ``words.METRIC_CHECKPOINTABLES``)
  holds NaN or Inf, or when a metric it logged is NaN or infinite; ``healthy`` when
  its data was read whole and neither holds; else ``not yet known``.

What is known of a checkpoint's health comes from, cheapest first: the metrics its
save logged (in its commit record, which a listing reads anyway: no data read);
NaN and Inf counted while its data was read (``verify(data=True)``, ``scan_run``, a
load), remembered by this process (``remember``, ``recalled``) and, by a training
run, in its record (``record_entry``, ``from_record``). ``judge`` turns them into
one ``Health``, counted once per leaf; every table, command and widget shows that.

JAX-free and pandas-free: ``tinax.checkpointing`` (restores), ``tinax.explore``
(tables, ``verify``) and the widgets read the same verdict.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tinax._format.lru import LruCache
from tinax._format.naming import names, words

# Where a health verdict came from (``Health.source``).
FROM_DATA = "data read"
FROM_RECORD = "run record"
FROM_METRICS = "logged metrics"
NOTHING_READ = "nothing read"
SOURCES = (FROM_DATA, FROM_RECORD, FROM_METRICS, NOTHING_READ)

# The integrity of a checkpoint by its listing status (``list_checkpoints``' ``status``).
_INTEGRITY_OF_STATUS = {
    words.COMPLETE: words.SOUND,
    words.INVALID: words.DAMAGED,
    words.FOUND_CORRUPT: words.DAMAGED,
    words.IN_PROGRESS: words.INCOMPLETE,
    words.INTERRUPTED: words.INCOMPLETE,
    words.BEING_REMOVED: words.INCOMPLETE,
    words.ABANDONED: words.SOUND,
}


def integrity_of_status(status: str) -> str:
    """A listing status (``complete``, ``invalid``, …) as an integrity word."""
    return _INTEGRITY_OF_STATUS.get(status, words.DAMAGED)


def overall(integrity: str, health: str) -> str:
    """The one word a single column shows: the integrity where it is not sound
    (``damaged``, ``incomplete``), else the health."""
    return health if integrity == words.SOUND else integrity


@dataclasses.dataclass(frozen=True)
class LeafCount:
    """NaN and Inf in one leaf, counted once as its data was read."""

    checkpointable: str
    key: str
    nan: int
    inf: int


@dataclasses.dataclass(frozen=True)
class Counts:
    """NaN and Inf in one checkpointable: the sums over its leaves, and how many of its
    leaves hold any."""

    nan: int
    inf: int
    leaves: int

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.nan + other.nan, self.inf + other.inf, self.leaves + other.leaves)


_NO_COUNTS = Counts(0, 0, 0)


def is_metric_checkpointable(name: str) -> bool:
    """Whether NaN there is a logged metric's (the auxiliary state, Orbax's metrics)."""
    return name in words.METRIC_CHECKPOINTABLES


@dataclasses.dataclass(frozen=True)
class Health:
    """A checkpoint's health, and what it rests on.

    Attributes:
      verdict: ``healthy``, ``diverged`` or ``not yet known`` (``tinax.vocabulary``'s
        ``HEALTHY``, ``DIVERGED``, ``HEALTH_UNKNOWN``).
      source: What decided it: ``data read`` (NaN and Inf counted as its data was
        read), ``run record`` (a training run read it and recorded what it found),
        ``logged metrics`` (a metric its save logged is NaN or infinite; no data
        read) or ``nothing read``.
      metrics: The logged metrics that are NaN or infinite, ``(name, value)``, by name.
      counts: NaN and Inf by checkpointable, every one read (``Counts`` of zeros
        where none); ``None`` where no data was read.
      leaves: The leaves holding NaN or Inf, where known leaf by leaf (a recorded
        verdict keeps the sums alone).
      complete: Whether every leaf's data was read (a damaged leaf is not).
    """

    verdict: str
    source: str
    metrics: tuple[tuple[str, float], ...] = ()
    counts: Mapping[str, Counts] | None = None
    leaves: tuple[LeafCount, ...] = ()
    complete: bool = False

    def __deepcopy__(self, memo: dict[int, Any]) -> Health:
        # A verdict is a value, never changed once made: a copy is the verdict itself.
        # (pandas deep-copies a table's ``attrs``, which hold each row's verdict, at
        # every operation on the table: a run's listing would copy them by the thousand.)
        return self

    @property
    def read(self) -> bool:
        """Whether NaN and Inf were counted in its data (here or by a run)."""
        return self.counts is not None

    def _total(self, state_only: bool) -> Counts | None:
        if self.counts is None:
            return None
        total = _NO_COUNTS
        for name, counts in self.counts.items():
            if not (state_only and is_metric_checkpointable(name)):
                total = total + counts
        return total

    @property
    def nan(self) -> int | None:
        """NaN values in every leaf read; ``None`` where no data was read."""
        total = self._total(False)
        return None if total is None else total.nan

    @property
    def inf(self) -> int | None:
        """Infinite values in every leaf read; ``None`` where no data was read."""
        total = self._total(False)
        return None if total is None else total.inf

    @property
    def nonfinite_leaves(self) -> int | None:
        """Leaves holding NaN or Inf; ``None`` where no data was read."""
        total = self._total(False)
        return None if total is None else total.leaves

    @property
    def state(self) -> Counts | None:
        """NaN and Inf in the model and optimizer state (every checkpointable but the
        metric ones); ``None`` where no data was read."""
        return self._total(True)

    @property
    def diverged_parts(self) -> tuple[str, ...]:
        """The checkpointables of its state that hold NaN or Inf, in stored order."""
        if self.counts is None:
            return ()
        return tuple(
            name
            for name, counts in self.counts.items()
            if counts.leaves and not is_metric_checkpointable(name)
        )

    @property
    def reason(self) -> str:
        """Why, in a few words: every view says it this way."""
        said = []
        state = self.state
        if state is not None and state.leaves:
            said.append(counts_phrase(state, self.diverged_parts))
        if self.metrics:
            said.append(metrics_phrase(self.metrics))
        elif self.counts is not None:
            # Metrics read as data, not recorded by name with the save.
            for name, counts in self.counts.items():
                if counts.leaves and is_metric_checkpointable(name):
                    said.append(counts_phrase(counts, (name,)))
        if said:
            return "; ".join(said)
        if self.verdict == words.HEALTHY:
            return "no NaN or Inf in its data"
        if self.read and not self.complete:
            return "no NaN or Inf in the data read, but not all of it could be read"
        return "its data has not been read"

    def __str__(self) -> str:
        return f"{self.verdict}: {self.reason}"


def counts_phrase(counts: Counts, where: Sequence[str]) -> str:
    """``32,848,128 NaN and 0 Inf in 594 leaves of model, optimizer``."""
    leaves = f"{counts.leaves:,} lea{'f' if counts.leaves == 1 else 'ves'}"
    return f"{counts.nan:,} NaN and {counts.inf:,} Inf in {leaves} of {', '.join(where)}"


def metrics_phrase(metrics: Sequence[tuple[str, float]]) -> str:
    """``its logged loss is NaN``; ``its logged grad_norm and loss are NaN``; ``its
    logged loss is NaN and scale is Inf``."""
    by_value: dict[str, list[str]] = {}
    for name, value in metrics:
        by_value.setdefault(_value_word(value), []).append(name)
    parts = []
    for word, named in by_value.items():
        joined = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
        parts.append(f"{joined} {'is' if len(named) == 1 else 'are'} {word}")
    return "its logged " + " and ".join(parts)


def _value_word(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Inf" if value > 0 else "-Inf"


def nonfinite_metrics(metrics: Mapping[str, float] | None) -> tuple[tuple[str, float], ...]:
    """The metrics that are NaN or infinite, by name."""
    if not metrics:
        return ()
    return tuple(sorted((k, v) for k, v in metrics.items() if not math.isfinite(v)))


def counts_of(leaves: Iterable[LeafCount], read: Iterable[str] = ()) -> dict[str, Counts]:
    """NaN and Inf by checkpointable from each leaf's counts (a leaf counted once);
    ``read`` names checkpointables read with nothing found, which get zeros."""
    found: dict[str, Counts] = {name: _NO_COUNTS for name in read}
    for leaf in leaves:
        if leaf.nan or leaf.inf:
            found[leaf.checkpointable] = found.get(leaf.checkpointable, _NO_COUNTS) + Counts(
                leaf.nan, leaf.inf, 1
            )
        else:
            found.setdefault(leaf.checkpointable, _NO_COUNTS)
    return found


def judge(
    *,
    metrics: Mapping[str, float] | None = None,
    counts: Mapping[str, Counts] | None = None,
    leaves: Sequence[LeafCount] = (),
    complete: bool = True,
    source: str | None = None,
) -> Health:
    """The health of a checkpoint from what is known of it.

    Args:
      metrics: The metrics its save logged, by name (``NaN`` and ``±inf`` included).
      counts: NaN and Inf by checkpointable, where its data was read (``counts_of``).
      leaves: The leaves holding NaN or Inf, where counted leaf by leaf.
      complete: With ``counts``: whether every leaf was read.
      source: Where the counts come from (``FROM_DATA`` or ``FROM_RECORD``).

    Returns:
      ``diverged`` if a logged metric is NaN or infinite, or NaN or Inf was counted
      anywhere but in the metric checkpointables (NaN counted there is a logged
      metric's too); ``healthy`` if the data was read whole and none was;
      ``not yet known`` otherwise.
    """
    bad_metrics = nonfinite_metrics(metrics)
    kept = tuple(leaf for leaf in leaves if leaf.nan or leaf.inf)
    if counts is None:
        verdict = words.DIVERGED if bad_metrics else words.HEALTH_UNKNOWN
        return Health(
            verdict,
            FROM_METRICS if bad_metrics else NOTHING_READ,
            bad_metrics,
            None,
            (),
            False,
        )
    # One order everywhere, whichever thread counted first: a training save's, then by name.
    last = len(names.TRAINING_CHECKPOINTABLES)
    order = {name: i for i, name in enumerate(names.TRAINING_CHECKPOINTABLES)}
    counts = {k: counts[k] for k in sorted(counts, key=lambda n: (order.get(n, last), n))}
    nonfinite = any(c.leaves for c in counts.values())
    if bad_metrics or nonfinite:
        verdict = words.DIVERGED
    else:
        verdict = words.HEALTHY if complete else words.HEALTH_UNKNOWN
    return Health(verdict, source or FROM_DATA, bad_metrics, dict(counts), kept, complete)


def with_metrics(health: Health, metrics: Mapping[str, float] | None) -> Health:
    """``health`` (from data) with the logged metrics of its checkpoint judged too."""
    if not nonfinite_metrics(metrics) or health.counts is None:
        return health if health.counts is not None else judge(metrics=metrics)
    return judge(
        metrics=metrics,
        counts=health.counts,
        leaves=health.leaves,
        complete=health.complete,
        source=health.source,
    )


def merged(earlier: Health | None, later: Health, held: Iterable[str] | None = None) -> Health:
    """``later`` (what a read of some of a checkpoint's checkpointables found) with what
    an ``earlier`` read of the same checkpoint found of the others: a script that loads
    a checkpoint part by part is told one count, as a read of it whole would.

    Args:
      earlier: What was known from its data before (``recalled``), if anything.
      later: What the read just made found.
      held: The checkpointables whose arrays it holds: the two reads together are
        complete where they counted every one.
    """
    if earlier is None or earlier.counts is None or later.counts is None:
        return later
    counts = {**earlier.counts, **later.counts}  # the later read of a part wins
    leaves = [*(f for f in earlier.leaves if f.checkpointable not in later.counts), *later.leaves]
    complete = later.complete or earlier.complete or (held is not None and set(held) <= set(counts))
    return judge(
        metrics=dict(later.metrics or earlier.metrics),
        counts=counts,
        leaves=leaves,
        complete=complete,
        source=later.source,
    )


# -- what this process has read ----------------------------------------------------------

# The health found by reading each checkpoint's data in this process, by its path and
# commit time: a committed checkpoint never changes, and one saved again under the same
# name commits at another time. Bounded: a verdict is a few numbers (and the leaves
# holding NaN, which a diverged checkpoint's keep).
_KEEP = 4096
_read: LruCache[tuple[str, int], Health] = LruCache(_KEEP)


def remember(path: object, committed_nsecs: int | None, health: Health) -> None:
    """Keeps what reading the data of the checkpoint at ``path`` (committed at
    ``committed_nsecs``) found; one without a commit time is not kept."""
    if committed_nsecs is None or health.counts is None:
        return
    _read.put((str(path), committed_nsecs), health)


def recalled(path: object, committed_nsecs: int | None) -> Health | None:
    """What this process found reading the data of the checkpoint at ``path``, if it did."""
    if committed_nsecs is None:
        return None
    return _read.get((str(path), committed_nsecs))


def forget() -> None:
    """Forgets every health found by reading data (tests)."""
    _read.clear()


# -- what a training run recorded ----------------------------------------------------------


def record_entry(health: Health, committed_nsecs: int | None) -> dict[str, Any]:
    """What a run's record keeps of a checkpoint's health read from its data: the
    sums by checkpointable, and the commit time that tells it from a later save of
    its step."""
    counts = health.counts or {}
    return {
        "committed_ns": committed_nsecs,
        "verdict": health.verdict,
        "complete": health.complete,
        "counts": {name: [c.nan, c.inf, c.leaves] for name, c in counts.items()},
    }


def from_record(entry: object, committed_nsecs: int | None) -> Health | None:
    """The health a run recorded (``record_entry``) of the checkpoint committed at
    ``committed_nsecs``; ``None`` if the entry is not one, or of another save."""
    if not isinstance(entry, Mapping):
        return None
    # A run's record names the save it read (its step may be saved again since); a
    # checkpoint's own record (``names.HEALTH_RECORD``) needs not.
    recorded_for = entry.get("committed_ns")
    if recorded_for is not None and recorded_for != committed_nsecs:
        return None
    found = entry.get("counts")
    if not isinstance(found, Mapping):
        return None
    counts: dict[str, Counts] = {}
    for name, numbers in found.items():
        if (
            not isinstance(name, str)
            or not isinstance(numbers, list)
            or len(numbers) != 3
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers)
        ):
            return None
        counts[name] = Counts(*numbers)
    complete = entry.get("complete") is True
    return judge(counts=counts, complete=complete, source=FROM_RECORD)


def known(
    path: object,
    committed_nsecs: int | None,
    metrics: Mapping[str, float] | None,
    recorded: object = None,
    own: object = None,
) -> Health:
    """Everything known of a checkpoint's health without reading its data: its logged
    ``metrics``, what this process read of it, what its writer recorded in it
    (``own``: its ``names.HEALTH_RECORD``) and what its run ``recorded`` (the run
    record's entry for its step, if any)."""
    found = recalled(path, committed_nsecs)
    if found is None:
        found = from_record(own, committed_nsecs)
    if found is None:
        found = from_record(recorded, committed_nsecs)
    if found is None:
        return judge(metrics=metrics)
    return with_metrics(found, metrics)
