"""CheckpointExplorer driven through its Python objects against real checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grain
import numpy as np
import pytest
from tinax.widgets import CheckpointExplorer
from tinax.widgets._meters import process_bytes_read
from tinax.widgets._text import format_bytes

from tinax.checkpointing import save_checkpointables

WEIGHTS = np.arange(12, dtype=np.float32).reshape(3, 4)


def _state(step: int) -> dict[str, Any]:
    return {
        "model": {
            "dense": {"w": WEIGHTS * step, "b": np.array([1.0, np.nan, np.inf, 2.0], np.float32)}
        },
        "optimizer": {"count": step, "mu": np.full(4, 0.5, np.float32)},
    }


def _save(path: Path | str, state: dict[str, Any]) -> None:
    save_checkpointables(path, state).result()


@pytest.fixture
def run(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    root.mkdir()
    for step in (1, 2):
        _save(root / f"step-{step}", _state(step))
    return root


@pytest.fixture
def any_run(root: str) -> str:
    """The same run on local disk, then on gs://."""
    for step in (1, 2):
        _save(f"{root}/step-{step}", _state(step))
    return root


def _label(explorer: CheckpointExplorer, name: str) -> Any:
    rows = explorer.checkpoints[explorer.checkpoints["name"] == name]
    assert len(rows) == 1, f"{name} not listed: {explorer.checkpoints['name'].tolist()}"
    return rows.index[0]


def _leaf_label(explorer: CheckpointExplorer, checkpointable: str, key: str) -> Any:
    leaves = explorer.leaves
    rows = leaves[(leaves["checkpointable"] == checkpointable) & (leaves["key"] == key)]
    assert len(rows) == 1
    return rows.index[0]


def test_pick_a_checkpoint_and_a_leaf_by_clicking(any_run: str) -> None:
    run = any_run
    explorer = CheckpointExplorer(run)
    assert explorer.checkpoints["name"].tolist() == ["step-1", "step-2"]
    assert explorer.wait(60)
    assert explorer.summary == "2 checkpoints"
    assert not explorer.contents.section.shown

    explorer.checkpoint_view.click(_label(explorer, "step-2"))
    assert explorer.checkpoint == f"{run}/step-2"
    assert explorer.contents.section.shown
    assert set(explorer.leaves["key"]) >= {"['dense']['w']", "['dense']['b']", "['mu']"}
    assert "step-2" in explorer.contents.section.heading.value
    # The run list folds to one line that names the open checkpoint; it unfolds.
    assert not explorer.run_section.is_open and explorer.run_section.shown
    assert "<code>step-2</code> open" in explorer.run_section.heading.value
    explorer.run_section.toggle.click()
    assert explorer.run_section.is_open

    explorer.leaf_view.click(_leaf_label(explorer, "model", "['dense']['w']"))
    assert explorer.leaf == ("model", "['dense']['w']")
    stats = explorer.statistics
    assert stats is not None
    assert stats.shape == (3, 4) and stats.dtype == "float32"
    assert (stats.minimum, stats.maximum, stats.mean) == (0.0, 22.0, 11.0)
    assert 'data-stat="mean">11<' in explorer.leaf_pane.stats_html.value
    assert bytes(explorer.leaf_pane.histogram.value).startswith(b"\x89PNG")
    assert explorer.leaf_pane.histogram.layout.display == ""
    np.testing.assert_array_equal(np.asarray(explorer.leaf_value), WEIGHTS * 2)

    explorer.open_leaf("model", "['dense']['b']")
    stats = explorer.statistics
    assert stats is not None
    assert (stats.nan_count, stats.inf_count) == (1, 1)
    assert stats.mean == pytest.approx(1.5)
    assert 'data-stat="NaN">1<' in explorer.leaf_pane.stats_html.value


