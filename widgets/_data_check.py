"""The "check data" action: ``verify(path, data=True)`` in the background, with
progress, cancel, and NaN/Inf per leaf."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as w
import pandas as pd

from tinax import explore
from tinax.vocabulary import WARNING

from ._guard import shown_in_widget
from ._nonfinite import NONFINITE_BACKGROUND, NONFINITE_COLOR, counted
from ._soundness import findings_list, verdict_span
from ._table import Column, PagedTable, RowLook
from ._task import joined, start_thread
from ._text import error_html, format_bytes, format_rate, format_seconds, note_html


class Cancelled(Exception):
    """Raised in the reader's progress callback when the reader asked to stop."""


def _count(value: Any) -> str:
    return "" if value is None or value is pd.NA else f"{int(value):,}"


_LEAF_COLUMNS = (
    Column("key", "key", lambda k: str(k) or "(whole)", key=True),
    Column("nan_count", "NaN", _count, align="right", descending_first=True),
    Column("inf_count", "Inf", _count, align="right", descending_first=True),
    Column("nbytes", "size", format_bytes, align="right", descending_first=True),
    Column("dtype", "dtype", essential=False, priority=1),
    Column("checkpointable", "checkpointable", essential=False, priority=2),
    Column("read", "read", lambda r: "yes" if r is True else "no", essential=False, priority=3),
)


def _flagged(row: pd.Series) -> bool:
    """Whether a leaf of the check needs a look: NaN or Inf in it, or not all read."""
    counts = (row.get(c) for c in ("nan_count", "inf_count"))
    return any(c is not None and c is not pd.NA and bool(c) for c in counts) or (
        row.get("read") is False
    )


def _look(row: pd.Series) -> RowLook:
    if counted(row.get("nan_count")) or counted(row.get("inf_count")):
        return RowLook(
            color=NONFINITE_COLOR, background=NONFINITE_BACKGROUND, tooltip="NaN or Inf values"
        )
    if row.get("read") is False:
        return RowLook(color="#7a4f01", background="#fff4ce", tooltip="not every region decoded")
    return RowLook()


def _unread_text(leaves: pd.DataFrame) -> str:
    """The leaves some of whose regions the check could not decode, counted (``""``:
    none). Their NaN and Inf are the verdict's to tell, in its one count."""
    read = leaves["read"] if "read" in leaves else pd.Series([], dtype=object)
    unread = sum(1 for r in read if r is not None and r is not pd.NA and not bool(r))
    return f"{unread:,} with regions not read" if unread else ""


