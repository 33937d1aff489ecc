"""The response a tinax save returns: Orbax's ``AsyncResponse`` plus clean-up and the claim."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from orbax.checkpoint import v1 as ocp

from tinax.checkpointing import _failures
from tinax.checkpointing._destination import Destination

T = TypeVar("T")

_log = logging.getLogger("tinax.checkpointing")

# Every save of this process that has not ended yet, so that the interpreter's exit
# can wait for them (see ``_wait_at_exit``).
_in_flight: set[Any] = set()
_in_flight_lock = threading.Lock()
_exit_hook_registered = False


def _wait_at_exit() -> None:
    """Waits for every save in flight before the interpreter shuts its thread pools.

    A script may end while a save is still writing. ``atexit`` would be too late:
    by then ``concurrent.futures`` has shut its thread pools down, and Orbax's
    background work fails with "cannot schedule new futures after shutdown" (or
    waits forever for work that never runs). ``threading._register_atexit``
    callbacks run first, in reverse order of registration, when the main thread
    ends; this one is registered after ``concurrent.futures.thread``'s, so it runs
    while every pool still works. Failures are already logged by each response. A
    save's end may start more work (a two-tier run promotes a local checkpoint once
    it has committed): that is waited for too.
    """
    told = False
    while True:
        with _in_flight_lock:
            waiting = sorted(_in_flight, key=lambda response: response.path)
        if not waiting:
            return
        if not told:
            told = True
            _log.warning(
                "waiting for %d tinax save(s) in flight to commit before exiting: %s",
                len(waiting),
                ", ".join(response.path for response in waiting),
            )
        for response in waiting:
            response.wait_quietly()  # never raises the save's failure


def track(operation: Any) -> None:
    """Has the interpreter's exit wait for a background operation of this process (a
    save, a promotion): anything with a ``path`` and a ``wait_quietly()`` that waits
    for its end without raising."""
    _register_exit_hook()
    with _in_flight_lock:
        _in_flight.add(operation)


def untrack(operation: Any) -> None:
    """The operation has ended: the exit no longer waits for it."""
    with _in_flight_lock:
        _in_flight.discard(operation)


def _register_exit_hook() -> None:
    global _exit_hook_registered
    with _in_flight_lock:
        if _exit_hook_registered:
            return
        _exit_hook_registered = True
    # Imported first so that its own exit callback (which shuts the pools down) is
    # registered before ours and therefore runs after it.
    import concurrent.futures.thread  # noqa: F401

    # Refused once the interpreter is shutting down: nothing can wait any more then.
    with contextlib.suppress(RuntimeError):
        threading._register_atexit(_wait_at_exit)  # type: ignore[attr-defined]


class SaveResponse(ocp.AsyncResponse[T]):
    """Completion of one save, bound to an Orbax ``AsyncResponse``.

    It implements Orbax's ``AsyncResponse`` protocol (``result`` and
    ``on_complete``). When the save fails, the Orbax temporary directory is
    removed before the failure is reported, whether or not anyone calls
    ``result``, so a reader never finds a half-written checkpoint. The claim on
    the destination is held until then, and given up whether the save committed
    or failed. A full disk is reported as ``OSError`` with ``errno.ENOSPC``, and
    a failure is logged once (Orbax's per-thread tracebacks of it are kept off
    the log).

    One short-lived watcher thread waits for Orbax's response; it ends when the
    save ends, successfully or not. ``on_end`` is called then, before the result
    is given out (the save's pause of the cycle collector ends there). After a
    commit, ``after_commit`` (if given) runs on that thread before the result is
    given out; what it raises is logged, never reported as the save's failure.

    A script that ends while saves are in flight does not lose them: the
    interpreter's exit waits for every one to end (logging one line that says so).
    """

    def __init__(
        self,
        inner: Any,
        destination: Destination,
        on_end: Callable[[], None],
        after_commit: Callable[[], None] | None = None,
    ) -> None:
        # The caller marked the save as in flight (``_failures.begin``); it ends here.
        self._inner = inner
        self._on_end = on_end
        self._after_commit = after_commit
        self._claimed = destination
        self._destination = destination.location
        self._future: concurrent.futures.Future[T] = concurrent.futures.Future()
        track(self)
        self._thread = threading.Thread(
            target=self._watch, name=f"tinax-save:{self._destination.name}", daemon=True
        )
        self._thread.start()

    def _watch(self) -> None:
        try:
            self._settle()
        finally:
            untrack(self)

    def _settle(self) -> None:
        try:
            value = self._inner.result()
        except BaseException as e:
            try:
                self._claimed.discard_temporaries()
            finally:
                self._claimed.release()
                self._on_end()
            failure = _failures.save_failure(str(self._destination), e)
            _failures.end(str(self._destination))
            self._future.set_exception(failure)
        else:
            try:
                self._claimed.release()
            finally:
                self._on_end()
            _failures.end(str(self._destination))
            if self._after_commit is not None:
                try:
                    self._after_commit()
                except Exception:
                    _log.exception("after the save to %s committed", self._destination)
            self._future.set_result(value)

    @property
    def path(self) -> str:
        """The checkpoint directory this save commits to."""
        return str(self._destination)

    def result(self, timeout: float | None = None) -> T:
        """Waits for the save to commit.

        Args:
          timeout: Seconds to wait; ``None`` waits for as long as it takes.

        Returns:
          ``None`` once the checkpoint is committed.

        Raises:
          TimeoutError: If the save has not finished within ``timeout``.
          OSError: With ``errno.ENOSPC`` if the disk filled up, naming the
            destination.
          Exception: Whatever else made the save fail.
        """
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError as e:
            if self._future.done():
                # The save itself timed out (waiting for another process, say).
                raise TimeoutError(f"save to {str(self._destination)!r} failed: {e}") from e
            raise TimeoutError(
                f"save to {str(self._destination)!r} not finished after {timeout} s"
            ) from None

    def wait_quietly(self) -> None:
        """Waits for the save to end; never raises its failure."""
        self._future.exception()

    def done(self) -> bool:
        """Whether the save has finished, successfully or not."""
        return self._future.done()

    def exception(self) -> BaseException | None:
        """The save's failure once it has finished, else ``None``."""
        if not self._future.done():
            return None
        return self._future.exception()

    def on_complete(self, callback: Callable[[T], None]) -> None:
        """Calls ``callback(result)`` once the save has committed successfully.

        As with Orbax's responses, a failed save does not call ``callback``; use
        ``result`` or ``exception`` to see the failure.
        """

        def _call(fut: concurrent.futures.Future[T]) -> None:
            if not fut.cancelled() and fut.exception() is None:
                callback(fut.result())

        self._future.add_done_callback(_call)
