"""A training run: ``TrainingRun``, which saves by its interval, keeps what its policy
keeps, resumes, and handles preemption, one job per module:

- ``_run_retention``: the run's directory, its record, what it keeps (``RunRecord``);
- ``_run_tiers``: a two-tier run's promotions to the durable tier (``TwoTiers``);
- ``_run_restore``: the resume, on every process alike, past diverged checkpoints, and
  the run going on from an earlier step (``Restore``);
- ``_run_preemption``: SIGTERM, and the end of a loop that goes on (``Preemption``);
- here: the arguments, the interval, the save itself, and the waits for what is in
  flight. (Over 500 lines: a fifth of them the class's documentation of its
  arguments, and as much again the checks of them.)

What a run directory needs, whichever tier it is, is in ``_run_files``; the local tier
in ``_local_tier``; a promotion in ``_promotion``; a job of several hosts in
``_hosts`` and ``_host_parts``. On several processes the primary process (process 0)
alone writes the durable tier's record, removes its checkpoints and commits
promotions; every process saves, restores and decides to save alike.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import signal
import threading
import types
from collections.abc import Callable
from typing import Any

import grain

from tinax import _paths
from tinax._format.naming import names
from tinax._format.records import tiers
from tinax._format.storage import removal
from tinax._format.storage.location import Location
from tinax.checkpointing import _host_parts, _hosts, _processes, _run_files
from tinax.checkpointing._local_tier import LocalTier
from tinax.checkpointing._promotion import Promotion
from tinax.checkpointing._response import SaveResponse
from tinax.checkpointing._resume import (
    PassedOver,
)
from tinax.checkpointing._run_preemption import Preemption
from tinax.checkpointing._run_restore import Restore
from tinax.checkpointing._training import (
    TrainingCheckpoint,
    TrainingCheckpointNames,
    check_step,
    start_training_save,
)

_log = logging.getLogger("tinax.checkpointing")

_MODES = ("min", "max")
# What a run does when the loop goes on after its preemption save has committed.
EXIT = "exit"
CONTINUE = "continue"
_PREEMPTION_CHOICES = (EXIT, CONTINUE)
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


def _sigterm_enabled() -> bool:
    return threading.current_thread() is threading.main_thread()


class TrainingRun(Restore, Preemption):
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
        kept_best = _check_count(keep_best, what="keep_best", minimum=0, allow_none=False)
        assert kept_best is not None  # not allowed to be None
        self._keep_best = kept_best
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

    def _promotes(self, step: int) -> bool:
        """Whether the interval of ``directory`` takes ``step``."""
        return self._save_every is not None and step % self._save_every == 0

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

    # -- resuming ----------------------------------------------------------------------

    # -- retention ---------------------------------------------------------------------

    # -- the run's record --------------------------------------------------------------


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
