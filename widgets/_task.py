"""A synchronous call presented as an Orbax ``AsyncResponse``, so progress can follow it."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


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
            threading.Thread(
                target=self._run, args=(call,), name=f"tinax-{self._name}", daemon=True
            ).start()
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