def test_picking_reads_only_that_leafs_bytes(tmp_path: Path) -> None:
    big = np.random.default_rng(0).standard_normal((16 << 20) // 4, dtype=np.float32)
    _save(tmp_path / "step-1", {"model": {"big": big, "small": np.arange(8.0)}})
    explorer = CheckpointExplorer(tmp_path)
    explorer.open_checkpoint("step-1")
    before = process_bytes_read()
    explorer.open_leaf("model", "['small']")
    after = process_bytes_read()
    assert explorer.statistics is not None and explorer.statistics.mean == pytest.approx(3.5)
    if before is not None and after is not None:
        assert after - before < big.nbytes // 4, f"read {after - before} bytes for a 64-byte leaf"


def test_in_progress_and_invalid_checkpoints_are_listed_but_never_opened(run: Path) -> None:
    partial = run / "step-3.orbax-checkpoint-tmp-1700000000"
    partial.mkdir()
    (partial / "model").mkdir()
    broken = run / "step-4"
    broken.mkdir()
    (broken / "_CHECKPOINT_METADATA").write_text("{not json")
    (broken / "model").mkdir()

    explorer = CheckpointExplorer(run)
    statuses = dict(zip(explorer.checkpoints["name"], explorer.checkpoints["status"], strict=True))
    assert statuses["step-1"] == statuses["step-2"] == "complete"
    assert statuses[_name_like(statuses, "step-3")] == "in progress"
    assert statuses["step-4"] == "invalid"
    assert "1 save in progress" in explorer.summary and "1 invalid" in explorer.summary
    for name in (_name_like(statuses, "step-3"), "step-4"):
        assert not explorer.checkpoint_view.pickable(_label(explorer, name))
        explorer.open_checkpoint(name)  # a programmatic pick is refused too
        assert explorer.checkpoint is None
        assert "not opened" in explorer.message.value


def _name_like(statuses: dict[str, str], prefix: str) -> str:
    names = [n for n in statuses if n.startswith(prefix)]
    assert len(names) == 1, names
    return names[0]


def test_filters_and_pages_at_ten_thousand_leaves(tmp_path: Path) -> None:
    layers = {f"layer_{i:05d}": np.full(2, i, np.float32) for i in range(10_000)}
    _save(tmp_path / "step-1", {"model": layers, "optimizer": {"count": 3}})
    explorer = CheckpointExplorer(tmp_path, page_size=25)

    explorer.open_checkpoint("step-1")
    assert len(explorer.leaves) == 10_001
    assert explorer.leaf_view.position == "rows 1–25 of 10,001"

    explorer.leaf_view.turn(1)
    explorer.leaf_view.page = 400
    assert explorer.leaf_view.position == "rows 10,001–10,001 of 10,001"

    explorer.contents.key_filter.value = "layer_0999"
    assert explorer.leaf_view.frame["key"].tolist() == [f"['layer_0999{i}']" for i in range(10)]
    assert explorer.leaf_view.page == 0
    explorer.contents.key_filter.value = ""
    explorer.contents.checkpointable_filter.value = "optimizer"
    assert explorer.leaf_view.frame["key"].tolist() == ["['count']"]

    explorer.open_leaf("model", "['layer_01234']")
    assert explorer.statistics is not None and explorer.statistics.mean == 1234.0
    assert explorer.contents.checkpointable_filter.value == ""  # the filter was cleared to show it


def test_checkpoints_are_in_step_order(tmp_path: Path) -> None:
    for step in (10, 9, 100):
        _save(tmp_path / f"step-{step}", {"model": {"w": np.zeros(2)}})
    explorer = CheckpointExplorer(tmp_path)
    assert explorer.checkpoints["name"].tolist() == ["step-9", "step-10", "step-100"]
    assert explorer.checkpoints["step"].tolist() == [9, 10, 100]


def test_refresh_and_polling_find_new_checkpoints(run: Path) -> None:
    explorer = CheckpointExplorer(run)
    explorer.open_checkpoint("step-2")
    _save(run / "step-3", _state(3))
    assert "step-3" not in explorer.checkpoints["name"].tolist()
    explorer.runs.refresh_button.click()
    assert explorer.checkpoints["name"].tolist() == ["step-1", "step-2", "step-3"]
    assert explorer.checkpoint == str(run / "step-2"), "refresh keeps the open checkpoint"

    explorer.poll_interval = 0.05
    assert explorer.runs.watch_box.value
    _save(run / "step-4", _state(4))
    deadline = time.monotonic() + 30
    while "step-4" not in explorer.checkpoints["name"].tolist():
        assert time.monotonic() < deadline, "polling did not find step-4"
        time.sleep(0.05)
    explorer.runs.watch_box.value = False
    assert explorer.poll_interval == 0
    explorer.close()


def test_errors_are_shown_in_the_widget(run: Path) -> None:
    explorer = CheckpointExplorer(run)
    # The run's check in the background ends first: it would see the damage below and
    # close the checkpoint as invalid before its leaf is read.
    assert explorer.wait(60)
    explorer.open_checkpoint("step-1")
    # Damage the checkpoint after it was listed: reading a leaf now fails.
    for path in (run / "step-1" / "model").rglob("*"):
        if path.is_file() and path.name not in {"_METADATA", "_sharding"}:
            path.write_bytes(b"garbage")
    explorer.leaf_view.click(_leaf_label(explorer, "model", "['dense']['w']"))
    assert explorer.error, "the failure should be recorded"
    assert "Error" in explorer.message.value or "error" in explorer.message.value.lower()
    # The widget stays usable.
    explorer.open_checkpoint("step-2")
    explorer.open_leaf("optimizer", "['mu']")
    assert explorer.statistics is not None and explorer.statistics.mean == 0.5


def test_the_removed_open_checkpoint_is_closed_on_refresh(run: Path) -> None:
    explorer = CheckpointExplorer(run)
    explorer.open_checkpoint("step-1")
    for path in sorted((run / "step-1").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (run / "step-1").rmdir()
    explorer.refresh()
    assert explorer.checkpoint is None
    assert "gone" in explorer.message.value


def test_constructor_checks_its_arguments(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        CheckpointExplorer(tmp_path / "missing")
    with pytest.raises(TypeError):
        CheckpointExplorer(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        CheckpointExplorer(tmp_path, poll_interval=-1)
    with pytest.raises(TypeError):
        CheckpointExplorer(tmp_path, poll_interval=True)
    explorer = CheckpointExplorer(tmp_path)
    # Validated before it is set, whether in the constructor or afterwards.
    for bad, error in [(-1, ValueError), (float("nan"), ValueError), ("2", TypeError)]:
        with pytest.raises(error):
            explorer.poll_interval = bad
        assert explorer.poll_interval == 0.0
    assert explorer.checkpoint_view.position == "no checkpoints yet"
    with pytest.raises(ValueError, match="no checkpoint"):
        explorer.open_checkpoint("step-9")
    with pytest.raises(ValueError, match="no checkpoint is open"):
        explorer.open_leaf("model", "['w']")
    json.dumps(explorer.get_state())  # the widget state is serialisable


def test_a_relative_run_directory_works(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(run.parent)
    explorer = CheckpointExplorer("run")
    assert "<code>run</code>" in explorer.heading.value
    explorer.open_checkpoint("step-1")
    explorer.open_leaf("model", "['dense']['w']")
    assert explorer.statistics is not None and explorer.statistics.mean == 5.5


def test_an_iterator_leaf_shows_its_stored_state(tmp_path: Path) -> None:
    iterator = iter(grain.MapDataset.range(10).to_iter_dataset())
    next(iterator)
    _save(tmp_path / "step-1", {"model": {"w": np.zeros(2)}, "iterator": iterator})
    explorer = CheckpointExplorer(tmp_path)
    explorer.open_checkpoint("step-1")
    label = _leaf_label(explorer, "iterator", "")
    explorer.leaf_view.show_row(label)
    slot = explorer.leaf_view.visible_labels().index(label)
    # A checkpointable stored whole has the empty key, shown as a word, never blank.
    assert explorer.leaf_view.visible_text("key")[slot] in {"(root)", "(whole)", "iterator"}
    explorer.leaf_view.click(label)
    assert explorer.leaf == ("iterator", "")
    assert explorer.statistics is None
    assert (
        "next_index" in explorer.leaf_pane.stats_html.value
        and "nothing read" in explorer.leaf_pane.stats_html.value
    )


def test_an_interrupted_save_is_removed_after_a_confirmation(run: Path) -> None:
    from claim_holder import Holder

    def leftover(name: str) -> Path:
        temporary = run / f"{name}.orbax-checkpoint-tmp"
        (temporary / "model").mkdir(parents=True)
        (temporary / "model" / "partial").write_bytes(b"x" * 2048)
        return temporary

    dead, live = leftover("step-3"), leftover("step-4")
    killed, writing = Holder(run / "step-3"), Holder(run / "step-4")
    try:
        killed.kill()
        explorer = CheckpointExplorer(run)
        statuses = dict(
            zip(explorer.checkpoints["name"], explorer.checkpoints["status"], strict=True)
        )
        assert statuses[dead.name] == "interrupted" and statuses[live.name] == "in progress"
        assert "1 interrupted save" in explorer.summary
        assert not explorer.checkpoint_view.pickable(_label(explorer, dead.name))
        panel = explorer.runs.interrupted
        assert panel.layout.display == ""
        # Only the interrupted one is offered, with its size and age.
        assert [value for _, value in panel.choice.options] == [str(dead)]
        assert "2.0 KiB" in panel.choice.options[0][0] and " old)" in panel.choice.options[0][0]

        panel.remove_button.click()
        assert panel.confirmation.layout.display == "" and dead.name in panel.question.value
        panel.cancel_button.click()
        assert panel.confirmation.layout.display == "none" and dead.exists()

        panel.remove_button.click()
        panel.confirm_button.click()
        assert not dead.exists() and live.exists()
        assert dead.name not in explorer.checkpoints["name"].tolist()
        assert "removed step-3" in panel.message.value
        assert panel.layout.display == "none"
    finally:
        killed.close()
        writing.close()


def test_a_save_that_claims_meanwhile_is_not_removed(run: Path) -> None:
    from claim_holder import Holder

    temporary = run / "step-3.orbax-checkpoint-tmp"
    (temporary / "model").mkdir(parents=True)
    first = Holder(run / "step-3")
    first.kill()
    explorer = CheckpointExplorer(run)
    panel = explorer.runs.interrupted
    panel.remove_button.click()
    # A new save to step-3 starts while the question is open.
    second = Holder(run / "step-3")
    try:
        panel.confirm_button.click()
        assert temporary.exists()
        assert "Not removed" in panel.message.value and f"pid {second.pid}" in panel.message.value
        statuses = dict(
            zip(explorer.checkpoints["name"], explorer.checkpoints["status"], strict=True)
        )
        assert statuses[temporary.name] == "in progress"
    finally:
        second.close()


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 25 one-leaf checkpoints written by Orbax itself, steps 0, 10, … 240."""
    from orbax.checkpoint import v1 as ocp

    root = tmp_path_factory.mktemp("long_run")
    for step in range(0, 250, 10):
        ocp.save_pytree(root / f"step_{step:06d}", {"w": np.full(2, step, np.float32)})
    return root


def _names_shown(explorer: CheckpointExplorer) -> list[str]:
    view = explorer.checkpoint_view
    return [str(explorer.checkpoints.loc[label, "name"]) for label in view.visible_labels()]


def test_a_run_is_listed_newest_first_narrowed_by_step_and_jumped_through(long_run: Path) -> None:
    explorer = CheckpointExplorer(long_run, page_size=10)
    assert _names_shown(explorer)[:3] == ["step_000240", "step_000230", "step_000220"]
    assert explorer.checkpoint_view.position == "rows 1–8 of 25"  # RUN_ROWS a page
    slider = explorer.runs.step_range
    assert (slider.min, slider.max, slider.value) == (0, 240, (0, 240))

    slider.value = (50, 100)
    assert _names_shown(explorer) == [f"step_{s:06d}" for s in (100, 90, 80, 70, 60, 50)]
    explorer.checkpoint_view.sort_by("step")  # oldest first, on request
    assert _names_shown(explorer)[0] == "step_000050"

    # Jumping to a step opens it, widening the range when it lies outside.
    explorer.runs.step_box.value = 200
    explorer.runs.go_button.click()
    assert explorer.checkpoint == str(long_run / "step_000200")
    assert slider.value == (0, 240)
    assert "step_000200" in _names_shown(explorer)
    assert explorer.checkpoint_view.selected == str(long_run / "step_000200")
    explorer.go_to_step(36)  # no such step: the nearest is opened, and said so
    assert explorer.checkpoint == str(long_run / "step_000040")
    assert "nearest" in explorer.message.value and "36" in explorer.message.value
    explorer.go_to_step(-5)
    assert explorer.checkpoint == str(long_run / "step_000000")
    with pytest.raises(TypeError):
        explorer.go_to_step("10")  # type: ignore[arg-type]
    explorer.close()


def test_the_run_is_shown_before_it_is_checked_and_marked_when_checked(tmp_path: Path) -> None:
    from orbax.checkpoint import v1 as ocp

    for step in (1, 2, 3):
        ocp.save_pytree(tmp_path / f"step_{step}", {"w": np.zeros(2, np.float32)})
    (tmp_path / "step_2" / "state" / "_METADATA").write_text('{"tree_metadata": {')
    explorer = CheckpointExplorer(tmp_path)
    assert explorer.wait(60)
    statuses = dict(zip(explorer.checkpoints["name"], explorer.checkpoints["status"], strict=True))
    assert statuses == {"step_1": "complete", "step_2": "invalid", "step_3": "complete"}
    assert explorer.summary == "2 checkpoints, 1 invalid"
    assert not explorer.checkpoint_view.pickable(_label(explorer, "step_2"))
    # Each explorer keeps what it has read (the process keeps nothing): the next one's
    # first listing is quick again, and its own check finds the damaged checkpoint.
    again = CheckpointExplorer(tmp_path)
    assert again.wait(60) and "checking" not in again.summary
    assert dict(zip(again.checkpoints["name"], again.checkpoints["status"], strict=True)) == (
        statuses
    )
    with pytest.raises(ValueError, match="no complete checkpoint with a step"):
        CheckpointExplorer(tmp_path / "step_2" / "state").go_to_step(1)


def test_a_large_checkpoint_shows_its_keys_first_and_its_sizes_when_read(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pandas as pd
    from tinax.widgets import _checkpoint_pane

    import tinax.explore as ex

    monkeypatch.setattr(_checkpoint_pane, "FILL_LATER_LEAVES", 1)  # every checkpoint is "large"
    explorer = CheckpointExplorer(run)
    assert explorer.wait(60)
    explorer.open_checkpoint("step-1")
    assert explorer.wait(60)
    explorer.leaf_view.sort_by("nbytes", ascending=False)
    full = ex.checkpoint_table(run / "step-2").reset_index(drop=True)
    # Holding the explorer's lock keeps the fill from being applied: what is shown
    # meanwhile can be looked at.
    with explorer.services.lock:
        explorer.open_checkpoint("step-2")
        assert explorer.filling
        shown = explorer.leaves
        named = ["checkpointable", "key", "kind"]
        pd.testing.assert_frame_equal(shown[named], full[named])
        assert (
            shown.loc[shown["kind"] != "iterator", ["shape", "dtype", "nbytes", "value"]]
            .isna()
            .all()
            .all()
        )
        assert "reading shapes and sizes…" in explorer.contents.section.heading.value
        assert "reading shapes and sizes…" in explorer.contents.size_bar.value
        tree = explorer.tree_view
        assert tree.order.disabled and set(tree.table.frame["nbytes"]) == {"…"}
        # Not sorted by sizes it does not have: stored order, and it says so.
        assert explorer.leaf_view.frame["key"].tolist() == full["key"].tolist()
        assert "sorted by size once it is read" in explorer.leaf_view.position
        # A scalar picked now shows its stored value, read for it.
        explorer.open_leaf("optimizer", "['count']")
        assert explorer.leaf_value == 2
        assert not explorer.wait(0.5)  # the fill is still to come
    assert explorer.wait(60)
    assert not explorer.filling
    pd.testing.assert_frame_equal(explorer.leaves, full)
    nbytes = explorer.leaf_view.frame["nbytes"]
    assert nbytes.tolist() == sorted(nbytes.tolist(), reverse=True)
    assert "once it is read" not in explorer.leaf_view.position
    total = int(pd.to_numeric(full["nbytes"]).fillna(0).sum())
    assert (
        f", {format_bytes(total)} in arrays and state (" in explorer.contents.section.heading.value
    )
    assert (
        "reading" not in explorer.contents.size_bar.value
        and "model" in explorer.contents.size_bar.value
    )
    assert not explorer.tree_view.order.disabled
    tree = explorer.tree_view
    assert sum(root.nbytes for root in tree.tree.roots) == total
    shown_sizes = {
        (node.checkpointable, node.key): size
        for node, size in zip(tree.nodes, tree.table.frame["nbytes"], strict=True)
    }
    assert shown_sizes[("optimizer", "")] == 24 and shown_sizes[("optimizer", "['count']")] == 8
    assert explorer.leaf == ("optimizer", "['count']")  # the pick is kept

    # A fill that arrives after another checkpoint was opened is dropped.
    with explorer.services.lock:
        explorer.open_checkpoint("step-2")
        explorer.open_checkpoint("step-1")
    assert explorer.wait(60)
    pd.testing.assert_frame_equal(
        explorer.leaves, ex.checkpoint_table(run / "step-1").reset_index(drop=True)
    )


def test_shapes_that_cannot_be_read_are_said_so_and_the_fill_ends(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tinax.widgets import _checkpoint_pane

    monkeypatch.setattr(_checkpoint_pane, "FILL_LATER_LEAVES", 1)
    explorer = CheckpointExplorer(run)
    assert explorer.wait(60)
    # The array store's data files gone since the run was listed: the keys can be
    # read, the shapes cannot.
    removed = [p for p in (run / "step-2" / "model").rglob("*") if p.parent.name == "d"]
    assert removed
    for path in removed:
        path.unlink()
    explorer.open_checkpoint("step-2")
    assert explorer.error == "", explorer.error
    assert "['dense']['w']" in set(explorer.leaves["key"])
    assert explorer.wait(60)
    assert not explorer.filling
    assert "Cannot read shapes and sizes" in explorer.contents.size_bar.value
    assert "cannot read the array metadata" in explorer.error


def test_a_training_run_shows_its_policy_and_why_each_checkpoint_is_kept(tmp_path: Path) -> None:
    import jax
    import jax.numpy as jnp

    from tinax.checkpointing import TrainingRun

    batches = iter(grain.MapDataset.range(1_000).batch(4).to_iter_dataset())
    rng = jax.random.key_data(jax.random.key(0))
    with TrainingRun(tmp_path, save_every=10, keep=1, keep_best=1, best_by="loss") as run:
        for step in range(1, 41):
            next(batches)
            if run.should_save(step):
                loss = abs(step - 20)  # best at step 20
                # grad_norm logged as NaN at 40: said so, never left blank.
                aux = {"loss": loss, "grad_norm": float("nan") if step == 40 else 0.5}
                run.save(step, {"w": jnp.full(3, step)}, {}, rng, aux, batches)
    explorer = CheckpointExplorer(tmp_path, poll_interval=0)
    kept = dict(zip(explorer.checkpoints["name"], explorer.checkpoints["kept"], strict=True))
    assert kept == {"step_000020": "best loss", "step_000040": "newest 1"}
    assert "every 10 steps · keeps newest 1 + best 1 by loss (min)" in explorer.summary
    # The run's metrics, read in the background: the one it is kept by first.
    assert explorer.wait(60)
    view = explorer.checkpoint_view
    titles = [c.title for c in view.columns]
    assert titles[:4] == ["checkpoint", "step", "loss", "grad_norm"]
    assert view.visible_text("metric:loss") == ["20", "0"]  # newest first
    assert view.visible_text("metric:grad_norm") == ["NaN", "0.5"]
    view.click_header("metric:loss")
    assert view.visible_text("name")[0] == "step_000020"
    # A run not written by TrainingRun has no reasons and no policy to show.
    plain = CheckpointExplorer(tmp_path / "step_000040", poll_interval=0)
    assert set(plain.checkpoints["kept"]) <= {""}
    assert "keeps" not in plain.summary


def test_export_opens_the_open_checkpoint_s_panel_and_writes_safetensors(
    run: Path, tmp_path: Path
) -> None:
    from safetensors.numpy import load_file

    explorer = CheckpointExplorer(run, poll_interval=0)
    assert explorer.contents.export_box.children == ()
    explorer.contents.export_button.click()  # nothing open: nothing to export
    assert explorer.contents.export_box.children == ()
    explorer.checkpoint_view.click(_label(explorer, "step-2"))
    explorer.contents.export_button.click()
    (panel,) = explorer.contents.export_box.children
    # The panel opens where its button is: right under the row of actions.
    body = list(explorer.contents.section.body.children)
    assert explorer.contents.export_button in explorer.contents.actions.children
    assert body.index(explorer.contents.export_box) == body.index(explorer.contents.actions) + 1
    assert panel.path == f"{run}/step-2"
    panel.destination.value = str(tmp_path / "out")
    panel.export_button.click()
    deadline = time.monotonic() + 60
    while panel.exporting and time.monotonic() < deadline:
        time.sleep(0.05)
    assert panel.error == "" and not panel.exporting
    tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    np.testing.assert_array_equal(tensors["dense.w"], WEIGHTS * 2)
    # Another checkpoint opened closes the panel; the button toggles it.
    explorer.checkpoint_view.click(_label(explorer, "step-1"))
    assert explorer.contents.export_box.children == ()
    explorer.contents.export_button.click()
    explorer.contents.export_button.click()
    assert explorer.contents.export_box.children == ()


@pytest.mark.slow  # mypy over the widgets: tens of seconds
def test_mypy_catches_a_misspelt_attribute_of_the_explorer_s_panes(tmp_path: Path) -> None:
    snippet = tmp_path / "use_explorer.py"
    snippet.write_text(
        "from widgets import CheckpointExplorer\n\n"
        "explorer = CheckpointExplorer('run')\n"
        "explorer.contents.leaf_veiw.show_row(0)\n"
        "explorer.runs.refersh()\n"
        "explorer.leaf_pane.statistcs\n"
        "explorer.contents.leaf_view.show_row(0)\n"
        "explorer.runs.refresh(deep=False)\n"
    )
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(repo / "pyproject.toml"),
            # The checkout's cache, which `make lint` (run before the tests by `make
            # test` and `make check`) has just filled: only the snippet is checked
            # afresh. Without one, mypy checks everything the snippet imports.
            "--cache-dir",
            str(repo / ".mypy_cache"),
            str(snippet),
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    # The snippet's lines, however mypy spells its path (absolute, or relative to the
    # directory it runs in).
    errors = [
        line
        for line in done.stdout.splitlines()
        if line.split(":", 1)[0].endswith(f"/{snippet.name}")
        or line.split(":", 1)[0] == snippet.name
    ]
    assert [e.split(":")[1] for e in errors] == ["4", "5", "6"], done.stdout[-2000:]
    assert 'maybe "leaf_view"' in errors[0] and 'maybe "refresh"' in errors[1]


def test_ages_tick_without_a_refresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from tinax.widgets import _run_list

    _save(tmp_path / "step-1", {"model": {"w": np.ones(2, np.float32)}})
    explorer = CheckpointExplorer(tmp_path)
    try:
        # The run's check in the background lists it again when it ends, which sets the
        # ages afresh: it must not land between the ticks below.
        assert explorer.wait(timeout=60)
        # The run list's clock stands still between the ticks, however slow the machine.
        now = time.monotonic()
        monkeypatch.setattr(_run_list, "time", types.SimpleNamespace(monotonic=lambda: now))
        explorer.runs.tick_ages()
        view = explorer.checkpoint_view
        assert view.visible_text("age")[0].endswith(" s")
        assert not explorer.runs.tick_ages()  # nothing shown has changed since
        explorer.runs._listed_at -= 125  # two minutes on
        assert explorer.runs.tick_ages()
        assert view.visible_text("age") == ["2 min"]
        assert not explorer.runs.tick_ages()
    finally:
        explorer.close()


def test_every_css_class_of_the_explorer_is_one_word(tmp_path: Path) -> None:
    # The browser refuses a view whose class list has a space in a name, and draws
    # the widget without its layout (a hidden section shows).
    _save(tmp_path / "step-1", {"model": {"w": np.ones(2, np.float32)}})
    explorer = CheckpointExplorer(tmp_path)
    explorer.open_checkpoint("step-1")
    seen, stack = 0, [explorer]
    while stack:
        widget = stack.pop()
        seen += 1
        for name in getattr(widget, "_dom_classes", ()):
            assert name and not any(c.isspace() for c in name), (type(widget).__name__, name)
        stack.extend(getattr(widget, "children", ()))
    assert seen > 30
    assert "tinax-section-data-check" in explorer.contents.data_section._dom_classes
    explorer.close()
