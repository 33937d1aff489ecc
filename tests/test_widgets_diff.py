"""CheckpointExplorer: the verdict of the open checkpoint, and comparing it with another."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from tinax.widgets import CheckpointExplorer
from tinax.widgets._diff import DiffView, forward
from tinax.widgets._diff_bars import LAYERS, subtree_changes
from tinax.widgets._nonfinite import NONFINITE_COLOR

from tinax.checkpointing import save_checkpointables

BASE = np.linspace(1.0, 2.0, 64, dtype=np.float32).reshape(8, 8)


def _state(scale: float) -> dict[str, Any]:
    return {
        "model": {
            "encoder": {"w": BASE * scale, "b": np.ones(8, np.float32)},
            "decoder": {"w": BASE + 0.001 * scale, "b": np.ones(8, np.float32)},
        },
        "optimizer": {"count": 3, "mu": np.full(4, 0.5, np.float32)},
    }


@pytest.fixture
def run(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    root.mkdir()
    save_checkpointables(root / "step-1", _state(1.0)).result()
    save_checkpointables(root / "step-2", _state(2.0)).result()
    return root


def test_the_open_checkpoint_shows_its_verdict(run: Path) -> None:
    broken = run / "step-3"
    shutil.copytree(run / "step-1", broken)
    (broken / "model" / "_METADATA").write_text("{")
    explorer = CheckpointExplorer(run)
    assert explorer.wait(60), "the background check of the run did not finish"
    explorer.open_checkpoint("step-1")
    assert explorer.wait(60), "the verdict did not come"
    assert 'data-ok="true"' in explorer.contents.verdict.value
    assert "sound (metadata checked)" in explorer.contents.verdict.value
    # A checkpoint the listing calls invalid is not opened; verify names its broken part.
    assert all("step-3" not in path for _, path in explorer.diff_view.choice.options)
    from tinax.widgets._soundness import verdict_html

    text = verdict_html(str(broken))
    assert 'data-ok="false"' in text and "model/_METADATA" in text


def test_compare_with_another_checkpoint(run: Path) -> None:
    explorer = CheckpointExplorer(run)
    explorer.open_checkpoint("step-1")
    view = explorer.diff_view
    assert view.result.layout.display == "none"
    labels = [label for label, _ in view.choice.options]
    assert labels == ["compare with…", "compare with step-2"]
    view.choice.value = str(run / "step-2")
    assert view.other == str(run / "step-2")
    assert view.result.layout.display == ""
    table = view.table.frame
    assert table["key"].iloc[0] == "['encoder']['w']"
    assert table["rel_change"].iloc[0] == pytest.approx(1.0)
    assert set(table["status"].iloc[-4:]) == {"same"}
    assert "2 changed" in view.title.value
    # One bar per top-level subtree that changed, the largest first, full length.
    bars = view.bars.children[1:]  # under a line that says what the bars measure
    assert "relative change" in view.bars.children[0].value
    assert [row.children[0].value for row in bars] == ["model encoder", "model decoder"]
    assert bars[0].children[1].value == pytest.approx(1.0)
    assert 0 < bars[1].children[1].value < 0.01
    view.depth.value = 2
    assert view.bars.children[1].children[0].value == "model encoder.w"
    # Back to the placeholder: the comparison goes away; so does closing the checkpoint.
    view.choice.value = ""
    assert view.result.layout.display == "none" and view.other is None
    view.choice.value = str(run / "step-2")
    explorer.open_checkpoint("step-2")
    assert view.other is None and view.base == str(run / "step-2")
    assert [label for label, _ in view.choice.options] == ["compare with…", "compare with step-1"]


def test_a_comparison_that_fails_is_shown_in_the_widget(run: Path) -> None:
    explorer = CheckpointExplorer(run)
    explorer.open_checkpoint("step-1")
    (run / "step-2" / "model" / "_METADATA").write_text("{")
    explorer.diff_view.choice.value = str(run / "step-2")
    assert "Cannot compare" in explorer.diff_view.title.value
    assert "not valid JSON" in explorer.error


def test_subtree_changes_are_norms_of_their_changed_leaves() -> None:
    import pandas as pd

    table = pd.DataFrame(
        {
            "checkpointable": ["m", "m", "m"],
            "key": ["['a']['x']", "['a']['y']", "['b']"],
            "status": ["changed", "changed", "same"],
            "norm_a": [3.0, 4.0, None],
            "norm_diff": [1.0, 0.0, None],
        }
    )
    subtrees = subtree_changes(table, 1)
    assert subtrees.to_dict("records") == [
        {
            "checkpointable": "m",
            "subtree": "['a']",
            "rel_change": pytest.approx(0.2),
            "leaves": 2,
            "nonfinite": 0,
            "nan": 0,
            "inf": 0,
            "nan_a": 0,
            "inf_a": 0,
        }
    ]


def _training(step: int, weights: np.ndarray, mu: np.ndarray) -> dict[str, Any]:
    return {
        "model": {"dense": {"kernel": weights, "bias": np.zeros(4, np.float32)}},
        "optimizer": {"count": np.asarray(step, np.int32), "mu": mu},
        "rng": np.asarray([0, step], np.uint32),  # a PRNG key as Orbax stores it
        "auxiliary": {"dropout_count": np.asarray(step * 2, np.int64)},
    }


def test_the_diff_ranks_weights_by_relative_change_and_tells_counters_and_keys_apart(
    tmp_path: Path,
) -> None:
    weights = np.linspace(1.0, 2.0, 16, dtype=np.float32).reshape(4, 4)
    mu = weights * np.float32(0.1)
    save_checkpointables(tmp_path / "step-100", _training(100, weights, mu)).result()
    later = _training(250, weights * np.float32(1.5), mu * np.float32(1.2))
    save_checkpointables(tmp_path / "step-250", later).result()
    explorer = CheckpointExplorer(tmp_path)
    explorer.open_checkpoint("step-100")
    explorer.diff_view.compare(str(tmp_path / "step-250"))
    table = explorer.diff_view.diff
    changed = table[table["status"] == "changed"]
    # The model (and the rest) before the optimizer's state; in each, floating-point
    # arrays first, by relative change; then the counters; then the key.
    assert list(changed["checkpointable"]) == [
        "model",
        "auxiliary",
        "rng",
        "optimizer",
        "optimizer",
    ]
    assert list(changed["value_kind"]) == ["float", "integer", "PRNG key", "float", "integer"]
    assert changed["rel_change"].iloc[0] == pytest.approx(0.5)
    counters = dict(zip(changed["key"], changed["change"], strict=True))
    assert counters["['dropout_count']"] == "+300" and counters["['count']"] == "+150"
    rng = changed[changed["checkpointable"] == "rng"].iloc[0]
    assert rng["change"] == "changed" and pd.isna(rng["rel_change"]) and pd.isna(rng["cosine"])
    # The rng's leaf is the whole checkpointable: its row reads as its name.
    view = explorer.diff_view.table
    slot = list(view.frame["checkpointable"]).index("rng")
    assert view.visible_text("key")[slot] == "rng"
    assert view.exact_keys()[slot] == "rng"
    assert view.sort_field is None  # the rows are in the diff's own order, and say so
    # The bars measure floating-point leaves only, in percent, the model's first; by
    # layer, the model's one module (dense) is looked through, as drift_table does.
    bars = explorer.diff_view.bars.children[1:]
    assert [row.children[0].value for row in bars] == ["model dense.kernel", "optimizer mu"]
    assert bars[0].children[2].value == "50 % (1 changed)"


def test_the_diff_tree_rolls_changes_up_by_subtree(run: Path) -> None:
    explorer = CheckpointExplorer(run)
    explorer.open_checkpoint("step-1")
    explorer.diff_view.compare(str(run / "step-2"))
    tree = explorer.diff_view.tree
    # Checkpointables open one level: model's encoder and decoder, optimizer's leaves.
    labels = tree.table.frame["label"].tolist()
    assert labels[:3] == ["model", "decoder", "encoder"]
    changed, rel = tree.rollup("model", "['encoder']")
    assert changed == 1 and rel == pytest.approx(1.0)  # w doubled, b the same
    changed, rel = tree.rollup("model")
    assert changed == 2 and 0 < rel < 1.0
    # Opening a subtree shows its leaves, indented one level deeper.
    tree.toggle("model", "['encoder']")
    frame = tree.table.frame
    rows = frame[frame["label"].isin(["b", "w"])]
    assert len(rows) >= 2 and set(rows["depth"]) == {2}
    assert tree.table.visible_text("rel_change")[labels.index("encoder")] == "100 %"


# --- the diff on its own: forward, model first, filtered, a row opens its leaf -----------


def _diff_view() -> DiffView:
    def fail(error: BaseException) -> None:
        raise error

    return DiffView(page_size=20, on_error=fail)


def _nnx_like(step: int, scale: float) -> dict[str, Any]:
    blocks = {
        str(i): {
            "q": {"kernel": {"value": BASE * scale * (1 + i)}},
            "norm": {"scale": {"value": np.ones(8, np.float32)}},
        }
        for i in range(12)
    }
    moments = {"blocks": {str(i): {"q": {"kernel": {"value": BASE * scale}}} for i in range(12)}}
    return {
        "model": {"blocks": blocks},
        "optimizer": {
            "step": {"value": np.asarray(step, np.int32)},
            "opt_state": {
                "0": {"count": {"value": np.asarray(step, np.int32)}, "mu": moments, "nu": moments}
            },
        },
    }


@pytest.fixture
def nnx_run(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    root.mkdir()
    save_checkpointables(root / "step_000200", _nnx_like(200, 1.0)).result()
    save_checkpointables(root / "step_000250", _nnx_like(250, 1.5)).result()
    return root


def test_the_diff_reads_forward_from_the_older_checkpoint_whichever_is_open(nnx_run: Path) -> None:
    older, newer = str(nnx_run / "step_000200"), str(nnx_run / "step_000250")
    assert forward(newer, older) == (older, newer) == forward(older, newer)
    assert forward("/r/step-10", "/r/step-9") == ("/r/step-9", "/r/step-10")
    view = _diff_view()
    view.set_base(newer, [("step_000200", older), ("step_000250", newer)])
    assert [label for label, _ in view.choice.options] == [
        "compare with…",
        "compare with step_000200",
    ]
    view.choice.value = older
    assert (view.base, view.other, view.older, view.newer) == (newer, older, older, newer)
    assert "Changes from <code>step_000200</code> to <code>step_000250</code>" in view.title.value
    # The leaves or the subtrees, one at a time.
    assert view.table.layout.display == "" and view.tree.layout.display == "none"
    view.view_as.value = "subtrees"
    assert view.table.layout.display == "none" and view.tree.layout.display == ""
    counters = view.diff[view.diff["value_kind"] == "integer"]
    assert set(counters["change"]) == {"+50"}


def test_the_model_comes_before_the_optimizer_state_and_blocks_in_number_order(
    nnx_run: Path,
) -> None:
    view = _diff_view()
    view.set_base(str(nnx_run / "step_000200"), [])
    view.compare(str(nnx_run / "step_000250"))
    frame = view.table.frame
    optimizer = (frame["checkpointable"] == "optimizer").to_numpy()
    assert not optimizer[:24].any() and optimizer[24:].all()
    # Equal changes keep natural order: block 2 before block 10.
    same = frame[(frame["checkpointable"] == "model") & (frame["status"] == "same")]
    assert [k.split("'")[3] for k in same["key"]] == [str(i) for i in range(12)]
    # The first page: the model's leaves, distinct labels, the exact key kept for hover.
    labels = view.table.visible_text("key")
    assert len(set(labels)) == 20
    assert all(re.fullmatch(r"\d+\.(q\.kernel|norm\.scale)", label) for label in labels)
    assert view.table.key_prefix == "blocks"  # what every row in view shares, in the header
    assert view.table.exact_keys()[0].startswith("['blocks']")
    # No column tells a change twice; columns with one value in view give way first.
    assert "rel_change" not in [c.field for c in view.table.columns]
    assert {"checkpointable", "value_kind"} <= set(view.table.quiet_columns())
    # The change sorts by its size, largest first.
    view.table.click_header("change")
    sizes = pd.to_numeric(view.table.frame["rel_change"], errors="coerce").dropna()
    assert list(sizes) == sorted(sizes, reverse=True) and sizes.iloc[0] > 0
    # The bars show the layers, as drift does: blocks.0 … rather than blocks.
    assert view.depth.value == LAYERS
    bars = [row.children[0].value for row in view.bars.children[1:]]
    assert len(bars) == 8 and all(b.startswith("model blocks.") for b in bars)
    # The tree of the diff walks the blocks in number order too.
    view.tree.toggle("model", "['blocks']")
    labels = view.tree.table.frame["label"].tolist()
    assert labels[2:14] == [str(i) for i in range(12)]


def test_the_filters_narrow_the_diff_and_a_row_opens_its_leaf(nnx_run: Path) -> None:
    view = _diff_view()
    view.set_base(str(nnx_run / "step_000250"), [])
    view.compare(str(nnx_run / "step_000200"))
    view.narrow("", "blocks.7")
    assert set(view.table.frame["key"].str.extract(r"\['blocks'\]\['(\d+)'\]")[0]) == {"7"}
    assert len(view.table.frame) == 4  # q and norm of the model, q of mu and nu
    view.narrow("optimizer", "['mu']")
    assert set(view.table.frame["checkpointable"]) == {"optimizer"}
    assert all("['mu']" in k for k in view.table.frame["key"])
    assert all(b.children[0].value.startswith("optimizer") for b in view.bars.children[1:])
    view.narrow()
    assert len(view.table.frame) == len(view.diff)
    # A click on a row (as the browser sends it) names the leaf to open.
    view.table._handle_custom_msg({"kind": "pick", "slot": 3}, [])
    row = view.table.frame.iloc[3]
    assert view.picked == (row["checkpointable"], row["key"])
    # So does a leaf clicked in the diff's tree.
    view.tree.toggle("model", "['blocks']")
    view.tree.toggle("model", "['blocks']['0']")
    view.tree.toggle("model", "['blocks']['0']['q']")
    slot = view.tree.table.frame["label"].tolist().index("kernel")
    view.tree.table._handle_custom_msg({"kind": "pick", "slot": slot}, [])
    assert view.picked == ("model", "['blocks']['0']['q']['kernel']['value']")


def test_a_diff_row_picked_in_the_explorer_opens_that_leaf(nnx_run: Path) -> None:
    explorer = CheckpointExplorer(nnx_run)
    explorer.open_checkpoint("step_000250")
    assert explorer.wait(60)
    explorer.diff_view.compare(str(nnx_run / "step_000200"))
    table = explorer.diff_view.table
    table._handle_custom_msg({"kind": "pick", "slot": 0}, [])
    row = table.frame.iloc[0]
    assert explorer.wait(60)
    picked = explorer.leaf_view.frame.loc[explorer.leaf_view.selected]
    assert (picked["checkpointable"], picked["key"]) == (row["checkpointable"], row["key"])


# --- NaN and Inf in a diff: a change of their own, first, never "0 %" -----------------------


def _diverging(step: int) -> dict[str, Any]:
    """A model of an embedding, a head, a norm and six blocks: block 3 jumps at step 2;
    from step 3 on the whole of block 5 is NaN and one element of the head is Inf."""
    blocks = {}
    for i in range(6):
        w = BASE * (1.0 + 0.01 * step)
        if i == 3 and step >= 2:
            w = w * 3.0
        if i == 5 and step >= 3:
            w = np.full_like(w, np.nan)
        blocks[str(i)] = {"w": w, "b": np.ones(8, np.float32)}
    head = BASE * (1.0 + 0.01 * step)
    if step >= 3:
        head[0, 0] = np.inf
    return {
        "model": {
            "embed": BASE * (1.0 + 0.01 * step),
            "head": head,
            "norm": np.ones(8, np.float32) * (1.0 + 0.01 * step),
            "blocks": blocks,
        }
    }


@pytest.fixture
def diverging_run(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    root.mkdir()
    for step in (1, 2, 3):
        save_checkpointables(root / f"step_{step}", _diverging(step)).result()
    return root


def test_the_bars_show_the_layer_that_moved(diverging_run: Path) -> None:
    view = _diff_view()
    view.set_base(str(diverging_run / "step_1"), [])
    view.compare(str(diverging_run / "step_2"))
    bars = [row.children[0].value for row in view.bars.children[1:]]
    # By layer: the block that jumped, not "model blocks" one key deep.
    assert view.depth.value == LAYERS and bars[0] == "model blocks.3"
    assert len(bars) == 8 and {"model embed", "model norm", "model blocks.0"} <= set(bars)
    # The ninth subtree is named under the bars, and "show all" draws its bar.
    assert view.more_box.layout.display == ""
    every = {"model embed", "model head", "model norm"} | {f"model blocks.{i}" for i in range(6)}
    (left_out,) = every - set(bars)
    assert f"and 1 more subtree: {left_out}" in view.more_bars.value
    view.all_bars.value = True
    assert len(view.bars.children[1:]) == 9 and "9 subtrees" in view.more_bars.value
    view.all_bars.value = False
    view.depth.value = 1
    assert view.bars.children[1].children[0].value == "model blocks"
    assert view.more_box.layout.display == "none"


def test_leaves_gone_nan_or_inf_come_first_in_their_own_colour_never_as_0_percent(
    diverging_run: Path,
) -> None:
    view = _diff_view()
    view.set_base(str(diverging_run / "step_3"), [])
    view.compare(str(diverging_run / "step_2"))
    assert (view.older, view.newer) == (
        str(diverging_run / "step_2"),
        str(diverging_run / "step_3"),
    )
    bars = view.bars.children[1:]
    labels = [row.children[0].value for row in bars]
    texts = [row.children[2].value for row in bars]
    # The NaN block and the head with its Inf come first, a full bar in their colour,
    # told by their counts.
    assert labels[:2] == ["model blocks.5", "model head"], labels
    # Counted in each checkpoint once (the newer, b, first), as a scan of each does.
    assert texts[0] == "NaN/Inf in 1 of 1 changed (b: 64 NaN)"
    assert texts[1] == "NaN/Inf in 1 of 1 changed (b: 1 Inf)"
    for row in bars[:2]:
        assert row.children[1].value == 1.0 and row.children[1].style.bar_color == NONFINITE_COLOR
    assert not any(t.startswith("0 %") for t in texts)
    assert "NaN/Inf" in view.bars.children[0].value
    # The table: those two leaves first, their change their counts, in their colour.
    frame = view.table.frame
    assert set(frame["key"].iloc[:2]) == {"['blocks']['5']['w']", "['head']"}
    first = dict(zip(frame["key"], frame["change"], strict=True))
    assert (
        first["['blocks']['5']['w']"] == "NaN 64 (was finite)"
        and first["['head']"] == "Inf 1 (was finite)"
    )
    assert view.table.rows[0]["color"] == NONFINITE_COLOR
    assert "2 changed leaves with NaN or Inf (b: 64 NaN, 1 Inf)" in view.title.value
    # Sorted by change, they stay first: no change is larger than one gone NaN.
    view.table.click_header("change")
    assert set(view.table.frame["key"].iloc[:2]) == {"['blocks']['5']['w']", "['head']"}
    # The subtrees' tree counts them apart, instead of a relative change.
    assert view.tree.nonfinite("model") == 2
    assert view.tree.nonfinite("model", "['blocks']") == 1
    labels = view.tree.table.frame["label"].tolist()
    assert view.tree.table.visible_text("rel_change")[labels.index("model")] == "NaN/Inf in 2"


def test_leaves_nan_on_both_sides_are_named_not_greyed_as_same(tmp_path: Path) -> None:
    import grain

    from tinax.checkpointing import save_training_checkpoint

    iterator = iter(grain.MapDataset.range(8).to_iter_dataset())
    nan = np.full((8, 8), np.nan, np.float32)
    for step in (60, 70):
        # Both diverged (their logged loss is NaN); w is all NaN, the same bytes in both.
        model = {"w": nan, "b": np.full(8, step, np.float32)}
        aux = {"loss": float("nan")}
        save_training_checkpoint(
            tmp_path / f"step_{step}", step, model, {"count": step}, np.zeros(2), aux, iterator
        ).result()
    view = _diff_view()
    view.set_base(str(tmp_path / "step_60"), [])
    view.compare(str(tmp_path / "step_70"))
    frame = view.diff.set_index("key")
    assert frame.loc["['w']", "status"] == "same"
    # Neither side read yet: the diff says it cannot tell, and offers to count.
    assert view.both.unknown_same and view.count_box.layout.display == ""
    assert "on both sides" not in view.title.value
    view.count_same()
    assert view.count_box.layout.display == "none"
    # w's 64 NaN, and the logged loss, NaN in both.
    assert "2 of the same leaves hold NaN or Inf on both sides (65 NaN, 0 Inf in each)" in (
        view.title.value
    )
    row = view.table.frame.set_index("key").loc["['w']"]
    assert row["change"] == "NaN 64 on both sides" and row["status"] == "same"
    label = list(view.table.frame["key"]).index("['w']")
    assert view.table.rows[label]["color"] == NONFINITE_COLOR
    # Read once, known to the next diff of either at once.
    again = _diff_view()
    again.set_base(str(tmp_path / "step_70"), [])
    again.compare(str(tmp_path / "step_60"))
    assert again.both.leaves == 2 and not again.both.unknown_same
