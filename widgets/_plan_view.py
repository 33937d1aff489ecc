"""The restore plan of the builder's chosen targets, shown before Load: what the load
will read, its peak host memory and each device's memory against what is available,
and the warnings; the rows per process and device fold under it."""

from __future__ import annotations

import html

import ipywidgets as w
import pandas as pd

from ._section import Section
from ._table import Column, PagedTable
from ._text import format_bytes

PLAN_COLUMNS = (
    Column("device", "where", key=True, keystr=False),
    Column("memory_bytes", "memory", format_bytes, align="right", descending_first=True),
    Column("limit_bytes", "limit", format_bytes, align="right", essential=False, priority=1),
    Column("read_bytes", "read", format_bytes, align="right", essential=False, priority=2),
    Column("chunks", "chunks", align="right", essential=False, priority=4),
    Column("beyond_bytes", "beyond", format_bytes, align="right", essential=False, priority=3),
    Column("largest", "largest", essential=False, priority=5),
)
_RED, _AMBER, _GREEN = "#b00020", "#7a4f01", "#1b5e20"


def _line(text: str, color: str = "#333") -> str:
    return f'<div style="color:{color};line-height:1.4">{text}</div>'


def summary_html(table: pd.DataFrame) -> str:
    """The plan in a few lines: reads, peak host memory against its limit, the devices'
    memory, then the warnings (or why it does not fit)."""
    attrs = table.attrs
    host = table[table["device"] == "host"]
    devices = table[table["device"] != "host"]
    files = int(host["files"].sum()) if len(host) else 0
    chunks = int(host["chunks"].sum()) if len(host) else 0
    lines = [
        _line(
            f"<b>Reads</b> {format_bytes(attrs['read_bytes'])} from {files:,} "
            f"data file{'' if files == 1 else 's'} ({chunks:,} chunks)"
        )
    ]
    limit = host["limit_bytes"].iloc[0] if len(host) else None
    against = "" if limit is None or pd.isna(limit) else f" of {format_bytes(limit)}"
    if attrs["budget_given"]:
        against += " (max_host_bytes)"
    elif attrs["available_bytes"] is not None:
        against += f" (90% of {format_bytes(attrs['available_bytes'])} available)"
    lines.append(
        _line(
            f"<b>Peak host memory</b> {format_bytes(attrs['peak_host_bytes'])}{html.escape(against)}"
        )
    )
    if len(devices):
        most = devices["memory_bytes"].max()
        free = devices["limit_bytes"].dropna()
        said = f" of {format_bytes(free.min())} free" if len(free) else ""
        lines.append(
            _line(
                f"<b>Per device</b> up to {format_bytes(most)}{html.escape(said)} "
                f"({len(devices)} device{'' if len(devices) == 1 else 's'})"
            )
        )
    if not attrs["fits"]:
        lines.append(_line(html.escape(f"Does not fit: {attrs['refusal']}"), _RED))
    else:
        for warning in attrs["warnings"]:
            lines.append(_line("⚠ " + html.escape(warning), _AMBER))
    return "".join(lines)


class PlanView(w.VBox):
    """The plan of a restore (``tinax.explore.restore_plan``'s table) in a few lines,
    its rows per process and device folded under them.

    Attributes:
      table: The plan shown, or ``None``.
    """

    def __init__(self, *, page_size: int = 20) -> None:
        self.table: pd.DataFrame | None = None
        self.summary = w.HTML("")
        self.rows = PagedTable(PLAN_COLUMNS, page_size=page_size, empty_text="no plan")
        self.section = Section("restore plan", "", [self.rows], is_open=False)
        super().__init__([self.summary, self.section], layout=w.Layout(display="none"))
        self.add_class("tinax-restore-plan")

    def show(self, table: pd.DataFrame) -> None:
        """Shows ``table``'s plan."""
        self.table = table
        self.summary.value = summary_html(table)
        self.rows.show(table)
        count = len(table)
        self.section.heading.value = (
            f"<b>the plan per process and device</b> ({count} row{'' if count == 1 else 's'})"
        )
        self.layout.display = ""

    def clear(self) -> None:
        """Shows nothing (no plan: nothing chosen, or the targets do not fit)."""
        self.table = None
        self.summary.value = ""
        self.layout.display = "none"
