"""PagedTable: one page of a DataFrame sent to the browser's table (grid.js) as text.

Clicks arrive from the browser as messages; these tests send the same messages
through ipywidgets' own message path (``_handle_custom_msg``) and read back the
rows and texts the browser is sent.
"""

from __future__ import annotations

import pandas as pd
import pytest
from tinax.widgets._page_text import KEY_WIDTHS, SILENT, UNIFORM
from tinax.widgets._table import Column, PagedTable, RowLook, format_cell

COLUMNS = (
    Column("name", "name", key=True),
    Column("size", "size", align="right", descending_first=True),
    Column("shape", "shape", essential=False),
)


def _frame(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "name": [f"row-{i}" for i in range(n)],
            "size": range(n),
            "shape": [(i,) for i in range(n)],
        }
    )


def _browser(table: PagedTable, **message: object) -> None:
    table._handle_custom_msg(dict(message), [])


def _names(table: PagedTable) -> list[str]:
    return table.visible_text("name")


def test_only_the_page_shown_is_sent_and_pages_turn() -> None:
    table = PagedTable(COLUMNS, page_size=20)
    table.show(_frame(45))
    assert table.page_count == 3 and len(table.rows) == 20
    assert table.position == "rows 1–20 of 45"
    _browser(table, kind="page", page=1)
    _browser(table, kind="page", page=2)
    assert table.page == 2
    assert _names(table) == [f"row-{i}" for i in range(40, 45)]
    assert table.position == "rows 41–45 of 45"
    _browser(table, kind="page", page=9)  # past the end: the last page
    assert table.page == 2
    table.turn(-5)
    assert table.page == 0
    # Every cell is text, shapes as Python writes them.
    assert table.rows[1]["cells"] == ["row-1", "1", "(1,)"]


def test_clicking_a_row_selects_its_index_label() -> None:
    table = PagedTable(COLUMNS, page_size=4)
    frame = _frame(30)
    table.show(frame[frame["size"] % 3 == 0])  # labels 0, 3, 6, ...
    table.turn(+1)
    _browser(table, kind="pick", slot=0)  # the first row of page 2: label 12
    assert table.selected == 12
    assert [r["selected"] for r in table.rows] == [True, False, False, False]
    # A new frame that still holds the row keeps the selection; one that does not drops it.
    table.show(frame, keep_page=True)
    assert table.selected == 12
    table.show(frame[frame["size"] > 20])
    assert table.selected is None
    with pytest.raises(ValueError, match="not on the current page"):
        table.click(0)


def test_row_look_refuses_picks_and_colours_text() -> None:
    table = PagedTable(
        COLUMNS, look=lambda row: RowLook(color="red", pickable=row["size"] != 1, tooltip="why")
    )
    table.show(_frame(3))
    assert not table.pickable(1) and table.pickable(0)
    assert [r["pickable"] for r in table.rows] == [True, False, True]
    assert table.rows[0]["color"] == "red" and table.rows[0]["tip"] == "why"
    _browser(table, kind="pick", slot=1)  # a refused pick is shown, not raised
    assert table.selected is None and "cannot be picked" in table.position


def test_tree_rows_carry_depth_mark_and_tick_boxes() -> None:
    ticks: list[tuple[object, bool]] = []
    table = PagedTable(
        COLUMNS,
        look=lambda row: RowLook(depth=row["size"], mark="▸", check=True, mixed=row["size"] == 2),
        on_check=lambda label, value: ticks.append((label, value)),
        sortable=False,
    )
    table.show(_frame(3))
    assert [(r["depth"], r["mark"], r["check"]) for r in table.rows] == [
        (0, "▸", 1),
        (1, "▸", 1),
        (2, "▸", 2),
    ]
    _browser(table, kind="check", slot=1, value=False)
    assert ticks == [(1, False)]
    _browser(table, kind="sort", field="size")  # a tree keeps its own order
    assert table.sort_field is None


def test_empty_frames_and_bad_arguments() -> None:
    table = PagedTable(COLUMNS, empty_text="no rows here")
    table.show(_frame(0))
    assert table.position == "no rows here" and table.rows == []
    assert table.page_count == 1
    with pytest.raises(ValueError):
        PagedTable(())
    with pytest.raises(ValueError, match="one key column"):
        PagedTable((Column("a", "a", key=True), Column("b", "b", key=True)))
    with pytest.raises(ValueError):
        PagedTable(COLUMNS, page_size=0)
    with pytest.raises(ValueError, match="no tick boxes"):
        table.tick(0, True)


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

    table = PagedTable(COLUMNS, page_size=2, look=look)
    table.show(_frame(4))
    _browser(table, kind="page", page=1)  # page 2 holds row 3: its look fails
    assert "KeyError" in table.position
    _browser(table, kind="page", page=0)
    assert table.position == "rows 1–2 of 4"


