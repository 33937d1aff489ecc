"""PagedTable: pages of a DataFrame in reused stock widgets, clickable rows."""

from __future__ import annotations

import ipywidgets as w
import pandas as pd
import pytest
from tinax.widgets._table import Column, PagedTable, RowLook, format_cell

COLUMNS = (Column("name", "name"), Column("size", "size"), Column("shape", "shape"))


def _frame(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "name": [f"row-{i}" for i in range(n)],
            "size": range(n),
            "shape": [(i,) for i in range(n)],
        }
    )


def _visible_names(table: PagedTable) -> list[str]:
    names = []
    for row in table.children[1:-1]:
        assert isinstance(row, w.HBox)
        if row.layout.display != "none":
            names.append(row.children[0].description)
    return names


def test_pages_turn_and_reuse_the_same_widgets() -> None:
    table = PagedTable(COLUMNS, pick="name", page_size=20)
    cells_before = [row.children for row in table.children[1:-1]]
    table.show(_frame(45))
    assert table.page_count == 3
    assert table.position.value == "rows 1–20 of 45 · page 1/3"
    assert table.prev_button.disabled and not table.next_button.disabled
    table.next_button.click()
    table.next_button.click()
    assert table.page == 2
    assert _visible_names(table) == [f"row-{i}" for i in range(40, 45)]
    assert table.position.value == "rows 41–45 of 45 · page 3/3"
    assert table.next_button.disabled
    table.turn(+5)
    assert table.page == 2
    assert [row.children for row in table.children[1:-1]] == cells_before


def test_clicking_a_row_selects_its_index_label() -> None:
    table = PagedTable(COLUMNS, pick="name", page_size=10)
    frame = _frame(30)
    table.show(frame[frame["size"] % 3 == 0])  # labels 0, 3, 6, ...
    table.turn(+1)
    button = table.pick_button(12)
    button.click()
    assert table.selected == 12
    assert button.button_style == "info"
    # A new frame that still holds the row keeps the selection; one that does not drops it.
    table.show(frame, keep_page=True)
    assert table.selected == 12
    table.show(frame[frame["size"] > 20])
    assert table.selected is None
    with pytest.raises(ValueError, match="not on the current page"):
        table.pick_button(0)


def test_row_look_disables_picking_and_colours_text() -> None:
    table = PagedTable(
        COLUMNS,
        pick="name",
        look=lambda row: RowLook(color="red", pickable=row["size"] != 1),
    )
    table.show(_frame(3))
    assert table.pick_button(1).disabled and not table.pick_button(0).disabled
    label = table.children[1].children[1]
    assert isinstance(label, w.Label) and label.style.text_color == "red"


def test_empty_frames_and_bad_arguments() -> None:
    table = PagedTable(COLUMNS, empty_text="no rows here")
    table.show(_frame(0))
    assert table.position.value == "no rows here"
    assert table.page_count == 1
    with pytest.raises(ValueError):
        PagedTable(())
    with pytest.raises(ValueError):
        PagedTable(COLUMNS, pick="missing")
    with pytest.raises(ValueError):
        PagedTable(COLUMNS, page_size=0)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ((3, 4), "(3, 4)"),
        ((4,), "(4,)"),
        ((), "()"),
        (None, ""),
        (float("nan"), ""),
        (pd.NA, ""),
        ("x", "x"),
    ],
)
def test_format_cell(value: object, text: str) -> None:
    assert format_cell(value) == text


def test_a_failing_row_look_is_shown_not_raised() -> None:
    def look(row: pd.Series) -> RowLook:
        if row["size"] == 3:
            raise KeyError("no look for row 3")
        return RowLook()

    table = PagedTable(COLUMNS, pick="name", page_size=2, look=look)
    table.show(_frame(4))
    table.next_button.click()  # page 2 holds row 3: its look fails
    assert "KeyError" in table.position.value
    table.prev_button.click()
    assert table.position.value == "rows 1–2 of 4 · page 1/2"


