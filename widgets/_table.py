"""A paged, sortable table of a DataFrame that fits the notebook's width.

Why a view of our own (``grid.js``, an anywidget) rather than stock widgets or a grid
library: a table of stock widgets (a button or label per cell) costs a widget per
cell, cannot align or shorten text, and overflowed every narrow notebook; the
maintained grids (ipydatagrid, itables) draw on a canvas or ship DataTables, with
no middle-shortened keys, no rows indented as a tree, no tick boxes, and a
JupyterLab extension of their own to keep in step. anywidget is one small
dependency whose JupyterLab extension ships in its wheel; the view is ~300 lines
of plain JavaScript and CSS. Python keeps the frame and sends the browser only the
page shown (a 50,000-leaf checkpoint is 20 rows of text on the wire), so opening
and sorting cost what pandas costs.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Callable, Collection, Sequence
from typing import Any

import anywidget
import pandas as pd
import traitlets

from ._columns import Column, RowLook, cell_text, check_columns, column_spec, page_rows
from ._guard import shown_in_widget
from ._page_text import KEY_WIDTHS, format_cell, key_labels, quiet_columns
from ._sorting import sorted_frame

__all__ = ["DEFAULT_PAGE_SIZE", "Column", "PagedTable", "RowLook", "format_cell"]

DEFAULT_PAGE_SIZE = 20
_HERE = pathlib.Path(__file__).parent


class PagedTable(anywidget.AnyWidget):
    """One page of a DataFrame in a table that fits its output (``grid.js``).

    Python keeps the whole frame and sends the browser the rows of the page shown,
    as text. Clicking a row sets ``selected`` to its index label (``click`` does the
    same from Python); clicking a header sorts by that column, a second click
    reverses the order (``click_header``, ``sort_by``); the page turns with the
    arrows or the page box (``turn``, ``jump``).

    A key column of leaf keys is sent as labels for people
    (``display.display_keys`` over the page, one set per width in ``KEY_WIDTHS``,
    each set distinct; the browser draws the longest set that fits) and the exact
    key for hover and copy; what the page's keys share goes to the header
    (``key_prefix``). ``quiet`` tells the browser which columns say nothing about
    the page.

    Attributes:
      selected: Index label of the picked row, or ``None``.
      page: Zero-based page number.
      sort_field: The column sorted by, or ``None`` for the frame's own order.
      ascending: Whether the sort is ascending.
      position: The text under the table: which rows of how many, or an error.
      frame: The rows as shown: the frame last passed to ``show``, sorted.
    """

    _esm = _HERE / "grid.js"
    _css = _HERE / "grid.css"
    spec: traitlets.List[Any] = traitlets.List().tag(sync=True)
    rows: traitlets.List[Any] = traitlets.List().tag(sync=True)
    position = traitlets.Unicode("").tag(sync=True)
    page = traitlets.Int(0).tag(sync=True)
    page_count = traitlets.Int(1).tag(sync=True)
    sort_field = traitlets.Unicode(None, allow_none=True).tag(sync=True)
    ascending = traitlets.Bool(True).tag(sync=True)
    sortable = traitlets.Bool(True).tag(sync=True)
    empty_text = traitlets.Unicode("nothing to show").tag(sync=True)
    # Per column: ``SILENT`` if it says nothing about the rows in view (every cell
    # blank, the same cells as a column before it, what the keys say): not shown;
    # ``UNIFORM`` if one value fills it: the first to give its width.
    quiet: traitlets.List[Any] = traitlets.List().tag(sync=True)
    # What the key column's labels leave out because every row in view shares it.
    key_prefix = traitlets.Unicode("").tag(sync=True)
    # Rows shown before the table scrolls within itself; 0: as many as the page has.
    scroll_rows = traitlets.Int(0).tag(sync=True)
    # ``[slot, n]``: the row the browser scrolls into view (``n`` counts the asks).
    reveal: traitlets.List[Any] = traitlets.List([-1, 0]).tag(sync=True)
    selected = traitlets.Any(None, allow_none=True)

    def __init__(
        self,
        columns: Sequence[Column],
        *,
        pick: bool = True,
        page_size: int = DEFAULT_PAGE_SIZE,
        look: Callable[[pd.Series], RowLook] | None = None,
        empty_text: str = "nothing to show",
        sort_field: str | None = None,
        ascending: bool = True,
        sortable: bool = True,
        on_check: Callable[[Any, bool], None] | None = None,
        scroll_rows: int = 0,
    ) -> None:
        """Builds an empty table.

        Args:
          columns: The columns shown, in order.
          pick: Whether clicking a row picks it (sets ``selected``).
          page_size: Rows per page.
          look: Returns a row's colours, whether it can be picked, its tree depth,
            mark and tick box.
          empty_text: Shown when the frame has no rows.
          sort_field: The column the rows are sorted by at first; ``None`` keeps
            each frame's own order.
          ascending: Whether that sort is ascending.
          sortable: Whether clicking a header sorts (a tree's rows have an order
            of their own).
          on_check: Called with a row's index label and its new tick when its box
            is clicked.
          scroll_rows: With a page larger than this, the table shows this many
            rows and scrolls within itself (a tree's one long page); 0: no limit.

        Raises:
          ValueError: If ``columns`` is empty or has two key columns, ``sort_field``
            is not one of them or ``page_size`` is not positive.
        """
        check_columns(columns)
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        if isinstance(scroll_rows, bool) or not isinstance(scroll_rows, int) or scroll_rows < 0:
            raise ValueError(f"scroll_rows must be an int of at least 0, got {scroll_rows!r}")
        fields = [c.field for c in columns]
        if sort_field is not None and sort_field not in fields:
            raise ValueError(f"sort column {sort_field!r} is not one of the columns")
        self.columns = tuple(columns)
        self.pick = pick
        self.page_size = page_size
        self._look = look
        self._on_check = on_check
        self.source = pd.DataFrame(columns=fields)
        self.frame = self.source
        # Columns whose values are still being read (see ``hold``).
        self.held: frozenset[str] = frozenset()
        super().__init__(
            spec=column_spec(self.columns),
            sortable=sortable,
            empty_text=empty_text,
            sort_field=sort_field,
            ascending=ascending,
            scroll_rows=scroll_rows,
        )
        self.add_class("tinax-table")
        guard = shown_in_widget(self._show_error)
        self.on_msg(guard(self._on_msg))
        self.observe(guard(self._render_on_change), names=["page", "selected"])
        self.observe(guard(self._on_sort), names=["sort_field", "ascending"])
        self._render()

    # -- public ---------------------------------------------------------------------

    @property
    def pages(self) -> int:
        """Number of pages (at least 1)."""
        return max(1, math.ceil(len(self.frame) / self.page_size))

    def show(self, frame: pd.DataFrame, *, keep_page: bool = False) -> None:
        """Shows ``frame``, sorted: from its first page, or the same page if ``keep_page``.

        The selection is kept when its row is still in ``frame``.
        """
        if frame.attrs:
            # pandas copies a frame's attrs deeply into every row and slice taken from
            # it (a run's listing names a thousand unchecked paths): the table needs none.
            frame = frame.copy(deep=False)
            frame.attrs = {}
        self.source = frame
        # A sort by a column still being read would be a wrong order: the rows keep
        # their own until it is read (``hold``), and the table says so.
        field = None if self.sort_field in self.held else self.sort_field
        column = next((c for c in self.columns if c.field == field), None)
        by = column.sort_by if column is not None and column.sort_by else field
        self.frame = sorted_frame(
            frame, by, ascending=self.ascending, natural=self._is_keystr(field)
        )
        if self.selected is not None and self.selected not in frame.index:
            self.selected = None
        page = min(self.page, self.pages - 1) if keep_page else 0
        if page != self.page:
            self.page = page  # renders
        else:
            self._render()

    def set_columns(self, columns: Sequence[Column]) -> None:
        """Shows ``columns`` from now on (a run's metrics, once read), the rows as they
        are; a sort by a column no longer there falls back to the frame's order.

        Raises:
          ValueError: If ``columns`` is empty or has two key columns.
        """
        check_columns(columns)
        self.columns = tuple(columns)
        with self.hold_sync():
            self.spec = column_spec(self.columns)
            if self.sort_field not in [c.field for c in self.columns]:
                self.sort_field = None  # shows the rows in their own order
            else:
                self.show(self.source, keep_page=True)

    def hold(self, fields: Collection[str]) -> None:
        """Marks the columns whose values are still being read (none: ``()``).

        Sorting by such a column is put off: the rows keep their own order, the
        table says that it will sort once the column is read, and it does when
        ``hold`` releases the column (or ``show`` is given a frame after that).
        """
        self.held = frozenset(fields)
        self.show(self.source, keep_page=True)

    def sort_by(self, field: str | None, *, ascending: bool = True) -> None:
        """Sorts the rows by the column ``field`` (``None``: the frame's own order).

        The page shown becomes the first; the selection is kept.

        Raises:
          ValueError: If ``field`` is not one of the columns.
        """
        if field is not None and field not in [c.field for c in self.columns]:
            raise ValueError(f"no column {field!r} to sort by")
        with self.hold_trait_notifications():
            self.sort_field = field
            self.ascending = ascending

    def click_header(self, field: str) -> None:
        """What clicking a header does: sort by it (sizes largest first), or reverse."""
        column = next((c for c in self.columns if c.field == field), None)
        if column is None:
            raise ValueError(f"no column {field!r} to sort by")
        if not self.sortable:
            return
        if self.sort_field == field:
            self.sort_by(field, ascending=not self.ascending)
        else:
            self.sort_by(field, ascending=not column.descending_first)

    def click(self, label: Any) -> None:
        """What clicking the row with index ``label`` does: picks it, if it can be.

        Raises:
          ValueError: If the row is not on the current page or cannot be picked.
        """
        labels = self.visible_labels()
        if label not in labels:
            raise ValueError(f"row {label!r} is not on the current page")
        if not self.pickable(label):
            raise ValueError(f"row {label!r} cannot be picked")
        self.selected = label

    def pickable(self, label: Any) -> bool:
        """Whether clicking the row with index ``label`` picks it."""
        return bool(self.pick and self._row_look(self.frame.loc[label]).pickable)

    def tick(self, label: Any, value: bool) -> None:
        """What clicking the tick box of the row ``label`` does."""
        if self._on_check is None:
            raise ValueError("this table has no tick boxes")
        self._on_check(label, bool(value))

    def jump(self, page: int) -> None:
        """Shows page ``page`` (counted from 1, as shown), clamped to the pages there are."""
        if isinstance(page, bool) or not isinstance(page, int):
            raise TypeError(f"a page number is an int, got {type(page).__name__}")
        self.page = min(max(0, page - 1), self.pages - 1)

    def turn(self, by: int) -> None:
        """Moves ``by`` pages forwards or backwards, staying within the table."""
        self.page = min(max(0, self.page + by), self.pages - 1)

    def show_row(self, label: Any) -> None:
        """Turns to the page holding the row with index ``label``."""
        position = self.frame.index.get_loc(label)
        if not isinstance(position, int):
            raise ValueError(f"index label {label!r} is not unique in the table")
        self.page = position // self.page_size
        self.reveal = [position % self.page_size, self.reveal[1] + 1]

    def visible_labels(self) -> list[Any]:
        """Index labels of the rows on the current page."""
        start = self.page * self.page_size
        return list(self.frame.index[start : start + self.page_size])

    def visible_text(self, field: str, *, width: int | None = None) -> list[str]:
        """The text of column ``field`` in the rows of the current page, as shown.

        For a key column, ``width`` picks the labels offered for that many
        characters (the longest set the browser would show in that room).
        """
        index = [c.field for c in self.columns].index(field)
        if width is None or not self.columns[index].key:
            return [row["cells"][index] for row in self.rows]
        if not any(row["labels"] for row in self.rows):
            return [row["cells"][index] for row in self.rows]
        level = next((i for i, w in enumerate(KEY_WIDTHS) if 0 < w <= width), len(KEY_WIDTHS) - 1)
        return [row["labels"][level] for row in self.rows]

    def exact_keys(self) -> list[str]:
        """What hovering and copying the key of each row in view give: the exact key."""
        return [row["exact"] for row in self.rows]

    def quiet_columns(self) -> list[str]:
        """The columns that say nothing about the rows in view (they give way first)."""
        return [c.field for c, q in zip(self.columns, self.quiet, strict=True) if q]

    # -- rendering ------------------------------------------------------------------

    def _row_look(self, row: pd.Series) -> RowLook:
        return self._look(row) if self._look is not None else RowLook()

    def _on_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict):
            return
        kind = content.get("kind")
        if kind == "page":
            self.jump(int(content["page"]) + 1)
        elif kind == "sort":
            self.click_header(str(content["field"]))
        elif kind in ("pick", "check"):
            labels = self.visible_labels()
            slot = int(content["slot"])
            if 0 <= slot < len(labels):
                if kind == "pick":
                    self.click(labels[slot])
                else:
                    self.tick(labels[slot], bool(content["value"]))

    def _show_error(self, error: BaseException) -> None:
        self.position = f"⚠ {type(error).__name__}: {error}"

    def _render_on_change(self, _change: Any) -> None:
        self._render()

    def _on_sort(self, _change: Any) -> None:
        self.show(self.source)

    def _is_keystr(self, field: str | None) -> bool:
        return any(c.field == field and c.is_keystr for c in self.columns)

    def _key_labels(
        self, page: pd.DataFrame, column: Column
    ) -> tuple[list[list[str]], list[str], str]:
        """Each row's labels at every ``KEY_WIDTHS`` width, its exact text, the shared prefix."""
        texts = [cell_text(column, row) for row in page_rows(page)]
        if not column.is_keystr or column.field not in page.columns:
            exact = texts
            if column.exact is not None and column.exact in page.columns:
                exact = [str(v) or t for v, t in zip(page[column.exact], texts, strict=True)]
            # Names (a tree's) offer no shorter labels: the browser cuts them if it must.
            return [[] for _ in texts], exact, ""
        keys = ["" if t == "" else str(v) for t, v in zip(texts, page[column.field], strict=True)]
        groups = None
        if column.group is not None and column.group in page.columns:
            groups = [str(v) for v in page[column.group]]
        return key_labels(texts, keys, groups)

    def _render(self) -> None:
        page = self.frame.iloc[self.page * self.page_size : (self.page + 1) * self.page_size]
        page_view = page_rows(page)
        cells = [[cell_text(c, row) for c in self.columns] for row in page_view]
        key_index = next((i for i, c in enumerate(self.columns) if c.key), None)
        labels: list[list[str]] = []
        exact: list[str] = []
        prefix = ""
        keyed_groups = False
        if key_index is not None:
            labels, exact, prefix = self._key_labels(page, self.columns[key_index])
            keyed_groups = any(
                c.is_keystr and c.group in page.columns and page[c.group].nunique() > 1
                for c in self.columns
            )
            for slot, row_labels in enumerate(labels):
                if row_labels:
                    cells[slot][key_index] = row_labels[0]
        rows = []
        for slot in range(len(page)):
            label = page.index[slot]
            look = self._row_look(page_view[slot])
            rows.append(
                {
                    "cells": cells[slot],
                    "labels": labels[slot] if labels else [],
                    "exact": exact[slot] if exact else "",
                    "selected": bool(label == self.selected)
                    if self.selected is not None
                    else False,
                    "pickable": bool(self.pick and look.pickable),
                    "color": look.color,
                    "background": look.background,
                    "tip": look.tooltip,
                    "depth": look.depth,
                    "mark": look.mark,
                    "check": None if look.check is None else (2 if look.mixed else int(look.check)),
                }
            )
        total = len(self.frame)
        if total == 0:
            position = self.empty_text
        elif total <= self.page_size:
            position = f"{total:,} rows" if total > 1 else "1 row"
        else:
            first = self.page * self.page_size + 1
            last = min(total, first + self.page_size - 1)
            position = f"rows {first:,}–{last:,} of {total:,}"
        if self.sort_field in self.held:
            title = next(c.title for c in self.columns if c.field == self.sort_field)
            position += f" · sorted by {title} once it is read"
        # One message to the browser, without holding the traits' notifications:
        # tables are redrawn from background threads (a listing, ages ticking), and
        # a hold there would swallow a pick made meanwhile on the main thread.
        with self.hold_sync():
            self.page_count = self.pages
            self.quiet = quiet_columns(
                cells,
                [c.key for c in self.columns],
                [
                    keyed_groups and any(k.is_keystr and k.group == c.field for k in self.columns)
                    for c in self.columns
                ],
            )
            self.key_prefix = prefix
            self.rows = rows
            self.position = position
