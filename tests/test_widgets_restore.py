"""RestoreTargetBuilder: targets from live state, comparison with a checkpoint, Load."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import traitlets
from tinax.widgets import CheckpointExplorer, RestoreTargetBuilder

from tinax.checkpointing import NumpyTarget, save_checkpointables


def _state(scale: float = 1.0) -> dict[str, Any]:
    return {
        "model": {
            "dense": {"w": jnp.arange(6.0).reshape(2, 3) * scale, "b": jnp.zeros(3)},
            "head": np.full(2, scale, np.float32),
        },
        "optimizer": {"mu": np.ones(4, np.float32) * scale, "count": 3},
    }


def _statuses(builder: RestoreTargetBuilder) -> dict[str, str]:
    """Comparison status by checkpointable name + key."""
    comparison = builder.comparison
    assert comparison is not None
    keys = comparison["checkpointable"] + comparison["key"]
    return dict(zip(keys, comparison["status"], strict=True))


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "step-1"
    save_checkpointables(path, _state(2.0)).result()
    return path


@pytest.fixture
def any_checkpoint(root: str) -> str:
    """The same checkpoint on local disk, then on gs://."""
    path = f"{root}/step-1"
    save_checkpointables(path, _state(2.0)).result()
    return path


def test_targets_and_table_from_live_state() -> None:
    builder = RestoreTargetBuilder(_state())
    target = builder.target
    assert set(target) == {"model", "optimizer"}
    assert isinstance(target["model"]["dense"]["w"], jax.ShapeDtypeStruct)
    assert target["model"]["dense"]["w"].shape == (2, 3)
    assert isinstance(target["model"]["head"], NumpyTarget)
    assert target["optimizer"]["count"] == 3
    assert set(builder.subtree_checkboxes) == {
        ("model", "['dense']"),
        ("model", "['head']"),
        ("optimizer", "['count']"),
        ("optimizer", "['mu']"),
    }
    assert len(builder.table) == 5
    # The tree of ticks names subtrees dotted, the exact key on hover and copy.
    view = builder.choice.view
    assert view.visible_text("label") == ["model", "dense", "head", "optimizer", "count", "mu"]
    assert view.exact_keys() == [
        "model",
        "['dense']",
        "['head']",
        "optimizer",
        "['count']",
        "['mu']",
    ]
    assert builder.reason == "no checkpoint to load from"
    assert builder.compare_section.layout.display == "none"

    builder.checkboxes["optimizer"].value = False
    assert set(builder.target) == {"model"}
    assert set(builder.table["checkpointable"]) == {"model"}
    # Unticked, visibly: the subtrees' own boxes, not only greyed out.
    optimizer_subtrees = [b for (n, _), b in builder.subtree_checkboxes.items() if n == "optimizer"]
    assert [b.value for b in optimizer_subtrees] == [False, False]
    assert not any(b.disabled for b in optimizer_subtrees)

    builder.subtree_checkboxes[("model", "['dense']")].value = False
    target = builder.target
    # Left out, but still in the structure: Orbax reads nothing for a placeholder.
    assert target["model"]["dense"] == {"w": ..., "b": ...}
    assert isinstance(target["model"]["head"], NumpyTarget)
    assert builder.table["key"].tolist() == ["['head']"]


def test_load_restores_the_chosen_targets_with_progress(any_checkpoint: str) -> None:
    builder = RestoreTargetBuilder(_state(), any_checkpoint)
    assert builder.reason == "" and not builder.load_button.disabled
    assert builder.comparison is not None
    assert set(builder.comparison["status"]) == {"ok"}
    seen: list[dict[str, Any]] = []
    builder.on_loaded(seen.append)
    builder.load_button.click()
    assert builder.progress is not None
    assert builder.progress.wait(60) == "done", builder.progress.error
    assert builder.status == "loaded"
    result = builder.result
    assert result is not None and seen == [result]
    np.testing.assert_array_equal(result["model"]["dense"]["w"], np.arange(6.0).reshape(2, 3) * 2)
    assert isinstance(result["model"]["dense"]["w"], jax.Array)
    assert isinstance(result["model"]["head"], np.ndarray)
    assert result["optimizer"]["count"] == 3
    assert builder.progress.total_bytes == int(builder.table["nbytes"].sum())
    # Once over, nothing says it is still loading.
    assert builder.progress.label.value == "loaded step-1"
    assert builder.progress.info.value.startswith("done")
    assert not builder.load_button.disabled


