"""Failed saves reported once, in the right words: a full disk is ``OSError(ENOSPC)``.

Orbax logs a failure in each of its background threads with a full traceback (a
full disk gives some 230 lines on stderr) and then raises the same failure as a
``ValueError`` carrying tensorstore's status text. While tinax saves are in flight,
those thread tracebacks are kept off the log; tinax logs one line per failed save
and raises an error of the right type.
"""

from __future__ import annotations

import errno
import logging
import threading

logger = logging.getLogger("tinax.checkpointing")

_ORBAX_THREAD_FAILURE = "_SignalingThread.run() raised an exception"
_NO_SPACE = ("No space left on device", "os_error_code='28'", "RESOURCE_EXHAUSTED")

_lock = threading.Lock()
_in_flight: dict[str, int] = {}
_installed = False


class _QuietOrbaxThreads(logging.Filter):
    """Drops Orbax's per-thread tracebacks of a failure while a tinax save is in flight."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        try:
            text = record.getMessage()
        except (TypeError, ValueError):
            return True
        if _ORBAX_THREAD_FAILURE not in text:
            return True
        with _lock:
            return not _in_flight


def _install() -> None:
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    logging.getLogger("absl").addFilter(_QuietOrbaxThreads())


def begin(destination: str) -> None:
    """Marks a save to ``destination`` as in flight."""
    _install()
    with _lock:
        _in_flight[destination] = _in_flight.get(destination, 0) + 1


def end(destination: str) -> None:
    """Marks a save to ``destination`` as finished."""
    with _lock:
        count = _in_flight.get(destination, 0) - 1
        if count > 0:
            _in_flight[destination] = count
        else:
            _in_flight.pop(destination, None)


def causes(error: BaseException) -> list[BaseException]:
    """``error`` and what caused it, outermost first, as a traceback would show them."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        if current.__cause__ is not None or current.__suppress_context__:
            current = current.__cause__
        else:
            current = current.__context__
    return seen


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is a write that found no space left."""
    for cause in causes(error):
        if isinstance(cause, OSError) and cause.errno == errno.ENOSPC:
            return True
        text = str(cause)
        if _NO_SPACE[0] in text or _NO_SPACE[1] in text:
            return True
    return False


def save_failure(destination: str, error: BaseException) -> BaseException:
    """The error a failed save to ``destination`` raises; logs one line about it."""
    if is_disk_full(error):
        logger.error("save to %s failed: no space left on device", destination)
        failure = OSError(
            errno.ENOSPC,
            # The path is the error's filename, which str() shows once.
            "No space left on device to save the checkpoint (nothing was left behind)",
            destination,
        )
        failure.__cause__ = error
        return failure
    logger.error("save to %s failed: %s", destination, str(error).splitlines()[0][:500])
    return error
