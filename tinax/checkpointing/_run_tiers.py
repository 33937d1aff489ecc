"""A two-tier run's promotions: local checkpoints copied to the durable tier, and the
bookkeeping of both tiers around them.

A two-tier run (``local=``) saves to a local directory every ``local_every`` steps and
promotes a local checkpoint to the run's directory, its durable tier, every
``save_every`` steps: in the background, after the local save has committed, one
promotion at a time (``_promotion``), at most one more waiting behind it. Each tier
has its record and its retention. On a job of several processes either process 0
promotes the checkpoint every process wrote into a local directory they share, or,
where each process keeps a part of every local checkpoint (``_hosts``), every
process promotes its part and process 0 commits them as one (``_host_parts``).
"""

from __future__ import annotations

import functools
import logging
import threading
import warnings
import zlib
from typing import Any

from tinax._format.naming import names
from tinax._format.storage.location import Location
from tinax.checkpointing import _host_parts, _hosts, _processes, _run_files
from tinax.checkpointing._promotion import Promotion
from tinax.checkpointing._run_retention import RunRecord
from tinax.checkpointing._training import (
    check_step,
)

_log = logging.getLogger("tinax.checkpointing")
# Seconds the other processes of a job wait for the primary's promotions to end (a
# promotion copies a whole checkpoint to a bucket).
_PROMOTION_WAIT = 3600.0


