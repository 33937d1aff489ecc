"""The terminal's tables and leaf names, without a checkpoint: keys of an NNX model with
adamw's moments, laid out at a terminal's width and named back as the table shows them."""

from __future__ import annotations

import io

import pandas as pd
import pytest

from tinax._cli import terminal as term
from tinax._format.naming.keys import format_key
from tinax.explore._key_match import LeafNotFoundError, exact_key, match_key


def nnx_keys(blocks: int = 12) -> list[str]:
    """An NNX model's keys under adamw's ``opt_state[0]`` moments, blocks in text order."""
    leaves = [
        ("attention_query_projection", "kernel"),
        ("attention_query_projection", "bias"),
        ("feed_forward_up_projection", "kernel"),
        ("post_attention_layer_norm", "scale"),
    ]
    keys = [format_key(("opt_state", "0", "count", "value"))]
    for moment in ("mu", "nu"):
        for block in sorted(range(blocks), key=str):
            for module, name in leaves:
                path = ("opt_state", "0", moment, "blocks", str(block), module, name, "value")
                keys.append(format_key(path))
    return keys


def table_of(keys: list[str]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "key": keys,
            "kind": ["jax.Array"] * len(keys),
            "shape": [(16, 16)] * len(keys),
            "dtype": ["float32"] * (len(keys) - 1) + ["int32"],
            "nbytes": [1024] * len(keys),
            "value": [None] * len(keys),
            "chunk_shape": [(16, 16)] * len(keys),
        }
    )


COLUMNS = (
    term.Column("key", "key", key=True, priority=0),
    term.Column("kind", "kind", priority=5),
    term.Column("shape", "shape", term.shape, priority=1),
    term.Column("dtype", "dtype", priority=1),
    term.Column("nbytes", "size", term.human_bytes, priority=2, right=True),
    term.Column("value", "value", priority=3),
    term.Column("chunk_shape", "chunks", term.shape, priority=7),
)


@pytest.mark.parametrize("columns", [40, 60, 80, 120])
def test_keys_stay_distinct_at_every_width_and_quiet_columns_give_way(columns):
    keys = nnx_keys()
    out = io.StringIO()
    plan = term.render(table_of(keys), COLUMNS, out, columns)
    assert plan is not None
    lines = out.getvalue().splitlines()
    assert all(len(line) <= columns for line in lines), max(map(len, lines))
    shown = [line.split()[0] for line in lines[1 : 1 + len(keys)]]
    assert len(set(shown)) == len(keys)
    # Nothing but the keys distinguishes rows of one kind; blank values and chunks that
    # repeat the shapes take no room; the one kind is said once, under the table.
    assert [c.source for c in plan.columns][:1] == ["key"]
    assert {"kind", "value", "chunk_shape"}.isdisjoint(c.source for c in plan.columns)
    said = " ".join(out.getvalue().split("every row: ", 1)[1].split())
    hidden = [c.header for c in plan.hidden]
    told = f" … {len(hidden)} more column{'s' * (len(hidden) != 1)}: {', '.join(hidden)};"
    # Said once under the table: what every row holds, then what the width left out.
    assert said == "kind: jax.Array; shape: (16, 16); size: 1.0 KiB" + (
        f"{told} --wide shows them" if hidden else ""
    )
    assert not any("['" in key or key.endswith(".value") for key in shown)
    if columns >= 80:
        assert "dtype" in lines[0]
    full = [term.key_labels(keys, None)[i] for i in range(len(keys))]
    if columns >= 120:
        assert shown == full  # room enough: every key whole


def test_a_column_that_repeats_another_is_left_out():
    frame = pd.DataFrame({"name": ["0", "5"], "step": [0, 5], "status": ["complete", "invalid"]})
    columns = (
        term.Column("name", "name", priority=0),
        term.Column("step", "step", term.number, priority=1),
        term.Column("status", "status", priority=0),
    )
    plan = term.layout(frame, columns, 80)
    assert [c.source for c in plan.columns] == ["name", "status"] and not plan.uniform


def test_a_message_wraps_in_the_room_left():
    frame = pd.DataFrame({"severity": ["error"], "part": ["model"], "message": ["word " * 40]})
    columns = (
        term.Column("severity", "severity", priority=0),
        term.Column("part", "part", priority=1),
        term.Column("message", "message", priority=0, wrap=True),
    )
    out = io.StringIO()
    term.render(frame, columns, out, 60)
    lines = out.getvalue().splitlines()
    assert len(lines) > 3 and all(len(line) <= 60 for line in lines)
    assert lines[1].startswith("error     model  word")


def test_a_leaf_is_named_by_any_form_a_table_shows():
    keys = nnx_keys()
    mu7 = "['opt_state']['0']['mu']['blocks']['7']['attention_query_projection']['kernel']['value']"
    for name in (
        mu7,
        "opt_state.0.mu.blocks.7.attention_query_projection.kernel",
        "opt_state.0.mu.blocks.7.attention_query_projection.kernel.value",
        "mu.blocks.7.attention_query_projection.kernel",  # what all rows share left out
        "['opt_state'][0]['mu']['blocks'][7]['attention_query_projection']['kernel']",
        "…mu…7.attention_query_projection.kernel",  # parts left out on a narrow line
    ):
        assert match_key(keys, name) == mu7, name
    assert match_key(["", "['x']"], "(root)") == ""
    assert exact_key(keys, "mu.blocks.7.attention_query_projection.kernel") is None
    # Every label a table shows names its own key back, given the labels shown; a
    # label that fits one key alone, without them.
    for width in (None, 60, 40, 30):
        labels = term.key_labels(keys, width)
        shown = dict(zip(labels, keys, strict=True))
        assert [match_key(keys, label, shown=shown) for label in labels] == keys, width
    labels = term.key_labels(keys, 40)
    alone = [(label, key) for label, key in zip(labels, keys, strict=True) if "…" in label]
    assert alone and all(match_key(keys, label) == key for label, key in alone[:3])


def test_a_miss_is_answered_with_the_nearest_names():
    keys = nnx_keys()
    with pytest.raises(LeafNotFoundError, match="the nearest: ") as caught:
        match_key(keys, "mu.blocks.7.attention_query_projection.kernl", checkpointable="optimizer")
    nearest = str(caught.value).split("the nearest: ", 1)[1].split(", ")
    assert nearest[0] == "opt_state.0.mu.blocks.7.attention_query_projection.kernel"
    assert isinstance(caught.value, KeyError) and isinstance(caught.value, ValueError)
    with pytest.raises(LeafNotFoundError, match="names 24 leaves"):
        match_key(keys, "attention_query_projection.kernel")
    with pytest.raises(LeafNotFoundError, match="is a subtree"):
        match_key(keys, "mu.blocks.7")
    with pytest.raises(LeafNotFoundError, match="nor one near it"):
        match_key(keys, "zzzz")
    with pytest.raises(TypeError):
        match_key(keys, 7)  # type: ignore[arg-type]
