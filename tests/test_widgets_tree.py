"""TreeView: a checkpoint's leaves as one scrolling tree, in natural order, named as
people read them, narrowed by a key filter."""

from __future__ import annotations

import pandas as pd
import pytest
from tinax.widgets._tree import LeafTree, TreeView, part_label

BLOCKS = 24
LAYERS = ("attn_norm", "q", "k", "v", "o", "mlp_norm", "up", "down")


def _nnx_adamw_leaves() -> pd.DataFrame:
    """The leaves of a 24-block NNX model and its adamw state, as checkpoint_table lists them."""
    rows = []
    for name, prefix in (
        ("model", ""),
        ("optimizer", "['opt_state']['0']['mu']"),
        ("optimizer", "['opt_state']['0']['nu']"),
    ):
        for block in range(BLOCKS):
            for layer in LAYERS:
                for param in ("bias", "kernel"):
                    rows.append(
                        (name, f"{prefix}['blocks']['{block}']['{layer}']['{param}']['value']")
                    )
    rows.append(("optimizer", "['opt_state']['0']['count']['value']"))
    rows.append(("optimizer", "['step']['value']"))
    frame = pd.DataFrame(rows, columns=["checkpointable", "key"])
    frame["nbytes"] = 64
    # The order Orbax's metadata may list them in: as text, block 10 before block 2.
    return frame.sort_values(["checkpointable", "key"]).reset_index(drop=True)


def _fail(error: BaseException) -> None:
    raise error


def _labels(view: TreeView) -> list[str]:
    return view.table.visible_text("label")


def test_blocks_open_in_number_order_with_readable_names_and_exact_keys() -> None:
    view = TreeView(page_size=20, on_error=_fail)
    view.show(_nnx_adamw_leaves())
    assert _labels(view) == ["model", "optimizer"]
    view.expand("model", "['blocks']")
    labels = _labels(view)
    assert labels[:3] == ["model", "blocks", "0"]
    assert labels[2 : 2 + BLOCKS] == [str(i) for i in range(BLOCKS)]
    exact = view.table.exact_keys()
    assert exact[1] == "['blocks']" and exact[3] == "['blocks']['1']"
    # The tree is one list that scrolls: the optimizer stays in it, not on a page 2.
    assert labels[-1] == "optimizer" and view.table.pages == 1
    assert view.table.scroll_rows == 20


def test_an_nnx_variable_is_a_leaf_under_its_own_name() -> None:
    view = TreeView(page_size=20, on_error=_fail)
    leaves = _nnx_adamw_leaves()
    view.show(leaves)
    node = view.expand("model", "['blocks']['10']['q']")
    labels = _labels(view)
    assert labels[labels.index("q") + 1 : labels.index("q") + 3] == ["bias", "kernel"]
    kernel = view.tree.find("model", "['blocks']['10']['q']['kernel']['value']")
    assert kernel.leaf is not None and kernel.label == "kernel"
    assert leaves.loc[kernel.leaf, "key"] == "['blocks']['10']['q']['kernel']['value']"
    slot = view.nodes.index(kernel)
    assert view.table.exact_keys()[slot] == "['blocks']['10']['q']['kernel']['value']"
    # Clicking it picks the leaf.
    view.table._handle_custom_msg({"kind": "pick", "slot": slot}, [])
    assert view.picked == kernel.leaf
    assert node.label == "q"


def test_a_key_filter_narrows_the_tree_and_opens_down_to_a_few_leaves() -> None:
    view = TreeView(page_size=20, on_error=_fail)
    leaves = _nnx_adamw_leaves()
    view.show(leaves)
    found = leaves[leaves["key"].str.contains("['blocks']['7']['q']", regex=False)]
    view.narrow(found.index)
    labels = _labels(view)
    assert labels == [
        "model", "blocks", "7", "q", "bias", "kernel",
        "optimizer", "opt_state", "0",
        "mu", "blocks", "7", "q", "bias", "kernel",
        "nu", "blocks", "7", "q", "bias", "kernel",
    ]  # fmt: skip
    view.narrow(None)
    assert view.tree.roots[0].leaves == BLOCKS * len(LAYERS) * 2


def test_part_labels_and_natural_children() -> None:
    assert part_label("['blocks']") == "blocks"
    assert part_label("[3]") == "3"
    assert part_label("['7']") == "7"
    tree = LeafTree(_nnx_adamw_leaves())
    blocks = tree.find("model", "['blocks']")
    assert [c.label for c in tree.children(blocks)][:12] == [str(i) for i in range(12)]
    with pytest.raises(ValueError, match="no subtree 'model' \\['nothing'\\]"):
        tree.find("model", "['nothing']")
