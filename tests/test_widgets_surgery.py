"""The explorer's "derive…" and "average…": a preview of what the result will hold, a
progress bar bound to the work, and the new checkpoint opened when done."""

from __future__ import annotations

import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from orbax.checkpoint import v1 as ocp
from tinax.widgets import CheckpointExplorer

import tinax.explore as ex
from tinax.checkpointing import save_checkpointables

pytestmark = pytest.mark.filterwarnings("ignore:Sharding info not provided when restoring")


def _until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """Three checkpoints of an NNX model and its AdamW state, the model moved each time."""
    root = tmp_path_factory.mktemp("surgery_widgets") / "run"
    root.mkdir()
    model = nnx.Linear(16, 32, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    for step in (10, 20, 30):
        model.kernel.value = model.kernel.value + 1.0
        save_checkpointables(
            root / f"step_{step:06d}",
            {"model": nnx.state(model), "optimizer": nnx.state(optimizer), "extra": {"step": step}},
        ).result()
    return root


def _open(explorer: CheckpointExplorer, name: str) -> None:
    explorer.open_checkpoint(name)
    _until(lambda: explorer.checkpoint is not None and explorer.checkpoint.endswith(name))


def test_derive_previews_writes_with_progress_and_opens_the_result(run):
    explorer = CheckpointExplorer(run)
    try:
        _open(explorer, "step_000020")
        pane = explorer.contents
        pane.derive_button.click()
        panel = pane.export_box.children[0]
        assert "43 leaves" not in panel.preview.value
        panel.params_only.click()
        assert panel.checkpointables.value == ("model",) and panel.cast.value == "bfloat16"
        # 16 x 32 kernel and 32 biases: read in float32, written in bfloat16.
        assert "2 leaves (2 arrays)" in panel.preview.value
        assert "1.1 KiB written, 2.1 KiB read" in panel.preview.value
        assert panel.destination.value == f"{run}/step_000020_bfloat16"
        panel.key_filter.value = "("
        assert "not a regular expression" in panel.preview.value and panel.run_button.disabled
        panel.key_filter.value = "kernel"
        assert "1 leaves" in panel.preview.value and not panel.run_button.disabled
        panel.run_button.click()
        assert panel.progress.wait(60) == "done", panel.progress.error
        _until(lambda: explorer.checkpoint == f"{run}/step_000020_bfloat16")
        assert panel.written == f"{run}/step_000020_bfloat16"
        assert panel.progress.bytes_done == 16 * 32 * 4
        # The new checkpoint is open, and says where it came from.
        assert list(explorer.leaves["key"]) == ["['kernel']['value']"]
        line = pane.lineage.line
        assert line.text.startswith(f"derived from {run}/step_000020 (step 20, ? not yet known)")
        assert "cast to bfloat16" in line.text
        # The source's path is a link: it opens the source, listed in this run.
        assert [p["text"] for p in line.parts if p["link"] is not None] == [f"{run}/step_000020"]
        line.click(0)
        _until(lambda: explorer.checkpoint == f"{run}/step_000020")
        assert explorer.contents.lineage.line.parts == []
        # A second derive to the same place fails in the panel, not in the notebook.
        _open(explorer, "step_000020")
        pane.derive_button.click()
        panel = pane.export_box.children[0]
        panel.destination.value = f"{run}/step_000020_bfloat16"
        panel.run_button.click()
        assert panel.progress.wait(60) == "failed"
        _until(lambda: not panel.running)
        assert "already exists" in panel.error and "Failed" in panel.message.value
    finally:
        explorer.close()


def test_average_of_ticked_checkpoints_opens_the_result(run, tmp_path):
    explorer = CheckpointExplorer(run)
    try:
        runs = explorer.runs
        with pytest.raises(ValueError, match="tick two or more"):
            runs.show_average()
        paths = [f"{run}/step_{s:06d}" for s in (30, 10)]
        for path in paths:
            runs.view.tick(path, True)
        assert runs.ticked == paths
        explorer.runs.average_button.click()
        panel = runs.average_box.children[0]
        # In step order, the model only by default (the others hold counters).
        assert panel.sources == sorted(paths)
        assert panel.checkpointables.value == ("model",)
        assert "2 leaves (2 arrays)" in panel.preview.value
        panel.checkpointables.value = ("model", "extra")
        assert "2 leaves" not in panel.preview.value
        panel.weights.value = "1"
        assert "1 weights for 2 checkpoints" in panel.preview.value
        panel.weights.value = "1 3"
        panel.checkpointables.value = ("model",)
        panel.destination.value = str(tmp_path / "soup")
        panel.run_button.click()
        assert panel.progress.wait(60) == "done", panel.progress.error
        _until(lambda: panel.written == str(tmp_path / "soup"))
        # Outside the run: not opened, but said where it went.
        _until(lambda: "outside this run" in explorer.message.value)
        a, b = (ocp.load_checkpointables(p)["model"]["kernel"]["value"] for p in sorted(paths))
        got = ocp.load_checkpointables(str(tmp_path / "soup"))["model"]["kernel"]["value"]
        expected = ((np.asarray(a, np.float64) + 3 * np.asarray(b, np.float64)) / 4).astype(
            np.float32
        )
        np.testing.assert_array_equal(got, expected)
        assert list(ex.lineage(tmp_path / "soup")["weight"]) == [0.25, 0.75]
        assert jnp.asarray(got).dtype == jnp.float32
        # With fewer than two ticked, the steps picked in the run timeline are averaged.
        runs.average_button.click()
        assert not runs.average_box.children
        runs.view.tick(paths[0], False)
        explorer.timeline.picked_steps = [20, 30]
        runs.average_button.click()
        assert runs.average_box.children[0].sources == [f"{run}/step_{s:06d}" for s in (20, 30)]
    finally:
        explorer.close()


def test_a_source_outside_the_run_opens_in_an_explorer_of_its_own(run, tmp_path):
    from tinax.checkpointing import derive_checkpoint

    elsewhere = tmp_path / "exports"
    elsewhere.mkdir()
    derive_checkpoint(run / "step_000030", elsewhere / "model_30", checkpointables=["model"])
    explorer = CheckpointExplorer(elsewhere)
    try:
        _open(explorer, "model_30")
        lineage = explorer.contents.lineage
        assert lineage.line.text == (
            f"derived from {run}/step_000030 (step 30, ? not yet known) · checkpointables model"
        )
        lineage.line.click(0)
        assert lineage.elsewhere.shown and len(lineage.elsewhere.body.children) == 1
        source = lineage.elsewhere.body.children[0]
        assert source.checkpoint == f"{run}/step_000030"
        assert "outside this run" in lineage.elsewhere.heading.value
        # A second click closes it; opening another checkpoint closes it too.
        lineage.line.click(0)
        assert not lineage.elsewhere.shown and source.comm is None
        lineage.line.click(0)
        explorer.contents.close()
        assert not lineage.elsewhere.shown and lineage.line.parts == []
        assert explorer.error == ""
    finally:
        explorer.close()


def test_a_diverged_source_is_named_and_used_only_when_allowed(tmp_path):
    import grain
    from tinax.widgets._surgery import DerivePanel

    from tinax.checkpointing import save_training_checkpoint

    iterator = iter(grain.MapDataset.range(8).to_iter_dataset())
    source = tmp_path / "step_000070"
    model = {"w": np.ones((4, 4), np.float32)}
    # Its logged loss is NaN: the library calls it diverged.
    aux = {"loss": float("nan")}
    save_training_checkpoint(source, 70, model, {"count": 7}, np.zeros(2), aux, iterator).result()
    panel = DerivePanel(source)
    assert "step_000070 diverged: its logged loss is NaN" in panel.health_note.value
    assert panel.run_button.disabled and panel.allow_diverged.layout.display == ""
    panel.allow_diverged.value = True
    assert not panel.run_button.disabled
    panel.checkpointables.value = ("model",)
    panel.run_button.click()
    assert panel.progress.wait(60) == "done", panel.progress.error
    _until(lambda: panel.written != "")
    assert ex.lineage(panel.written)["source"].tolist() == [str(source)]