def test_left_out_subtrees_are_not_restored(checkpoint: Path) -> None:
    state = _state()
    builder = RestoreTargetBuilder(state, checkpoint, load_in_thread=False)
    builder.checkboxes["optimizer"].value = False
    builder.subtree_checkboxes[("model", "['dense']")].value = False
    assert builder.comparison is not None
    statuses = _statuses(builder)
    assert statuses["model['dense']['w']"] == "left out"
    assert statuses["model['head']"] == "ok"
    assert statuses["optimizer['mu']"] == "left out"  # the whole checkpointable is unticked
    assert builder.reason == ""
    view = builder.compare_box.children[0]
    for row, status in zip(view.rows, view.visible_text("status"), strict=True):
        if status == "left out":
            assert row["background"] is None  # grey text, not a warning
    builder.load_button.click()
    # Loaded in the click itself: the result is there when click() returns.
    assert builder.status == "loaded"
    assert builder.result is not None
    assert set(builder.result) == {"model"}  # an unticked checkpointable is absent
    # A left-out subtree holds the live values passed in, the very same objects.
    live = state["model"]["dense"]
    assert builder.result["model"]["dense"]["w"] is live["w"]
    assert builder.result["model"]["dense"]["b"] is live["b"]
    assert not any(leaf is ... for leaf in jax.tree_util.tree_leaves(builder.result))
    np.testing.assert_array_equal(builder.result["model"]["head"], [2.0, 2.0])
    assert builder.summary == (
        "loaded 1 leaf (8 B) in "
        + builder.summary.split(" in ")[1].split(";")[0]
        + "; 2 left-out leaves kept as passed in; not loaded: optimizer"
    )
    assert re.search(r" in \d+\.\d+ s;", builder.summary)
    assert builder.summary in builder.summary_html.value
    assert builder.progress is not None and builder.progress.wait(10) == "done"


def test_incompatible_targets_disable_load_with_the_reason(checkpoint: Path) -> None:
    state = _state()
    state["model"]["dense"]["w"] = jnp.zeros((3, 3))
    state["extra"] = {"x": np.zeros(1)}
    builder = RestoreTargetBuilder(state, checkpoint)
    assert builder.load_button.disabled
    # Keys read dotted, as everywhere else, in the reason too.
    assert "model dense.w: shape differs" in builder.reason
    assert "missing from checkpoint" in builder.reason
    assert "Cannot load" in builder.reason_html.value
    view = builder.compare_box.children[0]
    # Differences are sorted to the top, highlighted.
    assert view.visible_text("status")[0] in {"shape differs", "missing from checkpoint"}
    assert view.rows[0]["background"] == "#fde7e9"
    builder.load_button.click()  # refused, nothing happens
    assert builder.progress is None

    builder.checkboxes["extra"].value = False
    builder.subtree_checkboxes[("model", "['dense']")].value = False
    assert builder.reason == "" and not builder.load_button.disabled


def test_a_dtype_difference_is_a_warning_not_a_block(checkpoint: Path) -> None:
    state = _state()
    state["optimizer"]["mu"] = np.ones(4, np.float64)
    builder = RestoreTargetBuilder(state, checkpoint)
    assert builder.reason == "" and not builder.load_button.disabled
    assert "cast to the target dtype" in builder.reason_html.value
    builder.load_button.click()
    assert builder.progress is not None and builder.progress.wait(60) == "done"
    assert builder.result is not None
    assert builder.result["optimizer"]["mu"].dtype == np.float64


