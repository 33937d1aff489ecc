"""What a ``PagedTable`` column is and how a row looks: its fields, formats and
priorities, and what the browser is told of them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pandas as pd

from ._page_text import format_cell


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a ``PagedTable``.

    Attributes:
      field: The DataFrame column shown.
      title: The header text.
      format: Turns a cell value into text.
      key: The column of keys and names: it takes the room left, in monospace,
        shortened in the middle when the room is short (whole on hover, with a copy
        button). At most one per table.
      essential: Always shown. A secondary column is hidden on a narrow output
        (highest ``priority`` first) and its value shown in the row's detail line.
      priority: Among secondary columns, which go first (higher goes first).
      align: ``"left"`` or ``"right"`` (numbers).
      descending_first: A first click on its header sorts largest first (sizes).
      keystr: Its values are leaf keys in ``keystr`` format: shown as people read
        them (``display.display_keys`` over the rows in view: dotted, what they all
        share left out and named in the header, shortened without two rows alike),
        the exact key on hover and copy, sorted in natural order. ``None``: when it
        is the key column and its field is ``"key"``.
      group: For a ``keystr`` column, the field naming each row's checkpointable:
        when the rows in view belong to several, it leads their labels.
      exact: For a key column that is not ``keystr`` (a tree's names), the field
        whose text hovering and copying give (the subtree's exact key).
      sort_by: The field whose values order the rows when its header is clicked
        (a change told as text, sorted by its size); ``None``: its own.
    """

    field: str
    title: str
    format: Callable[[Any], str] = format_cell
    key: bool = False
    essential: bool = True
    priority: int = 0
    align: str = "left"
    descending_first: bool = False
    keystr: bool | None = None
    group: str | None = "checkpointable"
    exact: str | None = None
    sort_by: str | None = None

    @property
    def is_keystr(self) -> bool:
        """Whether its values are leaf keys shown as ``display`` shows them."""
        return self.keystr if self.keystr is not None else (self.key and self.field == "key")


@dataclasses.dataclass(frozen=True)
class RowLook:
    """How one row looks: text and background colour, whether it can be picked, and
    for a tree's rows their depth, their open/closed mark and their tick box
    (``check`` ``None`` for none, ``mixed`` for a partly ticked subtree)."""

    color: str | None = None
    background: str | None = None
    pickable: bool = True
    tooltip: str | None = None
    depth: int = 0
    mark: str = ""
    check: bool | None = None
    mixed: bool = False


class PageRow(Mapping[str, Any]):
    """One row of a page as cells and looks read it (``row[field]``, ``row.get``,
    ``field in row``, ``row.name``), holding the values the row's Series would
    (NumPy scalars, ``Timestamp``, ``pd.NA``), made without a Series: pandas takes
    about 80 µs to build one, and a tree of 5,000 rows spent most of a redraw on
    them."""

    __slots__ = ("_at", "_columns", "name")

    def __init__(self, columns: Mapping[str, Any], at: int, name: Any) -> None:
        self._columns = columns
        self._at = at
        self.name = name

    def __getitem__(self, field: str) -> Any:
        return self._columns[field][self._at]

    def __contains__(self, field: object) -> bool:
        return field in self._columns

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __len__(self) -> int:
        return len(self._columns)


def page_rows(page: pd.DataFrame) -> list[Any]:
    """The rows of ``page`` as ``PageRow``s, in order (typed ``Any``: they stand in
    for the row Series that looks are written against)."""
    columns = {field: page[field].array for field in page.columns}
    return [PageRow(columns, at, name) for at, name in enumerate(page.index)]


def cell_text(column: Column, row: pd.Series) -> str:
    """A row's cell of ``column`` as text (``row``: a Series or a ``PageRow``)."""
    if column.field not in row:
        return ""
    value = row[column.field]
    try:
        return column.format(value)
    except Exception:
        # A value of a type the column did not expect is still shown.
        return format_cell(value)


def check_columns(columns: Sequence[Column]) -> None:
    """Refuses a table of no column, or of two key columns.

    Raises:
      ValueError: If so.
    """
    if not columns:
        raise ValueError("a table needs at least one column")
    if sum(c.key for c in columns) > 1:
        raise ValueError("a table has at most one key column")


def column_spec(columns: Sequence[Column]) -> list[dict[str, Any]]:
    """What the browser is told of each column."""
    return [
        {
            "field": c.field,
            "title": c.title,
            "key": c.key,
            "essential": c.essential,
            "priority": c.priority,
            "align": c.align,
        }
        for c in columns
    ]
