"""A training run: the save interval, retention, resume and preemption in one object.

(Over 500 lines: one class, whose interval, retention, resume and preemption share
the run's state and its record; split, each part would reach into the others.)

A run is a directory of checkpoints named ``step_<step>`` (``names.run_checkpoint_name``)
and one small JSON record beside them (``names.RUN_RECORD``): the run's policy, the
metric of every step saved, and why each checkpoint is kept. The record is a file,
so no listing takes it for a checkpoint, and it is replaced atomically.

Removal is crash-safe. A checkpoint is removed by first writing the deletion marker
(``names.DELETION_MARKER``) into it, then its commit records, then everything else,
the marker last. From the marker's first byte on, listings show it as
``being removed`` and no load accepts it; a kill at any instant leaves either a
complete checkpoint or one marked as being removed, never a half-removed one that
looks complete. The next run finishes what a killed one left.

A checkpoint that ``restore`` skips because its data does not load is set aside once
an older one has loaded: the record ``names.CORRUPT_RECORD`` (why, and when) is written
into it, then it is renamed ``<name>.tinax-corrupt`` (``names.corrupt_name``), kept for
inspection. The steps after the one restored belong to the resumed job, which saves them
again under their own names. (On object stores, which cannot rename, it stays marked in
place, and the save of its step removes it first.) Listings call it ``corrupt (found by
restore)`` and loads refuse it.

On several processes the primary process (process 0) alone writes the record and
removes checkpoints; every process saves, restores and decides to save alike.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import grain

from tinax import _claims, _paths
from tinax._format import names, preflight, removal, words
from tinax._format.runrecord import read_run_record
from tinax._format.storage import FILE, Location
from tinax.checkpointing import _processes
from tinax.checkpointing._response import SaveResponse
from tinax.checkpointing._training import (
    TrainingCheckpoint,
    TrainingCheckpointNames,
    check_step,
    load_training_checkpoint,
    start_training_save,
)
from tinax.checkpointing._verdict import TargetMismatchError

_log = logging.getLogger("tinax.checkpointing")

_MODES = ("min", "max")
# What a run does when the loop goes on after its preemption save has committed.
EXIT = "exit"
CONTINUE = "continue"
_PREEMPTION_CHOICES = (EXIT, CONTINUE)


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
        checkpoint (a job that must resume, not start afresh from a mistyped path).

    Raises:
      TypeError: If an argument is of the wrong kind.
      ValueError: If a count is out of range, ``best_mode`` is not ``"min"`` or
        ``"max"``, ``on_preemption`` not ``"exit"`` or ``"continue"``, or
        ``keep_best`` > 0 without ``best_by``.
      FileNotFoundError: If ``directory`` cannot be created (its parent is
        missing), or with ``must_exist`` if it is missing or has no checkpoint.
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
        if must_exist and not self._complete():
            raise FileNotFoundError(
                f"run directory {str(self._root)!r} holds no complete checkpoint to resume "
                "(must_exist=True); check the path"
            )
        self._lock = threading.RLock()
        self._pending: SaveResponse[None] | None = None
        self._preempted = False
        # The step whose save the preemption made, once that save has committed.
        self._preemption_saved: int | None = None
        self._decided: tuple[int, bool] | None = None
        self._sync = _processes.preemption_sync()
        self._previous_handler: Any = None
        self._handler_installed = False
        self._closed = False
        self._record = self._read_record()
        if self._primary:
            # The record is written by saves only: opening a run to read it changes nothing.
            self._clean_up()
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
        """The steps of the run's complete checkpoints, ascending."""
        return sorted(self._complete())

    def path(self, step: int) -> str:
        """Where the checkpoint of ``step`` is (or would be)."""
        return str(self._root / names.run_checkpoint_name(check_step(step)))

    def _complete(self) -> dict[int, Location]:
        """The run's committed checkpoints by step: named as the run names them, not
        being removed, and with a commit record."""
        found: dict[int, Location] = {}
        root = self._root.snapshot()
        for name, entry in root.entries().items():
            match = names.RUN_CHECKPOINT.match(name)
            if match is None or entry.kind == FILE:
                continue
            where = root / name
            inside = where.entries()
            if (
                names.DELETION_MARKER in inside
                or names.CORRUPT_RECORD in inside
                or names.CHECKPOINT_METADATA not in inside
            ):
                continue
            found[int(match.group(1))] = self._root / name
        return found

    # -- saving ------------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        """Whether ``save(step, ...)`` would save: the interval says so, or the job is
        preempted. In a multi-process job every process answers alike at every step
        (JAX's preemption sync point), so call it (or ``save``) at every step.

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
        interval = self._save_every is not None and step % self._save_every == 0
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

        Args:
          step: The training step (a non-negative integer).
          model, optimizer, rng, auxiliary, iterator: As for
            ``save_training_checkpoint``. With ``best_by``, ``auxiliary`` carries
            the metric.
          force: Save whatever the interval says.

        Returns:
          The save's response (an Orbax ``AsyncResponse``), or ``None`` if the step
          was not saved.

        Raises:
          TypeError, ValueError: As ``save_training_checkpoint`` does, or if the
            metric cannot be found in ``auxiliary``.
          FileExistsError: If the step has a checkpoint already.
          Exception: The failure of the previous save, if it failed.
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
        self.wait()
        if self._primary:
            self._clear_marked(step)
            self._check_new_step(step)
        if self._primary:
            with self._lock:
                if metric is not None:
                    self._record["metrics"][str(step)] = metric
                self._write_record()
        response = start_training_save(
            self.path(step),
            step,
            model,
            optimizer,
            rng,
            auxiliary,
            iterator,
            names=self._names,
            after_commit=self._retain if self._primary else None,
        )
        self._pending = response
        if self._preempted and self._preemption_saved is None:
            _log.warning("preempted: waiting for the save of step %d to commit", step)
            self.wait()
            self._preemption_saved = step
            _log.warning(
                "preempted: the save of step %d has committed; the loop can end (%s)",
                step,
                "a later save ends the process"
                if self._on_preemption == EXIT
                else "the run saves by its interval again",
            )
        return response

    def _check_new_step(self, step: int) -> None:
        """Refuses a step the run has a checkpoint of, before anything is written, and
        says when a save goes back behind the run's newest checkpoint."""
        where = self._root / names.run_checkpoint_name(step)
        if (where / names.CHECKPOINT_METADATA).exists() or (where / names.COMMIT_SUCCESS).exists():
            raise FileExistsError(
                f"run {self.directory!r} has a checkpoint of step {step} already "
                f"({where.name}; saves never overwrite): resume with run.restore(...) and "
                "go on from the restored step + 1"
            )
        # The record's kept steps, as of the last retention: no listing on each save.
        newest = max((int(k) for k in self._record["kept"] if str(k).isdigit()), default=None)
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
        """Waits for the save in flight (and its retention) to end.

        Raises:
          Exception: That save's failure.
        """
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
        _processes.agree(error, what=f"the end of the save to {pending.path!r}", timeout=300.0)

    def close(self) -> None:
        """Waits for the save in flight and puts the previous SIGTERM handler back."""
        if self._closed:
            return
        self._closed = True
        try:
            self.wait()
        finally:
            if self._handler_installed:
                self._handler_installed = False
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(signal.SIGTERM, self._previous_handler)

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
    ) -> TrainingCheckpoint | None:
        """Loads the newest checkpoint that loads (or the one of ``step``).

        Checkpoints are tried newest first. One whose data does not load (corrupt,
        unreadable, parts missing) is skipped with a warning naming it and why,
        and the next older one is tried; ``iterator`` moves only with the one that
        loads. Once one has loaded, the ones skipped are set aside (renamed
        ``<name>.tinax-corrupt``, kept for inspection; see the module docstring),
        so that the resumed job can save their steps again. The targets are as for
        ``load_training_checkpoint``. A fresh start (no checkpoint) is logged,
        naming the directory.

        Args:
          model_target, optimizer_target, rng_target, auxiliary_target: Restore targets.
          iterator: The Grain iterator to restore in place.
          step: Restore exactly this step (no fallback).

        Returns:
          The restored ``TrainingCheckpoint``, or ``None`` if the run has no
          checkpoint yet (a fresh start).

        Raises:
          TargetMismatchError: If a target does not match a checkpoint.
          FileNotFoundError: If ``step`` has no complete checkpoint.
          ValueError: If no checkpoint loads (each one's reason is named), or the
            one of ``step`` does not.
        """
        complete = self._complete()
        if step is not None:
            step = check_step(step)
            if step not in complete:
                raise FileNotFoundError(
                    f"run {self.directory!r} has no complete checkpoint of step {step} "
                    f"(it has {sorted(complete)})"
                )
            return self._load(
                complete[step],
                model_target,
                optimizer_target,
                rng_target,
                auxiliary_target,
                iterator,
            )
        failures: list[tuple[Location, str]] = []
        for candidate in sorted(complete, reverse=True):
            where = complete[candidate]
            try:
                restored = self._load(
                    where, model_target, optimizer_target, rng_target, auxiliary_target, iterator
                )
            except TargetMismatchError:
                raise
            except (ValueError, OSError) as e:
                reason = f"{type(e).__name__}: {e}"
                failures.append((where, reason))
                warnings.warn(
                    f"skipping checkpoint {str(where)!r}, which does not load ({reason}); "
                    "trying the next older one",
                    RuntimeWarning,
                    stacklevel=2,
                )
                continue
            if self._primary:
                for skipped, reason in failures:
                    self._set_aside(skipped, reason)
            return restored
        if failures:
            raise ValueError(
                f"no checkpoint of run {self.directory!r} loads: "
                + "; ".join(f"{where.name}: {reason}" for where, reason in failures)
            )
        _log.warning(
            "no checkpoint to resume in the run directory %r%s: a fresh start "
            "(TrainingRun(..., must_exist=True) refuses one)",
            self.directory,
            ", which this run has just created" if self._made else "",
        )
        return None

    def _set_aside(self, where: Location, reason: str) -> None:
        """Marks a checkpoint the restore refused, then moves it out of its step's way."""
        try:
            held = _claims.claim(where)
        except FileExistsError as e:
            _log.warning("not setting %s aside: %s", where, e)
            return
        try:
            record = {
                "format": names.CORRUPT_RECORD_FORMAT,
                "name": where.name,
                "reason": reason,
                "found_ns": time.time_ns(),
            }
            removal.replace_file(
                where / names.CORRUPT_RECORD, json.dumps(record, indent=1).encode("utf-8")
            )
            if not where.storage.commits_by_rename:
                _log.warning(
                    "checkpoint %s does not load (%s): marked corrupt in place; the save "
                    "of its step removes it",
                    where,
                    reason,
                )
                return
            for attempt in range(1, 1000):
                aside = where.parent / names.corrupt_name(where.name, attempt)
                if aside.exists():
                    continue
                os.rename(where.path, aside.path)
                _log.warning(
                    "checkpoint %s does not load (%s): moved aside to %s, kept for "
                    "inspection; the resumed job saves its step again",
                    where,
                    reason,
                    aside.name,
                )
                return
        except OSError as e:
            _log.warning("could not set %s aside: %s", where, e)
        finally:
            if held is not None:
                held.release()

    def _clear_marked(self, step: int) -> None:
        """Removes a checkpoint of ``step`` marked corrupt in place (object stores)."""
        where = self._root / names.run_checkpoint_name(step)
        if not (where / names.CORRUPT_RECORD).exists():
            return
        _log.warning("removing %s, marked corrupt by a restore, to save its step again", where)
        self._remove(where)

    def _load(
        self,
        where: Location,
        model_target: Any,
        optimizer_target: Any,
        rng_target: Any,
        auxiliary_target: Any,
        iterator: grain.DatasetIterator,
    ) -> TrainingCheckpoint:
        error: Exception | None = None
        restored = None
        try:
            restored = load_training_checkpoint(
                str(where),
                model_target,
                optimizer_target,
                rng_target,
                auxiliary_target,
                iterator,
                names=self._names,
            )
        except (ValueError, OSError) as e:
            error = e
        # Every process takes the same checkpoint: one that fails anywhere is skipped
        # everywhere (a target mismatch, too, is raised everywhere).
        try:
            _processes.agree(error, what=f"the restore of {str(where)!r}", timeout=300.0)
        except Exception:
            if isinstance(error, TargetMismatchError):
                raise error from None
            raise
        assert restored is not None
        return restored

    # -- retention ---------------------------------------------------------------------

    def _retain(self) -> None:
        """After a commit: keeps what the policy keeps, removes the rest, and records why."""
        with self._lock:
            complete = self._complete()
            kept = self._kept(complete)
            for step in sorted(set(complete) - set(kept)):
                self._remove(complete[step])
            self._clean_up(newest=max(complete, default=None))
            metrics = self._record["metrics"]
            self._record["metrics"] = {
                key: value for key, value in metrics.items() if int(key) in kept
            }
            self._record["kept"] = {str(step): reasons for step, reasons in sorted(kept.items())}
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
        """Removes one checkpoint, marker first and last (see the module docstring)."""
        try:
            held = _claims.claim(where)
        except FileExistsError as e:
            _log.warning("not removing %s: %s", where, e)
            return
        try:
            removal.mark_for_removal(where)
            _log.info("removing %s (the run keeps it no longer)", where)
            removal.finish_removal(where)
        finally:
            if held is not None:
                held.release()

    def _clean_up(self, newest: int | None = None) -> None:
        """Finishes removals a killed run left, and removes interrupted saves older
        than the newest complete checkpoint."""
        if newest is None:
            newest = max(self._complete(), default=None)
        removal.remove_stale_temporaries(self._root / names.RUN_RECORD)
        root = self._root.snapshot()
        for name, entry in sorted(root.entries().items()):
            if entry.kind == FILE:
                continue
            final = names.final_name(name)
            match = names.RUN_CHECKPOINT.match(final)
            if match is None:
                continue
            where = self._root / name
            if final == name and (root / name / names.DELETION_MARKER).exists():
                held = None
                try:
                    held = _claims.claim(where)
                    _log.info("finishing the removal of %s", where)
                    removal.finish_removal(where)
                except FileExistsError as e:
                    _log.warning("not removing %s: %s", where, e)
                finally:
                    if held is not None:
                        held.release()
                continue
            if newest is None or int(match.group(1)) >= newest:
                continue
            unfinished = final != name or _claims.uncommitted_status(where) is not None
            if not unfinished:
                continue
            try:
                _claims.remove_interrupted(where)
                _log.info("removed %s, left by an interrupted save", where)
            except (FileExistsError, ValueError, FileNotFoundError):
                pass  # A save still runs there, or it has gone meanwhile.

    # -- the run's record --------------------------------------------------------------

    def _policy(self) -> dict[str, Any]:
        return {
            "save_every": self._save_every,
            "keep": self._keep,
            "keep_best": self._keep_best,
            "best_by": _metric_label(self._best_by),
            "best_mode": self._best_mode,
        }

    def _read_record(self) -> dict[str, Any]:
        record = read_run_record(self._root)
        metrics = {} if record is None else record.get("metrics", {})
        kept = {} if record is None else record.get("kept", {})
        return {
            "format": names.RUN_RECORD_FORMAT,
            "policy": self._policy(),
            "metrics": dict(metrics) if isinstance(metrics, dict) else {},
            "kept": dict(kept) if isinstance(kept, dict) else {},
        }

    def _write_record(self) -> None:
        self._record["policy"] = self._policy()
        self._record["updated_ns"] = time.time_ns()
        data = json.dumps(self._record, indent=1, sort_keys=True).encode("utf-8")
        removal.replace_file(self._root / names.RUN_RECORD, data)


def _run_directory(directory: object) -> tuple[Location, bool]:
    """The run's directory, made if missing; and whether this call made it."""
    where = _paths.location(directory, what="directory")
    made = not where.storage.implicit_directories and not where.exists()
    removal.make_directory(where)
    return _paths.save_directory(directory, what="directory"), made
