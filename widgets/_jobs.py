"""Reads a widget runs in the background, each with its own button, progress and result
line, so that two of them (the run's layer drift and its NaN scan) run side by side."""

from __future__ import annotations

import html
import threading
from collections.abc import Callable

import ipywidgets as w

from ._task import joined, start_thread

# What a job's work is given: a progress callback ``(done, total)`` and the event
# that asks it to stop; it returns the line that says what it found.
Work = Callable[[Callable[[int, int], None], threading.Event], str]


class BackgroundJob:
    """One kind of background read: a button that starts it, a small progress bar
    beside it while it runs, and the line its last run ended with.

    Starting a job disables only its own button; another job's button stays
    usable, so that two jobs run at once. The bar keeps its room while hidden
    (``visibility``), so that nothing around it moves when a job starts or ends.

    Attributes:
      name: What the job is called in its notes (``"layer drift"``).
      button: Starts the job.
      bar: Its progress, visible while it runs.
      box: The button with the bar under it, to place in a row of controls.
      note: The line its last run ended with (plain text), or ``""``.
    """

    def __init__(
        self,
        name: str,
        *,
        button: w.Button,
        on_note: Callable[[], None],
        on_error: Callable[[BaseException], None],
    ) -> None:
        """Args:
        name: The job's name in its notes.
        button: The button that starts it (the caller wires its click).
        on_note: Called whenever ``note`` or the running state changes.
        on_error: Called with an exception the work raised.
        """
        self.name = name
        self.button = button
        # A thin bar under the button: no room is kept beside it while it is idle.
        self.bar = w.FloatProgress(
            value=0.0,
            min=0.0,
            max=1.0,
            tooltip=name,
            layout=w.Layout(width="100%", height="5px", margin="0", visibility="hidden"),
        )
        self.bar.add_class("tinax-job-bar")
        self.box = w.VBox(
            [button, self.bar], layout=w.Layout(flex="0 0 auto", align_items="stretch")
        )
        self.note = ""
        self._on_note = on_note
        self._on_error = on_error
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # True from the start of a run until its end is shown (its thread may still
        # be finishing then).
        self._active = False

    @property
    def running(self) -> bool:
        """Whether a run of the job is in progress."""
        return self._active

    def start(self, work: Work) -> bool:
        """Runs ``work`` in a background thread; returns ``False`` (and does nothing)
        if a run of this job is already in progress."""
        with self._lock:
            if self.running:
                return False
            cancel = self._cancel = threading.Event()
            self._active = True
            self.button.disabled = True
            self.bar.value = 0.0
            self.bar.layout.visibility = "visible"
            self.note = f"{self.name}: reading…"

            def progress(done: int, total: int) -> None:
                self.bar.value = done / total if total else 1.0

            def run() -> None:
                try:
                    self.note = work(progress, cancel)
                except Exception as e:  # shown in the widget, never a traceback
                    self.note = f"{self.name} failed"
                    self._on_error(e)
                finally:
                    self._active = False
                    self.button.disabled = False
                    self.bar.layout.visibility = "hidden"
                    self._on_note()

            self._thread = start_thread(run, name=f"tinax-{self.name}", stop=cancel.set)
        self._on_note()
        return True

    def cancel(self) -> None:
        """Asks a run in progress to stop at its next step."""
        self._cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for a run in progress; returns whether none is running."""
        return joined(self._thread, timeout)


def notes_html(jobs: list[BackgroundJob], *, color: str = "#555") -> str:
    """The jobs' notes, one line each (jobs without a note left out)."""
    lines = [html.escape(job.note) for job in jobs if job.note]
    return "".join(f'<div style="color:{color}">{line}</div>' for line in lines)
