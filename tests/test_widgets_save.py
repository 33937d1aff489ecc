"""SavePanel: names checked before anything is written, saves with progress."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import optax
import orbax.checkpoint.experimental.v1 as ocp
import pytest
from flax import nnx
from tinax.widgets import AsyncProgress, SavePanel

from tinax.checkpointing import abstract_restore_target, load_checkpointables, save_checkpointables
from tinax.explore import list_checkpoints


def test_default_name_is_the_next_free_step(tmp_path: Path) -> None:
    # An empty directory starts in TrainingRun's pattern; a stray folder keeps its name.
    (tmp_path / "step_000000").mkdir()
    assert SavePanel(tmp_path, {"a": {"x": np.zeros(2)}}).name_field.value == "step_000001"
    (tmp_path / "step_000000").rmdir()
    save_checkpointables(tmp_path / "step-3", {"a": {"x": np.zeros(2)}}).result()
    # A save in progress holds its name too.
    (tmp_path / "step-5.orbax-checkpoint-tmp-1234").mkdir()
    (tmp_path / "notes").mkdir()
    # Steps 3 and 5: the run saves every 2 steps, and step-5 is taken.
    assert SavePanel(tmp_path, {"a": {"x": np.zeros(2)}}).name_field.value == "step-7"


def _optimizer_state() -> Any:
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    return nnx.state(optimizer)


def test_the_next_name_follows_the_runs_own_pattern_and_the_status_tracks_the_save(
    tmp_path: Path,
) -> None:
    state = {"optimizer": _optimizer_state()}
    for step in range(50, 400, 50):
        ocp.save_checkpointables(tmp_path / f"step_{step:06d}", state)
    panel = SavePanel(tmp_path, state)
    assert panel.name_field.value == "step_000400"
    panel.save_button.click()
    assert panel.progress is not None and panel.progress.wait(60) == "done", panel.progress.error
    # Once the save is over, nothing in the panel still says it is saving.
    assert panel.progress.label.value == "saved step_000400"
    assert panel.progress.info.value.startswith("done")
    assert re.search(r"saved step_000400 in \d+\.\d+ s", panel.message.value)
    assert "saving" not in panel.message.value
    assert panel.name_field.value == "step_000450"
    listing = list_checkpoints(tmp_path)
    assert listing["step"].tolist() == list(range(50, 450, 50))


@pytest.mark.parametrize(
    ("checkpoints", "others", "proposed"),
    [
        (["0", "1", "2"], [], "3"),
        (["ckpt-0007", "ckpt-0009"], [], "ckpt-0011"),
        # Directories that are not checkpoints do not set the pattern.
        (["checkpoint_10", "checkpoint_20"], ["logs_2026", "notes", "eval_25"], "checkpoint_30"),
        (["step_99"], [], "step_100"),
        (["step_000990", "step_999990"], [], "step_1998990"),
        # A save still being written counts; a name already taken is skipped.
        (["step_10"], ["step_20.orbax-checkpoint-tmp-5"], "step_30"),
        (["step_10", "step_20"], ["step_30"], "step_40"),
    ],
)
def test_next_name_patterns(
    tmp_path: Path, checkpoints: list[str], others: list[str], proposed: str
) -> None:
    for name in checkpoints:
        ocp.save_checkpointables(tmp_path / name, {"a": {"x": np.zeros(2)}})
    for name in others:
        (tmp_path / name).mkdir()
    assert SavePanel(tmp_path, {"a": {"x": np.zeros(2)}}).name_field.value == proposed


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "empty"),
        ("a/b", "reserved character"),
        ("..", "dot path component"),
        ("x.orbax-checkpoint-tmp", "temporary"),
        ("step-3", "already taken"),
        ("step-5", "in progress"),
        ("_CHECKPOINT_METADATA", "reserved"),
    ],
)
def test_bad_or_taken_names_are_refused_before_writing(
    tmp_path: Path, name: str, reason: str
) -> None:
    save_checkpointables(tmp_path / "step-3", {"a": {"x": np.zeros(2)}}).result()
    (tmp_path / "step-5.orbax-checkpoint-tmp-99").mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    panel = SavePanel(tmp_path, {"a": {"x": np.ones(2)}})
    panel.name_field.value = name
    assert reason in panel.name_error
    assert panel.save_button.disabled
    assert "Cannot save" in panel.message.value
    panel.save_button.click()  # disabled in the browser; a direct click is refused too
    assert panel.progress is None
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    panel.name_field.value = "fine"
    assert panel.name_error == "" and not panel.save_button.disabled


def test_a_name_an_interrupted_save_left_behind_can_be_saved_again(tmp_path: Path) -> None:
    from claim_holder import Holder

    leftover = tmp_path / "step-5.orbax-checkpoint-tmp"
    (leftover / "a").mkdir(parents=True)
    holder = Holder(tmp_path / "step-5")
    try:
        panel = SavePanel(tmp_path, {"a": {"x": np.ones(2)}})
        panel.name_field.value = "step-5"
        assert "in progress" in panel.name_error  # its writer still runs
        holder.kill()
        panel.name_field.value = "step-50"
        panel.name_field.value = "step-5"
        assert panel.name_error == "" and not panel.save_button.disabled
        panel.save_button.click()
        assert panel.progress is not None
        assert panel.response is not None
        panel.response.result()
    finally:
        holder.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-5"]


def test_save_evaluates_the_callable_at_click_time(root: str) -> None:
    """On local disk, then on gs://."""
    state = {"model": {"w": np.arange(4.0)}}
    panel = SavePanel(
        root, lambda: {"model": state["model"], "extra": {"n": np.asarray(7, np.int32)}}
    )
    state["model"] = {"w": np.arange(4.0) * 10}
    panel.save_button.click()
    assert isinstance(panel.progress, AsyncProgress)
    assert panel.progress.wait(60) == "done", panel.progress.error
    assert panel.path == f"{root}/step_000000"
    assert panel.progress.total_bytes == 4 * 8 + 4
    restored = load_checkpointables(
        f"{root}/step_000000", {"model": abstract_restore_target(state["model"])}
    )
    np.testing.assert_array_equal(restored["model"]["w"], np.arange(4.0) * 10)
    assert not panel.saving
    assert panel.name_field.value == "step_000001"
    assert not panel.save_button.disabled
    assert "saved step_000000" in panel.message.value
    # A second save goes to the next name.
    panel.save_button.click()
    assert panel.progress.wait(60) == "done"
    assert list(list_checkpoints(root)["name"]) == ["step_000000", "step_000001"]
    assert panel.name_field.value == "step_000002"


