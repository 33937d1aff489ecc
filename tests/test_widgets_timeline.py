"""RunTimeline driven through its Python objects and the messages its view sends, on a
real run with a planted jump and NaN; alone and as the explorer's timeline."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from run_view_fixtures import JUMP_LAYER, JUMP_STEP, NAN_STEP, ROLLBACK_STEP, STEPS, write_small_run
from tinax.widgets import CheckpointExplorer, RunTimeline
from tinax.widgets._nonfinite import NONFINITE_COLOR
from tinax.widgets._timeline_data import NAN_CELL, first_nonfinite_metrics, nonfinite_metrics

from tinax.checkpointing import save_checkpointables


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> str:
    # Read only by the tests: written once for the file.
    return write_small_run(str(tmp_path_factory.mktemp("timeline") / "run"))


def _click(timeline: RunTimeline, **content) -> None:
    # What the browser's view sends on a click (timeline.js).
    timeline.view._handle_custom_msg(content, [])


def test_metrics_and_save_times_are_drawn_at_once(run):
    timeline = RunTimeline(run)
    data = timeline.view.data
    assert data["steps"] == list(STEPS)
    picks = timeline.metric_picks
    assert picks.picked == ["loss"] and timeline.view.metrics == ["loss"]
    assert set(picks.buttons) == {"epoch", "learning_rate", "loss"}
    # NaN is sent as a gap (null), never as an invalid JSON number.
    assert data["metrics"]["loss"][: NAN_STEP - 1] == pytest.approx(
        [1 / s for s in STEPS if s < NAN_STEP]
    )
    assert data["metrics"]["loss"][NAN_STEP - 1 :] == [None] * (len(STEPS) - NAN_STEP + 1)
    assert all(t > 0 for t in data["save_total_s"])
    assert "heat" not in data
    # A second metric beside the first, pressed as its button is, on the same axis.
    picks.buttons["learning_rate"].value = True
    assert timeline.view.metrics == ["loss", "learning_rate"]
    assert picks.buttons["learning_rate"].button_style == "info"
    picks.buttons["loss"].value = False
    assert timeline.view.metrics == ["learning_rate"]
    with pytest.raises(ValueError, match="no metric 'lr'"):
        picks.picked = ["lr"]
    assert "6 checkpoints" in timeline.summary.value


@pytest.mark.slow
def test_drift_heatmap_and_scan_markers(run):
    timeline = RunTimeline(run, drift=True)
    assert timeline.wait(120)
    data = timeline.view.data
    assert data["layers"][0] == "embed" and JUMP_LAYER in data["layers"]
    assert data["heat_steps"] == list(STEPS[1:])
    assert data["heat_previous"] == list(STEPS[:-1])
    row = data["layers"].index(JUMP_LAYER)
    column = data["heat_steps"].index(JUMP_STEP)
    best = max(v for cells in data["heat"] for v in cells if v is not None)
    assert data["heat"][row][column] == best
    assert f"moved most: <b>{JUMP_LAYER}</b> at step {JUMP_STEP}" in timeline.summary.value
    timeline.compute_scan()
    assert timeline.wait(120)
    data = timeline.view.data
    assert data["nonfinite_steps"] == [s for s in STEPS if s >= NAN_STEP]
    assert data["rollback_step"] == ROLLBACK_STEP
    assert f"roll back to step {ROLLBACK_STEP}" in timeline.message.value
    assert timeline.error == ""


@pytest.mark.slow
def test_clicks_open_a_step_diff_two_and_open_a_layer_diff_in_the_explorer(run):
    explorer = CheckpointExplorer(run)
    timeline = explorer.timeline
    assert not timeline.loaded
    explorer.timeline_section.toggle.click()
    assert timeline.loaded and timeline.view.data["steps"] == list(STEPS)
    _click(timeline, kind="step", step=2)
    explorer.wait(60)
    assert explorer.checkpoint == f"{run}/step_000002"
    assert timeline.picked_steps == [2]
    _click(timeline, kind="step", step=4)
    explorer.wait(60)
    assert timeline.picked_steps == [2, 4]
    diff = explorer.contents.diff_view
    assert (diff.older, diff.newer) == (f"{run}/step_000002", f"{run}/step_000004")
    assert not diff.diff.empty
    timeline.compute_drift()
    assert timeline.wait(120)
    row = timeline.view.data["layers"].index(JUMP_LAYER)
    column = timeline.view.data["heat_steps"].index(JUMP_STEP)
    _click(timeline, kind="cell", layer=row, column=column)
    explorer.wait(60)
    assert timeline.picked_cell == ("['layers'][2]", JUMP_STEP)
    assert (diff.older, diff.newer) == (
        f"{run}/step_{JUMP_STEP - 1:06d}",
        f"{run}/step_{JUMP_STEP:06d}",
    )
    assert explorer.contents.key_filter.value == JUMP_LAYER
    assert timeline.error == "" and explorer.error == ""
    explorer.close()


def test_the_timeline_follows_what_the_explorer_opens(run):
    explorer = CheckpointExplorer(run)
    timeline = explorer.timeline
    explorer.timeline_section.toggle.click()
    _click(timeline, kind="step", step=2)
    assert timeline.picked_steps == [2]
    # Opened from the list: the timeline says so, and a click diffs against it.
    explorer.open_checkpoint("step_000006")
    assert timeline.picked_steps == [6] and "step 6 open" in timeline.picks.value
    assert "step 2" not in timeline.picks.value
    _click(timeline, kind="step", step=4)
    diff = explorer.contents.diff_view
    # The step open stays open; the diff reads from the older to the newer.
    assert explorer.checkpoint == f"{run}/step_000006"
    assert (diff.older, diff.newer) == (f"{run}/step_000004", f"{run}/step_000006")
    assert timeline.picked_steps == [4, 6] and "diff of steps 4 → 6" in timeline.picks.value
    # "go to step", then a diff chosen in the explorer's own "compare with…".
    explorer.go_to_step(3)
    assert timeline.picked_steps == [3]
    diff.choice.value = f"{run}/step_000001"
    assert timeline.picked_steps == [1, 3]
    diff.choice.value = ""
    assert timeline.picked_steps == [3]
    explorer.contents.close()
    assert timeline.picked_steps == [] and timeline.picks.value == ""
    assert timeline.error == "" and explorer.error == ""
    explorer.close()


def test_a_bad_click_is_shown_in_the_widget(run):
    timeline = RunTimeline(run)
    _click(timeline, kind="step", step=99)
    assert "no complete checkpoint of step 99" in timeline.error
    assert "no complete checkpoint of step 99" in timeline.message.value


@pytest.mark.slow
def test_cancel_and_the_buttons_while_work_runs(run):
    seen = []
    timeline = RunTimeline(run, on_pick=lambda kind, what: seen.append((kind, what)))
    timeline.compute_drift()
    assert not timeline.cancel_button.disabled and timeline.drift_button.disabled
    # The scan is not held back by the drift: both read side by side.
    assert not timeline.scan_button.disabled
    timeline.cancel_button.click()
    assert timeline.wait(120)
    assert timeline.cancel_button.disabled and not timeline.drift_button.disabled
    pairs = timeline.drift.attrs["pairs"]
    assert timeline.drift.attrs["cancelled"] == (pairs < len(STEPS) - 1)
    assert ("cancelled" in timeline.message.value) == timeline.drift.attrs["cancelled"]
    timeline.pick_step(3)
    assert seen == [("step", 3)]


def test_nan_in_the_metrics_is_marked_before_any_scan(run):
    timeline = RunTimeline(run)
    data = timeline.view.data
    # The loss the run recorded as NaN, step by step, apart from a gap (None).
    assert data["metric_nonfinite"] == {"loss": [[s, "NaN"] for s in STEPS if s >= NAN_STEP]}
    assert "nonfinite_steps" not in data and timeline.scan.empty
    # The summary says the library's verdict, the NaN loss among its reasons, once.
    summary = timeline.summary.value
    assert f"diverged from step {NAN_STEP}: " in summary and "its logged loss is NaN" in summary
    assert "loss NaN from step" not in summary


def test_nonfinite_metrics_keep_missing_values_apart():
    rows = pd.DataFrame(
        {
            "step": [1, 2, 3, 4],
            # A nullable column keeps NaN (a value) apart from <NA> (none recorded).
            "loss": pd.arrays.FloatingArray(
                np.array([1.0, 0.0, math.nan, math.inf]), np.array([False, True, False, False])
            ),
            "lr": [0.1, 0.1, 0.1, -math.inf],
        }
    )
    found = nonfinite_metrics(rows, ["loss", "lr", "absent"])
    # <NA> is a checkpoint without the metric; NaN and ±Inf are values it recorded.
    assert found == {"loss": [[3, "NaN"], [4, "Inf"]], "lr": [[4, "-Inf"]]}
    assert first_nonfinite_metrics(found) == [("loss", 3, "NaN"), ("lr", 4, "-Inf")]


@pytest.mark.slow
def test_drift_and_scan_run_together_and_nan_cells_have_their_own_state(run):
    timeline = RunTimeline(run)
    timeline.compute_scan()
    timeline.compute_drift()
    # The drift started while the scan runs, not refused because of it (either may
    # have finished already: pairs and scans this process read before are kept).
    assert timeline.scan_job.running or not timeline.scan.empty
    assert timeline.drift_job.running or not timeline.drift.empty
    assert timeline.wait(120)
    assert not timeline.drift.empty and not timeline.scan.empty
    assert "layer drift of 5 pairs" in timeline.message.value
    assert f"roll back to step {ROLLBACK_STEP}" in timeline.message.value
    data = timeline.view.data
    row = data["layers"].index("layers.0")
    states = data["heat_state"]
    # layers.0 holds a NaN from NAN_STEP on: its cells are NaN/Inf, not the top of the
    # scale; the other layers' cells are values.
    for column, step in enumerate(data["heat_steps"]):
        assert states[row][column] == (NAN_CELL if step >= NAN_STEP else None)
        if step >= NAN_STEP:
            # One NaN element in each checkpoint: the tooltip counts each side once,
            # as a scan of that checkpoint does (never 2 for the later one).
            before = 1 if step > NAN_STEP else 0
            assert data["heat_counts"][row][column] == [before, 0, 1, 0, 0]
    others = [s for r, cells in enumerate(states) if r != row for s in cells]
    assert set(others) == {None}
    assert f"NaN/Inf in layers.0 from step {NAN_STEP}" in timeline.summary.value
    assert f"moved most: <b>{JUMP_LAYER}</b>" in timeline.summary.value


@pytest.mark.slow
def test_the_drift_depth_is_chosen_in_the_widget(run):
    timeline = RunTimeline(run, drift=True)
    assert timeline.wait(120)
    assert JUMP_LAYER in timeline.view.data["layers"] and timeline.drift.attrs["depth"] is None
    timeline.depth_choice.value = 1  # as the dropdown: the heatmap is read again
    assert timeline.wait(120)
    assert timeline.drift.attrs["depth"] == 1
    assert timeline.view.data["layer_keys"] == ["embed", "layers"]
    timeline.compute_drift(depth=2)
    assert timeline.depth_choice.value == 2
    assert timeline.wait(120)
    assert timeline.drift.attrs["depth"] == 2
    with pytest.raises(ValueError, match="1 to 3"):
        timeline.compute_drift(depth=7)
    with pytest.raises(TypeError):
        timeline.compute_drift(depth=True)


@pytest.mark.slow
def test_a_click_opens_a_step_the_second_diffs_and_the_page_stays(tmp_path):
    root = tmp_path / "long"
    root.mkdir()
    # More checkpoints than a page of the explorer's list holds.
    for step in range(1, 13):
        save_checkpointables(
            root / f"step_{step}", {"model": {"w": np.full((4,), step, np.float32)}}
        ).result()
    explorer = CheckpointExplorer(root)
    timeline = explorer.timeline
    explorer.timeline_section.toggle.click()
    runs = explorer.runs.view
    page = runs.page
    assert explorer.run_section.is_open and runs.page_count > 1
    _click(timeline, kind="step", step=2)
    assert explorer.checkpoint == str(root / "step_2") and timeline.picked_steps == [2]
    # The list neither folds nor turns its page: the timeline under it stays put.
    assert explorer.run_section.is_open and runs.page == page
    assert "step 2 open" in timeline.picks.value
    _click(timeline, kind="step", step=4)
    diff = explorer.contents.diff_view
    assert timeline.picked_steps == [2, 4]
    assert (diff.older, diff.newer) == (str(root / "step_2"), str(root / "step_4"))
    assert diff.choice.value == str(root / "step_4")  # the choice names what is compared
    # After a diff, a click opens one step again, not a diff with the last pick.
    _click(timeline, kind="step", step=6)
    assert timeline.picked_steps == [6] and explorer.checkpoint == str(root / "step_6")
    assert diff.other is None and diff.diff.empty and diff.choice.value == ""
    # A shift-click only opens, whatever is picked.
    _click(timeline, kind="step", step=3, open_only=True)
    assert timeline.picked_steps == [3] and diff.other is None
    # With "2nd click diffs" unticked, every click opens its step alone.
    timeline.diff_box.value = False
    _click(timeline, kind="step", step=5)
    assert timeline.picked_steps == [5] and explorer.checkpoint == str(root / "step_5")
    assert diff.other is None
    assert explorer.run_section.is_open and runs.page == page
    # Opening a step from the list itself still folds the list to one line.
    explorer.open_checkpoint("step_7")
    assert not explorer.run_section.is_open
    assert timeline.error == "" and explorer.error == ""
    explorer.close()


def test_an_empty_run(tmp_path):
    timeline = RunTimeline(tmp_path)
    assert timeline.view.data["steps"] == []
    assert timeline.metric_picks.layout.display == "none" and timeline.view.metrics == []
    with pytest.raises(FileNotFoundError):
        RunTimeline(tmp_path / "missing")


def test_a_leaf_gone_nan_is_never_drawn_as_a_norm_of_0(run):
    from tinax.widgets._history import history_png, leaf_history

    from tinax.explore import list_checkpoints

    history = leaf_history(list_checkpoints(run), "model", "['layers'][0]['w']")
    assert history["step"].tolist() == list(STEPS)
    for step, norm, nan in zip(history["step"], history["norm"], history["nan"], strict=True):
        if step >= NAN_STEP:
            # Its norm is NaN, as the array's is: not the norm of what is left, nor 0.
            assert math.isnan(norm) and nan == 1
        else:
            assert norm > 1 and nan == 0
    assert (history["inf"] == 0).all()
    assert history_png(history).startswith(b"\x89PNG")
    explorer = CheckpointExplorer(run)
    explorer.open_checkpoint("step_000006")
    explorer.open_leaf("model", "['layers'][0]['w']")
    explorer.show_history()
    assert explorer.wait(60)
    assert explorer.history["nan"].tolist() == [0] * (NAN_STEP - 1) + [1] * (
        len(STEPS) - NAN_STEP + 1
    )
    assert f"NaN/Inf from step {NAN_STEP}" in explorer.leaf_pane.history_status.value
    explorer.close()


@pytest.mark.slow
def test_one_verdict_in_the_list_the_header_and_the_timeline(run, tmp_path):
    import shutil

    # A copy: what this process read of the module's run before is not known of it.
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    explorer = CheckpointExplorer(copy)
    explorer.open_checkpoint(f"step_{NAN_STEP:06d}")
    assert explorer.wait(60)
    verdict = explorer.contents.verdict.value
    # Its logged loss is NaN: diverged from its metadata alone, never beside a green mark.
    assert 'data-health="diverged"' in verdict and "its logged loss is NaN" in verdict
    assert NONFINITE_COLOR in verdict and "✔" not in verdict
    explorer.open_checkpoint(f"step_{ROLLBACK_STEP:06d}")
    assert explorer.wait(60)
    assert "health not yet known" in explorer.contents.verdict.value
    health = dict(zip(explorer.checkpoints["step"], explorer.checkpoints["health"], strict=True))
    assert health[ROLLBACK_STEP] == "not yet known" and health[NAN_STEP] == "diverged"
    explorer.timeline_section.toggle.click()
    timeline = explorer.timeline
    assert timeline.view.data["health"][NAN_STEP - 1] == "diverged"
    # The scan reads every checkpoint: the verdict, the list and the timeline follow.
    timeline.compute_scan()
    assert timeline.wait(120) and explorer.wait(60)
    verdict = explorer.contents.verdict.value
    assert 'data-health="healthy"' in verdict and "sound and healthy" in verdict
    words = [str(w) for w in explorer.checkpoints.sort_values("step")["health"]]
    expected = ["healthy" if s < NAN_STEP else "diverged" for s in STEPS]
    assert words == expected and timeline.view.data["health"] == expected
    assert explorer.checkpoint_view.rows[0]["color"] == NONFINITE_COLOR  # step 6, newest
    # The diverged one says what the scan counted, once: the model's NaN, then the loss.
    explorer.open_checkpoint(f"step_{NAN_STEP:06d}")
    assert explorer.wait(60)
    reason = "1 NaN and 0 Inf in 1 leaf of model; its logged loss is NaN"
    assert reason in explorer.contents.verdict.value
    assert f"diverged from step {NAN_STEP}: {reason}" in timeline.summary.value
    explorer.contents.export_button.click()
    (panel,) = explorer.contents.export_box.children
    assert "model holds 1 NaN and 0 Inf (data read)" in panel.warning.value
    assert explorer.error == "" and timeline.error == ""
    explorer.close()


def test_the_metric_drawn_first_is_the_one_the_run_is_kept_by():
    from tinax.widgets._metric_picks import default_metric

    assert default_metric(["accuracy", "loss", "lr"], "accuracy") == "accuracy"
    assert default_metric(["grad_norm", "loss", "lr"], None) == "loss"
    assert default_metric(["grad_norm", "lr"], "loss") == "grad_norm"
    assert default_metric([], None) is None


def test_a_copy_beside_a_step_is_not_drawn_over_it(run, tmp_path):
    import shutil

    from tinax.checkpointing import derive_checkpoint

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    # A model-only copy of step 3 saved in the run, named with the step it came from.
    derive_checkpoint(copy / "step_000003", copy / "model_3", checkpointables=["model"])
    explorer = CheckpointExplorer(copy)
    timeline = explorer.timeline
    explorer.timeline_section.toggle.click()
    assert timeline.view.data["steps"] == list(STEPS)
    assert "not drawn, at a step drawn already: model_3" in timeline.summary.value
    # Opened from the list, the copy is not the step drawn: a click opens step 3 itself.
    explorer.open_checkpoint("model_3")
    assert timeline.picked_steps == [] and "model_3 open" in timeline.picks.value
    _click(timeline, kind="step", step=3)
    assert explorer.checkpoint == str(copy / "step_000003")
    assert timeline.error == "" and explorer.error == ""
    explorer.close()
