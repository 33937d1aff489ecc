"""tinax.explore.display: keys people can tell apart, natural order, one byte formatter.

The keys are those of a real flax NNX model of 24 blocks trained with optax's AdamW
(1,166 leaves), as ``state_table`` and a checkpoint on disk give them.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tinax._format import safetensors as st
from tinax.explore import display

BLOCKS = 24
WIDTHS = range(30, 121, 5)


def _nnx_training_state() -> dict[str, object]:
    import optax
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, width: int, *, rngs: nnx.Rngs) -> None:
            self.attn_norm = nnx.LayerNorm(width, rngs=rngs)
            self.q = nnx.Linear(width, width, rngs=rngs)
            self.k = nnx.Linear(width, width, rngs=rngs)
            self.v = nnx.Linear(width, width, rngs=rngs)
            self.o = nnx.Linear(width, width, rngs=rngs)
            self.mlp_norm = nnx.LayerNorm(width, rngs=rngs)
            self.up = nnx.Linear(width, 2 * width, rngs=rngs)
            self.down = nnx.Linear(2 * width, width, rngs=rngs)

    class Model(nnx.Module):
        def __init__(self, *, rngs: nnx.Rngs) -> None:
            self.embed = nnx.Linear(3, 4, rngs=rngs)
            self.blocks = nnx.List([Block(4, rngs=rngs) for _ in range(BLOCKS)])
            self.head = nnx.Linear(4, 1, rngs=rngs)

    model = Model(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    return {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}


@pytest.fixture(scope="module")
def training_state() -> dict[str, object]:
    return _nnx_training_state()


@pytest.fixture(scope="module")
def leaves(training_state: dict[str, object]) -> pd.DataFrame:
    from tinax.explore import state_table

    return state_table(training_state)


def _optimizer_keys(leaves: pd.DataFrame) -> list[str]:
    return list(leaves.loc[leaves["checkpointable"] == "optimizer", "key"])


# --- natural order -------------------------------------------------------------------


def test_natural_order_puts_block_10_after_block_2_for_indices_and_digit_keys() -> None:
    keys = [f"['blocks']['{i}']['w']" for i in (10, 2, 1, 0, 11, 19, 20, 3)]
    assert display.sort_keys(keys) == [
        f"['blocks']['{i}']['w']" for i in (0, 1, 2, 3, 10, 11, 19, 20)
    ]
    ints = ["['layers'][10]", "['layers'][9]", "['layers'][100]", "['layers'][0]"]
    assert display.sort_keys(ints) == [
        "['layers'][0]",
        "['layers'][9]",
        "['layers'][10]",
        "['layers'][100]",
    ]


def test_natural_order_keeps_a_subtree_together_and_after_its_parent() -> None:
    keys = ["['b']", "['a']['x']", "['a']", "['a'][2]", "['a']['10']", "['a'][1]['z']", ""]
    assert display.sort_keys(keys) == [
        "",
        "['a']",
        "['a'][1]['z']",
        "['a'][2]",
        "['a']['10']",
        "['a']['x']",
        "['b']",
    ]


def test_natural_key_of_text_that_is_no_keystr_orders_its_digit_runs_as_numbers() -> None:
    assert sorted(["step_10", "step_9", "step_100"], key=display.natural_key) == [
        "step_9",
        "step_10",
        "step_100",
    ]
    with pytest.raises(TypeError, match="a key is a str"):
        display.natural_key(3)  # type: ignore[arg-type]


@pytest.mark.slow  # a flax NNX model and optax state built
def test_natural_order_of_a_real_nnx_state_walks_blocks_0_to_23(leaves: pd.DataFrame) -> None:
    model = display.sort_keys(leaves.loc[leaves["checkpointable"] == "model", "key"])
    blocks = [display.readable_key(k).split(".")[1] for k in model if k.startswith("['blocks']")]
    assert list(dict.fromkeys(blocks)) == [str(i) for i in range(BLOCKS)]
    mu = [k for k in display.sort_keys(_optimizer_keys(leaves)) if "['mu']['blocks']" in k]
    order = [display.readable_key(k).split(".")[4] for k in mu]
    assert list(dict.fromkeys(order)) == [str(i) for i in range(BLOCKS)]


# --- readable names ------------------------------------------------------------------


def test_readable_key_is_dotted_without_nnx_value() -> None:
    key = "['blocks']['2']['attn']['q']['kernel']['value']"
    assert display.readable_key(key) == "blocks.2.attn.q.kernel"
    assert display.readable_key("[0]['mu']['w']") == "0.mu.w"
    assert display.readable_key("['value']") == "value"
    assert display.readable_key("") == "(root)"


def test_readable_key_refuses_what_is_not_a_keystr() -> None:
    with pytest.raises(ValueError, match=r"'blocks\.2' is not in keystr format"):
        display.readable_key("blocks.2")
    with pytest.raises(TypeError, match="got int"):
        display.readable_key(2)  # type: ignore[arg-type]


@pytest.mark.slow  # a flax NNX model and optax state built
def test_readable_keys_are_the_tensor_names_of_an_export(
    training_state: dict[str, object], leaves: pd.DataFrame, tmp_path: Path
) -> None:
    from orbax.checkpoint import v1 as ocp

    from tinax.explore import export_safetensors

    path = tmp_path / "step_000010"
    ocp.save_checkpointables(path, training_state)
    for name in ("model", "optimizer"):
        files = export_safetensors(path, tmp_path / name, checkpointable=name)
        exported = {t for f in files for t in st.read_header(f).tensors}
        keys = leaves.loc[leaves["checkpointable"] == name, "key"]
        assert exported == {display.readable_key(k) for k in keys}
        assert len(exported) == len(keys)


# --- labels for rows in view ---------------------------------------------------------


def test_labels_drop_what_every_row_shares_and_nnx_value() -> None:
    keys = [
        "['opt_state']['0']['mu']['blocks']['2']['q']['kernel']['value']",
        "['opt_state']['0']['nu']['blocks']['2']['q']['kernel']['value']",
    ]
    assert display.display_keys(keys) == ["mu.blocks.2.q.kernel", "nu.blocks.2.q.kernel"]
    assert display.shared_prefix(keys) == "opt_state.0"
    assert display.display_keys(keys[:1]) == ["opt_state.0.mu.blocks.2.q.kernel"]
    assert display.shared_prefix(keys[:1]) == ""
    assert display.display_keys([]) == []


def test_a_row_keeps_at_least_its_last_part() -> None:
    keys = ["['a']['b']", "['a']['b']['c']"]
    assert display.display_keys(keys) == ["b", "b.c"]
    assert display.display_keys(["['x']", "['x']"]) == ["x", "x"]


def test_keys_whose_dotted_names_meet_keep_their_exact_form() -> None:
    keys = ["['a.b']", "['a']['b']", "['x']", "['x']['value']"]
    labels = display.display_keys(keys)
    assert len(set(labels)) == 4
    assert labels == ["['a.b']", "['a']['b']", "['x']", "['x']['value']"]


@pytest.mark.slow  # a flax NNX model and optax state built
def test_checkpointables_are_the_first_part_of_each_label(leaves: pd.DataFrame) -> None:
    labels = display.display_keys(
        list(leaves["key"]), checkpointables=list(leaves["checkpointable"])
    )
    assert len(set(labels)) == len(leaves)
    assert "model.blocks.0.q.kernel" in labels
    assert "optimizer.opt_state.0.mu.blocks.0.q.kernel" in labels
    with pytest.raises(ValueError, match="checkpointables has 1 names for 2 keys"):
        display.display_keys(["['a']", "['b']"], checkpointables=["model"])


def _written_adamw_keys() -> list[str]:
    """The optimizer keys of a 24-block NNX model under adamw, written out by hand."""
    layers = {"attn_norm": ("bias", "scale"), "mlp_norm": ("bias", "scale")}
    layers |= {name: ("bias", "kernel") for name in ("q", "k", "v", "o", "up", "down")}
    keys = ["['opt_state']['0']['count']['value']", "['step']['value']"]
    for moment in ("mu", "nu"):
        for block in range(BLOCKS):
            for layer, params in layers.items():
                keys += [
                    f"['opt_state']['0']['{moment}']['blocks']['{block}']['{layer}']['{p}']['value']"
                    for p in params
                ]
    return keys


@pytest.mark.parametrize("width", (30, 45, 60, 90, 120))
def test_written_adamw_keys_stay_distinct_with_mu_nu_and_index_at_every_width(width: int) -> None:
    keys = _written_adamw_keys()
    labels = display.display_keys(keys, width=width)
    assert len(set(labels)) == len(keys) == 770
    assert max(len(label) for label in labels) <= width
    assert labels[2] == (
        "…mu.blocks.0.attn_norm.bias" if width < 40 else "opt_state.0.mu.blocks.0.attn_norm.bias"
    )


@pytest.mark.slow  # a flax NNX model and optax state built
@pytest.mark.parametrize("width", WIDTHS)
def test_every_width_keeps_all_24_block_adamw_labels_distinct(
    leaves: pd.DataFrame, width: int
) -> None:
    keys = _optimizer_keys(leaves)
    assert len(keys) > 700
    labels = display.display_keys(keys, width=width)
    assert len(set(labels)) == len(keys)
    assert all(len(label) <= width for label in labels)
    for key, label in zip(keys, labels, strict=True):
        parts = display.readable_key(key).split(".")
        shown = label.replace("…", ".").split(".")
        if parts[2:4] in (["mu", "blocks"], ["nu", "blocks"]):
            # mu/nu and the block index stay whatever the width.
            assert parts[2] in shown and parts[4] in shown, (key, label)
        assert label.endswith(parts[-1]), (key, label)


@pytest.mark.slow  # a flax NNX model and optax state built
@pytest.mark.parametrize("width", (30, 60, 90, 120))
def test_every_page_of_twenty_rows_is_distinct_at_every_width(
    leaves: pd.DataFrame, width: int
) -> None:
    keys = display.sort_keys(list(leaves["key"]))
    for start in range(0, len(keys), 20):
        page = keys[start : start + 20]
        labels = display.display_keys(page, width=width)
        assert len(set(labels)) == len(set(page)), page


def test_shortening_elides_common_middle_parts_first() -> None:
    keys = [
        f"['opt_state']['0']['{m}']['transformer']['blocks']['{i}']['attention']['{p}']['kernel']"
        for m in ("mu", "nu")
        for i in range(12)
        for p in ("query", "key")
    ]
    labels = display.display_keys(keys, width=28)
    assert len(set(labels)) == len(keys)
    assert labels[0] == "mu…0…query.kernel"
    assert labels[-1] == "nu…11…key.kernel"
    assert all(len(label) <= 28 for label in labels)


def test_labels_stay_long_rather_than_alike() -> None:
    keys = ["['aaaaaaaaaa']['bbbbbbbbbbbbbb']", "['aaaaaaaaaa']['bbbbbbbbbbbbbc']", "['zz']"]
    labels = display.display_keys(keys, width=4)
    assert len(set(labels)) == 3
    assert labels[2] == "zz"


def test_bad_widths_and_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="width must be at least 1, got 0"):
        display.display_keys(["['a']"], width=0)
    with pytest.raises(TypeError, match="width must be an int or None, got bool"):
        display.display_keys(["['a']"], width=True)
    with pytest.raises(TypeError, match="keys must be a sequence of str, got str"):
        display.display_keys("['a']")
    with pytest.raises(ValueError, match="not in keystr format"):
        display.display_keys(["['a']", "a.b"])


# --- bytes ---------------------------------------------------------------------------


def test_human_bytes_in_binary_units_with_blank_for_missing() -> None:
    assert display.human_bytes(0) == "0 B"
    assert display.human_bytes(1023) == "1023 B"
    assert display.human_bytes(1536) == "1.5 KiB"
    assert display.human_bytes(np.int64(3 << 30)) == "3.0 GiB"
    assert display.human_bytes(5 << 60) == "5120.0 PiB"
    for missing in (None, math.nan, pd.NA, pd.NaT, np.float32("nan")):
        assert display.human_bytes(missing) == ""
        assert display.human_bytes(missing, missing="—") == "—"
    for bad in ("12", True, b"1"):
        with pytest.raises(TypeError, match="a byte count is a number"):
            display.human_bytes(bad)


def test_the_project_has_one_byte_formatter() -> None:
    from tinax.widgets import _text

    from tinax._cli import terminal as _terminal
    from tinax.explore import _readable

    assert _readable.human_bytes is display.human_bytes
    assert _terminal.human_bytes is display.human_bytes
    assert _text.format_bytes(1536) == "1.5 KiB"
    assert _text.format_bytes(None) == "—"
    assert _text.format_bytes("x") == "—"


def test_state_parts_put_the_model_first_and_the_optimizer_last() -> None:
    assert display.state_part("model", "['blocks']['0']['q']['kernel']['value']") == display.MODEL
    assert display.state_part("state", "['params']['dense']['w']") == display.MODEL
    assert display.state_part("rng", "") == display.OTHER_STATE
    assert display.state_part("auxiliary", "['loss']") == display.OTHER_STATE
    assert display.state_part("optimizer", "['step']['value']") == display.OPTIMIZER_STATE
    assert display.state_part("state", "['opt_state'][0]['mu']['w']") == display.OPTIMIZER_STATE
    assert display._is_optimizer_state("Optimizer", "")
    assert not display._is_optimizer_state("model", "['optimizer_like']")


def test_key_filters_find_keys_typed_dotted_or_as_keystr() -> None:
    keys = ["['blocks']['7']['q']['kernel']['value']", "['blocks']['17']['q']['bias']", "['head']"]
    assert display.key_matches(keys, "blocks.7.") == [True, False, False]
    assert display.key_matches(keys, "['blocks']['7']") == [True, False, False]
    assert display.key_matches(keys, "Q.KERNEL") == [True, False, False]
    assert display.key_matches(keys, "  ") == [True, True, True]
    assert display.key_matches(["not a key"], "key") == [True]
    with pytest.raises(TypeError, match="a filter is a str, got int"):
        display.key_matches(keys, 7)  # type: ignore[arg-type]


def test_one_duration_formatter_is_coarse_for_ages_and_precise_for_timings() -> None:
    import datetime

    from tinax.explore.toolkit import human_duration

    coarse = [5, 75.5, 4000, 90000, pd.Timedelta("3min"), np.timedelta64(120, "s")]
    assert [human_duration(v) for v in coarse] == ["5 s", "1 min", "1 h", "1 d", "3 min", "2 min"]
    precise = [0.25, 12.34, 75, 7380, datetime.timedelta(seconds=3)]
    assert [human_duration(v, precise=True) for v in precise] == [
        "0.25 s",
        "12.3 s",
        "1 min 15 s",
        "2 h 3 min",
        "3.00 s",
    ]
    for missing in (None, math.nan, pd.NaT, pd.NA, np.timedelta64("NaT")):
        assert human_duration(missing) == human_duration(missing, precise=True) == ""
    with pytest.raises(ValueError):
        human_duration("soon")
