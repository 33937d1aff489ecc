"""The explorer as a researcher uses it on real runs that go wrong (``divergence_fixtures``):
a flax NNX model trained with optax's adamw whose loss, then every weight and moment, goes
NaN; and a Linen model with BatchNorm statistics, whose drift is read by layer."""

from __future__ import annotations

from pathlib import Path

import pytest
from divergence_fixtures import (
    LAST_FINITE_STEP,
    LINEN_STEPS,
    NAN_STEP,
    STEPS,
    write_linen_run,
    write_nnx_run,
)
from tinax.widgets import CheckpointExplorer, RunTimeline
from tinax.widgets._timeline_data import NAN_CELL

# Real JAX training steps write the runs (about 10 s): for ``make test``, not ``make check``.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nnx_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(write_nnx_run(str(tmp_path_factory.mktemp("nnx") / "run")))


@pytest.fixture(scope="module")
def linen_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(write_linen_run(str(tmp_path_factory.mktemp("linen") / "run")))


def _click(timeline: RunTimeline, step: int) -> None:
    timeline.view._handle_custom_msg({"kind": "step", "step": step}, [])


def test_a_real_divergence_is_in_plain_sight_in_the_explorer(nnx_run: Path) -> None:
    explorer = CheckpointExplorer(nnx_run)
    timeline = explorer.timeline
    explorer.timeline_section.toggle.click()
    # The loss, a JAX float32 as the jitted step returned it, is marked NaN at once.
    assert timeline.view.data["metric_nonfinite"]["loss"][0] == [NAN_STEP, "NaN"]
    assert f"diverged from step {NAN_STEP}: its logged eval.loss and loss are NaN" in (
        timeline.summary.value
    )
    # The step before the NaN, then the first NaN one: their diff.
    _click(timeline, LAST_FINITE_STEP)
    _click(timeline, NAN_STEP)
    diff = explorer.contents.diff_view
    assert timeline.picked_steps == [LAST_FINITE_STEP, NAN_STEP] and not diff.diff.empty
    texts = [row.children[2].value for row in diff.bars.children[1:]]
    # Every layer went NaN: each bar says so by its counts; none reads "0 %".
    assert texts and all(t.startswith("NaN/Inf in ") for t in texts), texts
    assert not any("0 %" in t for t in texts)
    labels = [row.children[0].value for row in diff.bars.children[1:]]
    assert "model layers.0" in labels and "model head" in labels
    first = diff.table.frame.iloc[0]
    assert first["nonfinite"] == "became non-finite" and "(was finite)" in first["change"]
    # The diff opened the older; the next click opens the NaN one alone. Its data
    # check: diverged, never sound.
    _click(timeline, NAN_STEP)
    assert timeline.picked_steps == [NAN_STEP] and diff.diff.empty
    explorer.data_check.start(in_thread=False)
    assert 'data-status="diverged"' in explorer.contents.verdict.value
    assert "✔" not in explorer.data_check.label.value
    # The scan and the drift at once: the NaN layers in their own state, the roll-back.
    timeline.compute_scan()
    timeline.compute_drift()
    assert timeline.wait(120)
    data = timeline.view.data
    assert data["nonfinite_steps"] == [s for s in STEPS if s >= NAN_STEP]
    assert data["rollback_step"] == LAST_FINITE_STEP
    for column, step in enumerate(data["heat_steps"]):
        states = {row[column] for row in data["heat_state"]}
        assert states == ({NAN_CELL} if step >= NAN_STEP else {None}), (step, states)
    assert timeline.error == "" and explorer.error == ""
    explorer.close()


def test_a_linen_runs_drift_is_read_by_layer_and_by_depth(linen_run: Path) -> None:
    timeline = RunTimeline(linen_run, drift=True)
    assert timeline.wait(120)
    layers = {
        "params.Dense_0",
        "params.Dense_1",
        "params.BatchNorm_0",
        "batch_stats.BatchNorm_0",
    }
    # params and batch_stats looked through: the layers, not two rows.
    assert set(timeline.view.data["layer_keys"]) == layers
    assert timeline.view.data["heat_steps"] == list(LINEN_STEPS[1:])
    timeline.depth_choice.value = 2
    assert timeline.wait(120)
    deep = set(timeline.view.data["layer_keys"])
    assert {"params.Dense_0.kernel", "batch_stats.BatchNorm_0.mean"} <= deep
    assert timeline.error == ""