def test_the_browser_is_told_which_columns_can_give_way() -> None:
    table = PagedTable(COLUMNS)
    assert [(c["field"], c["key"], c["essential"]) for c in table.spec] == [
        ("name", True, True),
        ("size", False, True),
        ("shape", False, False),
    ]
    assert "tinax-table" in table._dom_classes
    # The view's code and style ship with the package.
    assert "shorten" in str(PagedTable._esm) and ".tinax-grid" in str(PagedTable._css)


def test_headers_sort_sizes_largest_first_and_a_second_click_reverses() -> None:
    frame = pd.DataFrame(
        {
            "name": ["b", "a", "c", "d"],
            "size": pd.array([2, None, 10, 1], dtype="Int64"),
            "shape": [(2, 2), (3,), None, (1, 1, 1)],
        },
        index=[10, 11, 12, 13],
    )
    table = PagedTable(COLUMNS, page_size=2)
    table.show(frame)
    table.click(11)
    _browser(table, kind="sort", field="size")
    assert (table.sort_field, table.ascending, table.page) == ("size", False, 0)
    assert list(table.frame.index) == [12, 10, 13, 11]  # missing last
    _browser(table, kind="sort", field="size")
    assert list(table.frame.index) == [13, 10, 12, 11]  # missing last either way
    assert table.selected == 11
    table.click_header("shape")
    # Shapes by their number of elements: (1, 1, 1), (3,), (2, 2), then none.
    assert list(table.frame.index) == [13, 11, 10, 12]
    table.click_header("name")
    table.click_header("name")
    assert _names(table) == ["d", "c"]
    # A new frame is shown in the same order; stored order comes back on request.
    table.show(frame[frame["name"] != "d"])
    assert _names(table) == ["c", "b"]
    table.sort_by(None)
    assert table.sort_field is None and list(table.frame.index) == [10, 11, 12]
    with pytest.raises(ValueError, match="no column"):
        table.sort_by("missing")
    with pytest.raises(ValueError, match="sort column"):
        PagedTable(COLUMNS, sort_field="missing")


def test_a_table_starts_sorted_and_jumps_to_a_page() -> None:
    table = PagedTable(COLUMNS, page_size=10, sort_field="size", ascending=False)
    table.show(_frame(95))
    assert _names(table)[:2] == ["row-94", "row-93"]
    assert table.page_count == 10
    table.jump(7)
    assert table.page == 6 and _names(table)[0] == "row-34"
    table.jump(99)
    assert table.page == 9
    table.show(_frame(15))
    assert (table.page, table.page_count) == (0, 2)
    with pytest.raises(TypeError):
        table.jump("2")  # type: ignore[arg-type]


def test_a_frame_s_attrs_stay_with_the_caller_not_with_the_table() -> None:
    frame = _frame(45)
    frame.attrs["unchecked"] = [f"/run/{i}" for i in range(1_000)]
    table = PagedTable(COLUMNS, page_size=20)
    table.show(frame)
    assert table.frame.attrs == {} and table.source.attrs == {}
    assert len(frame.attrs["unchecked"]) == 1_000  # the caller's frame is untouched
    assert _names(table)[:2] == ["row-0", "row-1"] and len(table.frame) == 45
    table.sort_by("size", ascending=False)
    assert _names(table)[0] == "row-44"


# --- keys as people read them --------------------------------------------------------


def _adamw_keys() -> list[str]:
    """The optimizer keys of a 24-block NNX model under adamw."""
    layers = ("attn_norm", "q", "k", "v", "o", "mlp_norm", "up", "down")
    return [
        f"['opt_state']['0']['{moment}']['blocks']['{block}']['{layer}']['{param}']['value']"
        for moment in ("mu", "nu")
        for block in range(24)
        for layer in layers
        for param in ("bias", "kernel")
    ]


KEY_COLUMNS = (
    Column("key", "key", key=True),
    Column("dtype", "dtype"),
    Column("nbytes", "size", align="right"),
    Column("kind", "kind", essential=False, priority=1),
    Column("value", "value", essential=False, priority=2),
    Column("bytes_again", "bytes", essential=False, priority=3),
)


def _leaves(keys: list[str]) -> pd.DataFrame:
    n = len(keys)
    return pd.DataFrame(
        {
            "checkpointable": ["optimizer"] * n,
            "key": keys,
            "dtype": ["float32" if i % 3 else "bfloat16" for i in range(n)],
            "nbytes": [4 * (i + 1) for i in range(n)],
            "kind": ["jax.Array"] * n,
            "value": [None] * n,
            "bytes_again": [4 * (i + 1) for i in range(n)],
        }
    )


