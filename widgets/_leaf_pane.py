"""The explorer's leaf pane: one leaf's values, statistics, histogram and history."""

from __future__ import annotations

import html
import math
import threading
from typing import Any

import ipywidgets as w
import numpy as np
import pandas as pd

from tinax import explore
from tinax.explore.display import readable_key
from tinax.explore.toolkit import LeafStatistics, is_numeric, leaf_statistics
from tinax.vocabulary import ARRAY_KINDS, SCALAR, STRING

from ._guard import shown_in_widget
from ._histogram import histogram_png
from ._history import HISTORY_COLUMNS, history_png, leaf_history
from ._leaf_columns import format_value
from ._section import Section
from ._services import Services
from ._table import format_cell
from ._text import error_html, format_bytes, note_html

# Arrays this small show their values (a PRNG key's data, a bias, a step count).
SMALL_ARRAY = 64


def _format_number(value: float | int | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.6g}"


def _image_layout(**extra: str) -> w.Layout:
    # Never stretched by its row (a flex row stretches its items to the tallest one),
    # and scaled down whole, keeping its aspect ratio, when the notebook is narrow.
    return w.Layout(
        align_self="flex-start",
        flex="0 1 auto",
        max_width="100%",
        height="auto",
        object_fit="contain",
        **extra,
    )


def _itemsize(dtype: Any) -> float:
    try:
        return np.dtype(str(dtype)).itemsize
    except TypeError:
        return math.nan  # a dtype NumPy does not know: its size is not shown


def statistics_html(stats: LeafStatistics) -> str:
    """The statistics of one leaf as a small two-column HTML table."""
    rows = [
        ("shape", format_cell(stats.shape)),
        ("dtype", stats.dtype),
        ("elements", f"{stats.size:,}"),
        ("size", format_bytes(stats.size * _itemsize(stats.dtype))),
        ("min", _format_number(stats.minimum)),
        ("max", _format_number(stats.maximum)),
        ("mean", _format_number(stats.mean)),
        ("std", _format_number(stats.std)),
        ("NaN", f"{stats.nan_count:,}"),
        ("Inf", f"{stats.inf_count:,}"),
    ]
    cells = [
        f'<th style="text-align:left;padding:0 0.5em 0 0">{html.escape(k)}</th>'
        f'<td style="font-family:monospace;padding:0 1.5em 0 0" data-stat="{html.escape(k)}">'
        f"{html.escape(v)}</td>"
        for k, v in rows
    ]
    # Two statistics a row: half the height of one a row, and as easy to read.
    lines = "".join(f"<tr>{''.join(cells[i : i + 2])}</tr>" for i in range(0, len(cells), 2))
    return f'<table class="tinax-leaf-stats">{lines}</table>'


def values_html(value: Any) -> str:
    """A small array's values, as NumPy prints them."""
    array = np.asarray(value)
    try:
        text = np.array2string(array, max_line_width=96, threshold=SMALL_ARRAY, separator=", ")
    except (TypeError, ValueError):
        text = repr(array.tolist())
    return f'<pre class="tinax-leaf-values" style="margin:0 0 4px 0">{html.escape(text)}</pre>'


