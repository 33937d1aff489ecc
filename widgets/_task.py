"""The widgets' background threads, and work presented as an Orbax ``AsyncResponse``
so that a progress bar can follow it."""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# How long the interpreter's exit waits, in all, for the widgets' threads to end.
EXIT_WAIT_SECONDS = 60.0

_threads_lock = threading.Lock()
# Each thread still running → what asks it to stop (or None: it is waited for as is).
_threads: dict[threading.Thread, Callable[[], None] | None] = {}


def start_thread(
    target: Callable[[], Any], *, name: str, stop: Callable[[], None] | None = None
) -> threading.Thread:
    """Runs ``target`` in a new daemon thread that the interpreter's exit waits for.

    A daemon thread never holds a notebook's kernel open, but one still inside a
    tensorstore read while the interpreter shuts down makes the process abort
    ("terminate called without an active exception"). So at exit every thread
    started here is first asked to stop (``stop``, e.g. an ``Event.set``), then
    joined, up to ``EXIT_WAIT_SECONDS`` in all.

    Args:
      target: The work.
      name: The thread's name.
      stop: Asks the work to end early; ``None`` when it is short and is waited for.

    Returns:
      The started thread.
    """

    def run() -> None:
        try:
            target()
        finally:
            with _threads_lock:
                _threads.pop(thread, None)

    thread = threading.Thread(target=run, name=name, daemon=True)
    with _threads_lock:
        _threads[thread] = stop
    try:
        thread.start()
    except BaseException:
        with _threads_lock:
            _threads.pop(thread, None)
        raise
    return thread


def joined(thread: threading.Thread | None, timeout: float | None = None) -> bool:
    """Waits up to ``timeout`` seconds for ``thread`` (if any) to end; returns whether
    it has ended (or there is none)."""
    if thread is None:
        return True
    thread.join(timeout)
    return not thread.is_alive()


def running_threads() -> list[threading.Thread]:
    """The threads ``start_thread`` started that have not ended."""
    with _threads_lock:
        return [t for t in _threads if t.is_alive()]


@atexit.register
def _wait_for_threads_at_exit() -> None:
    with _threads_lock:
        threads = dict(_threads)
    for stop in threads.values():
        if stop is not None:
            # The exit goes on whatever a stop does.
            with contextlib.suppress(Exception):
                stop()
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


class Task(Generic[T]):
    """Runs one call, in a daemon thread or on the caller's thread, behind ``result``/``on_complete``.

    Create it, hand it to an ``AsyncProgress``, then ``start`` it: the bar is
    showing before any work begins, whichever thread does the work.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._started = False

    def start(self, call: Callable[[], T], *, in_thread: bool) -> None:
        """Runs ``call``: in a new daemon thread, or now on this thread.

        Raises:
          RuntimeError: If the task was already started.
        """
        if self._started:
            raise RuntimeError(f"task {self._name!r} was already started")
        self._started = True
        if in_thread:
            start_thread(lambda: self._run(call), name=f"tinax-{self._name}")
        else:
            self._run(call)

    def _run(self, call: Callable[[], T]) -> None:
        try:
            value = call()
        except BaseException as e:
            self._future.set_exception(e)
        else:
            self._future.set_result(value)

    def result(self, timeout: float | None = None) -> T:
        """The call's return value, waiting up to ``timeout`` seconds.

        Raises:
          TimeoutError: If it has not finished within ``timeout``.
          Exception: Whatever the call raised.
        """
        return self._future.result(timeout)

    def done(self) -> bool:
        """Whether the call has finished."""
        return self._future.done()

    def exception(self) -> BaseException | None:
        """The call's exception once finished, else ``None``."""
        return self._future.exception() if self._future.done() else None

    def on_complete(self, callback: Callable[[T], None]) -> None:
        """Calls ``callback(value)`` once the call has returned (not when it raised)."""

        def call(future: concurrent.futures.Future[T]) -> None:
            if future.exception() is None:
                callback(future.result())

        self._future.add_done_callback(call)


class PendingResponse(Generic[T]):
    """Stands for an ``AsyncResponse`` that a blocking call has not returned yet.

    Orbax's async saves block the calling thread while they copy arrays to host
    memory, and only then return a response. A progress bar bound to this object
    can show that phase too: ``attach`` hands over the real response once it
    exists, ``fail`` reports that the call raised instead.
    """

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._inner: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[T], None]] = []

    def attach(self, response: Any) -> None:
        """Hands over the real response; ``result``/``on_complete`` now follow it."""
        with self._lock:
            self._inner = response
            callbacks, self._callbacks = self._callbacks, []
            self._ready.set()
        for callback in callbacks:
            response.on_complete(callback)

    def fail(self, error: BaseException) -> None:
        """Reports that the call that should have returned the response raised ``error``."""
        with self._lock:
            self._error = error
            self._callbacks = []
            self._ready.set()

    def result(self, timeout: float | None = None) -> T:
        """The real response's result, waiting up to ``timeout`` seconds in all.

        Raises:
          TimeoutError: If nothing has finished within ``timeout``.
          Exception: The error passed to ``fail``, or whatever the real response raises.
        """
        start = time.monotonic()
        if not self._ready.wait(timeout):
            raise TimeoutError("the operation has not started yet")
        if self._error is not None:
            raise self._error
        remaining = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
        return self._inner.result(remaining)  # type: ignore[no-any-return]

    def done(self) -> bool:
        """Whether the call failed, or the real response has finished."""
        if not self._ready.is_set():
            return False
        if self._error is not None:
            return True
        done = getattr(self._inner, "done", None)
        return bool(done()) if callable(done) else False

    def on_complete(self, callback: Callable[[T], None]) -> None:
        """Calls ``callback(result)`` once the real response completes successfully."""
        with self._lock:
            if not self._ready.is_set():
                self._callbacks.append(callback)
                return
            inner = self._inner
        if inner is not None:
            inner.on_complete(callback)