def test_key_labels_are_readable_and_distinct_at_every_width_on_every_page() -> None:
    keys = _adamw_keys()
    table = PagedTable(KEY_COLUMNS, page_size=20)
    table.show(_leaves(keys))
    # What every row of the page shares is said once, in the header.
    assert table.visible_text("key")[:2] == ["0.attn_norm.bias", "0.attn_norm.kernel"]
    assert table.key_prefix == "opt_state.0.mu.blocks"
    # Hover and copy give the exact key.
    assert table.exact_keys()[0] == keys[0]
    for page in range(table.pages):
        table.jump(page + 1)
        for width in range(16, 60, 3):
            labels = table.visible_text("key", width=width)
            assert len(set(labels)) == len(labels), (page, width, labels)
        # Every row offers one label per width, the longest first.
        assert all(len(row["labels"]) == len(KEY_WIDTHS) for row in table.rows)
    # A page across mu and nu keeps them apart however narrow.
    table.show_row(keys.index(keys[383]))
    narrow = table.visible_text("key", width=16)
    assert any("mu" in label for label in narrow) and any("nu" in label for label in narrow)


def test_columns_that_say_nothing_in_view_give_way_first() -> None:
    table = PagedTable(KEY_COLUMNS, page_size=20)
    table.show(_leaves(_adamw_keys()))
    # One kind in every row, no values, bytes told twice: quiet; dtype varies.
    assert table.quiet_columns() == ["kind", "value", "bytes_again"]
    assert table.quiet == [0, 0, 0, UNIFORM, SILENT, SILENT]  # only the kind is ever shown
    one = _leaves(_adamw_keys()[:1])
    table.show(one)
    assert table.quiet_columns() == ["value", "bytes_again"]  # one row: a kind says something


def test_rows_of_several_checkpointables_lead_with_its_name() -> None:
    frame = pd.DataFrame(
        {
            "checkpointable": ["model", "optimizer", "optimizer"],
            "key": ["['step']", "['step']", ""],
        }
    )
    table = PagedTable((Column("key", "key", key=True), Column("checkpointable", "where")))
    table.show(frame)
    assert table.visible_text("key") == ["model.step", "optimizer.step", "optimizer"]
    assert table.exact_keys() == ["['step']", "['step']", "optimizer"]
    assert table.quiet_columns() == ["checkpointable"]  # the labels already say it


def test_the_key_column_sorts_in_natural_order() -> None:
    keys = [f"['blocks']['{i}']['w']" for i in (10, 2, 1, 0, 11, 19, 20, 3)]
    table = PagedTable((Column("key", "key", key=True),), page_size=5)
    table.show(pd.DataFrame({"key": keys}))
    table.click_header("key")
    assert list(table.frame["key"]) == [
        f"['blocks']['{i}']['w']" for i in (0, 1, 2, 3, 10, 11, 19, 20)
    ]
    assert table.visible_text("key") == ["0.w", "1.w", "2.w", "3.w", "10.w"]
    assert table.key_prefix == "blocks"
    table.click_header("key")
    assert list(table.frame["key"])[:2] == ["['blocks']['20']['w']", "['blocks']['19']['w']"]


def test_a_column_sorts_by_another_field_and_names_keep_their_exact_text() -> None:
    frame = pd.DataFrame(
        {
            "name": ["a", "b", "c"],
            "path": ["/r/a", "/r/b", ""],
            "change": ["9 %", "10 %", "+3"],
            "size": [0.09, 0.1, 3],
        }
    )
    table = PagedTable(
        (
            Column("name", "name", key=True, exact="path"),
            Column("change", "change", sort_by="size", descending_first=True),
        )
    )
    table.show(frame)
    assert table.exact_keys() == ["/r/a", "/r/b", "c"]
    table.click_header("change")
    assert list(table.frame["name"]) == ["c", "b", "a"]


def test_a_long_page_scrolls_within_the_table_and_reveals_a_row() -> None:
    with pytest.raises(ValueError, match="scroll_rows must be an int of at least 0, got -1"):
        PagedTable(COLUMNS, scroll_rows=-1)
    table = PagedTable(COLUMNS, page_size=500, scroll_rows=20)
    table.show(_frame(300))
    assert table.scroll_rows == 20 and table.pages == 1 and len(table.rows) == 300
    table.show_row(250)
    assert table.reveal[0] == 250
    asked = table.reveal[1]
    table.show_row(250)
    assert table.reveal == [250, asked + 1]  # asked again, scrolled again
