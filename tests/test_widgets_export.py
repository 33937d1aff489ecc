"""ExportPanel: a checkpoint's arrays to safetensors from a notebook, with progress."""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from damage import biggest_data_file, flip_middle_byte
from flax import nnx
from run_view_fixtures import NAN_STEP, write_small_run
from safetensors.numpy import load_file
from tinax.widgets import ExportPanel
from tinax.widgets._caught import _show, warnings_of_this_thread

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
    assert panel.destination.value == str(tmp_path / "weights_2")  # the next one is free


def _said(panel: ExportPanel, text: str) -> int:
    """How many times the panel says ``text``: its message, and the error of a bar."""
    shown = [panel.message.value]
    shown += [bar.error_box.value for bar in panel.progress_box.children]
    return sum(part.count(text) for part in shown)


def test_a_taken_destination_is_refused_at_the_click_and_said_once(checkpoint, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep")
    panel = ExportPanel(checkpoint)
    panel.destination.value = str(taken)
    panel.export_button.click()  # no exception escapes the click
    # Refused before any work starts: no progress bar, one message naming a free name.
    assert panel.progress is None and not panel.exporting
    assert "not empty" in panel.error and "taken_2 is free" in panel.error
    assert _said(panel, "not empty") == 1
    assert [p.name for p in taken.iterdir()] == ["mine.txt"]
    panel.destination.value = ""
    panel.export_button.click()
    assert "destination" in panel.error and not panel.exporting
    np.testing.assert_equal(panel.export_button.disabled, False)


def test_a_failed_export_is_said_once(checkpoint, tmp_path):
    flip_middle_byte(biggest_data_file(checkpoint / "model"))
    panel = ExportPanel(checkpoint)
    panel.destination.value = str(tmp_path / "out")
    panel.export_button.click()
    assert panel.progress is not None and panel.progress.wait(60) == "failed"
    _until(lambda: not panel.exporting)
    assert "corrupt" in panel.error and "Export failed" in panel.message.value
    # The message says it; the bar, which would say it again, is gone.
    assert panel.progress_box.children == ()
    assert _said(panel, "corrupt") == 1


def test_the_destination_proposed_never_exists(checkpoint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "step_10_safetensors").mkdir()
    (tmp_path / "step_10_safetensors" / "old.safetensors").write_text("x")
    panel = ExportPanel(checkpoint)
    assert panel.destination.value == str(tmp_path / "step_10_safetensors_2")
    panel.export_button.click()
    assert panel.progress is not None and panel.progress.wait(60) == "done", panel.progress.error
    _until(lambda: not panel.exporting)
    assert panel.files == [str(tmp_path / "step_10_safetensors_2" / "model.safetensors")]
    # What was written is taken now: the next export is offered the next free name.
    assert panel.destination.value == str(tmp_path / "step_10_safetensors_3")
    assert not (tmp_path / "step_10_safetensors_3").exists()


def test_a_checkpoint_without_arrays_is_refused(tmp_path):
    path = tmp_path / "strings"
    save_checkpointables(path, {"note": {"s": "text"}}).result()
    with pytest.raises(ValueError, match="no arrays"):
        ExportPanel(path)
    with pytest.raises(FileNotFoundError):
        ExportPanel(tmp_path / "absent")


def test_known_nan_is_warned_of_before_anything_is_written(checkpoint, tmp_path):
    panel = ExportPanel(checkpoint, nonfinite={"model": (64, 1)}, found_by="the data check")
    assert "model holds 64 NaN and 1 Inf (the data check)" in panel.warning.value
    assert panel.export_button.description == "Export anyway"
    assert panel.export_button.button_style == "warning"
    assert list(tmp_path.iterdir()) == [tmp_path / "run"]  # nothing written by the warning
    panel.checkpointable.value = "extra"  # nothing known of it
    assert panel.warning.value == "" and panel.export_button.description == "Export"


def test_a_checkpoint_whose_loss_is_nan_is_warned_of(tmp_path):
    run = write_small_run(str(tmp_path / "run"))
    panel = ExportPanel(f"{run}/step_{NAN_STEP:06d}")
    # Nothing read yet: the library's word from its logged loss, and what to do.
    assert "⚠ diverged: its logged loss is NaN; “check data” reads" in panel.warning.value
    assert ExportPanel(f"{run}/step_{NAN_STEP - 1:06d}").warning.value == ""


def _warn(text: str) -> None:
    warnings.warn(text, RuntimeWarning, stacklevel=1)


def test_the_warnings_of_an_export_thread_are_its_own_every_time(monkeypatch):
    shown_elsewhere: list[str] = []
    monkeypatch.setattr(
        warnings, "showwarning", lambda message, *args, **kw: shown_elsewhere.append(str(message))
    )
    filters = list(warnings.filters)
    caught: dict[str, list[str]] = {"a": [], "b": []}
    inside = threading.Barrier(3)
    done = threading.Barrier(3)

    def export(name: str) -> None:
        with warnings_of_this_thread(lambda w: caught[name].append(str(w))):
            inside.wait()
            for _ in range(2):  # the same warning from the same place: both said
                _warn(f"export {name}: 3 tensors hold NaN or Inf")
            done.wait()

    threads = [threading.Thread(target=export, args=(n,)) for n in "ab"]
    for thread in threads:
        thread.start()
    inside.wait()
    _warn("from the notebook itself")  # another thread's: shown as usual
    done.wait()
    for thread in threads:
        thread.join(10)
    assert caught == {
        "a": ["export a: 3 tensors hold NaN or Inf"] * 2,
        "b": ["export b: 3 tensors hold NaN or Inf"] * 2,
    }
    assert shown_elsewhere == ["from the notebook itself"]
    # Everything as it was once no export is watched.
    assert warnings.filters == filters and warnings.showwarning is not _show


def test_the_librarys_warning_of_nan_weights_is_shown_in_the_panel(tmp_path):
    path = tmp_path / "step_3"
    weights = np.ones((8, 8), np.float32)
    weights[0, :3] = np.nan
    save_checkpointables(path, {"model": {"w": weights, "b": np.zeros(8, np.float32)}}).result()
    panel = ExportPanel(path)  # nothing known before: no warning yet
    assert panel.warning.value == ""
    for destination in ("first", "again"):  # said each time, not once per place
        panel.destination.value = str(tmp_path / destination)
        panel.export_button.click()
        assert panel.progress is not None and panel.progress.wait(60) == "done"
        _until(lambda: not panel.exporting)
        assert (
            len(panel.warnings) == 1 and "1 tensor holds NaN or Inf: w (3 NaN)" in panel.warnings[0]
        )
        assert "w (3 NaN)" in panel.warning.value and "wrote 1 file(s)" in panel.message.value
