"""A training run's resume: the newest checkpoint that loads and has not diverged, of
either tier (or the one of a step asked for), on every process alike.

Checkpoints are tried newest first (of a step in both tiers, the local copy first);
one that does not load is skipped with a warning, and once an older one has loaded
the ones skipped are set aside (``_run_files``). One whose health verdict is
diverged (NaN or Inf, ``_resume``) is passed over unless asked for, and recorded in
the run's record. The checkpoints of the steps after the one restored belong to the
branch the run leaves: at its first save they are set aside as abandoned, and the
record says from which step the run went on. Where each process of a job keeps a
part of every local checkpoint, the order is decided once, on process 0, from what
every process holds (``_hosts``).
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from typing import Any

import grain

from tinax._format.integrity import health, preflight
from tinax._format.metadata.layout import Checkpoint
from tinax._format.naming import names, words
from tinax._format.records import tiers
from tinax._format.storage.location import Location
from tinax.checkpointing import _host_parts, _hosts, _processes, _run_files
from tinax.checkpointing._nonfinite import DivergedCheckpointError
from tinax.checkpointing._restore_plan import check_budget, memory_budget
from tinax.checkpointing._resume import DIVERGED as DIVERGED_WHY
from tinax.checkpointing._resume import (
    PassedOver,
    known_health,
    none_healthy_message,
    resumed_message,
)
from tinax.checkpointing._run_tiers import TwoTiers
from tinax.checkpointing._training import (
    TrainingCheckpoint,
    TrainingCheckpointNames,
    check_step,
    restore_training,
)
from tinax.checkpointing._verdict import TargetMismatchError

_log = logging.getLogger("tinax.checkpointing")


def _passes_preflight(where: Location) -> bool:
    """Whether a checkpoint passes the check every load makes first."""
    try:
        preflight.check(where)
    except (ValueError, OSError):
        return False
    return True


class Restore(TwoTiers):
    """The part of ``TrainingRun`` that restores (see the module docstring)."""

    _names: TrainingCheckpointNames
    _made: bool
    _failed_here: set[Location]
    _went_on_from: int | None

    @property
    def local_directory(self) -> str | None:
        """The local tier's directory, or ``None`` for a run of one tier."""
        return None if self._local is None else str(self._local.root)

    def _go_on(self, step: int) -> None:
        """Before the first save after a restore: the checkpoints of steps after the one
        restored belong to the branch the run leaves; they are set aside (kept for
        inspection as ``<name>.tinax-abandoned``, never resumed from), and the run's
        record says from which step it went on (primary)."""
        start, self._went_on_from = self._went_on_from, None
        if start is None or not self._primary or step <= start:
            return
        tiers_ = [self._root] if self._local is None else [self._local.root, self._root]
        later = [
            (root, s, where)
            for root in tiers_
            for s, where in _run_files.complete_checkpoints(root).items()
            if s > start
        ]
        if not later:
            return
        if self._local is not None:
            with self._lock:
                running = list(self._promotions)
            for promotion in running:  # none copies a checkpoint as it is moved aside
                promotion.wait_quietly()
        for _, _, where in later:
            _run_files.set_aside_abandoned(where, start, f"the run went on from step {start}")
        steps = sorted({s for _, s, _ in later})
        _log.warning(
            "going on from step %d of run %r: the checkpoints of steps %s belong to the "
            "branch it leaves; set aside as <name>%s, kept for inspection and never "
            "resumed from",
            start,
            self.directory,
            ", ".join(map(str, steps)),
            names.ABANDONED_SUFFIX,
        )
        gone = {str(s) for s in steps}
        with self._durable_lock:
            for member in ("kept", "metrics", names.RUN_RECORD_HEALTH):
                found = self._record.get(member, {})
                self._record[member] = {k: v for k, v in found.items() if k not in gone}
            self._record.setdefault(names.RUN_RECORD_WENT_ON, []).append(
                {"from_step": start, "set_aside": steps, "at_ns": time.time_ns()}
            )
            self._durable_steps -= set(steps)
            self._write_record()
        if self._local is not None:
            with self._lock:
                self._local.promote -= set(steps)
                self._local.kept = {k: v for k, v in self._local.kept.items() if k not in gone}
                self._local.write_record(self._policy())

    @property
    def went_on_from(self) -> list[dict[str, Any]]:
        """Each time the run went on from an earlier step than its newest, from the
        run's record: ``from_step``, the steps it ``set_aside`` then, and when
        (``at_ns``)."""
        found = self._record.get(names.RUN_RECORD_WENT_ON, [])
        return [dict(entry) for entry in found] if isinstance(found, list) else []

    def restore(
        self,
        model_target: Any,
        optimizer_target: Any,
        rng_target: Any,
        auxiliary_target: Any,
        iterator: grain.DatasetIterator,
        *,
        step: int | None = None,
        max_host_bytes: int | None = None,
        allow_diverged: bool = False,
    ) -> TrainingCheckpoint | None:
        """Loads the newest checkpoint that is intact and healthy (or the one of ``step``).

        Checkpoints are tried newest first (with two tiers: of either, the local one
        first of a step in both). One that diverged is passed over: a metric its
        save logged is NaN or infinite, or (counted as its data is read, before
        ``iterator`` is touched) its model or optimizer state holds NaN or Inf;
        what each load found is recorded in the run's record, where listings read
        it. One whose data does not load (corrupt, unreadable, parts missing) is
        skipped with a warning naming it and why, and the next older one is tried;
        ``iterator`` moves only with the one restored. Once one has loaded, the
        damaged ones are set aside (renamed ``<name>.tinax-corrupt``, kept for
        inspection; see the module docstring), and the steps passed over are logged
        with why (``passed_over`` lists them). The targets are as for
        ``load_training_checkpoint``. A fresh start (no checkpoint) is logged,
        naming the directory. With two tiers, the promotions a killed run left
        unfinished start once the restore has ended.

        Args:
          model_target, optimizer_target, rng_target, auxiliary_target: Restore targets.
          iterator: The Grain iterator to restore in place.
          step: Restore exactly this step (no older one; with two tiers, the durable
            copy if the local one does not load).
          max_host_bytes: The most host memory the restore may add at its peak, as
            ``with memory_budget(max_host_bytes)`` sets it; a checkpoint that does
            not fit is refused, not skipped (an older one is no smaller).
          allow_diverged: Take a checkpoint that diverged all the same (the newest
            that loads, or the one of ``step``); the load logs what it found.

        Returns:
          The restored ``TrainingCheckpoint``, or ``None`` if the run has no
          checkpoint yet (a fresh start).

        Raises:
          TargetMismatchError: If a target does not match a checkpoint.
          FileNotFoundError: If ``step`` has no complete checkpoint.
          DivergedCheckpointError: If every checkpoint that loads diverged, or the one
            of ``step`` did (a ``ValueError``, naming each and why), without
            ``allow_diverged``.
          ValueError: If no checkpoint loads (each one's reason is named), or the
            one of ``step`` does not.
          RestoreTooLargeError: If the checkpoint to restore does not fit in memory
            (a ``MemoryError``, raised before anything is read).
        """
        if not isinstance(allow_diverged, bool):
            raise TypeError(f"allow_diverged must be a bool, got {type(allow_diverged).__name__}")
        budget = check_budget(max_host_bytes)
        with memory_budget(budget) if budget is not None else contextlib.nullcontext():
            return self._restore(
                model_target,
                optimizer_target,
                rng_target,
                auxiliary_target,
                iterator,
                step,
                allow_diverged,
            )

    def _restore(
        self,
        model_target: Any,
        optimizer_target: Any,
        rng_target: Any,
        auxiliary_target: Any,
        iterator: grain.DatasetIterator,
        step: int | None,
        allow_diverged: bool,
    ) -> TrainingCheckpoint | None:
        candidates = self._candidates()
        if step is not None:
            step = check_step(step)
            chosen = [(s, where) for s, where in candidates if s == step]
            if not chosen:
                raise FileNotFoundError(
                    f"run {self.directory!r} has no complete checkpoint of step {step} "
                    f"(it has {sorted({s for s, _ in candidates})})"
                )
            candidates = chosen
        failures: list[tuple[Location, str]] = []
        passed: list[PassedOver] = []
        for found_step, where in candidates:
            if any(p.step == found_step and p.why == DIVERGED_WHY for p in passed):
                continue  # the other tier's copy of a step that diverged: the same values
            if not allow_diverged:
                known = known_health(where, self._tier_record(where))
                if known.verdict == words.DIVERGED:
                    passed.append(self._passed(found_step, where, known.reason))
                    continue
            try:
                restored = self._load(
                    where,
                    model_target,
                    optimizer_target,
                    rng_target,
                    auxiliary_target,
                    iterator,
                    allow_diverged=allow_diverged,
                )
            except TargetMismatchError:
                raise
            except DivergedCheckpointError as e:
                passed.append(self._passed(found_step, where, str(e)))
                continue
            except (ValueError, OSError) as e:
                if step is not None and len(candidates) == 1:
                    raise
                reason = f"{type(e).__name__}: {e}"
                failures.append((where, reason))
                warnings.warn(
                    f"skipping checkpoint {str(where)!r}, which does not load ({reason}); "
                    "trying the next older one",
                    RuntimeWarning,
                    stacklevel=2,
                )
                continue
            for skipped, reason in failures:
                if self._sets_aside(skipped):
                    _run_files.set_aside(skipped, reason)
            self._drop_parts_after(restored.step)
            if self._keeps_local:
                self._after_restore()
            self._passed_over = tuple(passed)
            # Saves go on from this step: the first sets aside the later checkpoints.
            self._went_on_from = restored.step
            if passed:
                _log.warning(resumed_message(restored.step, str(where), passed))
            return restored
        if passed:
            said = none_healthy_message(self.directory, passed)
            if failures:
                said += "; and these do not load: " + "; ".join(
                    f"{self._described(where)}: {reason}" for where, reason in failures
                )
            raise DivergedCheckpointError(said)
        if failures:
            raise ValueError(
                f"no checkpoint of run {self.directory!r} loads: "
                + "; ".join(f"{self._described(where)}: {reason}" for where, reason in failures)
            )
        searched = repr(self.directory)
        if self._local is not None:
            searched += f" or its local tier {self.local_directory!r}"
        _log.warning(
            "no checkpoint to resume in the run directory %s%s: a fresh start "
            "(TrainingRun(..., must_exist=True) refuses one)",
            searched,
            ", which this run has just created" if self._made else "",
        )
        self._drop_parts_after(-1)
        if self._keeps_local:
            self._after_restore()
        return None

    def _candidates(self) -> list[tuple[int, Location]]:
        """Every complete checkpoint by step, newest first; of a step in both tiers, the
        local one first. Where each process keeps a part, the list process 0 made of
        what every process holds (``_hosts.restore_candidates``)."""
        if self._parts:
            assert self._local is not None
            sound = [s for s, where in self._local.complete().items() if _passes_preflight(where)]
            chosen = _hosts.restore_candidates(sound, self._complete(), timeout=self._timeout)
            return [
                (
                    s,
                    self._local.path(s)
                    if tier == _hosts.LOCAL
                    else self._root / names.run_checkpoint_name(s),
                )
                for s, tier in chosen
            ]
        found = [(step, 1, where) for step, where in self._complete().items()]
        if self._local is not None:
            found += [(step, 0, where) for step, where in self._local.complete().items()]
        found.sort(key=lambda item: (-item[0], item[1]))
        return [(step, where) for step, _, where in found]

    def _drop_parts_after(self, step: int) -> None:
        """Where each process keeps a part: removes this process's parts of the steps
        after ``step``, the one the job resumed from, and its saves a killed job left
        unfinished, whatever their step. The other processes did not hold them whole
        (a promotion never had every part), and the resumed job saves those steps
        again."""
        if not self._parts:
            return
        assert self._local is not None
        with self._lock:
            # Its own directory: a save of this process still running holds its claim.
            _run_files.clean_up(self._local.root, None, every_unfinished=True)
            for later, where in sorted(self._local.complete().items()):
                if later > step:
                    _log.warning(
                        "removing %s: not every process holds its part, and the job resumed "
                        "from step %d",
                        where,
                        step,
                    )
                    _run_files.remove_checkpoint(where)
                    self._local.promote.discard(later)

    def _sets_aside(self, skipped: Location) -> bool:
        """Whether this process sets aside a checkpoint a restore skipped: the durable
        tier's, process 0; a local one, whoever keeps the local tier (where each
        process keeps a part: the process whose own part failed)."""
        if self._local is None or skipped.parent != self._local.root:
            return self._primary
        return self._keeps_local and (not self._parts or skipped in self._failed_here)

    @property
    def passed_over(self) -> tuple[PassedOver, ...]:
        """The checkpoints the last ``restore`` passed over, newest first: newer than
        the one it resumed from, and each one's step, tier, ``why`` (``diverged``,
        ``damaged``) and ``reason``."""
        return self._passed_over

    def _tier(self, where: Location) -> str:
        if self._local is None:
            return ""
        return tiers.LOCAL_TIER if where.parent == self._local.root else tiers.DURABLE_TIER

    def _passed(self, step: int, where: Location, reason: str) -> PassedOver:
        return PassedOver(step, str(where), self._tier(where), DIVERGED_WHY, reason)

    def _tier_record(self, where: Location) -> dict[str, Any] | None:
        """The record of the tier ``where`` is in, as this run knows it."""
        if self._local is not None and self._tier(where) == tiers.LOCAL_TIER:
            return {names.RUN_RECORD_HEALTH: self._local.health}
        return self._record

    def _record_health(self, where: Location, found: health.Health, committed: int | None) -> None:
        """Keeps what a load found of ``where``'s health in its tier's record (primary),
        where listings read it."""
        step = names.step_from_name(where.name)
        # On several processes each counted its own parts: no sums to record.
        if (
            not self._primary
            or _processes.process_count() != 1
            or step is None
            or found.verdict == words.HEALTH_UNKNOWN
        ):
            return
        entry = health.record_entry(found, committed)
        if self._local is not None and self._tier(where) == tiers.LOCAL_TIER:
            with self._lock:
                self._local.health[str(step)] = entry
                self._local.write_record(self._policy())
            return
        with self._durable_lock:
            self._record.setdefault(names.RUN_RECORD_HEALTH, {})[str(step)] = entry
            self._write_record()

    def _described(self, where: Location) -> str:
        if self._local is None:
            return where.name
        tier = tiers.LOCAL_TIER if where.parent == self._local.root else tiers.DURABLE_TIER
        return f"{where.name} ({tier})"

    def _after_restore(self) -> None:
        """Once a restore has ended (primary): the promotions a killed run left."""
        if self._local is None:
            return
        with self._lock:
            # What the restore set aside is no longer a step of either tier.
            self._local.promote &= set(self._local.complete())
        with self._durable_lock:
            self._durable_steps = set(self._complete())
        self._resume_promotions()

    def _load(
        self,
        where: Location,
        model_target: Any,
        optimizer_target: Any,
        rng_target: Any,
        auxiliary_target: Any,
        iterator: grain.DatasetIterator,
        *,
        allow_diverged: bool = False,
    ) -> TrainingCheckpoint:
        def accept(checkpoint: Checkpoint, found: health.Health) -> None:
            # Before the iterator moves: what the read found is kept, and a checkpoint
            # that diverged refused unless allowed.
            self._record_health(where, found, checkpoint.committed_nsecs)
            health.remember(checkpoint.path, checkpoint.committed_nsecs, found)
            if found.verdict == words.DIVERGED:
                if not allow_diverged:
                    raise DivergedCheckpointError(found.reason)
                _log.warning("resuming from %s, which diverged: %s", where, found.reason)

        error: Exception | None = None
        restored = None
        # A process's own part is loaded by that process alone.
        alone = self._parts and self._local is not None and where.parent == self._local.root
        try:
            with (
                _processes.waiting(self._timeout),
                _host_parts.own_storage() if alone else contextlib.nullcontext(),
            ):
                restored = restore_training(
                    str(where),
                    model_target,
                    optimizer_target,
                    rng_target,
                    auxiliary_target,
                    iterator,
                    names=self._names,
                    accept=accept,
                )
        except (ValueError, OSError) as e:
            error = e
            self._failed_here.add(where)
        # Every process takes the same checkpoint: one that fails anywhere is skipped
        # everywhere (a target mismatch, too, is raised everywhere).
        try:
            _processes.agree(error, what=f"the restore of {str(where)!r}", timeout=self._timeout)
        except Exception:
            if isinstance(error, TargetMismatchError):
                raise error from None
            raise
        assert restored is not None
        return restored
