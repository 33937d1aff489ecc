"""run_table: one row per checkpoint of a run, from metadata only: runs by TrainingRun, the
free functions, Orbax's V1 training.Checkpointer and V0 CheckpointManager, local and gs://."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp0
import pytest
from orbax.checkpoint import v1 as ocp
from run_view_fixtures import NAN_STEP, STEPS, big_run_script, write_small_run

from tinax._format.naming import names
from tinax.checkpointing import save_checkpointables
from tinax.explore import list_checkpoints, run_table


def test_a_training_run_has_its_metrics_save_times_and_why_kept(root):
    write_small_run(f"{root}/run")
    table = run_table(f"{root}/run")
    listing = list_checkpoints(f"{root}/run")
    assert list(table["name"]) == list(listing["name"])
    assert list(table["step"]) == list(STEPS)
    assert set(table["status"]) == {"complete"}
    assert (table["nbytes"] > 0).all()
    assert table["committed"].notna().all()
    assert set(table["kept"]) == {"all kept"}
    # Numeric scalars of the auxiliary dict: not its string, not the wrapper's step.
    assert table.attrs["metrics"] == ["epoch", "learning_rate", "loss"]
    assert "tag" not in table.columns and "step" not in table.attrs["metrics"]
    for step, loss in zip(table["step"], table["loss"], strict=True):
        if step >= NAN_STEP:
            assert math.isnan(loss)
        else:
            assert loss == pytest.approx(1.0 / step)
    assert (table["learning_rate"] == 0.5).all()
    assert (table["save_total_s"] > 0).all()
    assert (table["save_blocked_s"] <= table["save_total_s"]).all()
    assert table.attrs["errors"] == {}


def test_free_function_saves_have_save_times_and_no_metrics(tmp_path):
    for step in (3, 7):
        save_checkpointables(tmp_path / f"ckpt_{step}", {"w": {"x": np.ones(4)}}).result()
    table = run_table(tmp_path)
    assert list(table["step"]) == [3, 7]
    assert table.attrs["metrics"] == []
    assert table["kept"].isna().all()
    assert (table["save_total_s"] > 0).all()
    record = json.loads((tmp_path / "ckpt_3" / names.SAVE_TIMES).read_text())
    assert record["format"] == names.SAVE_TIMES_FORMAT
    assert table["save_blocked_s"].iloc[0] == pytest.approx(record["blocked_s"])


def test_orbax_v1_training_checkpointer_metrics(tmp_path):
    with ocp.training.Checkpointer(tmp_path / "run") as checkpointer:
        for step in (0, 5, 10):
            checkpointer.save_pytree(
                step, {"w": np.full((2,), step, np.float32)}, metrics={"accuracy": step / 10}
            )
    table = run_table(tmp_path / "run")
    assert list(table["step"]) == [0, 5, 10]
    assert list(table["accuracy"]) == [0.0, 0.5, 1.0]
    # Not saved by tinax: no save times.
    assert table["save_total_s"].isna().all()


def test_orbax_v0_checkpoint_manager_metrics(tmp_path):
    # V0 records metrics when its options rank checkpoints by them.
    options = ocp0.CheckpointManagerOptions(best_fn=lambda m: m["loss"], best_mode="min")
    with ocp0.CheckpointManager(tmp_path / "run", options=options) as manager:
        for step in (1, 2):
            manager.save(
                step,
                args=ocp0.args.Composite(model=ocp0.args.StandardSave({"w": np.ones(3) * step})),
                metrics={"loss": 2.0 / step},
            )
        manager.wait_until_finished()
    table = run_table(tmp_path / "run")
    assert list(table["step"]) == [1, 2]
    assert list(table["loss"]) == [2.0, 1.0]


@pytest.mark.slow
def test_a_checkpoint_that_is_not_complete_has_no_metrics(tmp_path):
    write_small_run(str(tmp_path / "run"))
    partial = tmp_path / "run" / "step_000009.orbax-checkpoint-tmp-1"
    shutil.copytree(tmp_path / "run" / "step_000002", partial)
    (partial / names.CHECKPOINT_METADATA).unlink()
    (partial / "commit_success.txt").unlink(missing_ok=True)
    table = run_table(tmp_path / "run")
    row = table[table["name"] == partial.name].iloc[0]
    assert row["status"] != "complete"
    assert math.isnan(row["loss"]) and math.isnan(row["save_total_s"])


def test_bad_input(tmp_path):
    with pytest.raises(TypeError, match="auxiliary"):
        run_table(tmp_path, auxiliary=3)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        run_table(tmp_path / "missing")
    with pytest.raises(TypeError):
        run_table(42)  # type: ignore[arg-type]


def test_a_training_save_records_its_metrics_with_its_commit(tmp_path):
    write_small_run(str(tmp_path / "run"))
    commit = json.loads((tmp_path / "run" / "step_000003" / names.CHECKPOINT_METADATA).read_text())
    recorded = commit["custom_metadata"][names.METRICS_RECORD]
    assert recorded["checkpointable"] == "auxiliary"
    assert recorded["values"]["loss"] == pytest.approx(1 / 3)
    # The table reads them there, not the auxiliary state: a value that no longer
    # matches it on disk is for a load or verify to find, the save's metrics stand.
    records = tmp_path / "run" / "step_000003" / "auxiliary" / names.CHECKSUMS_DIR
    shutil.rmtree(records.parent / "d")
    table = run_table(tmp_path / "run")
    assert table.set_index("step").loc[3, "loss"] == pytest.approx(1 / 3)
    assert str(tmp_path / "run" / "step_000003") not in table.attrs["errors"]


def test_an_auxiliary_value_that_differs_from_its_checksum_is_reported(tmp_path):
    write_small_run(str(tmp_path / "run"))
    # As a save without tinax's record of its metrics (Orbax's, an older tinax's): the
    # table reads the auxiliary state, checked against its checksums.
    commit_file = tmp_path / "run" / "step_000002" / names.CHECKPOINT_METADATA
    commit = json.loads(commit_file.read_text())
    del commit["custom_metadata"][names.METRICS_RECORD]
    commit_file.write_text(json.dumps(commit))
    records = tmp_path / "run" / "step_000002" / "auxiliary" / names.CHECKSUMS_DIR
    record_file = next(records.iterdir())
    record = json.loads(record_file.read_text())
    loss = record["leaves"]["['state']['loss']"]
    loss["pieces"][0][1] = "0" * 16
    record_file.write_text(json.dumps(record))
    table = run_table(tmp_path / "run")
    bad = str(tmp_path / "run" / "step_000002")
    assert "does not match its checksum" in table.attrs["errors"][bad]
    assert math.isnan(table.set_index("step").loc[2, "loss"])
    assert table.set_index("step").loc[3, "loss"] == pytest.approx(1 / 3)


def test_the_big_demo_run(big_run):
    demo = big_run_script()
    table = run_table(big_run)
    assert list(table["step"]) == list(demo.CHECKPOINT_STEPS)
    losses = table.set_index("step")["loss"]
    assert all(math.isnan(losses[s]) for s in demo.NONFINITE_STEPS)
    assert all(np.isfinite(losses[s]) for s in demo.CHECKPOINT_STEPS if s < demo.NAN_STEP)
    # The jump of a layer shows in the loss of the next checkpoint.
    after = demo.JUMP_STEP + demo.CHECKPOINT_EVERY
    assert losses[after] > 10 * losses[demo.JUMP_STEP]
    assert (table["save_blocked_s"] > 0).all()


@pytest.mark.slow
def test_three_hundred_checkpoints_in_a_fresh_process(tmp_path):
    write_small_run(str(tmp_path / "one"))
    run = tmp_path / "run"
    run.mkdir()
    for step in range(1, 301):
        shutil.copytree(tmp_path / "one" / "step_000002", run / f"step_{step:06d}")
    code = (
        "import sys\n"
        "from tinax.explore import run_table\n"
        "table = run_table(sys.argv[1])\n"
        "print(len(table), table['loss'].notna().sum())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(run)], capture_output=True, text=True, check=True
    )
    rows, losses = done.stdout.split()
    # Its speed (a goal of 1 s) is measured by bench/run_timeline.py.
    assert (int(rows), int(losses)) == (300, 300)


def test_run_table_reads_no_array_data(tmp_path, monkeypatch):
    write_small_run(str(tmp_path / "run"))
    import tensorstore

    def refuse(*args, **kwargs):
        raise AssertionError("run_table opened an array")

    monkeypatch.setattr(tensorstore, "open", refuse)
    table = run_table(tmp_path / "run")
    assert table["loss"].notna().sum() == NAN_STEP - 1
    assert Path(tmp_path / "run").is_dir()


def test_a_save_times_record_that_is_not_one_is_ignored(tmp_path):
    for step in (1, 2, 3):
        save_checkpointables(tmp_path / f"ckpt_{step}", {"w": {"x": np.ones(2)}}).result()
    (tmp_path / "ckpt_1" / names.SAVE_TIMES).write_text("not json")
    (tmp_path / "ckpt_2" / names.SAVE_TIMES).write_text(
        json.dumps({"format": names.SAVE_TIMES_FORMAT, "blocked_s": -1, "total_s": 2})
    )
    table = run_table(tmp_path)
    assert table["save_total_s"].isna().tolist() == [True, True, False]
    # The record's name is Orbax's and tinax's own: no checkpointable may take it.
    from tinax.checkpointing import validate_checkpointable_name

    with pytest.raises(ValueError):
        validate_checkpointable_name(names.SAVE_TIMES)
