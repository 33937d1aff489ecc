"""A progress bar bound to an Orbax ``AsyncResponse``."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as w
import traitlets

from tinax.explore import toolkit

from ._text import error_html, format_bytes, format_rate, format_seconds

RUNNING = "running"
DONE = "done"
FAILED = "failed"

# A running bar never shows full: the last bytes land before Orbax commits.
_RUNNING_CAP = 0.99
# The bar shows once this share of the total (or this many bytes) has landed; a rate
# and an ETA once bytes have moved for this long.
_MOVING_SHARE = 0.01
_MOVING_BYTES = 4 << 20
_RATE_AFTER = 0.25

# Without a total there is nothing to measure against: a block sliding to and fro
# says "working" where a full bar would read as "finished". Drawn once by the
# browser (a CSS animation); nothing is re-sent while it runs.
_PULSE_HTML = (
    "<style>@keyframes tinax-pulse{from{left:0}to{left:70%}}</style>"
    '<div class="tinax-progress-indeterminate" title="working; the total is not known" '
    'style="position:relative;overflow:hidden;height:1.2em;margin-top:0.2em;'
    'background:#e3eef8;border-radius:2px">'
    '<div style="position:absolute;top:0;width:30%;height:100%;background:#2196f3;'
    'border-radius:2px;animation:tinax-pulse 1.1s ease-in-out infinite alternate"></div></div>'
)


class BytesMoved:
    """The bytes a job running in another thread has moved so far: its ``progress(done,
    total)`` callback is ``moved``, and an ``AsyncProgress`` reads ``count`` as its
    ``count_bytes``. One for each run, so that a run that ended writes into its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = 0

    def moved(self, done: int, total: int) -> None:
        with self._lock:
            self._done = done

    def count(self) -> int:
        with self._lock:
            return self._done


def _check_response(response: object) -> Any:
    for method in ("result", "on_complete"):
        if not callable(getattr(response, method, None)):
            raise TypeError(
                "response must have result(timeout) and on_complete(callback) like an Orbax "
                f"AsyncResponse; {type(response).__name__} has no {method}()"
            )
    return response


def _check_total(total_bytes: object) -> int | None:
    if total_bytes is None:
        return None
    if isinstance(total_bytes, bool) or not isinstance(total_bytes, int):
        raise TypeError(f"total_bytes must be an int or None, got {type(total_bytes).__name__}")
    if total_bytes < 0:
        raise ValueError(f"total_bytes must be non-negative, got {total_bytes}")
    return total_bytes