def test_a_mapping_is_saved_as_given(tmp_path: Path) -> None:
    panel = SavePanel(str(tmp_path), {"params": {"b": np.ones((3, 2), np.float32)}})
    panel.name_field.value = "initial"
    panel.save_button.click()
    assert panel.progress is not None and panel.progress.wait(60) == "done"
    restored = load_checkpointables(
        tmp_path / "initial", {"params": {"b": abstract_restore_target(np.ones((3, 2), "f4"))}}
    )
    np.testing.assert_array_equal(restored["params"]["b"], np.ones((3, 2)))


def _boom() -> Any:
    raise RuntimeError("state is not ready")


@pytest.mark.parametrize(
    ("source", "shown"),
    [
        (_boom, "RuntimeError: state is not ready"),
        (lambda: [1, 2], "must return a mapping"),
        (lambda: {"model": {"f": print}}, "which Orbax cannot store"),
        (lambda: {"bad/name": {"x": np.zeros(1)}}, "reserved character"),
    ],
)
def test_errors_at_click_are_shown_not_raised(tmp_path: Path, source: Any, shown: str) -> None:
    panel = SavePanel(tmp_path, source)
    panel.save_button.click()  # must not raise
    assert shown in panel.error
    assert "Save failed" in panel.message.value
    assert not panel.saving and not panel.save_button.disabled
    assert list(tmp_path.iterdir()) == []