class LeafPane:
    """One leaf of the open checkpoint: the explorer's third pane.

    Picking a leaf reads only that leaf's bytes: arrays of up to ``SMALL_ARRAY``
    elements show their values, larger ones their statistics and a histogram (on
    a log scale if asked); "across the run" reads that one leaf from every complete
    checkpoint and plots its norm, mean and max against step.

    Attributes:
      section: The pane, folding away under its heading.
      leaf: ``(checkpointable, key)`` of the leaf shown, or ``None``.
      statistics: Its ``LeafStatistics``, or ``None``.
      value: Its value as read (or as stored, for a scalar), or ``None``.
      history: Its norm, mean and max at every complete checkpoint, once "across
        the run" has read them; else empty.
    """

    def __init__(self, services: Services) -> None:
        """Makes the pane's widgets (hidden until a leaf is shown)."""
        self._services = services
        self.leaf: tuple[str, str] | None = None
        self.statistics: LeafStatistics | None = None
        self.value: Any = None
        self.history = pd.DataFrame(columns=list(HISTORY_COLUMNS))
        self._history_stop = threading.Event()
        guard = shown_in_widget(services.show_error)
        self.values = w.HTML("")
        self.stats_html = w.HTML("")
        self.histogram = w.Image(format="png", layout=_image_layout(display="none"))
        self.histogram.add_class("tinax-histogram")
        self.log_box = w.Checkbox(
            value=False, description="log scale", indent=False, layout=w.Layout(display="none")
        )
        self.log_box.observe(guard(lambda _: self._draw_histogram()), names="value")
        self.history_button = w.Button(
            description="across the run",
            icon="line-chart",
            tooltip="this leaf's norm, mean and max at every complete checkpoint",
        )
        self.history_button.on_click(guard(lambda _: self.show_history_of(None)))
        self.history_status = w.Label("")
        self.history_image = w.Image(format="png", layout=_image_layout())
        # Holds the image only while there is a history to show: an empty image is
        # still an element of the page.
        self.history_box = w.Box([])
        self._listing = pd.DataFrame()
        self.section = Section(
            "leaf",
            "",
            [
                self.values,
                w.HBox(
                    [self.stats_html, w.VBox([self.histogram, self.log_box])],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                w.HBox(
                    [self.history_button, self.history_status],
                    layout=w.Layout(flex_flow="row wrap", align_items="center"),
                ),
                self.history_box,
            ],
        )
        self.section.show(False)

    def stop(self) -> None:
        """Stops reading a history."""
        self._history_stop.set()

    def clear(self) -> None:
        """Shows no leaf."""
        self.leaf = None
        self.statistics = None
        self.value = None
        self.section.show(False)
        self.histogram.layout.display = "none"
        self.log_box.layout.display = "none"
        self.stats_html.value = ""
        self.values.value = ""
        self._history_stop.set()
        self.history = pd.DataFrame(columns=list(HISTORY_COLUMNS))
        self.history_status.value = ""
        self.history_box.children = ()

    def show(
        self,
        checkpoint: str,
        row: pd.Series,
        *,
        filling: bool,
        listing: pd.DataFrame,
    ) -> None:
        """Shows one leaf of ``checkpoint``: reads its bytes (only its own).

        Args:
          checkpoint: The open checkpoint.
          row: The leaf's row of its ``checkpoint_table``.
          filling: Whether the table's values are still being read.
          listing: The run's listing, for "across the run".
        """
        self.clear()
        self._listing = listing
        checkpointable, key = str(row["checkpointable"]), str(row["key"])
        self.section.set_title(
            f'<span class="tinax-leaf-title"><b>{html.escape(checkpointable)}</b> '
            f"<code>{html.escape(readable_key(key))}</code></span>"
        )
        self.section.heading.tooltip = key
        self.section.show(True)
        self.section.set_open(True)
        if str(row["kind"]) not in ARRAY_KINDS:
            self.value = row.get("value")
            if filling and str(row["kind"]) in (SCALAR, STRING):
                # Not in the table yet: its few stored bytes are read now.
                self.value = explore.read_leaf(checkpoint, checkpointable, key)
            self.stats_html.value = (
                f"<pre>{html.escape(format_cell(self.value))}</pre>"
                f"{note_html(str(row['kind']) + ' leaf: stored value shown, nothing read')}"
            )
            self.leaf = (checkpointable, key)
            return
        self.stats_html.value = note_html("reading…")
        try:
            value = explore.read_leaf(checkpoint, checkpointable, key)
        except Exception as e:
            self.stats_html.value = error_html(e, title="Cannot read this leaf:")
            raise
        self.value = value
        small = is_numeric(value) and int(np.size(value)) <= SMALL_ARRAY
        if small:
            self.values.value = values_html(value)
        if is_numeric(value) and not (small and np.asarray(value).dtype.kind in "biu"):
            stats = leaf_statistics(value)
            self.statistics = stats
            self.stats_html.value = statistics_html(stats)
            self.leaf = (checkpointable, key)
            self._draw_histogram()
        elif small:
            # Integers this few are identities (a PRNG key, a step count), not a
            # distribution: their values are what there is to see.
            array = np.asarray(value)
            self.stats_html.value = note_html(
                f"{format_cell(tuple(array.shape))} {array.dtype}: values shown"
            )
        else:
            self.stats_html.value = f"<pre>{html.escape(format_value(repr(value)))}</pre>"
        self.leaf = (checkpointable, key)

    def show_history_of(self, listing: pd.DataFrame | None) -> None:
        """Reads the leaf shown from every complete checkpoint of ``listing`` (the
        one it was shown with, if ``None``), in the background, and plots its norm,
        mean and max against step.

        Raises:
          ValueError: If no leaf is shown.
        """
        lock = self._services.lock
        with lock:
            if self.leaf is None:
                raise ValueError("pick a leaf first")
            checkpointable, key = self.leaf
            self._history_stop.set()
            stop = self._history_stop = threading.Event()
            listing = self._listing if listing is None else listing
            self.history_status.value = "reading…"
            self.history_box.children = ()

        def progress(done: int, total: int) -> None:
            if not stop.is_set():
                self.history_status.value = f"read {done:,} of {total:,} checkpoints…"

        def work() -> None:
            try:
                table = leaf_history(listing, checkpointable, key, progress=progress, stop=stop)
                png = history_png(table, title=f"{checkpointable} {readable_key(key)}")
            except Exception as e:
                if not stop.is_set():
                    self.history_status.value = f"⚠ {type(e).__name__}: {e}"
                raise
            with lock:
                if stop.is_set():
                    return  # Another leaf was picked meanwhile.
                self.history = table
                failed = int((table["error"] != "").sum())
                parts = [f"{len(table) - failed:,} checkpoints read"]
                if failed:
                    parts.append(f"{failed:,} without this leaf or unreadable")
                counts = table["nan"].fillna(0) + table["inf"].fillna(0)
                if (counts > 0).any():
                    first = int(table["step"][counts > 0].dropna().min())
                    parts.append(f"NaN/Inf from step {first:,} (✕)")
                self.history_status.value = " · ".join(parts)
                if png:
                    self.history_image.value = png
                    self.history_box.children = (self.history_image,)

        self._services.in_background(work, "tinax-explorer-history")

    def _draw_histogram(self) -> None:
        stats = self.statistics
        key = "" if self.leaf is None else readable_key(self.leaf[1])
        png = b""
        if stats is not None:
            png = histogram_png(stats, title=key, log=self.log_box.value)
        if png:
            self.histogram.value = png
        self.histogram.layout.display = "" if png else "none"
        self.log_box.layout.display = "" if png else "none"
