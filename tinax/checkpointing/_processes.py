"""The processes of a job: who they are, and every wait on one another, with a deadline.

(Over 500 lines: every meeting, its deadline, the errors it carries from one process
to all and the leaving of a job that lost a process share one protocol over the
coordination service's keys; apart, each part would need the others' keys.)

A save, a restore or a promotion runs on every process of a job, and what one
process finds (a refused destination, a checkpoint that does not load on it, the
local steps its host holds) the others must know before they go on. Each such
meeting goes through the coordination service's key-value store that
``jax.distributed.initialize`` started: every process posts what it found and
waits for the others, for at most a deadline of the caller's (``timeout``). A
process that does not arrive in time (killed, stalled, or gone down another road)
is named: every process that waited raises one ``ProcessTimeoutError`` that says
which processes did not arrive at which meeting (the step it was for), and nothing
waits longer than that.

Two kinds of meeting:

- ``agree`` and ``gather``: every process posts, waits for all, and reads what
  every other posted (each raises the same agreed error, or none);
- ``decide``: every process reports to the primary (process 0), which alone
  decides from all the reports and posts its decision; every process returns it.
  What is decided once cannot differ between processes.

A job that lost a process cannot end the ordinary way: JAX's exit waits at a
shutdown barrier for every process, for ``shutdown_timeout_seconds`` (5 minutes by
default), and a killed process never comes. So once a wait here has named a
process that did not arrive, this process leaves at its exit without that barrier
(status 1, once its output is flushed); process 0, which holds the coordination
service the others talk to, first gives them a few seconds to go. When process 0
itself dies, the coordination service goes with it: a wait that finds it gone names
process 0 in the same error (unless JAX, which polls the service too, has ended the
process first).

The only module of tinax that reaches into JAX's private modules: JAX has no public
handle on the coordination service's client.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import itertools
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import jax

from tinax._format.integrity.checksums import CorruptDataError
from tinax.checkpointing._verdict import TargetMismatchError

_log = logging.getLogger("tinax.checkpointing")

# Errors a verdict can carry, by name (tinax's own among them, ``register_error``);
# anything else arrives as the nearest of them it derives from, or a RuntimeError.
_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        TypeError,
        ValueError,
        KeyError,
        FileExistsError,
        FileNotFoundError,
        NotADirectoryError,
        IsADirectoryError,
        PermissionError,
        TimeoutError,
        OSError,
        CorruptDataError,
        TargetMismatchError,
    )
}


_Error = TypeVar("_Error", bound=type[Exception])


def register_error(kind: _Error) -> _Error:
    """Lets a verdict carry ``kind`` (an error of tinax's, made from its message alone):
    every process then raises it as itself, so that each handles it alike. Returns it,
    to be used as a class decorator."""
    _ERRORS[kind.__name__] = kind
    return kind


_KEY_PREFIX = "tinax/agree"
_DECIDE_PREFIX = "tinax/decide"
_LEFT_PREFIX = "tinax/left"
# One sequence of rounds per set of participating processes: each of them makes the
# same saves in the same order, so the n-th round has the same key everywhere.
_rounds: dict[tuple[int, ...], Iterator[int]] = {}
_decisions = itertools.count()
# Seconds process 0 waits at its exit, after a lost process, for the other processes
# that are still there to leave first: the coordination service lives in process 0,
# and a process that loses it is aborted by JAX before it can report anything.
LINGER_SECONDS = 10.0


class ProcessTimeoutError(TimeoutError):
    """Some processes of the job did not arrive at a wait within its deadline.

    Raised on every process that waited, with the same message; once it has been
    raised the process leaves at its exit without JAX's shutdown barrier (see the
    module docstring).

    Attributes:
      missing: The indices of the processes that did not arrive.
      what: The wait (``"the save of step 30"``).
      timeout: The deadline, in seconds.
    """

    def __init__(self, message: str, *, missing: Sequence[int], what: str, timeout: float):
        super().__init__(message)
        self.missing = tuple(missing)
        self.what = what
        self.timeout = timeout


# The deadline of the waits of the training run whose work this thread does (its
# ``timeout``), where there is one (``waiting``).
_RUN_TIMEOUT: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "tinax_run_timeout", default=None
)


@contextlib.contextmanager
def waiting(timeout: float) -> Iterator[None]:
    """Every wait on other processes in this block (this thread's) lasts ``timeout``
    seconds at most: a ``TrainingRun``'s, around its saves and restores."""
    token = _RUN_TIMEOUT.set(timeout)
    try:
        yield
    finally:
        _RUN_TIMEOUT.reset(token)


def timeout_of(default: float) -> float:
    """How long a wait on other processes lasts: a training run's ``timeout`` inside
    ``waiting``, else ``default`` (Orbax's barrier timeout, for the free functions)."""
    found = _RUN_TIMEOUT.get()
    return default if found is None else found


def _client() -> Any:
    from jax._src import distributed

    return distributed.global_state.client


def preemption_sync() -> Any | None:
    """JAX's preemption sync manager in a multi-process job, else ``None``.

    ``jax.distributed.initialize`` starts it (unless ``jax_enable_preemption_service``
    is off): its notifier catches SIGTERM, tells every process through the
    coordination service, and ``reached_sync_point(step)`` then returns ``True`` at
    the same step everywhere (the step after the largest any process had reached).
    ``jax.experimental.multihost_utils.reached_preemption_sync_point`` is its public
    face; the manager itself is reached here to tell whether there is one.
    """
    from jax._src import distributed

    state = distributed.global_state
    if state.client is None or process_count() == 1:
        return None
    return state.preemption_sync_manager


def process_index() -> int:
    """This process's index in the job (0 in a single-process job)."""
    from jax._src import distributed

    state = distributed.global_state
    if state.client is not None:
        # As ``jax.distributed.initialize`` was told: asking the backend would start
        # it, which waits for every process of the job to start theirs.
        return int(state.process_id)
    return int(jax.process_index())


def process_count() -> int:
    """How many processes the job has."""
    from jax._src import distributed

    state = distributed.global_state
    if state.client is not None:
        return int(state.num_processes)
    return int(jax.process_count())


def is_primary(primary_host: int | None) -> bool:
    """Whether this process is the one that checks and claims a save's destination.

    Args:
      primary_host: Orbax's ``MultiprocessingOptions.primary_host``; ``None`` makes
        every process primary (each writes to storage of its own).
    """
    return primary_host is None or process_index() == primary_host


def _participants(active: Sequence[int] | None) -> tuple[int, ...]:
    return tuple(sorted(active)) if active else tuple(range(process_count()))


def _alone() -> bool:
    return process_count() == 1 or _client() is None


def agree(
    error: Exception | None,
    *,
    what: str,
    timeout: float,
    active_processes: Sequence[int] | None = None,
) -> None:
    """Raises on every process if any process found an error; returns on all otherwise.

    In a single-process job ``error`` itself is raised. With several processes, every
    process raises the same exception type with the same message: the lowest-numbered
    failing process's, followed by which process that was.

    Args:
      error: What this process found, or ``None``.
      what: The occasion, for the timeout message (``"the save of step 30"``).
      timeout: Seconds to wait for the other processes.
      active_processes: The processes taking part (Orbax's ``active_processes``);
        ``None`` for all of them.

    Raises:
      Exception: The agreed error.
      ProcessTimeoutError: If not every process arrived within ``timeout``.
    """
    participants = _participants(active_processes)
    if _alone() or participants == (process_index(),):
        if error is not None:
            raise error
        return
    verdict = None if error is None else _record(error)
    found = _exchange(verdict, what=what, timeout=timeout, participants=participants, cause=error)
    failures = [(index, record) for index, record in found.items() if record is not None]
    if not failures:
        return
    index, record = min(failures, key=lambda item: item[0])
    raise _agreed_error(record, index) from error


def _record(error: BaseException) -> dict[str, Any]:
    """What other processes learn of ``error``: its type, the names of the types it
    derives from, and its message."""
    return {
        "type": type(error).__name__,
        "bases": [kind.__name__ for kind in type(error).__mro__],
        "message": str(error),
    }


def _agreed_error(record: dict[str, Any], index: int) -> Exception:
    """The error of ``record`` as every process raises it: of its own type where that
    is one of ``_ERRORS``, else of the nearest such type it derives from (a
    ``CorruptDataError`` arrives as a ``ValueError``), named in the message."""
    bases = record.get("bases") or [record["type"]]
    kind = next((_ERRORS[name] for name in bases if name in _ERRORS), RuntimeError)
    message = record["message"]
    if kind.__name__ != record["type"]:
        message = f"{record['type']}: {message}"
    return kind(f"{message} [process {index} of {process_count()}]")


def gather(
    value: Any, *, what: str, timeout: float, active_processes: Sequence[int] | None = None
) -> list[Any]:
    """Every participating process's ``value`` (JSON-able), in process order; each of
    them calls it.

    Args:
      value: What this process contributes.
      what: The occasion, for the timeout message.
      timeout: Seconds to wait for the other processes.
      active_processes: The processes taking part; ``None`` for all of them.

    Raises:
      ProcessTimeoutError: If not every process arrived within ``timeout``.
    """
    participants = _participants(active_processes)
    if _alone() or participants == (process_index(),):
        return [value]
    found = _exchange(value, what=what, timeout=timeout, participants=participants, cause=None)
    return [found[index] for index in participants]


def decide(
    report: Any,
    choose: Callable[[list[Any]], Any],
    *,
    what: str,
    timeout: float,
) -> Any:
    """One decision for the whole job, made in one place: every process reports, the
    primary (process 0) calls ``choose`` on every report (in process order) and posts
    what it returns, and every process returns that.

    Args:
      report: What this process contributes (JSON-able).
      choose: Called on the primary alone; its result must be JSON-able. An
        exception it raises is raised on every process (as ``agree`` raises).
      what: The occasion, for the timeout message.
      timeout: Seconds to wait: the primary for every report, the others for the
        decision.

    Raises:
      ProcessTimeoutError: If a report, or the decision, did not arrive in time.
      Exception: What ``choose`` raised.
    """
    if _alone():
        return choose([report])
    with _service(what, timeout):
        return _decide_round(report, choose, what=what, timeout=timeout)


def _decide_round(
    report: Any, choose: Callable[[list[Any]], Any], *, what: str, timeout: float
) -> Any:
    _check_not_lost(range(process_count()), what=what, timeout=timeout)
    client = _client()
    number = next(_decisions)
    base = f"{_DECIDE_PREFIX}/{number}"
    me, count = process_index(), process_count()
    client.key_value_set(f"{base}/report/{me}", json.dumps(report))
    deadline = time.monotonic() + timeout
    if me == 0:
        reports: list[Any] = []
        for index in range(count):
            text = _wait_key(f"{base}/report/{index}", deadline)
            if text is None:
                arrived = _arrived(f"{base}/report/")
                missing = [i for i in range(count) if i not in arrived]
                error = _timeout_error(missing, arrived, what=what, timeout=timeout)
                _post_decision(base, {"timeout": missing})
                raise error
            reports.append(json.loads(text))
        try:
            chosen = choose(reports)
        except Exception as e:
            record = _record(e)
            _post_decision(base, {"error": record})
            raise _agreed_error(record, 0) from e
        _post_decision(base, {"decision": chosen})
        if number > 0:
            # Every process reported in this round, so each has read the last one.
            client.key_value_delete(f"{_DECIDE_PREFIX}/{number - 1}/")
        return chosen
    text = _wait_key(f"{base}/decision", deadline)
    if text is None:
        arrived = _arrived(f"{base}/report/")
        missing = [i for i in range(count) if i not in arrived] or [0]
        raise _timeout_error(missing, arrived, what=what, timeout=timeout)
    posted = json.loads(text)
    if "timeout" in posted:
        missing = posted["timeout"]
        arrived = [i for i in range(count) if i not in missing]
        raise _timeout_error(missing, arrived, what=what, timeout=timeout)
    if "error" in posted:
        raise _agreed_error(posted["error"], 0)
    return posted["decision"]


def _post_decision(base: str, posted: dict[str, Any]) -> None:
    _client().key_value_set(f"{base}/decision", json.dumps(posted))


def _wait_key(key: str, deadline: float) -> str | None:
    """The value of ``key`` once it is set, or ``None`` if that is not before ``deadline``."""
    left = deadline - time.monotonic()
    try:
        return str(_client().blocking_key_value_get(key, max(1, int(left * 1000))))
    except Exception as e:
        if "UNAVAILABLE" in str(e):
            raise  # the coordination service is gone (see ``_service``)
        return None


def _arrived(directory: str) -> list[int]:
    """The processes that posted under ``directory`` (their index ends each key)."""
    try:
        found = _client().key_value_dir_get(directory)
    except Exception:
        return []
    return sorted({int(key.rsplit("/", 1)[1]) for key, _ in found})


def _exchange(
    value: Any,
    *,
    what: str,
    timeout: float,
    participants: tuple[int, ...],
    cause: BaseException | None,
) -> dict[int, Any]:
    """One round through the coordination service: every participant's ``value``."""
    with _service(what, timeout):
        return _exchange_round(
            value, what=what, timeout=timeout, participants=participants, cause=cause
        )


def _exchange_round(
    value: Any,
    *,
    what: str,
    timeout: float,
    participants: tuple[int, ...],
    cause: BaseException | None,
) -> dict[int, Any]:
    _check_not_lost(participants, what=what, timeout=timeout)
    client = _client()
    counter = _rounds.setdefault(participants, itertools.count())
    number = next(counter)
    tag = "-".join(map(str, participants))
    base = f"{_KEY_PREFIX}/{tag}/{number}"
    client.key_value_set(f"{base}/{process_index()}", json.dumps(value))
    deadline = time.monotonic() + timeout
    while True:
        found = {
            int(key.rsplit("/", 1)[1]): text for key, text in client.key_value_dir_get(f"{base}/")
        }
        missing = [i for i in participants if i not in found]
        if not missing:
            break
        if time.monotonic() >= deadline:
            raise _timeout_error(missing, sorted(found), what=what, timeout=timeout) from cause
        # Waits in the coordination service for the first missing post (no barrier:
        # a process that posted has arrived, even if it dies right after).
        _wait_key(f"{base}/{missing[0]}", deadline)
    if process_index() == participants[0] and number > 0:
        # Each process posts to this round only after reading the last one whole, so
        # with every post of this round in, the last round's keys can go.
        client.key_value_delete(f"{_KEY_PREFIX}/{tag}/{number - 1}/")
    return {index: json.loads(text) for index, text in found.items()}


def _listed(indices: Sequence[int]) -> str:
    words = [str(i) for i in indices]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _who(indices: Sequence[int]) -> str:
    """``"process 1"``, ``"processes 1 and 3"``."""
    return f"process{'' if len(indices) == 1 else 'es'} {_listed(indices)}"


def _timeout_error(
    missing: Sequence[int],
    arrived: Sequence[int],
    *,
    what: str,
    timeout: float,
    silent: bool = False,
) -> ProcessTimeoutError:
    """The error of a wait that ended at its deadline, with ``missing`` (never empty)
    not there (``silent``: a meeting's, after that long without a word from them);
    records the loss (see the module docstring)."""
    who = _who(missing)
    there = [i for i in arrived if i not in missing]
    came = f" ({_who(there)} did)" if there else ""
    if silent:
        happened = f"went silent for {timeout:g} s in {what}{came}"
    else:
        happened = f"did not reach {what} within {timeout:g} s{came}"
    message = (
        f"{who} of {process_count()} {happened}: "
        f"{'it has' if len(missing) == 1 else 'they have'} died or stalled"
    )
    error = ProcessTimeoutError(message, missing=missing, what=what, timeout=timeout)
    _lost(error, there)
    return error


def _check_not_lost(waited: Sequence[int], *, what: str, timeout: float) -> None:
    """Raises at once, instead of waiting out a deadline, where this process already
    raised a ``ProcessTimeoutError`` naming one of ``waited`` (``lost``): a process
    found gone is not waited for again (a promotion's meeting still running when the
    save beside it found the loss)."""
    if _loss is None:
        return
    earlier = _loss[0]
    gone = [i for i in earlier.missing if i in waited]
    if not gone:
        return
    who = _who(gone)
    raise ProcessTimeoutError(
        f"{who} of {process_count()} cannot reach {what}: already lost in {earlier.what}",
        missing=gone,
        what=what,
        timeout=timeout,
    )


@contextlib.contextmanager
def _service(what: str, timeout: float) -> Iterator[None]:
    """In a wait on the other processes, the loss of JAX's coordination service (it
    lives in process 0 and dies with it) is raised as the ``ProcessTimeoutError``
    that names process 0, not as the client's error."""
    try:
        yield
    except ProcessTimeoutError:
        raise
    except Exception as e:
        if process_index() == 0 or "UNAVAILABLE" not in str(e):
            raise
        message = (
            f"process 0 of {process_count()} was lost in {what}: JAX's coordination "
            "service, which it holds, no longer answers: it has died"
        )
        error = ProcessTimeoutError(message, missing=[0], what=what, timeout=timeout)
        _lost(error, [])
        raise error from e


# -- meetings in the background ------------------------------------------------------


class Meeting:
    """A meeting of the job's processes held on background threads (a promotion's),
    which may last as long as the work between its posts: none of its waits has a
    fixed length, but each ends once a process it waits for has been silent for
    ``timeout`` seconds, posting neither what is waited for nor, every second while
    it works (``working``), that it is alive.

    Every process makes the meeting with the same ``name``, so the same keys.

    Args:
      name: The meeting's name, the same on every process.
      timeout: Seconds of silence after which a process is taken for lost.
    """

    def __init__(self, name: str, timeout: float) -> None:
        self.base = f"tinax/meet/{name}"
        self.timeout = timeout

    def post(self, what: str, value: Any) -> None:
        """Posts this process's ``value`` (JSON-able) under ``what``."""
        if not _alone():
            _client().key_value_set(f"{self.base}/{what}/{process_index()}", json.dumps(value))

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        """Says every second, while the block runs, that this process is alive."""
        if _alone():
            yield
            return
        stop = threading.Event()
        key = f"{self.base}/alive/{process_index()}"

        def tick() -> None:
            beat = 0
            while not stop.wait(0 if beat == 0 else 1.0):
                beat += 1
                with contextlib.suppress(Exception):
                    _client().key_value_set(key, str(beat), allow_overwrite=True)

        ticker = threading.Thread(target=tick, name="tinax-alive", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            stop.set()
            ticker.join()

    def wait(self, what: str, processes: Sequence[int], *, during: str) -> dict[int, Any]:
        """What each of ``processes`` posted under ``what``, once all have.

        Args:
          what: The post waited for.
          processes: Who must post it.
          during: The occasion, for the error (``"the promotion of step 30"``).

        Raises:
          ProcessTimeoutError: If a process was silent for ``timeout`` seconds
            before it posted.
        """
        if _alone():
            raise RuntimeError("a meeting needs a job of several processes")
        client = _client()
        heard = {p: time.monotonic() for p in processes}
        beats: dict[int, str] = {}
        with _service(during, self.timeout):
            while True:
                posted = {
                    int(key.rsplit("/", 1)[1]): json.loads(text)
                    for key, text in client.key_value_dir_get(f"{self.base}/{what}/")
                }
                left = [p for p in processes if p not in posted]
                if not left:
                    return {p: posted[p] for p in processes}
                _check_not_lost(left, what=during, timeout=self.timeout)
                now = time.monotonic()
                for key, beat in client.key_value_dir_get(f"{self.base}/alive/"):
                    index = int(key.rsplit("/", 1)[1])
                    if beats.get(index) != beat:
                        beats[index], heard[index] = beat, now
                silent = [p for p in left if now - heard[p] >= self.timeout]
                if silent:
                    there = [p for p in processes if p not in silent]
                    raise _timeout_error(
                        silent, there, what=during, timeout=self.timeout, silent=True
                    )
                time.sleep(0.1)

    def close(self) -> None:
        """Removes the meeting's keys (once no process reads them any more)."""
        if not _alone():
            with contextlib.suppress(Exception):
                _client().key_value_delete(f"{self.base}/")


# -- leaving a job that lost a process -----------------------------------------------

_lost_lock = threading.Lock()
# The first loss this process saw, and the processes known to be there then.
_loss: tuple[ProcessTimeoutError, list[int]] | None = None


def lost() -> ProcessTimeoutError | None:
    """The first ``ProcessTimeoutError`` this process raised, if any: a job that lost a
    process, whose other waits need not begin."""
    return None if _loss is None else _loss[0]


def _lost(error: ProcessTimeoutError, present: list[int]) -> None:
    global _loss
    with _lost_lock:
        if _loss is None:
            _loss = (error, present)


@atexit.register
def _leave_after_loss() -> None:
    """Ends a process whose job lost a process without JAX's shutdown barrier.

    Registered after JAX's own exit handler (this module imports JAX first), so it
    runs before it. Output is flushed, then ``os._exit(1)``.
    """
    if _loss is None or _alone():
        return
    error, present = _loss
    me = process_index()
    _log.error(
        "process %d leaves the job without JAX's shutdown barrier, which would wait for "
        "the process(es) that did not arrive: %s",
        me,
        error,
    )
    # Everything this process says is out before it tells process 0 that it has gone:
    # from then on process 0 may leave, and with it the coordination service, whose
    # loss JAX answers by aborting this process (status -6) if it is still here.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    try:
        if me == 0:
            deadline = time.monotonic() + LINGER_SECONDS
            for index in present:
                if index != 0 and _wait_key(f"{_LEFT_PREFIX}/{index}", deadline) is None:
                    break
        else:
            _client().key_value_set(f"{_LEFT_PREFIX}/{me}", "1")
    except Exception:
        pass  # the coordination service may be gone already
    os._exit(1)