def test_constructor_checks_its_arguments(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        SavePanel(3, {"a": {}})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        SavePanel(tmp_path, [("a", 1)])  # type: ignore[arg-type]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        SavePanel(tmp_path / "file", {"a": {}})
    # A missing directory is made by the first save, unless a file stands in its way.
    with pytest.raises(ValueError, match="cannot make directory .* is not a directory"):
        SavePanel(tmp_path / "file" / "saves", {"a": {}})
    assert (tmp_path / "file").read_text() == "x"


def test_a_relative_directory_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path)
    panel = SavePanel("run", {"model": {"w": np.arange(3.0)}})
    panel.save_button.click()
    assert panel.progress is not None and panel.progress.wait(60) == "done", panel.progress.error
    assert (tmp_path / "run" / "step_000000" / "_CHECKPOINT_METADATA").is_file()


def test_a_missing_directory_is_made_by_the_first_save(tmp_path: Path) -> None:
    where = tmp_path / "saves" / "model"
    panel = SavePanel(where, {"model": {"w": np.arange(3.0)}})
    assert not where.exists()  # nothing is written before a click
    assert "made at the first save" in panel.where_html.value
    assert panel.name_field.value == "step_000000" and not panel.save_button.disabled
    panel.save_button.click()
    assert panel.progress is not None and panel.progress.wait(60) == "done", panel.progress.error
    assert panel.error == ""
    assert list_checkpoints(where)["name"].tolist() == ["step_000000"]
    assert "made at the first save" not in panel.where_html.value
    assert panel.name_field.value == "step_000001"


def _training_run(directory: Path) -> None:
    """A TrainingRun with checkpoints of steps 50 and 100, as a training script leaves it."""
    import grain

    from tinax.checkpointing import TrainingRun

    iterator = iter(grain.MapDataset.range(8).to_iter_dataset())
    with TrainingRun(directory, save_every=50, handle_sigterm=False) as run:
        for step in (50, 100):
            next(iterator)
            run.save(
                step, {"w": np.full(3, step, np.float32)}, {"mu": np.zeros(3)}, 0, {}, iterator
            )


def test_a_training_runs_directory_is_refused_with_the_reason(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _training_run(run)
    before = sorted(p.name for p in run.iterdir())
    panel = SavePanel(run, lambda: {"model": {"w": np.ones(3, np.float32)}})
    assert "TrainingRun's directory (it holds the run's record)" in panel.refused
    assert f"{str(run) + '-saves'!r}" in panel.refused  # where to save instead
    assert panel.save_button.disabled
    assert "Cannot save here" in panel.message.value
    panel.save_button.click()  # disabled in the browser; a direct click is refused too
    assert panel.progress is None and panel.error == ""
    panel.name_field.value = "snapshot"  # no name makes it acceptable
    assert panel.save_button.disabled
    assert sorted(p.name for p in run.iterdir()) == before
    # The newest complete checkpoint is still the run's own.
    listing = list_checkpoints(run)
    assert listing["name"].tolist() == ["step_000050", "step_000100"]
    # One click saves beside the run instead, into a directory the save makes.
    assert panel.elsewhere_button.layout.display == ""
    assert panel.elsewhere_button.description == "save into run-saves instead"
    panel.elsewhere_button.click()
    assert panel.refused == "" and panel.error == ""
    assert panel.directory == str(tmp_path / "run-saves")
    assert panel.elsewhere_button.layout.display == "none"
    assert panel.name_field.value == "step_000000" and not panel.save_button.disabled
    panel.save_button.click()
    assert panel.progress is not None and panel.progress.wait(60) == "done", panel.progress.error
    assert list_checkpoints(tmp_path / "run-saves")["name"].tolist() == ["step_000000"]
    assert list_checkpoints(run)["name"].tolist() == ["step_000050", "step_000100"]


def test_a_run_started_after_the_panel_was_made_is_refused_at_the_click(tmp_path: Path) -> None:
    run = tmp_path / "run"
    panel = SavePanel(run, lambda: {"model": {"w": np.ones(3, np.float32)}})
    assert panel.refused == "" and not panel.save_button.disabled
    _training_run(run)
    panel.name_field.value = "step_000150"
    panel.save_button.click()
    assert "TrainingRun" in panel.refused and "(model)" in panel.refused
    assert panel.progress is None and panel.save_button.disabled
    assert list_checkpoints(run)["name"].tolist() == ["step_000050", "step_000100"]
