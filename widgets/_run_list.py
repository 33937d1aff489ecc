"""The explorer's run list: the run's checkpoints, newest first, kept up to date."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as w
import pandas as pd

from tinax import explore
from tinax.explore.toolkit import ListingCache, resolve_path, run_listing
from tinax.vocabulary import COMPLETE

from ._guard import shown_in_widget
from ._interrupted import InterruptedSaves
from ._run_rows import (
    CHECKPOINT_COLUMNS,
    checkpoint_columns,
    checkpoint_look,
    listing_summary,
    metric_names,
    with_metrics,
    with_policy_text,
)
from ._services import Services
from ._surgery import AveragePanel
from ._table import PagedTable, RowLook
from ._task import start_thread
from ._text import format_age

DEFAULT_POLL_SECONDS = 2.0


class RunList:
    """The run's checkpoints, newest first, kept up to date: the explorer's first pane.

    It lists the run (a quick walk first, then each checkpoint checked in the
    background), narrows the list to a step range, opens a checkpoint by step,
    polls for new checkpoints, keeps the ages shown ticking, and offers the
    removal of interrupted saves. Picking a complete checkpoint calls ``on_pick``.

    Attributes:
      checkpoints: The run's ``list_checkpoints`` table (indexed by path), with a
        ``kept`` column where the run recorded why each is kept.
      metrics: The run's metrics (``run_table``, read in the background after each
        listing that changed), shown as columns after the step: the metric the run
        keeps its best checkpoints by first, a value logged NaN or Inf as such.
      summary: The checkpoints counted in words, with the run's policy.
      view: The table of checkpoints.
      controls: The step range, "go to step" and its button.
      interrupted: The interrupted saves and their removal.
      refresh_button, watch_box: Re-list now; re-list periodically.
      ticked: Paths of the complete checkpoints whose tick box is ticked.
      average_button, average_box: "average…" and the panel it opens for the
        ticked checkpoints (or, with fewer than two ticked, those ``other_picks``
        gives: the run timeline's picked steps).
    """

    def __init__(
        self,
        root: str,
        services: Services,
        *,
        page_size: int,
        poll_interval: float,
        on_listing: Callable[[pd.DataFrame, bool], None],
        on_pick: Callable[[str, str], None],
        on_watch: Callable[[bool], None],
    ) -> None:
        """Makes the pane's widgets; ``refresh`` lists the run.

        Args:
          root: The run directory (checked).
          services: The explorer's shared services.
          page_size: Rows per page of the table.
          poll_interval: Seconds between automatic refreshes at first; ``0``: none.
          on_listing: Called, under the lock, with each listing shown and whether
            it differs from the one before.
          on_pick: Called, under the lock, with the path and name of a complete
            checkpoint picked.
          on_watch: Called when the "watch" box is ticked (``True``) or unticked.
        """
        self.root = root
        self._services = services
        # What the listings read of each checkpoint, kept for the next refresh: only
        # what changed since is read again (``ListingCache``, bounded).
        self._cache = ListingCache()
        # Whether the run is on an object store, where each checkpoint is checked
        # when it is opened rather than by every listing (its listings say).
        self._remote = False
        self._on_listing = on_listing
        self._on_pick = on_pick
        self._on_watch = on_watch
        self.checkpoints = pd.DataFrame()
        self.metrics = pd.DataFrame()
        self._metric_names: list[str] = []
        # Metrics reads finish out of order too: the last one started is kept.
        self._metric_reads = 0
        self.summary = ""
        # Listings finish out of order (a background check, a refresh): the last
        # one started is the one shown.
        self._listings_started = 0
        self._listing_shown = 0
        self._listed_at = time.monotonic()
        self._ages_shown: list[str] = []
        self._stop_polling = threading.Event()
        self._poller: threading.Thread | None = None
        guard = shown_in_widget(services.show_error)
        self.refresh_button = w.Button(description="Refresh", icon="refresh")
        self.refresh_button.on_click(guard(lambda _: self.refresh()))
        self.watch_box = w.Checkbox(
            value=poll_interval > 0, description="watch for new checkpoints", indent=False
        )
        self.watch_box.observe(guard(lambda c: self._on_watch(bool(c["new"]))), names="value")
        self.interrupted = InterruptedSaves(on_removed=self.refresh)
        self.ticked: list[str] = []
        self.other_picks: Callable[[], list[str]] = list
        self.average_button = w.Button(
            description="average…",
            icon="compress",
            tooltip="the average of the checkpoints ticked (or picked in the timeline)",
        )
        self.average_button.on_click(guard(lambda _: self.show_average()))
        self.average_box = w.VBox([])
        self.view = PagedTable(
            CHECKPOINT_COLUMNS,
            page_size=page_size,
            look=self._look,
            on_check=guard(self._on_tick),
            empty_text="no checkpoints yet",
            sort_field="step",
            ascending=False,
        )
        self.view.observe(guard(self._on_pick_row), names="selected")
        self.step_range = w.IntRangeSlider(
            value=(0, 0),
            min=0,
            max=0,
            description="steps",
            continuous_update=False,
            layout=w.Layout(width="32em", max_width="100%", display="none"),
        )
        self.step_range.observe(guard(self._on_step_range), names="value")
        self.step_box = w.IntText(value=0, description="go to step", layout=w.Layout(width="14em"))
        self._offered_step = 0
        self.go_button = w.Button(description="Go", tooltip="open the checkpoint of this step")
        self.go_button.layout = w.Layout(width="5em")
        self.go_button.on_click(guard(lambda _: self.go_to_step(int(self.step_box.value))))
        self.controls = w.HBox(
            [self.step_range, self.step_box, self.go_button],
            layout=w.Layout(flex_flow="row wrap"),
        )

    def refresh(self, *, deep: bool | None = None) -> None:
        """Re-lists the run's checkpoints, keeping the open checkpoint if it is still there.

        Args:
          deep: Whether checkpoints not read before are read (metadata only) to
            tell whether they can be opened. ``False`` lists quickly (each
            checkpoint's commit record) and leaves that check to a background
            thread (which lists as ``None`` does); ``None``: on a local disk, yes;
            on a bucket, where each file is a round trip, each checkpoint is
            checked when it is opened.
        """
        if deep is None:
            deep = not self._remote
        with self._services.lock:
            self._listings_started += 1
            number = self._listings_started
        table = with_policy_text(run_listing(self.root, deep=deep, cache=self._cache))
        self._remote = bool(table.attrs.get("remote"))
        listed_at = time.monotonic()
        with self._services.lock:
            if number < self._listing_shown:
                return  # A listing started later is already shown.
            self._listing_shown = number
            self._listed_at = listed_at
            # On a bucket, where each file is a round trip, a checkpoint is checked
            # when it is opened, not all of them in the background.
            checking = deep is False and bool(table.attrs.get("unchecked"))
            checking = checking and not table.attrs.get("remote")
            self._show_listing(table, checking=checking)
        if checking:
            self._services.in_background(self._check_listing, "tinax-explorer-check")

    def go_to_step(self, step: int) -> None:
        """Opens the complete checkpoint of ``step``, or the nearest one, and shows its row.

        Raises:
          TypeError: If ``step`` is not an int.
          ValueError: If the run has no complete checkpoint with a step.
        """
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"a step is an int, got {type(step).__name__}")
        table = self.checkpoints
        done = table[(table["status"] == COMPLETE) & table["step"].notna()] if len(table) else table
        if done.empty:
            raise ValueError(f"no complete checkpoint with a step in {str(self.root)!r}")
        steps = done["step"].astype("int64")
        distance = (steps - step).abs()
        # The nearest step; of two as near, the earlier.
        label = distance.sort_values(kind="stable").index[0]
        found = int(steps.loc[label])
        self.open_checkpoint(label)
        if found != step:
            self._services.note(
                f"no complete checkpoint at step {step:,}; opened step {found:,}, the nearest",
                "#555",
            )

    def open_checkpoint(
        self, name_or_path: str | os.PathLike[str], *, turn_page: bool = True
    ) -> None:
        """Opens a listed checkpoint, as if its row had been clicked (it opens afresh
        when it is the one picked already).

        Args:
          name_or_path: The checkpoint's name or path.
          turn_page: Show its row: widen the step range to it and turn to its page.
            ``False`` leaves the list as it is (its row is marked if in view).

        Raises:
          ValueError: If no listed checkpoint has that name or path.
        """
        wanted = os.fspath(name_or_path)
        # Under the lock that background redraws of the list hold: a pick is never
        # made while one of them is sending the table.
        with self._services.lock:
            table = self.checkpoints
            rows = table[(table["name"].astype(str) == wanted) | (table.index == wanted)]
            if rows.empty:
                raise ValueError(f"no checkpoint {wanted!r} in {str(self.root)!r}")
            label = rows.index[0]
            if turn_page:
                if label not in self.view.frame.index:
                    self.step_range.value = (self.step_range.min, self.step_range.max)
                self.view.show_row(label)
            if self.view.selected == label:
                self.view.selected = None
            self.view.selected = label

    def opened(self, path: str) -> Any:
        """The checkpoint at ``path`` as this list's last deep listing opened it, while
        nothing under it has changed (``ListingCache.opened``); else ``None``."""
        return self._cache.opened(path)

    def comparable(self) -> list[tuple[str, str]]:
        """``(name, path)`` of every complete checkpoint, in listing order."""
        table = self.checkpoints
        if table.empty:
            return []
        done = table[table["status"] == COMPLETE]
        return [(str(n), str(p)) for n, p in zip(done["name"], done["path"], strict=True)]

    def bytes_on_disk(self, name: str) -> int | None:
        """The listed size on disk of checkpoint ``name``, if known."""
        table = self.checkpoints
        if table.empty:
            return None
        rows = table[table["name"].astype(str) == name]
        if len(rows) and pd.notna(rows["nbytes"].iloc[0]):
            return int(rows["nbytes"].iloc[0])
        return None

    def show_average(self) -> None:
        """Opens the average panel of the ticked checkpoints (or the timeline's picks);
        a second click closes it.

        Raises:
          ValueError: If fewer than two complete checkpoints are ticked or picked.
        """
        if self.average_box.children:
            self.average_box.children = ()
            return
        paths = list(self.ticked) if len(self.ticked) >= 2 else self.other_picks()
        if len(paths) < 2:
            raise ValueError(
                "tick two or more complete checkpoints in the list (or pick two steps in "
                "the run timeline) to average them"
            )
        by_step = self.checkpoints.loc[paths, "step"] if len(self.checkpoints) else None
        if by_step is not None and by_step.notna().all():
            paths = [str(p) for p in by_step.sort_values(kind="stable").index]
        self.average_box.children = (AveragePanel(paths, on_done=self.open_written),)

    def open_written(self, path: str) -> None:
        """Lists the run again and opens ``path``, a checkpoint just written into it; a
        note says where it went when the run does not hold it."""
        self.refresh()
        where = resolve_path(path)
        with self._services.lock:
            if where in self.checkpoints.index:
                self.open_checkpoint(where)
            else:
                self._services.note(f"wrote {where}: outside this run, not listed here", "#1b5e20")

    def _look(self, row: pd.Series) -> RowLook:
        look = checkpoint_look(row)
        if str(row.get("status", "")) != COMPLETE:
            return look
        return dataclasses.replace(look, check=str(row.get("path", "")) in self.ticked)

    def _on_tick(self, label: Any, value: bool) -> None:
        path = str(label)
        with self._services.lock:
            if value and path not in self.ticked:
                self.ticked.append(path)
            elif not value and path in self.ticked:
                self.ticked.remove(path)
            self._show_rows(self.checkpoints, keep_page=True)

    def unpick(self, path: str | None = None) -> None:
        """Clears the picked row (only if it is ``path``'s, when given)."""
        label = self.view.selected
        if label is not None and (path is None or label == path):
            self.view.selected = None

    def tick_ages(self) -> bool:
        """Advances the ages shown by the time since the listing; redraws the table
        only when a shown age changes. Returns whether it did."""
        with self._services.lock:
            table = self.checkpoints
            if table.empty or "age" not in table.columns:
                return False
            elapsed = pd.Timedelta(seconds=time.monotonic() - self._listed_at)
            ages = pd.to_timedelta(table["age"], errors="coerce") + elapsed
            shown = [format_age(a) for a in ages]
            if shown == self._ages_shown:
                return False
            self._ages_shown = shown
            self._show_rows(table.assign(age=ages), keep_page=True)
            return True

    def set_poll_interval(self, interval: float) -> None:
        """Re-lists the run every ``interval`` seconds from a daemon thread; ``0``: never."""
        self.watch_box.value = interval > 0
        self._stop_polling.set()
        self._stop_polling = stop = threading.Event()
        if interval > 0:
            self._poller = start_thread(
                lambda: self._poll(interval, stop), name="tinax-explorer-poll", stop=stop.set
            )

    def stop(self) -> None:
        """Stops polling."""
        self._stop_polling.set()

    def _poll(self, interval: float, stop: threading.Event) -> None:
        guarded_refresh = shown_in_widget(self._services.show_error)(self.refresh)
        while not stop.wait(interval):
            guarded_refresh()

    def _check_listing(self) -> None:
        # Deep where reading is cheap, so it remembers each verdict: later listings
        # are quick and exact.
        self.refresh(deep=None)

    def _show_listing(self, table: pd.DataFrame, *, checking: bool = False) -> None:
        table = table.set_index(table["path"].astype(str), drop=False)
        table.index.name = None
        changed = not self._same_listing(self.checkpoints, table)
        self.checkpoints = table
        self.ticked = [p for p in self.ticked if p in table.index]
        parts = [listing_summary(table)]
        if table.attrs.get("policy"):
            parts.append(table.attrs["policy"])
        unchecked = len(table.attrs.get("unchecked", ()))
        if unchecked and checking:
            parts.append(f"checking {unchecked:,} that have not been read yet…")
        self.summary = " · ".join(parts)
        if changed:
            self._update_step_range(table)
            self._ages_shown = [format_age(a) for a in table["age"]] if len(table) else []
            self._show_rows(table, keep_page=True)
        self.interrupted.update(table)
        self._on_listing(table, changed)
        if changed and len(table):
            self._services.in_background(self._read_metrics, "tinax-explorer-metrics")

    def _update_step_range(self, table: pd.DataFrame) -> None:
        steps = table["step"].dropna() if len(table) else pd.Series(dtype="Int64")
        if steps.empty:
            self.step_range.layout.display = "none"
            return
        low, high = int(steps.min()), int(steps.max())
        # "go to step" offers the newest step until the reader types another.
        if self.step_box.value in (0, self._offered_step):
            self.step_box.value = high
        self._offered_step = high
        slider = self.step_range
        was_all = slider.layout.display == "none" or slider.value == (slider.min, slider.max)
        old_low, old_high = slider.value
        with slider.hold_trait_notifications():
            # Widened first, so that neither bound is clamped against the other.
            slider.min, slider.max = min(slider.min, low), max(slider.max, high)
            value = (low, high) if was_all else (max(low, old_low), min(high, old_high))
            slider.value = value if value[0] <= value[1] else (low, high)
            slider.min, slider.max = low, high
        slider.layout.display = ""

    def _show_rows(self, table: pd.DataFrame, *, keep_page: bool = False) -> None:
        """Shows the rows of ``table`` in the step range, with the run's metrics."""
        rows = with_metrics(self._in_step_range(table), self.metrics, self._metric_names)
        self.view.show(rows, keep_page=keep_page)

    def _read_metrics(self) -> None:
        """Reads the run's metrics (metadata only) and shows them as columns."""
        with self._services.lock:
            self._metric_reads += 1
            number = self._metric_reads
            kept_by = self.checkpoints.attrs.get("best_by")
        metrics = explore.run_table(self.root)
        names = metric_names(metrics, kept_by if isinstance(kept_by, str) else None)
        with self._services.lock:
            if number != self._metric_reads:
                return  # a later read will show its own
            self.metrics = metrics
            if names != self._metric_names:
                self._metric_names = names
                self.view.set_columns(checkpoint_columns(names))
            self._show_rows(self.checkpoints, keep_page=True)

    def _in_step_range(self, table: pd.DataFrame) -> pd.DataFrame:
        slider = self.step_range
        if slider.layout.display == "none" or slider.value == (slider.min, slider.max):
            return table
        low, high = slider.value
        steps = table["step"]
        return table[steps.notna() & (steps >= low) & (steps <= high)].copy()

    def _on_step_range(self, _change: Any) -> None:
        with self._services.lock:
            if not self.checkpoints.empty:
                self._show_rows(self.checkpoints)

    @staticmethod
    def _same_listing(old: pd.DataFrame, new: pd.DataFrame) -> bool:
        # The health too: a data check or a scan turns "not yet known" into a verdict.
        fields = ["path", "status", "nbytes", "committed", "health", "health_reason"]
        if list(old.index) != list(new.index) or not {*fields, "age"} <= set(old.columns):
            return False
        # Ages change all the time; the table is redrawn when their shown text does.
        if list(old["age"].map(format_age)) != list(new["age"].map(format_age)):
            return False
        return bool(old[fields].astype(str).equals(new[fields].astype(str)))

    def _on_pick_row(self, change: Any) -> None:
        label = change["new"]
        with self._services.lock:
            if label is None:
                return
            row = self.checkpoints.loc[label]
            if str(row["status"]) != COMPLETE:
                # Buttons of such rows are disabled; this guards programmatic picks.
                self.view.selected = None
                self._services.note(
                    f"{row['name']} is {row['status']}; it is not opened", "#8a6d00"
                )
                return
            self._on_pick(str(row["path"]), str(row["name"]))
