"""A paged table of a DataFrame built from stock widgets, with clickable rows."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Sequence
from typing import Any

import ipywidgets as w
import pandas as pd
import traitlets
from ipywidgets.widgets.widget_string import LabelStyle

from ._guard import shown_in_widget

DEFAULT_PAGE_SIZE = 20
# A free-width column is as wide as its longest text, within these bounds.
_FLEX_MIN = "10em"
_FLEX_MAX_CHARS = 64
# The advance of one monospace character, in em (DejaVu Sans Mono, Menlo, Consolas: 0.6).
_CHAR_EM = 0.62


def _row_layout(**extra: str) -> w.Layout:
    # max-content: the row is as wide as its cells, so the grid above can scroll it.
    return w.Layout(width="max-content", min_width="100%", **extra)


def format_cell(value: Any) -> str:
    """A table cell's text: ``''`` for missing values, tuples without trailing commas."""
    if value is None or value is pd.NaT:
        return ""
    if isinstance(value, float) and math.isnan(value):
        return ""
    try:
        if pd.isna(value) is True:
            return ""
    except (TypeError, ValueError):
        pass
    if isinstance(value, tuple):
        # Shapes read as Python writes them: (4,) and ().
        return "(" + ", ".join(str(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a ``PagedTable``.

    Attributes:
      field: The DataFrame column shown.
      title: The header text.
      width: CSS width of the column; ``None`` lets it take the remaining room.
      format: Turns a cell value into text.
    """

    field: str
    title: str
    width: str | None = "8em"
    format: Callable[[Any], str] = format_cell


@dataclasses.dataclass(frozen=True)
class RowLook:
    """How one row looks: text and background colour, and whether it can be picked."""

    color: str | None = None
    background: str | None = None
    pickable: bool = True
    tooltip: str | None = None


def _sort_value(value: Any) -> Any:
    """A cell's place in a sort of a column that is not numbers: shapes by their size."""
    if isinstance(value, tuple):
        return (0, math.prod(v if isinstance(v, int) else 0 for v in value), len(value), str(value))
    return (1, 0, 0, str(value))


def _sort_key(series: pd.Series) -> pd.Series:
    if pd.api.types.is_bool_dtype(series.dtype):
        return series.astype("Int64")
    if (
        pd.api.types.is_numeric_dtype(series.dtype)
        or pd.api.types.is_datetime64_any_dtype(series.dtype)
        or pd.api.types.is_timedelta64_dtype(series.dtype)
        or (pd.api.types.is_string_dtype(series.dtype) and series.dtype != object)
    ):
        return series
    # Objects (shapes, tuples of names, mixed values): missing ones stay missing, so
    # that they sort last whichever way.
    return series.map(lambda v: None if format_cell(v) == "" else _sort_value(v))


def sorted_frame(frame: pd.DataFrame, field: str | None, *, ascending: bool = True) -> pd.DataFrame:
    """``frame`` sorted by its column ``field`` (stable, missing values last).

    Numbers, times and strings sort by value; shapes by their number of elements;
    anything else by its text. ``None`` (or a field ``frame`` lacks) keeps ``frame``'s
    own order.
    """
    if field is None or field not in frame.columns or len(frame) < 2:
        return frame
    key = _sort_key(frame[field])
    try:
        order = key.sort_values(ascending=ascending, kind="stable", na_position="last").index
    except TypeError:
        # Values that do not compare with one another sort by their text.
        text = frame[field].map(lambda v: format_cell(v) or None)
        order = text.sort_values(ascending=ascending, kind="stable", na_position="last").index
    return frame.loc[order]


def _cell_text(column: Column, row: pd.Series) -> str:
    if column.field not in row.index:
        return ""
    value = row[column.field]
    try:
        return column.format(value)
    except Exception:
        # A value of a type the column did not expect is still shown.
        return format_cell(value)


class PagedTable(w.VBox):
    """One page of a DataFrame as rows of stock widgets, with paging controls.

    The widgets for a page are made once and reused: turning a page or changing
    the frame only updates their traitlets. With a ``pick`` column, that column is
    a button per row and clicking it sets ``selected`` to the row's index label.
    The rows can be sorted by any column (``sort_choice`` and ``order_button``, or
    ``sort_by``), and ``page_box`` jumps to a page by number.

    Attributes:
      selected: Index label of the picked row, or ``None``.
      page: Zero-based page number.
      sort_field: The column sorted by, or ``None`` for the frame's own order.
      ascending: Whether the sort is ascending.
      frame: The rows as shown: the frame last passed to ``show``, sorted.
    """

    selected = traitlets.Any(None, allow_none=True)
    page = traitlets.Int(0)
    sort_field = traitlets.Unicode(None, allow_none=True)
    ascending = traitlets.Bool(True)

    def __init__(
        self,
        columns: Sequence[Column],
        *,
        pick: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        look: Callable[[pd.Series], RowLook] | None = None,
        empty_text: str = "nothing to show",
        sort_field: str | None = None,
        ascending: bool = True,
        sortable: bool = True,
    ) -> None:
        """Builds an empty table.

        Args:
          columns: The columns shown, in order.
          pick: The ``field`` of the column whose cells are buttons that pick the row.
          page_size: Rows per page.
          look: Returns a row's colours and whether it can be picked.
          empty_text: Shown when the frame has no rows.
          sort_field: The column the rows are sorted by at first; ``None`` keeps
            each frame's own order.
          ascending: Whether that sort is ascending.
          sortable: Whether the sort controls are shown (a table whose rows have
            an order of their own, such as a tree's, hides them).

        Raises:
          ValueError: If ``columns`` is empty, ``pick`` or ``sort_field`` is not
            one of them or ``page_size`` is not positive.
        """
        if not columns:
            raise ValueError("a table needs at least one column")
        if pick is not None and pick not in [c.field for c in columns]:
            raise ValueError(f"pick column {pick!r} is not one of the columns")
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        fields = [c.field for c in columns]
        if sort_field is not None and sort_field not in fields:
            raise ValueError(f"sort column {sort_field!r} is not one of the columns")
        self.columns = tuple(columns)
        self.pick = pick
        self.page_size = page_size
        self._look = look
        self._empty_text = empty_text
        # Set while the controls are updated to match the traits, so that they do not
        # echo the change back.
        self._syncing = False
        self.source = pd.DataFrame(columns=fields)
        self.frame = self.source
        # Columns whose values are still being read (see ``hold``).
        self.held: frozenset[str] = frozenset()

        self.header = w.HBox(
            [
                w.Label(
                    c.title,
                    tooltip=c.title,
                    style={"font_weight": "bold"},
                    layout=self._cell_layout(c),
                )
                for c in self.columns
            ],
            layout=_row_layout(),
        )
        self._rows: list[w.HBox] = []
        self._cells: list[list[w.Widget]] = []
        # Widgets are what a table costs to build and to draw: cells of a column share
        # one layout, cells of a row one style (a row has one look), buttons one style.
        layouts = {c.field: self._cell_layout(c, button=c.field == pick) for c in self.columns}
        button_style = w.ButtonStyle(font_family="monospace")
        for i in range(page_size):
            cells: list[w.Widget] = []
            row_style = LabelStyle()
            for c in self.columns:
                if c.field == pick:
                    button = w.Button(description="", layout=layouts[c.field], style=button_style)
                    button.on_click(shown_in_widget(self._show_error)(self._picker(i)))
                    cells.append(button)
                else:
                    cells.append(w.Label("", layout=layouts[c.field], style=row_style))
            for c, cell in zip(self.columns, cells, strict=True):
                if c.width is None:
                    cell.add_class("tinax-fitted-cell")  # sized to its text: never cut
            self._cells.append(cells)
            self._rows.append(w.HBox(cells, layout=_row_layout(display="none")))
        self.prev_button = w.Button(icon="chevron-left", tooltip="previous page")
        self.next_button = w.Button(icon="chevron-right", tooltip="next page")
        for b in (self.prev_button, self.next_button):
            b.layout = w.Layout(width="3em")
        guard = shown_in_widget(self._show_error)
        self.prev_button.on_click(guard(lambda _: self.turn(-1)))
        self.next_button.on_click(guard(lambda _: self.turn(+1)))
        self.position = w.Label("")
        self.page_box = w.BoundedIntText(
            value=1, min=1, max=1, description="page", layout=w.Layout(width="10em")
        )
        self.page_box.observe(guard(self._on_page_box), names="value")
        self.sort_choice = w.Dropdown(
            options=[("stored order", ""), *[(c.title, c.field) for c in self.columns]],
            value="",
            description="sort by",
            layout=w.Layout(width="16em"),
        )
        self.order_button = w.ToggleButton(
            value=False, description="descending", icon="sort-amount-desc", tooltip="reverse"
        )
        self.order_button.layout = w.Layout(width="9em")
        self.sort_choice.observe(guard(self._on_sort_control), names="value")
        self.order_button.observe(guard(self._on_sort_control), names="value")
        sort_controls = [self.sort_choice, self.order_button] if sortable else []
        self.nav = w.HBox(
            [self.prev_button, self.position, self.next_button, self.page_box, *sort_controls],
            layout=w.Layout(flex_flow="row wrap"),
        )
        # Rows never squeeze their cells below their widths: a narrow notebook scrolls
        # the table sideways instead of clipping columns.
        super().__init__(
            children=[self.header, *self._rows, self.nav],
            layout=w.Layout(overflow="auto hidden", max_width="100%"),
        )
        self.add_class("tinax-table")
        self.observe(
            shown_in_widget(self._show_error)(self._render_on_change), names=["page", "selected"]
        )
        self.observe(guard(self._on_sort), names=["sort_field", "ascending"])
        self.set_trait("sort_field", sort_field)
        self.set_trait("ascending", ascending)
        self._sync_sort_controls()
        self._render()

    @staticmethod
    def _cell_layout(column: Column, *, button: bool = False) -> w.Layout:
        if column.width is None:
            return w.Layout(
                flex="0 0 auto",
                width=_FLEX_MIN,
                min_width=_FLEX_MIN,
                margin="1px 4px",
                justify_content="flex-start" if button else None,
            )
        return w.Layout(
            flex="0 0 auto",
            width=column.width,
            min_width=column.width,
            margin="1px 4px",
            justify_content="flex-start" if button else None,
        )

    def _fit_flexible_columns(self) -> None:
        """Widens the free-width columns to their longest text in ``frame`` (up to a cap).

        A key is the one thing a reader needs whole: its column is never narrower
        than its text (up to ``_FLEX_MAX_CHARS``; longer ones show in full on hover),
        and the table scrolls sideways when the notebook is narrower than the row.
        """
        for index, column in enumerate(self.columns):
            if column.width is not None:
                continue
            longest = len(column.title)
            if column.field in self.frame.columns and len(self.frame):
                # Raw text lengths: formatting every cell of a large table costs too much.
                lengths = self.frame[column.field].astype(str).str.len()
                longest = max(longest, int(lengths.max()))
            chars = min(max(longest, 8), _FLEX_MAX_CHARS)
            # In em, not ch: a ch differs between the bold header, the monospace
            # buttons and the plain labels, and the column must line up across them.
            width = f"{chars * _CHAR_EM + 2:.1f}em"
            cells = [self.header.children[index], *(row[index] for row in self._cells)]
            for cell in cells:
                if cell.layout.min_width != width:
                    cell.layout.width = width
                    cell.layout.min_width = width

    # -- public ---------------------------------------------------------------------

    @property
    def page_count(self) -> int:
        """Number of pages (at least 1)."""
        return max(1, math.ceil(len(self.frame) / self.page_size))

    def show(self, frame: pd.DataFrame, *, keep_page: bool = False) -> None:
        """Shows ``frame``, sorted: from its first page, or the same page if ``keep_page``.

        The selection is kept when its row is still in ``frame``.
        """
        self.source = frame
        # A sort by a column still being read would be a wrong order: the rows keep
        # their own until it is read (``hold``), and the table says so.
        field = None if self.sort_field in self.held else self.sort_field
        self.frame = sorted_frame(frame, field, ascending=self.ascending)
        self._fit_flexible_columns()
        if self.selected is not None and self.selected not in frame.index:
            self.selected = None
        page = min(self.page, self.page_count - 1) if keep_page else 0
        if page != self.page:
            self.page = page  # renders
        else:
            self._render()

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

    def jump(self, page: int) -> None:
        """Shows page ``page`` (counted from 1, as shown), clamped to the pages there are."""
        if isinstance(page, bool) or not isinstance(page, int):
            raise TypeError(f"a page number is an int, got {type(page).__name__}")
        self.page = min(max(0, page - 1), self.page_count - 1)

    def turn(self, by: int) -> None:
        """Moves ``by`` pages forwards or backwards, staying within the table."""
        self.page = min(max(0, self.page + by), self.page_count - 1)

    def show_row(self, label: Any) -> None:
        """Turns to the page holding the row with index ``label``."""
        position = self.frame.index.get_loc(label)
        if not isinstance(position, int):
            raise ValueError(f"index label {label!r} is not unique in the table")
        self.page = position // self.page_size

    def visible_labels(self) -> list[Any]:
        """Index labels of the rows on the current page."""
        start = self.page * self.page_size
        return list(self.frame.index[start : start + self.page_size])

    def pick_button(self, label: Any) -> w.Button:
        """The pick button of the visible row with index ``label``.

        Raises:
          ValueError: If the table has no pick column or the row is not on this page.
        """
        if self.pick is None:
            raise ValueError("this table has no pick column")
        labels = self.visible_labels()
        if label not in labels:
            raise ValueError(f"row {label!r} is not on the current page")
        column = [c.field for c in self.columns].index(self.pick)
        button = self._cells[labels.index(label)][column]
        assert isinstance(button, w.Button)
        return button

    # -- rendering ------------------------------------------------------------------

    def _picker(self, slot: int) -> Callable[[Any], None]:
        def pick(_button: Any) -> None:
            labels = self.visible_labels()
            if slot < len(labels):
                self.selected = labels[slot]

        return pick

    def _show_error(self, error: BaseException) -> None:
        self.position.value = f"⚠ {type(error).__name__}: {error}"

    def _render_on_change(self, _change: Any) -> None:
        self._render()

    def _on_sort(self, _change: Any) -> None:
        self._sync_sort_controls()
        self.show(self.source)

    def _sync_sort_controls(self) -> None:
        self._syncing = True
        try:
            self.sort_choice.value = self.sort_field or ""
            self.order_button.value = not self.ascending
        finally:
            self._syncing = False

    def _on_sort_control(self, _change: Any) -> None:
        if not self._syncing:
            self.sort_by(self.sort_choice.value or None, ascending=not self.order_button.value)

    def _on_page_box(self, change: Any) -> None:
        if not self._syncing:
            self.jump(int(change["new"]))

    def _render(self) -> None:
        page = self.frame.iloc[self.page * self.page_size : (self.page + 1) * self.page_size]
        for slot, row_box in enumerate(self._rows):
            if slot >= len(page):
                row_box.layout.display = "none"
                continue
            label = page.index[slot]
            row = page.iloc[slot]
            look = self._look(row) if self._look is not None else RowLook()
            for column, cell in zip(self.columns, self._cells[slot], strict=True):
                text = _cell_text(column, row)
                if isinstance(cell, w.Button):
                    cell.description = text
                    # The whole text on hover, with why the row cannot be picked if it cannot.
                    cell.tooltip = f"{text}: {look.tooltip}" if look.tooltip else text
                    cell.disabled = not look.pickable
                    cell.button_style = "info" if label == self.selected else ""
                else:
                    assert isinstance(cell, w.Label)
                    cell.value = text
                    cell.tooltip = text if len(text) > 12 else None
                    cell.style.text_color = look.color
                    cell.style.background = look.background
            row_box.layout.display = ""
        total = len(self.frame)
        if total == 0:
            self.position.value = self._empty_text
        else:
            first = self.page * self.page_size + 1
            last = min(total, first + self.page_size - 1)
            self.position.value = (
                f"rows {first:,}–{last:,} of {total:,} · page {self.page + 1:,}/{self.page_count:,}"
            )
        if self.sort_field in self.held:
            title = next(c.title for c in self.columns if c.field == self.sort_field)
            self.position.value += f" · sorted by {title} once it is read"
        self.prev_button.disabled = self.page <= 0
        self.next_button.disabled = self.page >= self.page_count - 1
        self._syncing = True
        try:
            # The bound first, so that the value is never clamped to an old one.
            self.page_box.max = max(self.page_count, self.page_box.value)
            self.page_box.value = self.page + 1
            self.page_box.max = self.page_count
        finally:
            self._syncing = False