class TwoTiers(RunRecord):
    """The part of ``TrainingRun`` that promotes (see the module docstring)."""

    _primary: bool
    _timeout: float
    _lock: threading.RLock
    _promotions: list[Promotion]
    _promotion_errors: list[BaseException]
    _promotions_started: int
    _resumed_promotions: bool

    @property
    def _keeps_local(self) -> bool:
        """Whether this process keeps the local tier (its record, retention and
        promotions): the primary, or every process where each has a part."""
        return self._primary or self._parts

    def path(self, step: int) -> str:
        """Where the checkpoint of ``step`` is (or would be) in ``directory``."""
        return str(self._root / names.run_checkpoint_name(check_step(step)))

    def _waiting(self) -> set[int]:
        """Local steps waiting for their promotion or being promoted (primary)."""
        assert self._local is not None
        # A step is recorded from its enqueueing until its promotion has ended.
        return set(self._local.promote)

    def _after_local_commit(self, step: int, promote: bool) -> None:
        """After a local save commits (primary): the local tier's retention, then the
        promotion of that checkpoint if it is due."""
        assert self._local is not None
        with self._lock:
            if promote:
                self._local.promote.add(step)
            try:
                self._local.retain(self._waiting(), self._policy())
            finally:
                # A retention that failed (it is logged) stops no promotion.
                if promote:
                    self._start_promotion(step)

    def _start_promotion(self, step: int) -> None:
        assert self._local is not None
        with self._lock:
            previous = next((p for p in reversed(self._promotions) if not p.done()), None)
            self._promotions = [p for p in self._promotions if not p.done()]
            copy = None
            if self._parts:
                # Every process starts its promotions in the same order: the n-th has
                # the same meeting everywhere.
                self._promotions_started += 1
                meeting = _processes.Meeting(
                    f"{zlib.crc32(str(self._root).encode())}/{self._promotions_started}",
                    self._timeout,
                )
                copy = functools.partial(_host_parts.promote_parts, meeting=meeting, step=step)
            self._promotions.append(
                Promotion(
                    step,
                    self._local.path(step),
                    self._root / names.run_checkpoint_name(step),
                    after=functools.partial(self._after_promotion, step),
                    previous=previous,
                    copy=copy,
                )
            )

    def _promote_now(self, step: int) -> None:
        """Promotes the committed local checkpoint of ``step``, which its save did not
        plan to promote (primary)."""
        assert self._local is not None
        with self._lock:
            if step in self._local.promote or step in self._durable_steps:
                return
        self._make_room()
        self._after_local_commit(step, True)

    def _check_durable(self, step: int) -> None:
        """Refuses to call the preemption save done unless ``step`` has committed in
        ``directory``; every process agrees.

        Raises:
          RuntimeError: If it has not (its local checkpoint proved corrupt and was set
            aside, with a warning).
        """
        error: Exception | None = None
        if self._primary:
            with self._durable_lock:
                durable = step in self._durable_steps
            if not durable:
                error = RuntimeError(
                    f"preempted: the save of step {step} did not reach {self.directory!r} "
                    "(see the warning above); the run is not safe to end yet"
                )
        _processes.agree(
            error,
            what=f"the preemption save of step {step} in {self.directory!r}",
            timeout=self._timeout,
        )

    def _make_room(self) -> None:
        """Before a save that will be promoted: at most one promotion may wait behind
        the one running, so a third waits here for the running one to end."""
        while True:
            with self._lock:
                live = [p for p in self._promotions if not p.done()]
            if len(live) < 2:
                return
            live[0].wait_quietly()

    def _release_promoted(self) -> None:
        """Forgets the local steps recorded as waiting for a promotion that no resumed
        run would start: the durable tier holds them, or holds a newer step (a killed
        run promoted them and pruned them since, or went on past them); the
        checkpoints themselves are left to the local tier's retention (primary)."""
        assert self._local is not None
        pending = set(self._local.pending(self._durable_steps, self._save_every))
        for step in sorted(self._local.promote - pending):
            where = "holds it" if step in self._durable_steps else "has gone past it"
            _log.info(
                "the local checkpoint of step %d no longer waits for its promotion: %r %s",
                step,
                self.directory,
                where,
            )
        self._local.promote &= pending

    def _resume_promotions(self) -> None:
        """Starts the promotions a killed run left unfinished (primary, once)."""
        if self._resumed_promotions:
            return
        self._resumed_promotions = True
        assert self._local is not None
        with self._lock:
            pending = self._local.pending(self._durable_steps, self._save_every)
        if self._parts:
            # A step whose part some process lacks cannot be promoted.
            pending = _hosts.pending_everywhere(pending, timeout=self._timeout)
        with self._lock:
            for step in pending:
                _log.warning(
                    "promoting the local checkpoint of step %d to %r: the run that saved it "
                    "did not finish its promotion",
                    step,
                    self.directory,
                )
                self._local.promote.add(step)
                self._start_promotion(step)

    def _after_promotion(self, step: int, error: BaseException | None) -> None:
        """After a promotion ends (on its thread, primary): the durable tier's record and
        retention; a local checkpoint that proved corrupt is set aside."""
        assert self._local is not None
        source = self._local.path(step)
        with self._lock:
            metric = self._local.metrics.get(str(step))
        try:
            self._settle_promotion(step, source, error, metric)
        finally:
            with self._lock:
                self._local.promote.discard(step)
                self._local.retain(self._waiting(), self._policy())

    def _settle_promotion(
        self, step: int, source: Location, error: BaseException | None, metric: Any
    ) -> None:
        """The durable tier's bookkeeping after a promotion (or its failure's); a save
        call meanwhile waits for none of it."""
        with self._durable_lock:
            if error is None:
                _log.info("promoted %s to %s", source, self.path(step))
                self._durable_steps.add(step)
                if self._primary:
                    if metric is not None:
                        self._record["metrics"][str(step)] = metric
                    self._retain()
            elif isinstance(error, _host_parts.PartRefused):
                # Another process's part was corrupt: that process sets it aside and
                # warns; here the step is not promoted, and the run goes on.
                _log.warning("the local checkpoint of step %d was not promoted: %s", step, error)
            elif isinstance(error, ValueError):
                # The local checkpoint is not what was saved (or not a checkpoint at all).
                warnings.warn(
                    f"the local checkpoint {str(source)!r} was not promoted: {error}; it is "
                    "set aside and the run goes on",
                    RuntimeWarning,
                    stacklevel=1,
                )
                with self._lock:
                    _run_files.set_aside(source, f"{type(error).__name__}: {error}")
            else:
                _log.warning(
                    "the promotion of %s to %s failed (%s: %s); the local checkpoint stays "
                    "and the run goes on",
                    source,
                    self.path(step),
                    type(error).__name__,
                    error,
                )
                with self._lock:
                    self._promotion_errors.append(error)

    def _wait_promotions(self) -> None:
        """Waits for every promotion started (primary); every process then agrees on
        the first failure not yet reported."""
        error: Exception | None = None
        if self._keeps_local:
            with self._lock:
                running = list(self._promotions)
            for promotion in running:
                promotion.wait_quietly()
            with self._lock:
                failures, self._promotion_errors = self._promotion_errors, []
                self._promotions = [p for p in self._promotions if not p.done()]
            error = next((e for e in failures if isinstance(e, Exception)), None)
        _processes.agree(
            error,
            what=f"the end of the promotions to {self.directory!r}",
            # Each process waited for its own part's promotions; else process 0's alone
            # copies whole checkpoints, for as long as that takes.
            timeout=self._timeout if self._parts else max(self._timeout, _PROMOTION_WAIT),
        )
