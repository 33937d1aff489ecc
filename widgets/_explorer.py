"""Browsing a run: its checkpoints, one checkpoint's leaves, one leaf's values."""

from __future__ import annotations

import html
import os
import threading
from typing import Any

import ipywidgets as w
import pandas as pd
import traitlets

from tinax import _paths, explore
from tinax._format.words import ARRAY_KINDS, COMPLETE, IN_PROGRESS, INTERRUPTED
from tinax.explore import LeafStatistics, is_numeric, leaf_statistics

from ._diff import DiffView
from ._guard import shown_in_widget
from ._histogram import histogram_png
from ._interrupted import InterruptedSaves
from ._table import Column, PagedTable, RowLook, format_cell
from ._text import error_html, format_age, format_bytes, note_html
from ._verdict import verdict_html

DEFAULT_POLL_SECONDS = 2.0
_VALUE_CHARS = 40


def _format_time(value: Any) -> str:
    if value is None or value is pd.NaT or (isinstance(value, float) and pd.isna(value)):
        return ""
    try:
        return pd.Timestamp(value).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError):
        return format_cell(value)


def _format_names(value: Any) -> str:
    if isinstance(value, tuple | list):
        return ", ".join(str(v) for v in value)
    return format_cell(value)


def _format_value(value: Any) -> str:
    text = format_cell(value)
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 1] + "…"


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


def _checkpoint_look(row: pd.Series) -> RowLook:
    status = str(row.get("status", ""))
    if status == COMPLETE:
        return RowLook()
    if status == IN_PROGRESS:
        return RowLook(
            color="#8a6d00",
            pickable=False,
            tooltip="a save in progress: not opened until it commits",
        )
    if status == INTERRUPTED:
        return RowLook(
            color="#8a6d00",
            pickable=False,
            tooltip="an interrupted save: its writer is gone, it never loads; remove it below",
        )
    return RowLook(color="#b00020", pickable=False, tooltip=f"{status}: cannot be opened")


CHECKPOINT_COLUMNS = (
    Column("name", "checkpoint", None),
    Column("step", "step", "6em"),
    Column("status", "status", "7em"),
    Column("nbytes", "size", "7em", format_bytes),
    Column("committed", "committed (UTC)", "11em", _format_time),
    Column("age", "age", "5em", format_age),
    Column("checkpointables", "checkpointables", None, _format_names),
)


def _format_key(value: Any) -> str:
    # A checkpointable that is a single leaf (an iterator, an array) has the empty key.
    return format_cell(value) or "(whole)"


LEAF_COLUMNS = (
    Column("key", "key", None, _format_key),
    Column("checkpointable", "checkpointable", "9em"),
    Column("kind", "kind", "7em"),
    Column("shape", "shape", "8em"),
    Column("dtype", "dtype", "6em"),
    Column("nbytes", "size", "6em", format_bytes),
    Column("value", "value", "10em", _format_value),
)


def statistics_html(stats: LeafStatistics) -> str:
    """The statistics of one leaf as a small two-column HTML table."""
    rows = [
        ("shape", format_cell(stats.shape)),
        ("dtype", stats.dtype),
        ("size", f"{stats.size:,}"),
        ("min", _format_number(stats.minimum)),
        ("max", _format_number(stats.maximum)),
        ("mean", _format_number(stats.mean)),
        ("std", _format_number(stats.std)),
        ("NaN", f"{stats.nan_count:,}"),
        ("Inf", f"{stats.inf_count:,}"),
    ]
    cells = "".join(
        f'<tr><th style="text-align:left;padding-right:1em">{html.escape(k)}</th>'
        f'<td style="font-family:monospace" data-stat="{html.escape(k)}">{html.escape(v)}</td></tr>'
        for k, v in rows
    )
    return f'<table class="tinax-leaf-stats">{cells}</table>'


