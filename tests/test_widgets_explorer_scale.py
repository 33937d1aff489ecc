"""CheckpointExplorer at scale: the leaf tree, the size bar, small values, a leaf across
the run, sorting and paging, on real flax NNX / optax training checkpoints."""

from __future__ import annotations

import os
from typing import Any

import grain
import jax
import numpy as np
import optax
import pandas as pd
import pytest
from flax import nnx
from tinax.widgets import CheckpointExplorer
from tinax.widgets._tree import LeafTree, key_parts, size_bar_html, size_breakdown

from tinax.checkpointing import save_training_checkpoint

STEPS = (0, 5, 10)
KERNEL = "['dense1']['kernel']['value']"


class _Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.dense1 = nnx.Linear(4, 16, rngs=rngs)
        self.dense2 = nnx.Linear(16, 2, rngs=rngs)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three training checkpoints of an NNX model under AdamW; the kernel grows each step."""
    root = tmp_path_factory.mktemp("run")
    model = _Model(nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    tx = optax.adamw(1e-2)
    opt_state = tx.init(params)
    grads = jax.tree.map(lambda p: p * 0 + 0.5, params)
    kernels = {}
    iterator = iter(grain.MapDataset.range(32).to_iter_dataset())
    for step in STEPS:
        model.dense1.kernel.value = model.dense1.kernel.value * 0 + step + 1.0
        kernels[step] = np.asarray(model.dense1.kernel.value)
        _, opt_state = tx.update(grads, opt_state, params)
        next(iterator)
        save_training_checkpoint(
            root / f"step_{step:06d}",
            step,
            nnx.state(model),
            opt_state,
            jax.random.key(7),
            {"loss": 1.0 / (step + 1)},
            iterator,
        ).result()
    return {"root": root, "kernels": kernels}


def _pick_in_tree(explorer: CheckpointExplorer, name: str) -> None:
    """Clicks the tree row of the node called ``name`` (turning to its page)."""
    tree = explorer.tree_view
    index = next(i for i, node in enumerate(tree.nodes) if node.name == name)
    tree.table.show_row(index)
    tree.table.click(index)


def test_the_tree_shows_subtrees_with_counts_and_byte_subtotals(run: dict[str, Any]) -> None:
    explorer = CheckpointExplorer(run["root"])
    explorer.open_checkpoint("step_000010")
    leaves = explorer.leaves
    tree = explorer.tree_view
    nbytes = pd.to_numeric(leaves["nbytes"]).fillna(0)
    expected = nbytes.groupby(leaves["checkpointable"], sort=False).sum()
    assert [(n.name, n.nbytes) for n in tree.nodes] == list(expected.items())
    counts = leaves["checkpointable"].value_counts()
    assert all(n.leaves == counts[n.name] for n in tree.nodes)

    _pick_in_tree(explorer, "optimizer")  # opens it
    names = [n.name for n in tree.nodes]
    assert names[names.index("optimizer") + 1 : names.index("optimizer") + 4] == [
        "[0]",
        "[1]",
        "[2]",
    ]
    _pick_in_tree(explorer, "[0]")
    opened = tree.tree.find("optimizer", "[0]")
    assert [c.name for c in tree.tree.children(opened)] == ["['count']", "['mu']", "['nu']"]
    assert opened.nbytes == sum(c.nbytes for c in tree.tree.children(opened))
    tree.order.value = "size"  # largest first: the moments, then the count
    by_size = [c.name for c in tree.tree.children(opened, by="size")]
    assert by_size == ["['mu']", "['nu']", "['count']"]
    assert [n.name for n in tree.nodes][:2] == ["optimizer", "[0]"]  # optimizer is largest

    # Down to a leaf in a few clicks (NNX's trailing ['value'] is no level of its
    # own); clicking it picks it in the explorer.
    for name in ("['mu']", "['dense1']", "['kernel']"):
        _pick_in_tree(explorer, name)
    assert explorer.leaf == ("optimizer", "[0]['mu']" + KERNEL)
    assert explorer.statistics is not None and explorer.statistics.shape == (4, 16)

    # Closing a subtree closes what is under it.
    tree.toggle(tree.tree.find("optimizer"))
    assert "['mu']" not in [n.name for n in tree.nodes]
    tree.expand("optimizer", "[0]['mu']")
    assert not tree.is_open(tree.tree.find("optimizer", "[0]['mu']['dense1']"))
    assert tree.is_open(tree.tree.find("optimizer", "[0]"))
    with pytest.raises(ValueError, match="no subtree"):
        tree.expand("optimizer", "['nothing']")
    with pytest.raises(ValueError, match="is a leaf"):
        tree.toggle(tree.tree.find("optimizer", "[0]['count']"))
    tree.collapse_button.click()
    assert len(tree.nodes) == len(expected)


def test_the_size_bar_splits_the_checkpoint_by_its_parts(run: dict[str, Any]) -> None:
    explorer = CheckpointExplorer(run["root"])
    explorer.open_checkpoint("step_000005")
    leaves = explorer.leaves
    nbytes = pd.to_numeric(leaves["nbytes"]).fillna(0)
    by_part = nbytes.groupby(leaves["checkpointable"]).sum()
    bar = explorer.contents.size_bar.value
    for part in ("model", "optimizer"):
        share = by_part[part] / by_part.sum()
        assert f'data-part="{part}"' in bar and f"width:{share * 100:.2f}%" in bar
    # Optimizer state is twice the model (two moments), and drawn so.
    assert by_part["optimizer"] > 2 * by_part["model"]

    # One checkpointable holding nearly everything is split by its own subtrees.
    state = pd.DataFrame(
        {
            "checkpointable": ["state"] * 4 + ["rng"],
            "key": ["['params']['w']", "['params']['b']", "['opt_state'][0]", "['step']", ""],
            "nbytes": [600, 200, 1600, 8, 8],
        }
    )
    parts = size_breakdown(LeafTree(state))
    assert parts == [
        ("state ['opt_state']", 1600),
        ("state ['params']", 800),
        ("state ['step']", 8),
        ("rng", 8),
    ]
    assert 'data-part="state [&#x27;opt_state&#x27;]"' in size_bar_html(parts)
    assert size_bar_html([]) == ""


def test_the_tree_of_fifty_thousand_leaves_is_built_as_it_is_opened() -> None:
    blocks = 1_250
    keys = [
        f"['block_{b:04d}']['{part}']['{leaf}']"
        for b in range(blocks)
        for part in ("attention", "mlp")
        for leaf in (
            "kernel",
            "bias",
            "scale",
            "offset",
            "extra",
            "more",
            "last",
            "tail",
            "end",
            "z",
        )
    ]
    leaves = pd.DataFrame(
        {
            "checkpointable": ["model"] * len(keys) + ["optimizer"] * len(keys),
            "key": keys + [f"[0]['mu']{k}" for k in keys],
            "nbytes": list(range(len(keys))) * 2,
        }
    )
    assert len(leaves) == 50_000
    tree = LeafTree(leaves)
    assert all(p is None for p in tree._parts)  # nothing parsed to show the top level
    model = tree.find("model")
    children = tree.children(model, by="size")
    assert len(children) == blocks and children[0].name == "['block_1249']"
    assert sum(c.leaves for c in children) == 25_000
    assert all(p is None for p in tree._parts[25_000:])  # the optimizer's keys untouched
    leaf = tree.find("optimizer", "[0]['mu']['block_0001']['mlp']['kernel']")
    assert leaf.leaf is not None and leaves.loc[leaf.leaf, "nbytes"] == leaf.nbytes


@pytest.mark.parametrize(
    ("key", "parts"),
    [
        ("['a'][0]['b']", ("['a']", "[0]", "['b']")),
        ("[" + repr("a'b\"c") + "]", ("[" + repr("a'b\"c") + "]",)),
        ("""["it's"][12]""", ("""["it's"]""", "[12]")),
        ("['a]b']", ("['a]b']",)),
        ("", ()),
        ("odd", ("odd",)),
    ],
)
def test_key_parts(key: str, parts: tuple[str, ...]) -> None:
    assert key_parts(key) == parts


def test_small_arrays_show_their_values_and_the_histogram_has_a_log_scale(
    run: dict[str, Any],
) -> None:
    explorer = CheckpointExplorer(run["root"])
    explorer.open_checkpoint("step_000010")
    explorer.open_leaf("rng", "")
    key_data = np.asarray(jax.random.key_data(jax.random.key(7)))
    assert explorer.leaf_pane.values.value.count(", ") == 1
    for number in key_data:
        assert str(int(number)) in explorer.leaf_pane.values.value
    assert explorer.statistics is None and explorer.leaf_pane.histogram.layout.display == "none"
    assert "mean" not in explorer.leaf_pane.stats_html.value
    explorer.open_leaf("optimizer", "[0]['count']")
    assert ">3</pre>" in explorer.leaf_pane.values.value  # three updates so far

    explorer.open_leaf("model", "['dense2']['bias']['value']")  # 2 floats: values and statistics
    assert "tinax-leaf-values" in explorer.leaf_pane.values.value
    assert explorer.statistics is not None and explorer.leaf_pane.log_box.layout.display == ""
    explorer.open_leaf("model", KERNEL)  # 64 elements: still shown
    assert explorer.leaf_pane.values.value.count("11.") == 64
    linear = bytes(explorer.leaf_pane.histogram.value)
    explorer.leaf_pane.log_box.value = True
    logarithmic = bytes(explorer.leaf_pane.histogram.value)
    assert logarithmic.startswith(b"\x89PNG") and logarithmic != linear
    explorer.leaf_pane.log_box.value = False
    assert bytes(explorer.leaf_pane.histogram.value) == linear


def test_a_leaf_across_the_run(run: dict[str, Any]) -> None:
    explorer = CheckpointExplorer(run["root"])
    explorer.open_checkpoint("step_000010")
    explorer.open_leaf("model", KERNEL)
    explorer.leaf_pane.history_button.click()
    assert explorer.wait(120)
    history = explorer.history
    assert history["step"].tolist() == list(STEPS)
    for step, norm, mean, maximum in zip(
        history["step"], history["norm"], history["mean"], history["max"], strict=True
    ):
        kernel = run["kernels"][step]
        assert norm == pytest.approx(float(np.linalg.norm(kernel)))
        assert mean == pytest.approx(float(kernel.mean()))
        assert maximum == pytest.approx(float(kernel.max()))
    assert (history["error"] == "").all()
    # The values' distribution at each step, for the bands over steps: sorted percentiles.
    for quantiles in history["quantiles"]:
        assert len(quantiles) == 9 and list(quantiles) == sorted(quantiles)
    assert bytes(explorer.leaf_pane.history_image.value).startswith(b"\x89PNG")
    assert explorer.leaf_pane.history_box.children == (explorer.leaf_pane.history_image,)
    assert explorer.leaf_pane.history_status.value == "3 checkpoints read"

    # A leaf that is not everywhere: the others say why.
    extra = run["root"] / "step_000020"
    from orbax.checkpoint import v1 as ocp

    ocp.save_checkpointables(extra, {"model": {"other": np.zeros(2, np.float32)}})
    try:
        explorer.refresh()
        explorer.open_checkpoint("step_000010")
        explorer.open_leaf("model", KERNEL)
        explorer.show_history()
        assert explorer.wait(120)
        assert explorer.history["step"].tolist() == [*STEPS, 20]
        assert "no leaf" in explorer.history["error"].iloc[-1]
        assert "1 without this leaf or unreadable" in explorer.leaf_pane.history_status.value
        # Picking another leaf forgets the history.
        explorer.open_leaf("model", "['dense2']['bias']['value']")
        assert explorer.history.empty and explorer.leaf_pane.history_box.children == ()
    finally:
        import shutil

        shutil.rmtree(extra)
    with pytest.raises(ValueError, match="pick a leaf"):
        CheckpointExplorer(run["root"]).show_history()


def test_a_leaf_picked_in_the_table_is_shown_in_the_tree(run: dict[str, Any]) -> None:
    explorer = CheckpointExplorer(run["root"], page_size=4)
    explorer.open_checkpoint("step_000005")
    key = "[0]['nu']['dense2']['kernel']['value']"
    rows = explorer.leaves[explorer.leaves["key"] == key]
    explorer.leaf_view.show_row(rows.index[0])
    explorer.leaf_view.click(rows.index[0])
    tree = explorer.tree_view
    node = tree.tree.find("optimizer", key)
    index = [n.id for n in tree.nodes].index(node.id)
    assert index in tree.table.visible_labels()  # its page is the one shown
    assert tree.nodes[index].name == "['kernel']" and tree.nodes[index].leaf is not None
    for above in ("", "[0]", "[0]['nu']", "[0]['nu']['dense2']"):
        assert tree.is_open(tree.tree.find("optimizer", above))
    assert not tree.is_open(tree.tree.find("optimizer", "[0]['mu']"))
    assert explorer.leaf == ("optimizer", key)


def test_the_leaf_table_sorts_and_jumps(run: dict[str, Any]) -> None:
    explorer = CheckpointExplorer(run["root"], page_size=5)
    explorer.open_checkpoint("step_000000")
    view = explorer.leaf_view
    view.click_header("nbytes")  # sizes sort largest first
    assert view.sort_field == "nbytes" and not view.ascending
    largest = pd.to_numeric(explorer.leaves["nbytes"]).max()
    assert explorer.leaves.loc[view.visible_labels()[0], "nbytes"] == largest
    view.jump(view.page_count)
    assert view.page == view.page_count - 1
    # Filtering keeps the sort.
    explorer.contents.key_filter.value = "kernel"
    shown = [explorer.leaves.loc[label, "nbytes"] for label in view.visible_labels()]
    assert shown == sorted(shown, reverse=True) and view.page == 0


def test_opening_a_listed_checkpoint_parses_none_of_its_metadata_again(
    run: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run's deep listing opened and checked every checkpoint: the explorer opens
    # one from what it read (its leaves, lineage, verdict), while nothing changed.
    from tinax._format.metadata import pytree

    parsed: list[str] = []
    parse = pytree.parse_layout

    def counted(directory: Any, *args: Any, **kwargs: Any) -> Any:
        parsed.append(str(directory))
        return parse(directory, *args, **kwargs)

    explorer = CheckpointExplorer(run["root"])
    explorer.wait(60)
    monkeypatch.setattr(pytree, "parse_layout", counted)
    explorer.open_checkpoint("step_000005")
    explorer.wait(60)
    assert explorer.checkpoint is not None and len(explorer.leaves) > 0
    assert (
        "sound" in explorer.contents.verdict.value or "healthy" in explorer.contents.verdict.value
    )
    assert parsed == []
    # Changed on disk since it was listed: read afresh.
    metadata = run["root"] / "step_000010" / "model" / "_METADATA"
    stat = metadata.stat()
    os.utime(metadata, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    explorer.open_checkpoint("step_000010")
    explorer.wait(60)
    assert str(run["root"] / "step_000010" / "model") in parsed
    explorer.close()