class DataCheck(w.VBox):
    """A "check data" button for one checkpoint: every chunk read, decoded and checked
    against its checksums, NaN and Inf counted per leaf (``tinax.explore.verify``
    with ``data=True``), in a background thread with a progress bar and a Cancel
    button. When it ends, a sound checkpoint is one line (the verdict, what was read
    and how fast); otherwise the findings follow, and a table of the leaves with
    NaN, Inf or regions not decoded. An error shows in the widget.

    The ``button`` is not among the widget's children: the host places it with its
    other actions.

    Attributes:
      button: The "check data" button.
      path: The checkpoint checked, or ``None``.
      result: The last ``Verification``, or ``None`` (none yet, or cancelled).
      status: ``""``, ``"checking"``, ``"done"``, ``"cancelled"`` or ``"failed"``.
    """

    def __init__(
        self,
        *,
        page_size: int = 10,
        on_start: Callable[[], None] | None = None,
        on_done: Callable[[str, Any], None] | None = None,
    ) -> None:
        """Args:
        page_size: Rows per page of the table of leaves.
        on_start: Called when a check starts (the host shows the widget then).
        on_done: Called with the path checked and the ``Verification`` of a check
          that ended.
        """
        self._on_start = on_start
        self._on_done = on_done
        self.path: str | None = None
        self.result: Any = None
        self.status = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        guard = shown_in_widget(self._show_error)
        self.button = w.Button(
            description="check data",
            icon="check-square-o",
            tooltip="read every chunk of every array: checksums, NaN and Inf",
            layout=w.Layout(width="auto"),
            disabled=True,
        )
        self.button.on_click(guard(lambda _: self.start()))
        self.cancel_button = w.Button(
            description="Cancel", icon="stop", layout=w.Layout(width="auto", display="none")
        )
        self.cancel_button.on_click(guard(lambda _: self.cancel()))
        self.bar = w.FloatProgress(
            value=0.0, min=0.0, max=1.0, layout=w.Layout(width="12em", display="none")
        )
        self.label = w.HTML("")
        self.findings = w.HTML("")
        self.table = PagedTable(
            _LEAF_COLUMNS,
            page_size=page_size,
            look=_look,
            pick=False,
            empty_text="no leaf with NaN, Inf or regions not read",
            sort_field="nan_count",
            ascending=False,
        )
        self.table.layout.display = "none"
        super().__init__(
            [
                w.HBox(
                    [self.bar, self.cancel_button, self.label],
                    layout=w.Layout(flex_flow="row wrap", align_items="center"),
                ),
                self.findings,
                self.table,
            ]
        )
        self.add_class("tinax-data-check")

    def set_path(self, path: str | None) -> None:
        """The checkpoint the button checks; a check of another one is cancelled."""
        if path != self.path:
            self.cancel()
            self.path = path
            self.result = None
            self.status = ""
            self.label.value = ""
            self.findings.value = ""
            self.table.layout.display = "none"
        self.button.disabled = path is None

    def start(self, *, in_thread: bool = True) -> None:
        """Checks the checkpoint's data: in a background thread, or on this one.

        Raises:
          ValueError: If no checkpoint is set.
        """
        if self.path is None:
            raise ValueError("no checkpoint to check")
        self.cancel()
        self._stop = threading.Event()
        stop, path = self._stop, self.path
        self.status = "checking"
        self.result = None
        self.findings.value = ""
        self.table.layout.display = "none"
        self.button.disabled = True
        self.cancel_button.layout.display = ""
        self.bar.layout.display = ""
        self.bar.bar_style = "info"
        self.bar.value = 0.0
        self.label.value = note_html("reading…")
        started = time.monotonic()
        if self._on_start is not None:
            self._on_start()

        def progress(done: int, total: int) -> None:
            if stop.is_set():
                raise Cancelled
            elapsed = time.monotonic() - started
            self.bar.value = done / total if total else 1.0
            rate = format_rate(done, elapsed)
            eta = ""
            if done and total > done and elapsed > 0.5:
                eta = f", {format_seconds((total - done) * elapsed / done)} left"
            self.label.value = note_html(
                f"{format_bytes(done)} of {format_bytes(total)} at {rate}{eta}"
            )

        def work() -> None:
            try:
                result = explore.verify(path, data=True, progress=progress)
            except Exception as e:
                if not stop.is_set():
                    self._finish(path, error=e, started=started)
                return
            self._finish(path, result=result, started=started, cancelled=stop.is_set())

        if in_thread:
            self._thread = start_thread(work, name="tinax-data-check", stop=stop.set)
        else:
            work()

    def cancel(self) -> None:
        """Stops a check in progress (at its next region); nothing is shown of it."""
        if self.status == "checking":
            self._stop.set()
            self.status = "cancelled"
            self._end_controls()
            self.label.value = note_html("cancelled")

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for a check in the background; returns whether none is running."""
        return joined(self._thread, timeout)

    def _end_controls(self) -> None:
        self.button.disabled = self.path is None
        self.cancel_button.layout.display = "none"
        self.bar.layout.display = "none"

    def _finish(
        self,
        path: str,
        *,
        started: float,
        result: Any = None,
        error: BaseException | None = None,
        cancelled: bool = False,
    ) -> None:
        with self._lock:
            if path != self.path or cancelled or self.status != "checking":
                return
            seconds = format_seconds(time.monotonic() - started)
            self._end_controls()
            if error is not None:
                self.status = "failed"
                self.label.value = note_html(f"failed in {seconds}", color="#b00020")
                self.findings.value = error_html(error, title="Cannot check data:")
                return
            self.status = "done"
            self.result = result
            leaves = result.leaves
            flagged = leaves[leaves.apply(_flagged, axis=1)] if len(leaves) else leaves
            read = format_bytes(pd.to_numeric(leaves.get("nbytes"), errors="coerce").sum())
            summary = f"{len(leaves):,} arrays, {read} read in {seconds}"
            found = _unread_text(leaves) if len(leaves) else ""
            if found:
                summary += f"; {found}"
            self.label.value = (
                verdict_span(result, css_class="tinax-data-verdict") + " " + note_html(summary)
            )
            self.findings.value = findings_list(_not_in_table(result.findings, flagged), limit=8)
            # A clean check is that one line: the table lists only the leaves to look at.
            self.table.show(flagged)
            self.table.layout.display = "" if len(flagged) else "none"
        if self._on_done is not None:
            self._on_done(path, result)

    def _show_error(self, error: BaseException) -> None:
        self.findings.value = error_html(error)


def _not_in_table(findings: pd.DataFrame, flagged: pd.DataFrame) -> pd.DataFrame:
    """The findings the table of leaves does not already tell: a warning about a leaf
    listed there (its NaN and Inf) is said once, in its row; errors always show."""
    if flagged.empty or findings.empty:
        return findings
    listed = {
        f"{c} {k}".strip() for c, k in zip(flagged["checkpointable"], flagged["key"], strict=True)
    }
    told = findings["part"].astype(str).isin(listed) & (findings["severity"] == WARNING)
    return findings[~told]