class CheckpointExplorer(w.VBox):
    """Browse a run: its checkpoints, one checkpoint's leaves, one leaf's statistics.

    Checkpoints still being written, interrupted saves and directories that
    cannot be read are listed with their status and age and cannot be opened; an
    interrupted save can be removed, after a confirmation. Picking a leaf reads only that
    leaf's bytes. Refresh re-lists the run; ``poll_interval`` (or the "watch"
    checkbox) re-lists it periodically from a daemon thread.

    Attributes:
      checkpoint: Path of the open checkpoint, or ``None``.
      leaf: ``(checkpointable, key)`` of the picked leaf, or ``None``.
      error: The last error shown in the widget, or ``""``.
      poll_interval: Seconds between automatic refreshes; ``0`` turns polling off.
      checkpoints: The run's ``list_checkpoints`` table.
      leaves: The open checkpoint's ``checkpoint_table`` (all rows, unfiltered).
      statistics: The picked leaf's ``LeafStatistics``, or ``None``.
      leaf_value: The picked leaf's value as read, or ``None``.
    """

    checkpoint = traitlets.Unicode(None, allow_none=True)
    leaf = traitlets.Any(None, allow_none=True)
    error = traitlets.Unicode("")
    # Any, so that the validator (not the trait type) says what is wrong with a value.
    poll_interval = traitlets.Any(0.0)

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        poll_interval: float = 0.0,
        page_size: int = 20,
    ) -> None:
        """Lists the checkpoints under ``root``.

        Args:
          root: A run directory, or one checkpoint.
          poll_interval: Seconds between automatic refreshes; ``0`` for none.
          page_size: Rows per page in the tables.

        Raises:
          TypeError: If ``root`` is not a path.
          FileNotFoundError: If ``root`` does not exist.
          ValueError: If ``poll_interval`` is negative.
        """
        self._root = _paths.existing_directory(root, what="run directory")
        # The header shows the path as given; everything else uses the checked one.
        self.root = str(self._root)
        poll_interval = self._valid_poll_interval({"value": poll_interval})
        self._lock = threading.RLock()
        self._stop_polling = threading.Event()
        self._poller: threading.Thread | None = None
        self.checkpoints = pd.DataFrame()
        self.leaves = pd.DataFrame()
        self.statistics: LeafStatistics | None = None
        self.leaf_value: Any = None

        guard = shown_in_widget(self._show_error)
        self.refresh_button = w.Button(description="Refresh", icon="refresh")
        self.refresh_button.on_click(guard(lambda _: self.refresh()))
        self.watch_box = w.Checkbox(
            value=poll_interval > 0, description="watch for new checkpoints", indent=False
        )
        self.watch_box.observe(guard(self._on_watch), names="value")
        self.summary = w.Label("")
        self.message = w.HTML("")
        self.interrupted = InterruptedSaves(on_removed=self.refresh)

        self.checkpoint_view = PagedTable(
            CHECKPOINT_COLUMNS,
            pick="name",
            page_size=page_size,
            look=_checkpoint_look,
            empty_text="no checkpoints yet",
        )
        self.checkpoint_view.observe(guard(self._on_pick_checkpoint), names="selected")

        self.leaf_title = w.HTML("")
        self.checkpointable_filter = w.Dropdown(
            options=[("all checkpointables", "")], value="", description="show"
        )
        self.key_filter = w.Text(
            value="", placeholder="key contains…", description="key", continuous_update=True
        )
        for control in (self.checkpointable_filter, self.key_filter):
            control.observe(guard(self._on_filter), names="value")
        self.leaf_view = PagedTable(
            LEAF_COLUMNS, pick="key", page_size=page_size, empty_text="no matching leaves"
        )
        self.leaf_view.observe(guard(self._on_pick_leaf), names="selected")
        self.verdict = w.HTML("")
        self.diff_view = DiffView(page_size=page_size, on_error=self._show_error)
        self.leaf_section = w.VBox(
            [
                self.leaf_title,
                self.verdict,
                self.diff_view,
                w.HBox(
                    [self.checkpointable_filter, self.key_filter],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                self.leaf_view,
            ],
            layout=w.Layout(display="none"),
        )

        self.leaf_heading = w.HTML("")
        self.stats_html = w.HTML("")
        self.histogram = w.Image(format="png", layout=_image_layout(display="none"))
        self.histogram.add_class("tinax-histogram")
        self.leaf_panel = w.VBox(
            [
                self.leaf_heading,
                w.HBox([self.stats_html, self.histogram], layout=w.Layout(flex_flow="row wrap")),
            ],
            layout=w.Layout(display="none"),
        )

        super().__init__(
            children=[
                w.HTML(f"<b>Run</b> <code>{html.escape(os.fspath(root))}</code>"),
                w.HBox(
                    [self.refresh_button, self.watch_box, self.summary],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                self.message,
                self.checkpoint_view,
                self.interrupted,
                self.leaf_section,
                self.leaf_panel,
            ]
        )
        self.add_class("tinax-checkpoint-explorer")
        self.observe(guard(self._on_poll_interval), names="poll_interval")
        self.refresh()
        self.poll_interval = poll_interval

    # -- public ---------------------------------------------------------------------

    def refresh(self) -> None:
        """Re-lists the run's checkpoints, keeping the open checkpoint if it is still there."""
        with self._lock:
            table = explore.list_checkpoints(self.root)
            table = table.set_index(table["path"].astype(str), drop=False)
            table.index.name = None
            changed = not self._same_listing(self.checkpoints, table)
            self.checkpoints = table
            counts = table["status"].value_counts() if len(table) else pd.Series(dtype=int)
            parts = [f"{len(table)} checkpoint{'s' if len(table) != 1 else ''}"]
            parts += [f"{n} {status}" for status, n in counts.items() if status != COMPLETE]
            self.summary.value = " · ".join(parts)
            if changed:
                self.checkpoint_view.show(table, keep_page=True)
                self.diff_view.set_base(self.checkpoint, self._comparable())
            self.interrupted.update(table)
            if self.checkpoint is not None:
                still = table[table["path"].astype(str) == self.checkpoint]
                if still.empty or str(still.iloc[0]["status"]) != COMPLETE:
                    self._close_checkpoint()
                    self.message.value = note_html(
                        "the open checkpoint is gone from the run", color="#8a6d00"
                    )

    def open_checkpoint(self, name_or_path: str | os.PathLike[str]) -> None:
        """Opens a listed checkpoint, as if its row had been clicked.

        Raises:
          ValueError: If no listed checkpoint has that name or path.
        """
        wanted = os.fspath(name_or_path)
        table = self.checkpoints
        rows = table[(table["name"].astype(str) == wanted) | (table.index == wanted)]
        if rows.empty:
            raise ValueError(f"no checkpoint {wanted!r} in {str(self.root)!r}")
        label = rows.index[0]
        self.checkpoint_view.show_row(label)
        self.checkpoint_view.selected = label

    def open_leaf(self, checkpointable: str, key: str) -> None:
        """Picks a leaf of the open checkpoint, as if its row had been clicked.

        Raises:
          ValueError: If no checkpoint is open or it has no such leaf.
        """
        if self.checkpoint is None:
            raise ValueError("no checkpoint is open")
        leaves = self.leaves
        rows = leaves[(leaves["checkpointable"] == checkpointable) & (leaves["key"] == key)]
        if rows.empty:
            raise ValueError(f"the open checkpoint has no leaf {checkpointable!r} {key}")
        label = rows.index[0]
        if label not in self.leaf_view.frame.index:
            self.checkpointable_filter.value = ""
            self.key_filter.value = ""
        self.leaf_view.show_row(label)
        self.leaf_view.selected = label

    def close(self) -> None:
        """Stops polling and closes the widget."""
        # Also called from __del__, possibly on an instance whose __init__ failed.
        stop = getattr(self, "_stop_polling", None)
        if stop is not None:
            stop.set()
        super().close()

    # -- checkpoints ----------------------------------------------------------------

    def _comparable(self) -> list[tuple[str, str]]:
        table = self.checkpoints
        if table.empty:
            return []
        done = table[table["status"] == COMPLETE]
        return [(str(n), str(p)) for n, p in zip(done["name"], done["path"], strict=True)]

    @staticmethod
    def _same_listing(old: pd.DataFrame, new: pd.DataFrame) -> bool:
        fields = ["path", "status", "nbytes", "committed"]
        if list(old.index) != list(new.index) or not {*fields, "age"} <= set(old.columns):
            return False
        # Ages change all the time; the table is redrawn when their shown text does.
        if list(old["age"].map(format_age)) != list(new["age"].map(format_age)):
            return False
        return bool(old[fields].astype(str).equals(new[fields].astype(str)))

    def _show_error(self, error: BaseException) -> None:
        self.error = f"{type(error).__name__}: {error}"
        self.message.value = error_html(error)

    def _on_pick_checkpoint(self, change: Any) -> None:
        label = change["new"]
        with self._lock:
            if label is None:
                return
            row = self.checkpoints.loc[label]
            if str(row["status"]) != COMPLETE:
                # Buttons of such rows are disabled; this guards programmatic picks.
                self.checkpoint_view.selected = None
                self.message.value = note_html(
                    f"{row['name']} is {row['status']}; it is not opened", color="#8a6d00"
                )
                return
            self._open(str(row["path"]), str(row["name"]))

    def _open(self, path: str, name: str) -> None:
        self._close_checkpoint()
        self.error = ""
        self.message.value = ""
        leaves = explore.checkpoint_table(path).reset_index(drop=True)
        self.leaves = leaves
        self.checkpoint = path
        names = list(dict.fromkeys(str(n) for n in leaves["checkpointable"]))
        self.checkpointable_filter.options = [("all checkpointables", ""), *[(n, n) for n in names]]
        self.checkpointable_filter.value = ""
        self.key_filter.value = ""
        total = int(pd.to_numeric(leaves["nbytes"], errors="coerce").fillna(0).sum())
        self.leaf_title.value = (
            f"<b>{html.escape(name)}</b>: {len(leaves):,} leaves in {len(names)} "
            f"checkpointable{'s' if len(names) != 1 else ''}, {format_bytes(total)}"
        )
        self.leaf_view.show(leaves)
        self.verdict.value = verdict_html(path)
        self.diff_view.set_base(path, self._comparable())
        self.leaf_section.layout.display = ""

    def _close_checkpoint(self) -> None:
        self.checkpoint = None
        self.leaves = pd.DataFrame()
        self.leaf_view.selected = None
        self.leaf_view.show(pd.DataFrame(columns=[c.field for c in LEAF_COLUMNS]))
        self.leaf_section.layout.display = "none"
        self.verdict.value = ""
        self.diff_view.set_base(None, [])
        self._clear_leaf()
        if self.checkpoint_view.selected is not None:
            label = self.checkpoint_view.selected
            if label not in self.checkpoints.index or (
                str(self.checkpoints.loc[label]["status"]) != COMPLETE
            ):
                self.checkpoint_view.selected = None

    # -- leaves ---------------------------------------------------------------------

    def _on_filter(self, _change: Any) -> None:
        with self._lock:
            leaves = self.leaves
            if leaves.empty:
                return
            mask = pd.Series(True, index=leaves.index)
            if self.checkpointable_filter.value:
                mask &= leaves["checkpointable"] == self.checkpointable_filter.value
            text = self.key_filter.value.strip()
            if text:
                mask &= leaves["key"].astype(str).str.contains(text, case=False, regex=False)
            self.leaf_view.show(leaves[mask])

    def _clear_leaf(self) -> None:
        self.leaf = None
        self.statistics = None
        self.leaf_value = None
        self.leaf_panel.layout.display = "none"
        self.histogram.layout.display = "none"
        self.stats_html.value = ""

    def _on_pick_leaf(self, change: Any) -> None:
        label = change["new"]
        with self._lock:
            self._clear_leaf()
            if label is None or self.checkpoint is None:
                return
            row = self.leaves.loc[label]
            checkpointable, key = str(row["checkpointable"]), str(row["key"])
            self.leaf_heading.value = (
                f"<b>{html.escape(checkpointable)}</b> <code>{html.escape(key)}</code>"
            )
            self.leaf_panel.layout.display = ""
            if str(row["kind"]) not in ARRAY_KINDS:
                self.leaf_value = row.get("value")
                self.stats_html.value = (
                    f"<pre>{html.escape(format_cell(self.leaf_value))}</pre>"
                    f"{note_html(str(row['kind']) + ' leaf: stored value shown, nothing read')}"
                )
                self.leaf = (checkpointable, key)
                return
            self.stats_html.value = note_html("reading…")
            try:
                value = explore.read_leaf(self.checkpoint, checkpointable, key)
            except Exception as e:
                self.stats_html.value = error_html(e, title="Cannot read this leaf:")
                raise
            self.leaf_value = value
            if is_numeric(value):
                stats = leaf_statistics(value)
                self.statistics = stats
                self.stats_html.value = statistics_html(stats)
                png = histogram_png(stats, title=key)
                if png:
                    self.histogram.value = png
                    self.histogram.layout.display = ""
            else:
                self.stats_html.value = f"<pre>{html.escape(_format_value(repr(value)))}</pre>"
            self.leaf = (checkpointable, key)

    # -- polling --------------------------------------------------------------------

    def _on_watch(self, change: Any) -> None:
        if change["new"] and self.poll_interval <= 0:
            self.poll_interval = DEFAULT_POLL_SECONDS
        elif not change["new"]:
            self.poll_interval = 0.0

    @traitlets.validate("poll_interval")
    def _valid_poll_interval(self, proposal: Any) -> float:
        value = proposal["value"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(
                f"poll_interval must be a number of seconds, got {type(value).__name__}"
            )
        if not value >= 0:
            raise ValueError(f"poll_interval must be non-negative, got {value}")
        return float(value)

    def _on_poll_interval(self, change: Any) -> None:
        interval = float(change["new"])
        self.watch_box.value = interval > 0
        self._stop_polling.set()
        self._stop_polling = threading.Event()
        if interval > 0:
            stop = self._stop_polling
            self._poller = threading.Thread(
                target=self._poll, args=(interval, stop), name="tinax-explorer-poll", daemon=True
            )
            self._poller.start()

    def _poll(self, interval: float, stop: threading.Event) -> None:
        guarded_refresh = shown_in_widget(self._show_error)(self.refresh)
        while not stop.wait(interval):
            guarded_refresh()