def _truncate_largest_data_file(checkpoint: Path) -> None:
    # The array bytes live in the largest OCDBT data file; the metadata stays readable.
    files = [p for p in checkpoint.rglob("*") if p.is_file() and p.parent.name == "d"]
    largest = max(files, key=lambda p: p.stat().st_size)
    with open(largest, "r+b") as f:
        f.truncate(largest.stat().st_size // 2)


def test_a_failing_load_is_shown_not_raised(tmp_path: Path) -> None:
    state = {"model": {"big": np.random.default_rng(0).standard_normal(1 << 18)}}
    save_checkpointables(tmp_path / "step-1", state).result()
    builder = RestoreTargetBuilder(state, tmp_path / "step-1")
    assert builder.reason == ""
    _truncate_largest_data_file(tmp_path / "step-1")
    builder.load_button.click()
    assert builder.progress is not None, builder.message.value
    assert builder.progress.wait(60) == "failed"
    assert builder.status == "failed"
    assert builder.error
    assert builder.result is None
    assert "Failed" in builder.progress.error_box.value
    assert builder.progress.label.value == "step-1: failed"
    assert builder.progress.info.value.startswith("failed in ")
    assert not builder.load_button.disabled, "the person can try again"


def test_a_failing_load_in_the_click_is_reported_at_once(tmp_path: Path) -> None:
    state = {"model": {"big": np.random.default_rng(0).standard_normal(1 << 18)}}
    save_checkpointables(tmp_path / "step-1", state).result()
    builder = RestoreTargetBuilder(state, tmp_path / "step-1", load_in_thread=False)
    _truncate_largest_data_file(tmp_path / "step-1")
    builder.load_button.click()
    assert builder.status == "failed" and builder.error
    assert builder.progress is not None and builder.progress.wait(10) == "failed"


def test_a_failing_callback_is_shown_not_raised(checkpoint: Path) -> None:
    builder = RestoreTargetBuilder(_state(), checkpoint, load_in_thread=False)

    def broken(_result: dict[str, Any]) -> None:
        raise RuntimeError("callback broke")

    builder.on_loaded(broken)
    builder.load_button.click()
    assert builder.status == "loaded"
    assert builder.error == "RuntimeError: callback broke"
    assert "callback broke" in builder.message.value


def test_path_follows_the_explorer(checkpoint: Path) -> None:
    save_checkpointables(checkpoint.parent / "step-2", {"model": {"head": np.zeros(5)}}).result()
    explorer = CheckpointExplorer(checkpoint.parent)
    builder = RestoreTargetBuilder(_state())
    traitlets.dlink((explorer, "checkpoint"), (builder, "path"))
    explorer.open_checkpoint("step-1")
    assert builder.path == str(checkpoint)
    assert builder.reason == ""
    explorer.open_checkpoint("step-2")
    assert builder.load_button.disabled
    assert "shape differs" in builder.reason or "missing from checkpoint" in builder.reason


def test_constructor_checks_its_arguments(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        RestoreTargetBuilder([("model", {})])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RestoreTargetBuilder({})
    with pytest.raises(ValueError):
        RestoreTargetBuilder({"a/b": {"x": np.zeros(1)}})
    with pytest.raises(FileNotFoundError):
        RestoreTargetBuilder(_state(), tmp_path / "missing")
    with pytest.raises(TypeError):
        RestoreTargetBuilder(_state(), load_in_thread=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        RestoreTargetBuilder(_state()).on_loaded(3)  # type: ignore[arg-type]


def test_relative_paths_work(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(checkpoint.parent)
    builder = RestoreTargetBuilder(_state(), "step-1", load_in_thread=False)
    assert builder.path == str(checkpoint)
    builder.subtree_checkboxes[("model", "['dense']")].value = False
    builder.load_button.click()
    assert builder.status == "loaded", builder.error
    builder.path = "step-1"
    assert builder.path == str(checkpoint)
    with pytest.raises(FileNotFoundError):
        builder.path = "step-9"


def test_a_grain_iterator_is_restored_in_place(tmp_path: Path) -> None:
    iterator = iter(grain.MapDataset.range(10).to_iter_dataset())
    next(iterator), next(iterator)
    save_checkpointables(
        tmp_path / "step-2", {"model": {"w": np.ones(3)}, "iterator": iterator}
    ).result()
    fresh = iter(grain.MapDataset.range(10).to_iter_dataset())
    builder = RestoreTargetBuilder(
        {"model": {"w": np.zeros(3)}, "iterator": fresh}, tmp_path / "step-2", load_in_thread=False
    )
    assert builder.reason == ""
    assert ("iterator", "") in set(
        zip(builder.table["checkpointable"], builder.table["key"], strict=True)
    )
    builder.load_button.click()
    assert builder.status == "loaded", builder.error
    assert next(fresh) == 2
    np.testing.assert_array_equal(builder.result["model"]["w"], np.ones(3))  # type: ignore[index]


def test_unticking_an_optax_namedtuple_field_leaves_out_exactly_its_leaves(
    tmp_path: Path,
) -> None:
    import optax

    params = {"dense": {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}}
    state = {"model": params, "optimizer": optax.scale_by_adam().init(params)}
    save_checkpointables(tmp_path / "step-1", state).result()
    builder = RestoreTargetBuilder(state, tmp_path / "step-1", load_in_thread=False)
    assert {key for name, key in builder.subtree_checkboxes if name == "optimizer"} == {
        "['count']",
        "['mu']",
        "['nu']",
    }
    builder.subtree_checkboxes[("optimizer", "['mu']")].value = False

    target = builder.target["optimizer"]
    assert target.mu == {"dense": {"w": ..., "b": ...}}
    assert isinstance(target.nu["dense"]["w"], jax.ShapeDtypeStruct)
    optimizer_keys = set(builder.table[builder.table["checkpointable"] == "optimizer"]["key"])
    assert optimizer_keys == {"['count']", "['nu']['dense']['b']", "['nu']['dense']['w']"}
    assert builder.comparison is not None
    statuses = _statuses(builder)
    assert statuses["optimizer['mu']['dense']['w']"] == "left out"
    assert statuses["optimizer['nu']['dense']['w']"] == "ok"
    assert builder.reason == "" and not builder.load_button.disabled

    builder.load_button.click()
    assert builder.status == "loaded", builder.error
    restored = builder.result["optimizer"]  # type: ignore[index]
    assert type(restored) is type(state["optimizer"])
    np.testing.assert_array_equal(restored.nu["dense"]["w"], np.zeros((2, 3)))


def test_a_subtree_is_matched_by_key_path_not_by_text(tmp_path: Path) -> None:
    # ['m'] is a text prefix of ['mu'], but not a key-path prefix of it.
    state = {"optimizer": {"m": np.zeros(2), "mu": np.ones(2)}}
    builder = RestoreTargetBuilder(state)
    builder.subtree_checkboxes[("optimizer", "['m']")].value = False
    assert list(builder.table["key"]) == ["['mu']"]
    assert builder.target["optimizer"]["m"] is ...


def test_a_lossy_cast_blocks_load_until_allowed(tmp_path: Path) -> None:
    save_checkpointables(tmp_path / "c", {"model": {"n": np.array([16777217], np.int32)}}).result()
    state = {"model": {"n": np.zeros(1, np.float32)}}
    builder = RestoreTargetBuilder(state, tmp_path / "c", load_in_thread=False)
    assert builder.load_button.disabled
    assert "lossy cast" in builder.reason and "model n:" in builder.reason
    builder.lossy_box.value = True
    assert builder.reason == "" and not builder.load_button.disabled
    assert "cast to the target dtype" in builder.reason_html.value
    builder.load_button.click()
    assert builder.status == "loaded", builder.error
    assert builder.result["model"]["n"][0] == np.float32(16777216.0)  # type: ignore[index]


def _nnx_training_state() -> dict[str, Any]:
    import optax
    from flax import nnx

    model = nnx.Sequential(
        nnx.Linear(4, 8, rngs=nnx.Rngs(0)), nnx.relu, nnx.Linear(8, 2, rngs=nnx.Rngs(1))
    )
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    return {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}


def test_a_checkpointables_box_and_its_subtrees_boxes_agree() -> None:
    builder = RestoreTargetBuilder(_nnx_training_state())
    parent = builder.checkboxes["optimizer"]
    subtrees = {k: b for (n, k), b in builder.subtree_checkboxes.items() if n == "optimizer"}
    assert len(subtrees) >= 2 and all(b.value for b in subtrees.values())
    first, *others = subtrees
    rebuilds: list[int] = []
    original = builder._rebuild
    builder._rebuild = lambda: (rebuilds.append(1), original())[1]  # type: ignore[method-assign]

    subtrees[first].value = False
    parent.value = False  # unticks every subtree, visibly
    assert [b.value for b in subtrees.values()] == [False] * len(subtrees)
    assert not any(b.disabled for b in subtrees.values())
    assert "optimizer" not in builder.target
    parent.value = True  # gives back the subtrees as they were
    assert not subtrees[first].value and all(subtrees[k].value for k in others)
    optimizer_keys = builder.table[builder.table["checkpointable"] == "optimizer"]["key"]
    assert len(optimizer_keys) and not optimizer_keys.str.startswith(first).any()

    parent.value = False
    subtrees[others[0]].value = True  # ticking a subtree ticks its checkpointable
    assert parent.value
    assert [k for k, b in subtrees.items() if b.value] == [others[0]]
    subtrees[others[0]].value = False  # unticking the last one unticks it
    assert not parent.value and "optimizer" not in builder.target
    # One comparison per click, however many boxes the click changed.
    assert len(rebuilds) == 6


def test_the_comparison_lists_only_differences_unless_asked(checkpoint: Path) -> None:
    state = _state()
    state["model"]["head"] = np.zeros(2, np.float64)  # stored as float32: a cast
    builder = RestoreTargetBuilder(state, checkpoint)
    view = builder.comparison_view
    table = builder.compare_box.children[0]
    assert not view.show_all.value
    assert list(table.frame["key"]) == ["['head']"]
    assert "4 ok" in view.title.value  # the counts still cover every leaf
    # Shapes and dtypes, on both sides, come right after the status.
    titles = [c.title for c in table.columns]
    assert titles[:7] == [
        "key",
        "status",
        "checkpointable",
        "stored shape",
        "target shape",
        "stored dtype",
        "target dtype",
    ]
    view.show_all.value = True
    assert len(table.frame) == len(builder.comparison) == 5
    assert table.frame["key"].iloc[0] == "['head']"  # differences still first
    view.show_all.value = False
    builder.subtree_checkboxes[("model", "['head']")].value = False
    table = builder.compare_box.children[0]
    assert table.frame.empty
    assert table.position == "no differences: every chosen leaf matches the checkpoint"


def test_a_partial_load_of_an_nnx_and_optax_state_has_no_placeholders(tmp_path: Path) -> None:
    state = _nnx_training_state()
    save_checkpointables(tmp_path / "step_000100", state).result()
    builder = RestoreTargetBuilder(state, tmp_path / "step_000100")
    adam = [k for (n, k) in builder.subtree_checkboxes if n == "optimizer" and "opt_state" in k]
    assert adam, builder.subtree_checkboxes
    builder.subtree_checkboxes[("optimizer", adam[0])].value = False
    builder.load_button.click()
    assert builder.progress is not None and builder.progress.wait(60) == "done"
    assert builder.status == "loaded", builder.error
    result = builder.result
    assert result is not None and set(result) == {"model", "optimizer"}
    leaves = jax.tree_util.tree_leaves(result)
    assert leaves and not any(leaf is ... for leaf in leaves)
    assert jax.tree_util.tree_structure(result["optimizer"]) == jax.tree_util.tree_structure(
        state["optimizer"]
    )
    live_opt = jax.tree_util.tree_leaves(state["optimizer"]["opt_state"])
    got_opt = jax.tree_util.tree_leaves(result["optimizer"]["opt_state"])
    assert all(a is b for a, b in zip(got_opt, live_opt, strict=True))
    # What was loaded was read from the checkpoint: new arrays with the saved values.
    for got, saved in zip(
        jax.tree_util.tree_leaves(result["model"]),
        jax.tree_util.tree_leaves(state["model"]),
        strict=True,
    ):
        assert got is not saved
        np.testing.assert_array_equal(got, saved)
    loaded = int(builder.table["nbytes"].sum())
    assert builder.summary.startswith(f"loaded {len(builder.table)} leaves (")
    assert f"{len(live_opt)} left-out leaves kept as passed in" in builder.summary
    assert loaded > 0


def test_a_subtree_can_be_left_out_at_any_depth(tmp_path: Path) -> None:
    # The model's parameters without BatchNorm's running statistics.
    from flax import nnx

    model = nnx.Sequential(nnx.Linear(4, 8, rngs=nnx.Rngs(0)), nnx.BatchNorm(8, rngs=nnx.Rngs(1)))
    state = {"model": nnx.state(model)}
    save_checkpointables(tmp_path / "step-1", state).result()
    builder = RestoreTargetBuilder(state, tmp_path / "step-1", load_in_thread=False)
    everything = builder.table["key"].tolist()
    statistics = [k for k in everything if "['mean']" in k or "['var']" in k]
    assert len(statistics) == 2, everything
    for key in statistics:
        builder.tick("model", key.removesuffix("['value']"), False)
    assert builder.ticked("model") is None  # restored in part
    assert builder.ticked("model", "['layers']['1']") is None  # the BatchNorm layer
    kept = builder.table["key"].tolist()
    assert kept == [k for k in everything if k not in statistics]
    builder.load_button.click()
    assert builder.status == "loaded"
    # The statistics left out hold the live values, the very same objects.
    leaves = dict(jax.tree_util.tree_leaves_with_path(builder.result["model"]))
    live = dict(jax.tree_util.tree_leaves_with_path(state["model"]))
    for path, leaf in leaves.items():
        if "mean" in jax.tree_util.keystr(path) or "var" in jax.tree_util.keystr(path):
            assert leaf is live[path]
    builder.tick("model", "", True)  # the whole model again
    assert builder.ticked("model") is True


def _nnx_model_and_optimizer() -> tuple[Any, Any]:
    """A model with every kind of NNX variable: parameters, BatchNorm statistics, and a
    dropout RNG stream; its AdamW optimizer."""
    import optax
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.dense = nnx.Linear(4, 8, rngs=rngs)
            self.norm = nnx.BatchNorm(8, rngs=rngs)
            self.layer_norm = nnx.LayerNorm(8, rngs=rngs)
            self.dropout = nnx.Dropout(0.1, rngs=rngs)
            self.head = nnx.Linear(8, 1, rngs=rngs)

    model = Net(nnx.Rngs(params=0, dropout=1))
    return model, nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)


def _training_state(model: Any, optimizer: Any) -> dict[str, Any]:
    from flax import nnx

    return {
        "model": nnx.state(model),
        "optimizer": nnx.state(optimizer),
        "rng": jax.random.key(0),
        "auxiliary": {"loss": 0.5},
    }


def _model_keys(builder: RestoreTargetBuilder) -> list[str]:
    table = builder.table
    return table.loc[table["checkpointable"] == "model", "key"].tolist()


def test_presets_tick_the_common_partial_restores() -> None:
    builder = RestoreTargetBuilder(_training_state(*_nnx_model_and_optimizer()))
    everything = _model_keys(builder)
    statistics = ["['norm']['mean']['value']", "['norm']['var']['value']"]
    rng_stream = [k for k in everything if k.startswith("['dropout']")]
    assert set(statistics) <= set(everything) and len(rng_stream) == 2

    builder.apply_preset("model only")
    assert builder.preset == "model only"
    assert set(builder.target) == {"model"} and _model_keys(builder) == everything
    assert builder.preset_buttons["model only"].button_style == "info"

    builder.apply_preset("without normalisation statistics")
    assert set(builder.target) == {"model"}
    assert _model_keys(builder) == [k for k in everything if k not in statistics]
    # LayerNorm's scale and bias are parameters: kept.
    assert "['layer_norm']['scale']['value']" in _model_keys(builder)
    assert builder.ticked("model", "['norm']") is None  # scale and bias still restored

    builder.apply_preset("params only")
    assert _model_keys(builder) == [
        k for k in everything if k not in statistics and k not in rng_stream
    ]

    builder.apply_preset("everything")
    assert set(builder.target) == {"model", "optimizer", "rng", "auxiliary"}
    assert _model_keys(builder) == everything
    # A tick by hand leaves the preset.
    builder.tick("optimizer", "", False)
    assert builder.preset == ""
    assert all(b.button_style == "" for b in builder.preset_buttons.values())

    with pytest.raises(ValueError, match="unknown preset 'weights'"):
        builder.apply_preset("weights")


def test_presets_that_do_not_apply_are_disabled_and_refused() -> None:
    builder = RestoreTargetBuilder({"params": {"w": np.zeros(3)}, "opt": {"mu": np.zeros(3)}})
    for label in ("model only", "params only", "without normalisation statistics"):
        assert builder.preset_buttons[label].disabled
    assert not builder.preset_buttons["everything"].disabled
    with pytest.raises(ValueError, match="no checkpointable is named|there is none"):
        builder.apply_preset("model only")
    # A single checkpointable is the model; a plain dict has no statistics.
    single = RestoreTargetBuilder({"params": {"w": np.zeros(3)}})
    assert not single.preset_buttons["model only"].disabled
    assert single.preset_buttons["without normalisation statistics"].disabled


def test_linen_variables_are_classed_by_their_collections() -> None:
    import flax.linen as nn

    net = nn.Sequential([nn.Dense(4), nn.BatchNorm(use_running_average=True)])
    variables = net.init(jax.random.key(0), jnp.zeros((1, 3)))
    builder = RestoreTargetBuilder({"model": variables})
    builder.apply_preset("without normalisation statistics")
    assert _model_keys(builder) and all(k.startswith("['params']") for k in _model_keys(builder))
    builder.apply_preset("model only")
    assert any(k.startswith("['batch_stats']") for k in _model_keys(builder))
    # Linen's variables are values, not NNX state: the hint says to take them.
    from tinax.widgets._presets import apply_hint

    assert apply_hint({"model": variables}, ["model"]) == 'model = builder.result["model"]'


def test_a_preset_load_says_where_the_values_are_and_apply_updates_the_model(
    tmp_path: Path,
) -> None:
    from flax import nnx

    saved_model, saved_optimizer = _nnx_model_and_optimizer()
    # Give the statistics values a fresh model does not have.
    saved_model.norm.mean[...] = jnp.full(8, 3.0)
    saved_model.dense.kernel[...] = jnp.full((4, 8), 2.0)
    save_checkpointables(
        tmp_path / "step_000100", _training_state(saved_model, saved_optimizer)
    ).result()

    model, optimizer = _nnx_model_and_optimizer()
    live_mean = np.asarray(model.norm.mean[...]).copy()
    builder = RestoreTargetBuilder(
        _training_state(model, optimizer), tmp_path / "step_000100", load_in_thread=False
    )
    builder.preset_buttons["without normalisation statistics"].click()
    assert builder.preset == "without normalisation statistics" and builder.reason == ""
    assert builder.apply_button.layout.display == "none"
    builder.load_button.click()
    assert builder.status == "loaded", builder.error
    assert set(builder.result or {}) == {"model"}
    assert "not loaded: optimizer, rng, auxiliary" in builder.summary
    assert "builder.result" in builder.summary_html.value
    assert "nnx.update(model, builder.result[&quot;model&quot;])" in builder.summary_html.value
    assert builder.apply_button.layout.display == ""
    # Nothing in the notebook's model has changed yet.
    assert not np.array_equal(np.asarray(model.dense.kernel[...]), np.full((4, 8), 2.0))

    builder.apply_button.click()
    assert builder.applied == ["model"], builder.error
    assert "applied model" in builder.summary_html.value
    np.testing.assert_array_equal(np.asarray(model.dense.kernel[...]), np.full((4, 8), 2.0))
    # The statistics were left out: the live model keeps its own.
    np.testing.assert_array_equal(np.asarray(model.norm.mean[...]), live_mean)
    assert isinstance(builder.result["model"], nnx.State)


def test_apply_before_a_load_is_shown_not_raised(tmp_path: Path) -> None:
    model, optimizer = _nnx_model_and_optimizer()
    builder = RestoreTargetBuilder(_training_state(model, optimizer))
    with pytest.raises(RuntimeError, match="nothing loaded yet"):
        builder.apply()
    builder.apply_button.click()  # hidden until a load; a direct click is shown
    assert "nothing loaded yet" in builder.error


def test_the_leaves_restored_fold_under_a_heading_that_counts_them() -> None:
    builder = RestoreTargetBuilder(_state())
    assert not builder.leaves_section.is_open  # the tree above says the same
    assert "5 leaves to restore" in builder.leaves_section.heading.value
    builder.checkboxes["optimizer"].value = False
    assert "3 leaves to restore" in builder.leaves_section.heading.value
    builder.leaves_section.toggle.click()
    assert builder.leaves_section.is_open


def test_a_preset_on_a_many_block_model_parses_each_key_a_bounded_number_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leaving out many variables (a BatchNorm per block) stays linear in the leaves: each
    comparison parses a key once, not once per left-out subtree (12 s on 24 blocks)."""
    from flax import nnx
    from tinax.widgets import _choice

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.dense = nnx.Linear(4, 4, rngs=rngs)
            self.norm = nnx.BatchNorm(4, rngs=rngs)

    class Net(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.blocks = nnx.List([Block(rngs) for _ in range(8)])

    state = {"model": nnx.state(Net(nnx.Rngs(0)))}
    save_checkpointables(tmp_path / "step_000001", state).result()
    builder = RestoreTargetBuilder(state, tmp_path / "step_000001")
    leaves = len(builder.table)
    calls = 0
    parse_key = _choice.parse_key

    def counted(key: str) -> Any:
        nonlocal calls
        calls += 1
        return parse_key(key)

    monkeypatch.setattr(_choice, "parse_key", counted)
    builder.apply_preset("without normalisation statistics")
    assert len(builder.choice.left_out("model")) == 16
    assert builder.reason == "" and len(builder.table) == leaves - 16
    # Once per key for the comparison, once per left-out subtree for the choice itself
    # (once per key and subtree would be 16 times as many).
    assert calls <= 2 * leaves + 16, calls


def _until_loaded(builder: RestoreTargetBuilder) -> None:
    assert builder.progress is not None
    assert builder.progress.wait(60) == "done", builder.progress.error
    deadline = time.monotonic() + 60
    while builder.status != "loaded":
        assert time.monotonic() < deadline, builder.error
        time.sleep(0.02)


def test_a_diverged_checkpoint_is_loaded_only_when_asked_twice(tmp_path: Path) -> None:
    from tinax.checkpointing import save_training_checkpoint

    iterator = iter(grain.MapDataset.range(8).to_iter_dataset())
    next(iterator)
    state = _state(2.0)
    model, optimizer = state["model"], state["optimizer"]
    path = tmp_path / "step_000060"
    # Its logged loss is NaN: the library calls it diverged before any data is read.
    aux = {"loss": jnp.asarray(jnp.nan), "lr": 0.5}
    save_training_checkpoint(path, 60, model, optimizer, jnp.zeros(2), aux, iterator).result()
    live = {"model": model, "optimizer": optimizer}
    builder = RestoreTargetBuilder(live, path)
    guard = builder.load_guard
    assert 'data-health="diverged"' in guard.verdict.value
    assert "its logged loss is NaN" in guard.verdict.value and "✔" not in guard.verdict.value
    assert not builder.load_button.disabled
    # Load asks first; Cancel loads nothing.
    builder.load_button.click()
    assert guard.asked and builder.progress is None and builder.status == ""
    assert "step_000060</b> diverged (its logged loss is NaN)" in guard.asking.value
    guard.cancel.click()
    assert not guard.asked and builder.progress is None
    # Load, then "Load anyway": loaded, and the summary says what it holds.
    builder.load_button.click()
    guard.load_anyway.click()
    _until_loaded(builder)
    assert not guard.asked and builder.result is not None
    assert "diverged: its logged loss is NaN" in builder.summary
    assert builder.error == ""


def test_a_load_that_finds_nan_says_so(tmp_path: Path) -> None:
    state = _state(2.0)
    state["model"]["head"] = np.array([1.0, np.nan], np.float32)
    path = tmp_path / "step-1"
    save_checkpointables(path, state).result()
    builder = RestoreTargetBuilder(_state(), path)
    # Nothing read yet: no word of NaN, and Load does not ask.
    assert 'data-health="not yet known"' in builder.load_guard.verdict.value
    builder.load_button.click()
    _until_loaded(builder)
    assert not builder.load_guard.asked
    # The load counted what it read: the verdict and the summary say it, in one count.
    assert 'data-health="diverged"' in builder.load_guard.verdict.value
    assert "diverged: 1 NaN and 0 Inf in 1 leaf of model" in builder.summary
