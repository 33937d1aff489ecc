"""RunTimeline driven through its Python objects and the messages its view sends, on a
real run with a planted jump and NaN; alone and as the explorer's timeline."""

from __future__ import annotations

from pathlib import Path

import pytest
from run_view_fixtures import JUMP_LAYER, JUMP_STEP, NAN_STEP, ROLLBACK_STEP, STEPS, write_small_run
from tinax.widgets import CheckpointExplorer, RunTimeline


@pytest.fixture
def run(tmp_path: Path) -> str:
    return write_small_run(str(tmp_path / "run"))


def _click(timeline: RunTimeline, **content) -> None:
    # What the browser's view sends on a click (timeline.js).
    timeline.view._handle_custom_msg(content, [])


def test_metrics_and_save_times_are_drawn_at_once(run):
    timeline = RunTimeline(run)
    data = timeline.view.data
    assert data["steps"] == list(STEPS)
    assert timeline.metric_choice.value == "loss" and timeline.view.metric == "loss"
    assert set(timeline.metric_choice.options) == {"epoch", "learning_rate", "loss"}
    # NaN is sent as a gap (null), never as an invalid JSON number.
    assert data["metrics"]["loss"][: NAN_STEP - 1] == pytest.approx(
        [1 / s for s in STEPS if s < NAN_STEP]
    )
    assert data["metrics"]["loss"][NAN_STEP - 1 :] == [None] * (len(STEPS) - NAN_STEP + 1)
    assert all(t > 0 for t in data["save_total_s"])
    assert "heat" not in data
    timeline.metric_choice.value = "learning_rate"
    assert timeline.view.metric == "learning_rate"
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
    timeline.cancel_button.click()
    assert timeline.wait(120)
    assert timeline.cancel_button.disabled and not timeline.drift_button.disabled
    pairs = timeline.drift.attrs["pairs"]
    assert timeline.drift.attrs["cancelled"] == (pairs < len(STEPS) - 1)
    assert ("cancelled" in timeline.message.value) == timeline.drift.attrs["cancelled"]
    timeline.pick_step(3)
    assert seen == [("step", 3)]


def test_an_empty_run(tmp_path):
    timeline = RunTimeline(tmp_path)
    assert timeline.view.data["steps"] == []
    assert timeline.metric_choice.layout.display == "none"
    with pytest.raises(FileNotFoundError):
        RunTimeline(tmp_path / "missing")
