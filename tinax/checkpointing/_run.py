"""A training run: the save interval, retention, resume and preemption in one object.

(Over 500 lines: one class, whose interval, retention, resume, preemption and two
tiers share the run's state and its record; split, each part would reach into the
others. What a run directory needs, whichever tier it is, is in ``_run_files``; the
local tier in ``_local_tier``; a promotion in ``_promotion``.)

A run is a directory of checkpoints named ``step_<step>`` (``names.run_checkpoint_name``)
and one small JSON record beside them (``names.RUN_RECORD``): the run's policy, the
metric of every step saved, and why each checkpoint is kept. The record is a file,
so no listing takes it for a checkpoint, and it is replaced atomically. Removal is
crash-safe, and a checkpoint a restore could not load is set aside (``_run_files``).
The steps after the one restored belong to the resumed job, which saves them again
under their own names.

A two-tier run (``local=``) saves to a local directory every ``local_every`` steps and
promotes a local checkpoint to the run's directory, its durable tier, every
``save_every`` steps: in the background, after the local save has committed, one
promotion at a time (``_promotion``). Each tier has its record and its retention;
restore takes the newest checkpoint that loads from either.

On several processes the primary process (process 0) alone writes the records,
removes checkpoints and promotes; every process saves, restores and decides to save
alike.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
import types
import warnings
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import grain

from tinax import _paths
from tinax._format.integrity import health, preflight
from tinax._format.metadata.layout import Checkpoint
from tinax._format.naming import names, words
from tinax._format.records import tiers
from tinax._format.records.runrecord import read_run_record
from tinax._format.storage import removal
from tinax._format.storage.location import Location
from tinax.checkpointing import _host_parts, _hosts, _processes, _run_files
from tinax.checkpointing._local_tier import LocalTier
from tinax.checkpointing._nonfinite import DivergedCheckpointError
from tinax.checkpointing._promotion import Promotion
from tinax.checkpointing._response import SaveResponse
from tinax.checkpointing._restore_plan import check_budget, memory_budget
from tinax.checkpointing._resume import DIVERGED as DIVERGED_WHY
from tinax.checkpointing._resume import (
    PassedOver,
    known_health,
    none_healthy_message,
    resumed_message,
)
from tinax.checkpointing._training import (
    TrainingCheckpoint,
    TrainingCheckpointNames,
    check_step,
    restore_training,
    start_training_save,
)
from tinax.checkpointing._verdict import TargetMismatchError

_log = logging.getLogger("tinax.checkpointing")

_MODES = ("min", "max")
# What a run does when the loop goes on after its preemption save has committed.
EXIT = "exit"
CONTINUE = "continue"
_PREEMPTION_CHOICES = (EXIT, CONTINUE)
# Seconds the other processes of a job wait for the primary's promotions to end (a
# promotion copies a whole checkpoint to a bucket).
_PROMOTION_WAIT = 3600.0
# Seconds a process waits for the others at each meeting of a run (``timeout``).
DEFAULT_TIMEOUT = 60.0


def _check_count(value: object, *, what: str, minimum: int, allow_none: bool) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "an integer or None" if allow_none else "an integer"
        raise TypeError(f"{what} must be {kind} (booleans are not), got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{what} must be at least {minimum}, got {value}")
    return value


def _metric_label(best_by: str | Callable[[Any], Any] | None) -> str | None:
    if best_by is None:
        return None
    if isinstance(best_by, str):
        return best_by
    return getattr(best_by, "__name__", None) or type(best_by).__name__


def _metric_value(auxiliary: Mapping[Any, Any], best_by: str) -> Any:
    """The metric ``best_by`` names in the auxiliary state: a key, or a dotted path
    into nested mappings (``"eval.loss"``, as ``run_table`` names its column).

    Raises:
      ValueError: If there is no such key, naming the keys there are.
    """
    if best_by in auxiliary:
        return auxiliary[best_by]
    found: Any = auxiliary
    for part in best_by.split("."):
        if not isinstance(found, Mapping) or part not in found:
            raise ValueError(
                f"best_by={best_by!r} is not a key of the auxiliary state, nor a dotted "
                f"path into it (it has {sorted(map(str, auxiliary))})"
            )
        found = found[part]
    return found


def _sigterm_enabled() -> bool:
    return threading.current_thread() is threading.main_thread()


class TrainingRun:
    """The checkpoints of one training run: when to save, what to keep, where to resume.

    ``save`` starts a save when the interval (or a preemption) says so, with at most
    one save in flight; after each commit the run keeps the ``keep`` newest complete
    checkpoints plus the ``keep_best`` best by ``best_by`` and removes the others
    (crash-safe, see the module docstring). ``restore`` loads the newest checkpoint
    that loads, skipping damaged ones with a warning and setting them aside once an
    older one has loaded. A SIGTERM makes the next ``save`` save and wait for its
    commit, and only then sets ``preempted``, so the loop can ``break`` (a SIGTERM
    between a ``save`` and the loop's check is saved at the next step); a loop
    that goes on instead is ended at its next ``save`` (or ``should_save``) as
    SIGTERM would have ended it (``on_preemption="exit"``), or goes on saving by
    its interval (``on_preemption="continue"``).

    Two tiers: with ``local``, every save goes to that directory on fast storage of
    this machine, every ``local_every`` steps, and the local checkpoint of every
    ``save_every``-th step is promoted to ``directory`` (a path or ``gs://``) in the
    background: its files copied (each read once), its values checked against their
    saved checksums, committed as Orbax commits there. Each tier keeps its own
    (``local_keep`` newest locally, besides those waiting for their promotion;
    ``keep`` newest plus ``keep_best`` best in ``directory``); ``restore`` takes the
    newest checkpoint that loads from either (the local copy of a step in both); a
    SIGTERM's save is promoted before ``save`` returns; the run that resumes after a
    kill removes what a killed promotion left and promotes again what was waiting.

    Example::

      with TrainingRun(root, save_every=50, keep=2, keep_best=1, best_by="loss") as run:
          restored = run.restore(model_target, opt_target, rng_target, aux_target, iterator)
          start = 0 if restored is None else restored.step + 1
          for step in range(start, steps):
              ...
              run.save(step, model, opt_state, rng, {"loss": loss}, iterator)
              if run.preempted:
                  break

    Args:
      directory: The run's directory (local, or ``gs://``); created if missing.
      save_every: Save when ``step % save_every == 0``; ``None`` saves only when
        forced or preempted.
      keep: How many of the newest complete checkpoints to keep; ``None`` keeps
        every checkpoint (and ``keep_best`` is moot).
      keep_best: How many of the best checkpoints by ``best_by`` to keep besides.
      best_by: The metric: a key of the (dict) ``auxiliary`` state, or a callable
        of it returning a number. Required when ``keep_best`` > 0.
      best_mode: ``"min"`` or ``"max"``: which end of the metric is best.
      names: The five checkpointable names (``TrainingCheckpointNames``).
      handle_sigterm: Whether to install a SIGTERM handler (main thread only; the
        previous handler is chained, and put back by ``close``).
      on_preemption: What happens when the loop calls ``save`` or ``should_save``
        for a later step after the preemption save has committed (it did not
        ``break``). ``"exit"`` (the default): the run is closed and the process
        ends as SIGTERM would have ended it: with the default SIGTERM action it is
        killed by SIGTERM; where a Python handler was chained (or SIGTERM was
        ignored), ``SystemExit(143)`` is raised from that call. ``"continue"``:
        the loop goes on and saves by its interval again.
      must_exist: Refuse a directory that does not exist or holds no complete
        checkpoint (a job that must resume, not start afresh from a mistyped path;
        with ``local``, a checkpoint in either tier will do).
      local: A directory on fast storage of this machine (a local SSD, ``/dev/shm``)
        for a second tier: the run saves there every ``local_every`` steps and
        promotes the local checkpoint of every ``save_every``-th step to
        ``directory``, the durable tier. Created (with its parents) if missing:
        on a new machine the run resumes from ``directory``. In a job of several
        processes, either every process names one directory they share (processes
        of one host), or each its own (one on each host of a pod slice: each
        process saves its part there, and a promotion gathers every process's;
        see ``_hosts``).
      local_every: Save to ``local`` when ``step % local_every == 0`` (and at the
        steps the durable tier takes). Required with ``local``.
      local_keep: How many of the newest local checkpoints to keep (those waiting
        for their promotion are kept besides).
      timeout: Seconds a process of a job of several waits for the others at each
        meeting of the run (the end of a save, a restore, a promotion of parts:
        there, seconds of silence), before it raises ``ProcessTimeoutError`` naming
        those that did not arrive. Keep it below ``jax.distributed.initialize``'s
        ``heartbeat_timeout_seconds`` (100 by default), past which JAX itself ends
        every process when one has died.

    Raises:
      TypeError: If an argument is of the wrong kind.
      ValueError: If a count is out of range, ``best_mode`` is not ``"min"`` or
        ``"max"``, ``on_preemption`` not ``"exit"`` or ``"continue"``,
        ``keep_best`` > 0 without ``best_by``, ``local`` is not a local directory
        apart from ``directory``, ``local`` comes without ``local_every`` (or
        ``local_every`` without ``local``), ``local`` holds another run's
        checkpoints, or some of the job's processes share a local directory and
        others do not.
      FileNotFoundError: If ``directory`` cannot be created (its parent is
        missing), or with ``must_exist`` if it is missing or has no checkpoint.
      NotADirectoryError: If ``local`` is a file (nothing is created).
      PermissionError: If ``directory`` or ``local`` cannot be created, its parent being
        read-only (nothing is left behind).
      OSError: If ``local`` cannot be created otherwise.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        save_every: int | None = None,
        keep: int | None = None,
        keep_best: int = 0,
        best_by: str | Callable[[Any], Any] | None = None,
        best_mode: str = "min",
        names: TrainingCheckpointNames | None = None,
        handle_sigterm: bool = True,
        on_preemption: str = EXIT,
        must_exist: bool = False,
        local: str | os.PathLike[str] | None = None,
        local_every: int | None = None,
        local_keep: int = 2,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._save_every = _check_count(save_every, what="save_every", minimum=1, allow_none=True)
        self._keep = _check_count(keep, what="keep", minimum=1, allow_none=True)
        self._keep_best = _check_count(keep_best, what="keep_best", minimum=0, allow_none=False)
        if best_by is not None and not isinstance(best_by, str) and not callable(best_by):
            raise TypeError(
                f"best_by must be a key of the auxiliary state, a callable or None, "
                f"got {type(best_by).__name__}"
            )
        if self._keep_best and best_by is None:
            raise ValueError("keep_best > 0 needs best_by: which metric makes a checkpoint best")
        if not isinstance(best_mode, str):
            raise TypeError(f"best_mode must be a string, got {type(best_mode).__name__}")
        if best_mode not in _MODES:
            raise ValueError(f"best_mode must be 'min' or 'max', got {best_mode!r}")
        if names is not None and not isinstance(names, TrainingCheckpointNames):
            raise TypeError(
                f"names must be a TrainingCheckpointNames or None, got {type(names).__name__}"
            )
        if not isinstance(handle_sigterm, bool):
            raise TypeError(f"handle_sigterm must be a bool, got {type(handle_sigterm).__name__}")
        if not isinstance(on_preemption, str):
            raise TypeError(f"on_preemption must be a string, got {type(on_preemption).__name__}")
        if on_preemption not in _PREEMPTION_CHOICES:
            raise ValueError(f"on_preemption must be 'exit' or 'continue', got {on_preemption!r}")
        if not isinstance(must_exist, bool):
            raise TypeError(f"must_exist must be a bool, got {type(must_exist).__name__}")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
        if not timeout > 0:
            raise ValueError(f"timeout must be more than 0 seconds, got {timeout}")
        self._timeout = float(timeout)
        every = _check_count(local_every, what="local_every", minimum=1, allow_none=True)
        kept_locally = _check_count(local_keep, what="local_keep", minimum=1, allow_none=False)
        if local is None and every is not None:
            raise ValueError("local_every needs local: the directory of the local tier")
        if local is not None and every is None:
            raise ValueError("local needs local_every: how many steps apart the local saves are")
        local_location = None if local is None else _local_location(local, directory)
        self._best_by = best_by
        self._best_mode = best_mode
        self._on_preemption = on_preemption
        self._names = names or TrainingCheckpointNames()
        self._made = False
        if must_exist:
            self._root = _paths.save_directory(directory, what="run directory")
        else:
            self._root, self._made = _run_directory(directory)
        self._primary = _processes.process_index() == 0
        # Whether each process keeps a part of every local checkpoint in a local
        # directory of its own (``_host_parts``); it then keeps that tier itself.
        self._parts = False
        self._local: LocalTier | None = None
        if local_location is not None:
            assert every is not None and kept_locally is not None
            try:
                made = _make_local(local_location)
                kind = _hosts.local_tier_kind(local_location, timeout=self._timeout)
                self._parts = kind == _hosts.PER_PROCESS
                self._local = LocalTier(local_location, self._root, every, kept_locally, made)
            except BaseException:
                if self._made:  # nothing left behind of a run that did not open
                    with contextlib.suppress(OSError):
                        os.rmdir(self._root.path)
                raise
        if must_exist and not (self._complete() or (self._local and self._local.complete())):
            raise FileNotFoundError(
                f"run directory {str(self._root)!r} holds no complete checkpoint to resume "
                "(must_exist=True); check the path"
            )
        # ``_lock``: the local tier's record and the promotions; ``_durable_lock``: the
        # run's record in ``directory`` and its retention, which on a bucket takes
        # requests that no save call should wait for.
        self._lock = threading.RLock()
        self._durable_lock = threading.RLock()
        self._pending: SaveResponse[None] | None = None
        self._pending_step: int | None = None
        self._preempted = False
        self._passed_over: tuple[PassedOver, ...] = ()
        # The step the last restore resumed from, until the next save has set aside the
        # checkpoints of later steps (the branch the run leaves).
        self._went_on_from: int | None = None
        # The step whose save the preemption made, once that save has committed.
        self._preemption_saved: int | None = None
        self._decided: tuple[int, bool] | None = None
        self._sync = _processes.preemption_sync()
        self._previous_handler: Any = None
        self._handler_installed = False
        self._closed = False
        self._record = self._read_record()
        # Two tiers: the promotions started by this process (the primary), the
        # failures not yet reported, and whether the ones a killed run left are started.
        self._promotions: list[Promotion] = []
        self._promotion_errors: list[BaseException] = []
        self._promotions_started = 0
        self._resumed_promotions = self._local is None or not self._keeps_local
        self._durable_steps: set[int] = set()
        # The checkpoints whose load failed on this process in the last restore.
        self._failed_here: set[Location] = set()
        if self._primary:
            # A run of one tier writes its record at saves only: opening it to read it
            # changes nothing.
            self._clean_up()
            if self._local is not None:
                # Promotions alone write the durable tier: whatever did not commit
                # there was left by a killed one, whatever its step.
                _run_files.clean_up(self._root, None, every_unfinished=True)
        if self._local is not None and self._keeps_local:
            _run_files.clean_up(self._local.root, max(self._local.complete(), default=None))
            self._durable_steps = set(self._complete())
            self._release_promoted()
            # Each tier's record names the other from the start: a listing of either
            # finds both, and no other run takes this local directory.
            with self._lock, self._durable_lock:
                self._local.write_record(self._policy())
                if self._primary:
                    self._write_record()
        elif self._primary:
            self._durable_steps = set(self._complete())
        if handle_sigterm and self._sync is None and _sigterm_enabled():
            # In a multi-process job JAX's preemption service owns SIGTERM (its
            # notifier tells every process); replacing its handler would blind it.
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._handler_installed = True

    # -- what the run holds ------------------------------------------------------------

    @property
    def directory(self) -> str:
        """The run's directory."""
        return str(self._root)

    @property
    def preempted(self) -> bool:
        """Whether the run was preempted and its preemption save has committed: the
        loop may end now without losing a step.

        A SIGTERM (on any process of the job) makes the next ``save`` (or
        ``should_save``) the preemption save, whatever the interval; this turns true
        only once that save has committed. A SIGTERM that lands after a ``save`` and
        before the loop reads this flag leaves it false until the next step's save
        has committed, so ``if run.preempted: break`` never ends a loop with its
        newest steps unsaved.
        """
        return self._preemption_saved is not None

    @property
    def preemption_requested(self) -> bool:
        """Whether a SIGTERM (on any process of the job) asked the run to stop; the
        next ``save`` is then the preemption save, and ``preempted`` turns true once
        it has committed."""
        return self._preempted

    @property
    def steps(self) -> list[int]:
        """The steps of the run's complete checkpoints (in either tier), ascending."""
        found = set(self._complete())
        if self._local is not None:
            found |= set(self._local.complete())
        return sorted(found)

    @property
    def durable_steps(self) -> list[int]:
        """The steps of the complete checkpoints in ``directory``, ascending."""
        return sorted(self._complete())

    @property
    def local_steps(self) -> list[int]:
        """The steps of the complete checkpoints in the local tier (none without one)."""
        return [] if self._local is None else sorted(self._local.complete())

    @property
    def local_directory(self) -> str | None:
        """The local tier's directory, or ``None`` for a run of one tier."""
        return None if self._local is None else str(self._local.root)

    @property
    def _keeps_local(self) -> bool:
        """Whether this process keeps the local tier (its record, retention and
        promotions): the primary, or every process where each has a part."""
        return self._primary or self._parts

    def path(self, step: int) -> str:
        """Where the checkpoint of ``step`` is (or would be) in ``directory``."""
        return str(self._root / names.run_checkpoint_name(check_step(step)))

    def _complete(self) -> dict[int, Location]:
        """The committed checkpoints of ``directory`` by step."""
        return _run_files.complete_checkpoints(self._root)

    # -- saving ------------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        """Whether ``save(step, ...)`` would save: the interval says so (either tier's,
        with two), or the job is preempted. In a multi-process job every process
        answers alike at every step (JAX's preemption sync point), so call it (or
        ``save``) at every step.

        After the preemption save has committed, a later step ends the process with
        ``on_preemption="exit"`` (see the class), and is judged by the interval alone
        with ``"continue"``.
        """
        step = check_step(step)
        if self._decided is not None and self._decided[0] == step:
            return self._decided[1]
        if self._sync is not None and not self._preempted and self._sync.reached_sync_point(step):
            self._preempted = True
            _log.warning("preempted: every process saves at step %d", step)
        interval = self._promotes(step) or (
            self._local is not None and step % self._local.every == 0
        )
        if self._preemption_saved is not None and step != self._preemption_saved:
            if self._on_preemption == EXIT:
                self._end_after_preemption(step)
            decision = interval
        else:
            decision = self._preempted or interval
        self._decided = (step, decision)
        return decision

    def save(
        self,
        step: int,
        model: Any,
        optimizer: Any,
        rng: Any,
        auxiliary: Any,
        iterator: grain.DatasetIterator,
        *,
        force: bool = False,
    ) -> SaveResponse[None] | None:
        """Saves the training state of ``step`` if ``should_save(step)`` (or ``force``).

        The previous save is waited for first, so at most one is in flight. After
        the save commits, retention runs (before the response gives its result
        out). After a preemption the save is waited for before this returns.

        With two tiers the save goes to the local tier; once it has committed, the
        local checkpoint of a step on the ``save_every`` interval (or a forced or
        preemption save) is promoted to ``directory`` in the background. One
        promotion runs at a time and one more may wait behind it: a save that
        would queue a third waits first for the running one to end. After a
        preemption the promotion, too, is waited for before this returns.

        Args:
          step: The training step (a non-negative integer).
          model, optimizer, rng, auxiliary, iterator: As for
            ``save_training_checkpoint``. With ``best_by``, ``auxiliary`` carries
            the metric.
          force: Save whatever the interval says (with two tiers: and promote).

        Returns:
          The save's response (an Orbax ``AsyncResponse``), or ``None`` if the step
          was not saved.

        Raises:
          TypeError, ValueError: As ``save_training_checkpoint`` does, or if the
            metric cannot be found in ``auxiliary``.
          FileExistsError: If the step has a checkpoint already.
          PermissionError: If the run's directory (or its local tier) is read-only for
            this process: a paragraph saying so, before anything is written.
          Exception: The failure of the previous save, if it failed; after a
            preemption, the failure of its promotion.
          RuntimeError: If the run is closed.
        """
        if self._closed:
            raise RuntimeError(f"the training run {self.directory!r} is closed")
        if not isinstance(force, bool):
            raise TypeError(f"force must be a bool, got {type(force).__name__}")
        step = check_step(step)
        if not (self.should_save(step) or force):
            return None
        metric = self._metric(auxiliary)
        if self._primary:
            _run_files.check_writable(self._root, step, "the run directory")
            if self._local is not None:
                _run_files.check_writable(self._local.root, step, "the local tier")
        self._wait_save()
        self._go_on(step)
        promote = False
        if self._local is None:
            where, after = self._root, self._retain
        else:
            promote = force or self._preempted or self._promotes(step)
            where = self._local.root
            after = functools.partial(self._after_local_commit, step, promote)
            if self._keeps_local:
                self._resume_promotions()
                if promote:
                    self._make_room()
        if self._primary or self._parts:
            _run_files.clear_marked(where, step)
            self._check_new_step(step)
            if self._local is None:
                with self._durable_lock:
                    if metric is not None:
                        self._record["metrics"][str(step)] = metric
                    self._write_record()
            else:
                with self._lock:
                    if metric is not None:
                        self._local.metrics[str(step)] = metric
                    self._local.write_record(self._policy())
        state = TrainingCheckpoint(step, model, optimizer, rng, auxiliary, iterator)
        with _processes.waiting(self._timeout):
            if self._parts:
                response = _host_parts.start_save(
                    where / names.run_checkpoint_name(step),
                    state,
                    names=self._names,
                    after_commit=after,
                )
            else:
                response = start_training_save(
                    str(where / names.run_checkpoint_name(step)),
                    state,
                    names=self._names,
                    after_commit=after if self._primary else None,
                )
        self._pending, self._pending_step = response, step
        if self._preempted and self._preemption_saved is None:
            _log.warning("preempted: waiting for the save of step %d to commit", step)
            self._wait_save()
            if self._local is not None:
                if not promote and self._keeps_local:
                    # The notice landed after this save was decided a local one only
                    # (while it started, say): it is the preemption save all the same.
                    self._promote_now(step)
                _log.warning("preempted: waiting for the promotion of step %d to commit", step)
                self._wait_promotions()
                self._check_durable(step)
            self._preemption_saved = step
            _log.warning(
                "preempted: the save of step %d has committed%s; the loop can end (%s)",
                step,
                "" if self._local is None else f" in {self.directory!r}",
                "a later save ends the process"
                if self._on_preemption == EXIT
                else "the run saves by its interval again",
            )
        return response

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

    def _promotes(self, step: int) -> bool:
        """Whether the interval of ``directory`` takes ``step``."""
        return self._save_every is not None and step % self._save_every == 0

    def _check_new_step(self, step: int) -> None:
        """Refuses a step the run has a checkpoint of, before anything is written, and
        says when a save goes back behind the run's newest checkpoint."""
        name = names.run_checkpoint_name(step)
        where = (self._root if self._local is None else self._local.root) / name
        # With two tiers, the durable tier as this run last listed it: no request to a
        # bucket on each save.
        if (
            (where / names.CHECKPOINT_METADATA).exists()
            or (where / names.COMMIT_SUCCESS).exists()
            or (self._local is not None and step in self._durable_steps)
        ):
            tier = "" if self._local is None else ", in either tier"
            raise FileExistsError(
                f"run {self.directory!r} has a checkpoint of step {step} already "
                f"({name}{tier}; saves never overwrite): resume with run.restore(...) and "
                "go on from the restored step + 1"
            )
        # The records' kept steps, as of the last retention: no listing on each save.
        kept = list(self._record["kept"])
        if self._local is not None:
            kept.extend(self._local.kept)
        newest = max((int(k) for k in kept if str(k).isdigit()), default=None)
        if newest is not None and step < newest:
            _log.warning(
                "saving step %d of run %r, whose newest checkpoint is step %d: did this job "
                "resume with run.restore(...) first?",
                step,
                self.directory,
                newest,
            )

    def _metric(self, auxiliary: Any) -> float | None:
        if self._best_by is None:
            return None
        if isinstance(self._best_by, str):
            if not isinstance(auxiliary, Mapping):
                raise TypeError(
                    f"best_by={self._best_by!r} needs a mapping as auxiliary state, "
                    f"got {type(auxiliary).__name__}"
                )
            value = _metric_value(auxiliary, self._best_by)
        else:
            value = self._best_by(auxiliary)
        shape = getattr(value, "shape", ())
        if isinstance(value, bool) or shape != ():
            raise TypeError(
                f"the metric {_metric_label(self._best_by)!r} must be a number or a 0-d "
                f"array, got {type(value).__name__}" + (f" of shape {shape}" if shape else "")
            )
        try:
            # Python and NumPy numbers, 0-d NumPy and JAX arrays (bfloat16 too).
            number = float(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"the metric {_metric_label(self._best_by)!r} must be a number, "
                f"got {type(value).__name__}"
            ) from None
        return number

    def wait(self) -> None:
        """Waits for the save in flight (and its retention) to end; with two tiers, for
        every promotion started too.

        Raises:
          Exception: That save's failure, or the first promotion failure since the
            last ``wait`` (a local checkpoint whose values are corrupt is not
            reported: it is set aside, with a warning, and the run goes on).
        """
        self._wait_save()
        if self._local is not None:
            self._wait_promotions()

    def _wait_save(self) -> None:
        """Waits for the save in flight (and its retention) to end."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        error: Exception | None = None
        try:
            pending.result()
        except Exception as e:
            error = e
        # Every process has a save in flight here or none. The primary's ends after
        # its retention: once all have arrived, every process sees what it kept.
        _processes.agree(
            error, what=f"the end of the save of step {self._pending_step}", timeout=self._timeout
        )

    def close(self) -> None:
        """Waits for the save in flight (and every promotion) and puts the previous
        SIGTERM handler back."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._local is not None and self._keeps_local:
                self._resume_promotions()
            self.wait()
        finally:
            if self._handler_installed:
                self._handler_installed = False
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(signal.SIGTERM, self._previous_handler)

    # -- two tiers ---------------------------------------------------------------------

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

    def __enter__(self) -> TrainingRun:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        if error is None:
            self.close()
            return
        # The body's error is the one to see; a failing save is only logged.
        try:
            self.close()
        except Exception:
            _log.exception("the save in flight of %s failed", self.directory)

    def _on_sigterm(self, signum: int, frame: types.FrameType | None) -> None:
        self._preempted = True
        self._decided = None
        previous = self._previous_handler
        if callable(previous):
            previous(signum, frame)

    def _end_after_preemption(self, step: int) -> None:
        """Ends the process as SIGTERM would have: the loop went on after its
        preemption save had committed."""
        previous = self._previous_handler if self._handler_installed else None
        _log.warning(
            "preempted: the save of step %d has committed and the loop went on to step %d; "
            "ending the process as SIGTERM would (TrainingRun(on_preemption='continue') "
            "lets a loop go on; `if run.preempted: break` ends it by itself)",
            self._preemption_saved,
            step,
        )
        self.close()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if previous == signal.SIG_DFL:
            # The default action: the process is killed by the signal, as if this run
            # had never caught it.
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the signal is delivered while this sleeps
        raise SystemExit(128 + signal.SIGTERM)

    # -- resuming ----------------------------------------------------------------------

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

    # -- retention ---------------------------------------------------------------------

    def _retain(self) -> None:
        """After a commit: keeps what the policy keeps, removes the rest, and records why."""
        with self._durable_lock:
            complete = self._complete()
            kept = self._kept(complete)
            for step in sorted(set(complete) - set(kept)):
                self._remove(complete[step])
            self._clean_up(newest=max(complete, default=None))
            for member in ("metrics", names.RUN_RECORD_HEALTH):
                self._record[member] = {
                    key: value
                    for key, value in self._record.get(member, {}).items()
                    if int(key) in kept
                }
            self._record["kept"] = {str(step): reasons for step, reasons in sorted(kept.items())}
            self._durable_steps = set(kept)
            self._write_record()

    def _kept(self, complete: dict[int, Location]) -> dict[int, list[str]]:
        """Why each checkpoint that stays is kept, by step."""
        steps = sorted(complete, reverse=True)
        if self._keep is None:
            return {step: [words.KEPT_ALL] for step in steps}
        kept: dict[int, list[str]] = {}
        for step in steps[: self._keep]:
            kept.setdefault(step, []).append(words.kept_newest(self._keep))
        if self._keep_best:
            label = _metric_label(self._best_by) or "metric"
            metrics = self._record["metrics"]
            scored = [
                (metrics[str(step)], step)
                for step in steps
                if isinstance(metrics.get(str(step)), int | float)
                and math.isfinite(metrics[str(step)])
            ]
            # Best first; among equals, the newer.
            sign = 1 if self._best_mode == "min" else -1
            scored.sort(key=lambda item: (sign * item[0], -item[1]))
            for _, step in scored[: self._keep_best]:
                kept.setdefault(step, []).append(words.kept_best(label, self._keep_best))
        for step in steps:
            try:
                preflight.check(complete[step])
            except (ValueError, OSError):
                continue
            if step not in kept:
                kept[step] = [words.KEPT_NEWEST_SOUND]
            break
        return kept

    def _remove(self, where: Location) -> None:
        _run_files.remove_checkpoint(where)

    def _clean_up(self, newest: int | None = None) -> None:
        """Finishes removals a killed run left, and removes interrupted saves older
        than the newest complete checkpoint."""
        if newest is None:
            newest = max(self._complete(), default=None)
        _run_files.clean_up(self._root, newest)

    # -- the run's record --------------------------------------------------------------

    def _policy(self) -> dict[str, Any]:
        policy: dict[str, Any] = {
            "save_every": self._save_every,
            "keep": self._keep,
            "keep_best": self._keep_best,
            "best_by": _metric_label(self._best_by),
            "best_mode": self._best_mode,
        }
        if self._local is not None:
            if not self._parts:
                # Where each process keeps a part, no one directory is the local tier
                # (a listing of the durable one must not take process 0's for it).
                policy[tiers.LOCAL] = self._local.root.path
                policy[tiers.LOCAL_HOST] = socket.gethostname()
            policy[tiers.LOCAL_EVERY] = self._local.every
            policy[tiers.LOCAL_KEEP] = self._local.keep
        return policy

    def _read_record(self) -> dict[str, Any]:
        found = read_run_record(self._root)
        metrics = {} if found is None else found.get("metrics", {})
        kept = {} if found is None else found.get("kept", {})
        healths = {} if found is None else found.get(names.RUN_RECORD_HEALTH, {})
        went_on = [] if found is None else found.get(names.RUN_RECORD_WENT_ON, [])
        record = {
            "format": names.RUN_RECORD_FORMAT,
            "policy": self._policy(),
            "metrics": dict(metrics) if isinstance(metrics, dict) else {},
            "kept": dict(kept) if isinstance(kept, dict) else {},
            names.RUN_RECORD_HEALTH: dict(healths) if isinstance(healths, dict) else {},
            names.RUN_RECORD_WENT_ON: list(went_on) if isinstance(went_on, list) else [],
        }
        if self._local is not None:
            record[tiers.TIER] = tiers.DURABLE_TIER
        return record

    def _write_record(self) -> None:
        self._record["policy"] = self._policy()
        self._record["updated_ns"] = time.time_ns()
        data = json.dumps(self._record, indent=1, sort_keys=True).encode("utf-8")
        removal.replace_file(self._root / names.RUN_RECORD, data)


def _passes_preflight(where: Location) -> bool:
    """Whether a checkpoint passes the check every load makes first."""
    try:
        preflight.check(where)
    except (ValueError, OSError):
        return False
    return True


def _run_directory(directory: object) -> tuple[Location, bool]:
    """The run's directory, made if missing; and whether this call made it."""
    where = _paths.location(directory, what="directory")
    made = not where.storage.implicit_directories and not where.exists()
    removal.make_directory(where)
    return _paths.save_directory(directory, what="directory"), made


def _local_location(local: object, directory: object) -> Location:
    """The local tier's directory, checked: on this machine, and apart from ``directory``.

    Raises:
      TypeError: If ``local`` is not a path.
      ValueError: If it is a ``gs://`` URL, or it and ``directory`` are one directory
        or one holds the other.
    """
    where = _paths.location(local, what="local")
    tiers.check_local_tier(where, _paths.location(directory, what="directory"))
    return where


def _make_local(local: Location) -> bool:
    """Makes the local tier's directory (with its parents: a freshly mounted disk lacks
    them); whether it was missing.

    Raises:
      NotADirectoryError: If ``local`` (or a parent) is a file.
      PermissionError: If it cannot be made for its parent is read-only.
    """
    missing = not local.exists()
    if not missing and not os.path.isdir(local.path):
        raise NotADirectoryError(
            f"TrainingRun(local={local.path!r}): that is a file, not a directory. local is "
            "the directory of the run's local tier, on fast storage of this machine (a local "
            "SSD, /dev/shm), created if missing: give a directory, or leave local out for a "
            "run of one tier. Nothing was created",
        )
    try:
        os.makedirs(local.path, exist_ok=True)
    except (NotADirectoryError, FileExistsError):
        raise NotADirectoryError(
            f"TrainingRun(local={local.path!r}): a part of that path is a file, not a "
            "directory; give a directory for the run's local tier. Nothing was created",
        ) from None
    except PermissionError as e:
        raise PermissionError(
            f"TrainingRun(local={local.path!r}): it cannot be made, a parent is read-only "
            f"for this process ({os.strerror(e.errno or errno.EACCES)}); give a directory "
            "this process can write for the run's local tier. Nothing was created",
        ) from None
    return missing
