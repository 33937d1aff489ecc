"""ExportPanel: a checkpoint's arrays to safetensors from a notebook, with progress."""

from __future__ import annotations

import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file
from tinax.widgets import ExportPanel

from tinax.checkpointing import save_checkpointables


def _until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    model = nnx.Linear(32, 64, rngs=nnx.Rngs(0))
    path = tmp_path / "run" / "step_10"
    path.parent.mkdir()
    state = {"model": nnx.state(model), "extra": {"count": jnp.int32(3)}, "note": {"s": "x"}}
    save_checkpointables(path, state).result()
    return path


def test_export_writes_the_chosen_checkpointable_with_progress(checkpoint, tmp_path):
    panel = ExportPanel(checkpoint)
    assert list(panel.checkpointable.options) == ["model", "extra"]
    assert panel.checkpointable.value == "model"
    assert panel.total_bytes() == (32 * 64 + 64) * 4
    panel.dtype.value = "bfloat16"
    assert panel.total_bytes() == (32 * 64 + 64) * 2
    panel.dtype.value = "as stored"
    panel.destination.value = str(tmp_path / "weights")
    panel.export_button.click()
    assert panel.progress is not None and panel.progress.wait(60) == "done", panel.progress.error
    _until(lambda: not panel.exporting)
    assert panel.files == [str(tmp_path / "weights" / "model.safetensors")]
    assert panel.progress.bytes_done == panel.total_bytes()
    tensors = load_file(panel.files[0])
    assert sorted(tensors) == ["bias", "kernel"] and tensors["kernel"].shape == (32, 64)
    assert "wrote 1 file(s)" in panel.message.value and not panel.error
    assert not panel.export_button.disabled


def test_a_failed_export_is_shown_in_the_panel(checkpoint, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep")
    panel = ExportPanel(checkpoint)
    panel.destination.value = str(taken)
    panel.export_button.click()  # no exception escapes the click
    assert panel.progress is not None and panel.progress.wait(60) == "failed"
    _until(lambda: not panel.exporting)
    assert "not empty" in panel.error and "Export failed" in panel.message.value
    assert [p.name for p in taken.iterdir()] == ["mine.txt"]
    panel.destination.value = ""
    panel.export_button.click()
    assert "destination" in panel.error and not panel.exporting
    np.testing.assert_equal(panel.export_button.disabled, False)


def test_a_checkpoint_without_arrays_is_refused(tmp_path):
    path = tmp_path / "strings"
    save_checkpointables(path, {"note": {"s": "text"}}).result()
    with pytest.raises(ValueError, match="no arrays"):
        ExportPanel(path)
    with pytest.raises(FileNotFoundError):
        ExportPanel(tmp_path / "absent")
