"""A training run's preemption: the SIGTERM that makes the next save the preemption save,
and the process's end when the loop goes on past it.

A SIGTERM makes the next ``save`` (or ``should_save``) save whatever the interval and
wait for the commit; only then is ``preempted`` true, so that ``if run.preempted:
break`` never ends a loop with its newest steps unsaved. In a job of several
processes JAX's preemption service owns SIGTERM: its notifier tells every process,
and every process saves at the same step (``_processes.preemption_sync``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
import types
from typing import Any

_log = logging.getLogger("tinax.checkpointing")


class Preemption:
    """The part of ``TrainingRun`` that handles preemption (see the module docstring)."""

    _preempted: bool
    _preemption_saved: int | None
    _decided: tuple[int, bool] | None
    _previous_handler: Any
    _handler_installed: bool

    def close(self) -> None:
        """Waits for what the run has in flight and ends it (``TrainingRun.close``)."""
        raise NotImplementedError

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