def test_a_narrow_notebook_scrolls_the_table_instead_of_cutting_keys() -> None:
    columns = (Column("key", "key", None), Column("size", "size", "6em"))
    table = PagedTable(columns, pick="key", page_size=3)
    keys = ["['a']", "['model']['encoder']['layers_11']['attention']['kernel']", "x" * 200]
    table.show(pd.DataFrame({"key": keys, "size": [1, 2, 3]}))
    # The table scrolls sideways; rows are as wide as their cells, never squeezed.
    assert table.layout.overflow == "auto hidden"
    assert "tinax-table" in table._dom_classes
    rows = [table.header, *table.children[1:-1]]
    assert all(row.layout.width == "max-content" for row in rows)
    key_cells = [row.children[0] for row in rows]
    # The key column is as wide as its longest key, up to a cap past which the
    # whole key shows on hover.
    assert {cell.layout.min_width for cell in key_cells} == {f"{64 * 0.62 + 2:.1f}em"}
    assert all(cell.layout.flex == "0 0 auto" for cell in key_cells)
    assert table.pick_button(2).tooltip == "x" * 200
    size_cells = [row.children[1] for row in rows]
    assert {cell.layout.flex for cell in size_cells} == {"0 0 auto"}
    assert table.header.children[1].tooltip == "size"

    table.show(pd.DataFrame({"key": keys[:2], "size": [1, 2]}))
    assert key_cells[0].layout.min_width == f"{len(keys[1]) * 0.62 + 2:.1f}em"
    table.show(pd.DataFrame({"key": ["['a']"], "size": [1]}))
    assert key_cells[0].layout.min_width == f"{8 * 0.62 + 2:.1f}em"


def test_rows_sort_by_any_column_through_the_controls() -> None:
    frame = pd.DataFrame(
        {
            "name": ["b", "a", "c", "d"],
            "size": pd.array([2, None, 10, 1], dtype="Int64"),
            "shape": [(2, 2), (3,), None, (1, 1, 1)],
        },
        index=[10, 11, 12, 13],
    )
    table = PagedTable(COLUMNS, pick="name", page_size=2)
    table.show(frame)
    table.pick_button(11).click()
    table.sort_choice.value = "size"
    assert list(table.frame.index) == [13, 10, 12, 11]  # missing last, as numbers
    assert (table.sort_field, table.ascending, table.page) == ("size", True, 0)
    table.order_button.value = True
    assert list(table.frame.index) == [12, 10, 13, 11]  # missing last either way
    assert table.selected == 11
    table.sort_by("shape")
    # Shapes by their number of elements: (1, 1, 1), (3,), (2, 2), then none.
    assert list(table.frame.index) == [13, 11, 10, 12]
    assert table.sort_choice.value == "shape" and not table.order_button.value
    table.sort_by("name", ascending=False)
    assert _visible_names(table) == ["d", "c"]
    assert table.order_button.value
    # A new frame is shown in the same order; stored order comes back on request.
    table.show(frame[frame["name"] != "d"])
    assert _visible_names(table) == ["c", "b"]
    table.sort_choice.value = ""
    assert table.sort_field is None and list(table.frame.index) == [10, 11, 12]
    with pytest.raises(ValueError, match="no column"):
        table.sort_by("missing")
    with pytest.raises(ValueError, match="sort column"):
        PagedTable(COLUMNS, sort_field="missing")


def test_a_table_starts_sorted_and_jumps_to_a_page() -> None:
    table = PagedTable(COLUMNS, pick="name", page_size=10, sort_field="size", ascending=False)
    table.show(_frame(95))
    assert _visible_names(table)[:2] == ["row-94", "row-93"]
    assert (table.page_box.value, table.page_box.max) == (1, 10)
    table.page_box.value = 7
    assert table.page == 6 and _visible_names(table)[0] == "row-34"
    table.jump(99)
    assert table.page == 9 and table.page_box.value == 10
    table.prev_button.click()
    assert table.page_box.value == 9
    table.show(_frame(15))
    assert (table.page, table.page_box.value, table.page_box.max) == (0, 1, 2)
    with pytest.raises(TypeError):
        table.jump("2")  # type: ignore[arg-type]