class AsyncProgress(w.VBox):
    """A progress bar bound to any object with ``result(timeout)`` and ``on_complete(callback)``.

    With ``total_bytes`` and a ``watch`` path (or a ``count_bytes`` callable) the bar
    moves with the bytes that have landed, and stops at ``total_bytes``; otherwise
    it shows an indeterminate bar (a sliding block, never a full bar) with the
    elapsed time. It ends in ``status`` ``"done"`` (total and rate shown) or
    ``"failed"`` (the error shown in the widget).

    One daemon watcher thread waits on the response and samples the byte count; it
    ends when the response finishes. Traitlets are updated from that thread.

    Attributes:
      status: ``"running"``, ``"done"`` or ``"failed"``.
      error: ``"TypeName: message"`` of the failure, else ``""``.
      bytes_done: Bytes counted so far (never decreases).
      total_bytes: The expected total, or ``None`` if unknown.
      elapsed: Seconds since the widget was created (frozen when it finishes).
      value: The response's result once ``status`` is ``"done"``.
    """

    status = traitlets.Unicode(RUNNING)
    error = traitlets.Unicode("")
    bytes_done = traitlets.Int(0)
    total_bytes = traitlets.Int(None, allow_none=True)
    elapsed = traitlets.Float(0.0)

    def __init__(
        self,
        response: Any,
        *,
        total_bytes: int | None = None,
        watch: str | os.PathLike[str] | None = None,
        description: str = "",
        count_bytes: Callable[[], int | None] | None = None,
        interval: float = 0.1,
    ) -> None:
        """Starts following ``response``.

        Args:
          response: An Orbax ``AsyncResponse`` or anything with ``result(timeout)``
            and ``on_complete(callback)``.
          total_bytes: Bytes the operation moves in all, if known.
          watch: A checkpoint path being written: bytes are counted under Orbax's
            temporary ``<watch>.orbax-checkpoint-tmp*`` directories, then under
            ``watch`` itself.
          description: A short label shown before the bar.
          count_bytes: Instead of ``watch``, a callable returning the bytes moved so
            far (or ``None`` when it cannot tell); it is called from the watcher
            thread.
          interval: Seconds between samples.

        Raises:
          TypeError: If ``response`` lacks ``result``/``on_complete``, ``total_bytes``
            is not an int, ``watch`` is not a path, ``description`` is not a str,
            ``count_bytes`` is not callable, or both ``watch`` and ``count_bytes``
            are given.
          ValueError: If ``total_bytes`` is negative or ``interval`` is not positive.
        """
        self._response = _check_response(response)
        total = _check_total(total_bytes)
        if not isinstance(description, str):
            raise TypeError(f"description must be a str, got {type(description).__name__}")
        if watch is not None and not isinstance(watch, str | os.PathLike):
            raise TypeError(f"watch must be a path or None, got {type(watch).__name__}")
        if count_bytes is not None and not callable(count_bytes):
            raise TypeError("count_bytes must be a callable returning an int")
        if watch is not None and count_bytes is not None:
            raise TypeError("pass either watch or count_bytes, not both")
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        self._interval = float(interval)
        self._count: Callable[[], int | None] | None = count_bytes
        if watch is not None:
            watched = toolkit.resolve_path(watch, what="watch")
            self._count = lambda: toolkit.bytes_written(watched)
        self._measured = self._count is not None and total is not None
        self.value: Any = None

        # Label and text keep their whole width; on a narrow screen they wrap under
        # the bar rather than being cut.
        self.label = w.Label(description, layout=w.Layout(flex="0 0 auto"))
        self.bar = w.FloatProgress(
            value=0.0,
            min=0.0,
            max=1.0,
            bar_style="" if self._measured else "info",
            layout=w.Layout(width="40%", min_width="8em", display="none"),
        )
        # A sliding block until bytes start to move: the first seconds of a save
        # write metadata, and a bar that crawls there reads as stalled.
        self.pulse = w.HTML(_PULSE_HTML, layout=w.Layout(width="40%", min_width="8em"))
        self._moving: tuple[float, int] | None = None
        self.info = w.Label("starting…", layout=w.Layout(flex="0 0 auto"))
        self.error_box = w.HTML("", layout=w.Layout(display="none"))
        super().__init__(
            children=[
                w.HBox(
                    [self.label, self.bar, self.pulse, self.info],
                    layout=w.Layout(flex_flow="row wrap", align_items="center"),
                ),
                self.error_box,
            ],
            layout=w.Layout(width="100%"),
        )
        self.add_class("tinax-async-progress")
        self.total_bytes = total

        self._start = time.monotonic()
        self._finished = threading.Event()
        self._finish_lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._watch, name=f"tinax-progress:{description or 'task'}", daemon=True
        )
        self._thread.start()
        try:
            self._response.on_complete(self._on_complete)
        except Exception as e:  # a broken response must not break the notebook
            self._finish(error=e)

    # -- public ---------------------------------------------------------------------

    @property
    def response(self) -> Any:
        """The response this bar follows."""
        return self._response

    @property
    def indeterminate(self) -> bool:
        """Whether the bar shows work going on without a measure of how much is left."""
        return self.pulse.layout.display != "none"

    def wait(self, timeout: float | None = None) -> str:
        """Blocks until the bar has finished (or ``timeout`` seconds pass).

        Returns:
          The ``status`` at return: ``"done"``, ``"failed"``, or ``"running"`` on timeout.
        """
        self._finished.wait(timeout)
        return self.status

    # -- watcher thread --------------------------------------------------------------

    def _watch(self) -> None:
        while not self._finished.is_set():
            try:
                value = self._response.result(timeout=self._interval)
            except TimeoutError as e:
                done = getattr(self._response, "done", None)
                if callable(done) and done():
                    self._finish(error=e)  # the operation itself timed out
                    return
                self._sample()
            except BaseException as e:
                self._finish(error=e)
                return
            else:
                self._finish(value=value)
                return

    def _on_complete(self, value: Any) -> None:
        self._finish(value=value)

    def _read_count(self) -> int | None:
        if self._count is None:
            return None
        try:
            count = self._count()
        except Exception:
            return None
        if count is None:
            return None
        # Bytes on disk include metadata beyond the array bytes (an uncompressed save
        # writes a little more than total_bytes): progress stops at the total.
        if self.total_bytes is not None:
            return min(int(count), self.total_bytes)
        return int(count)

    def _sample(self) -> None:
        count = self._read_count()  # outside the lock: it may walk a directory tree
        with self._finish_lock:
            if self._finished.is_set():
                # The operation ended while counting: the final text stands, a late
                # sample must not turn a full bar back into a running one.
                return
            self.elapsed = time.monotonic() - self._start
            if count is not None and count > self.bytes_done:
                self.bytes_done = count
            parts = []
            total = self.total_bytes or 0
            if (
                self._measured
                and self._moving is None
                and self.bytes_done >= min(total * _MOVING_SHARE, _MOVING_BYTES)
            ):
                self._moving = (self.elapsed, self.bytes_done)
                self.pulse.layout.display = "none"
                self.bar.layout.display = None
            if self._moving is not None:
                fraction = self.bytes_done / total if total else 0.0
                self.bar.value = min(fraction, _RUNNING_CAP)
                parts.append(f"{format_bytes(self.bytes_done)} / {format_bytes(total)}")
                # Rate and ETA from when the bytes began to move, not from the start.
                since, first = self._moving
                seconds, moved = self.elapsed - since, self.bytes_done - first
                if seconds >= _RATE_AFTER and moved > 0:
                    rate = moved / seconds
                    parts.append(format_rate(moved, seconds))
                    if total > self.bytes_done:
                        parts.append(f"{format_seconds((total - self.bytes_done) / rate)} left")
            elif self.bytes_done:
                parts.append(format_bytes(self.bytes_done))
            parts.append(f"{format_seconds(self.elapsed)} elapsed")
            self.info.value = " · ".join(parts)

    def _finish(self, *, value: Any = None, error: BaseException | None = None) -> None:
        with self._finish_lock:
            if self._finished.is_set():
                return
            self.elapsed = time.monotonic() - self._start
            # The outcome replaces the sliding block: a full green or red bar.
            self.pulse.layout.display = "none"
            self.bar.layout.display = None
            if error is None:
                self.value = value
                count = self._read_count()
                if count is not None and count > self.bytes_done:
                    self.bytes_done = count
                if self.total_bytes is not None:
                    self.bytes_done = self.total_bytes
                self.bar.value = 1.0
                self.bar.bar_style = "success"
                moved = self.bytes_done
                if moved:
                    self.info.value = (
                        f"done: {format_bytes(moved)} in {format_seconds(self.elapsed)} "
                        f"({format_rate(moved, self.elapsed)})"
                    )
                else:
                    self.info.value = f"done in {format_seconds(self.elapsed)}"
                self.status = DONE
            else:
                if not self._measured:
                    self.bar.value = 1.0  # else it stays where the failure stopped it
                self.bar.bar_style = "danger"
                self.info.value = f"failed in {format_seconds(self.elapsed)}"
                self.error_box.value = error_html(error, title="Failed:")
                self.error_box.layout.display = ""
                self.error = f"{type(error).__name__}: {error}"
                self.status = FAILED
            self._finished.set()
