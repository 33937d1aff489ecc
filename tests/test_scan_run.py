"""scan_run: NaN/Inf in every checkpoint, the first non-finite step and the roll-back step."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pandas as pd
import pytest
from run_view_fixtures import NAN_STEP, ROLLBACK_STEP, STEPS, big_run_script, write_small_run

from tinax.explore import scan_run
from tinax.explore._run_view import scan as _scan_run
from tinax.explore._run_view.scan import DIVERGED, FINITE, NOT_COMPLETE, NOT_SCANNED, NOT_SOUND


@pytest.fixture
def small_run(tmp_path) -> str:
    return write_small_run(str(tmp_path / "run"))


def test_the_first_nonfinite_step_and_the_rollback_step(small_run):
    table = scan_run(small_run, leaves=True)
    assert list(table["step"]) == list(STEPS)
    verdicts = dict(zip(table["step"], table["verdict"], strict=True))
    assert all(verdicts[s] == (DIVERGED if s >= NAN_STEP else FINITE) for s in STEPS)
    assert table.attrs["first_nonfinite_step"] == NAN_STEP
    assert table.attrs["rollback_step"] == ROLLBACK_STEP
    bad = table[table["step"] >= NAN_STEP]
    # One NaN in layers.0's kernel, one NaN loss in the auxiliary state.
    assert (bad["nan"] == 2).all() and (bad["inf"] == 0).all()
    assert (table[table["step"] < NAN_STEP]["nan"] == 0).all()
    leaves = table.attrs["leaves"]
    assert set(leaves["step"]) == {s for s in STEPS if s >= NAN_STEP}
    assert set(leaves["key"]) == {"['layers'][0]['w']", "['state']['loss']"}


def _damage_a_checksum(checkpointable: Path) -> None:
    """Makes the saved checksum of one array disagree with its bytes."""
    record_file = next((checkpointable / "tinax_checksums").iterdir())
    record = json.loads(record_file.read_text())
    record["leaves"]["['layers'][1]['w']"]["pieces"][0][1] = "0" * 16
    record_file.write_text(json.dumps(record))


def test_a_damaged_checkpoint_is_not_a_rollback_point(small_run):
    _damage_a_checksum(Path(small_run) / f"step_{ROLLBACK_STEP:06d}" / "model")
    table = scan_run(small_run)
    row = table.set_index("step").loc[ROLLBACK_STEP]
    assert row["verdict"] == NOT_SOUND
    assert "not sound" in table.attrs["problems"][str(row["path"])]
    assert table.attrs["rollback_step"] == ROLLBACK_STEP - 1


def test_a_run_without_nan_has_no_rollback_step(tmp_path):
    run = write_small_run(str(tmp_path / "run"))
    for step in STEPS:
        if step >= NAN_STEP:
            shutil.rmtree(f"{run}/step_{step:06d}")
    table = scan_run(run)
    assert set(table["verdict"]) == {FINITE}
    assert table.attrs["first_nonfinite_step"] is None
    assert table.attrs["rollback_step"] is None


def test_scanned_checkpoints_are_not_read_again(small_run, monkeypatch):
    scan_run(small_run)

    def refuse(path):
        raise AssertionError(f"{path} was read again")

    monkeypatch.setattr(_scan_run, "_scan", refuse)
    again = scan_run(small_run)
    assert again.attrs["first_nonfinite_step"] == NAN_STEP


def test_an_interrupted_save_is_not_complete_and_not_read(small_run):
    partial = f"{small_run}/step_000099.orbax-checkpoint-tmp-1"
    shutil.copytree(f"{small_run}/step_000002", partial)
    os.remove(f"{partial}/_CHECKPOINT_METADATA")
    table = scan_run(small_run)
    row = table[table["name"] == "step_000099.orbax-checkpoint-tmp-1"].iloc[0]
    assert row["verdict"] == NOT_COMPLETE and row["nan"] is pd.NA


def test_progress_and_cancel(small_run):
    seen = []
    scan_run(small_run, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(i, len(STEPS)) for i in range(1, len(STEPS) + 1)]
    stop = threading.Event()

    def progress(done: int, total: int) -> None:
        if done == 2:
            stop.set()

    _scan_run._scanned.clear()
    partial = scan_run(small_run, progress=progress, cancel=stop)
    assert partial.attrs["cancelled"] is True
    assert list(partial["verdict"][:2]) == [FINITE, FINITE]
    assert set(partial["verdict"][2:]) == {NOT_SCANNED}
    assert partial["nan"][2:].isna().all()


def test_bad_input(tmp_path):
    with pytest.raises(TypeError, match="leaves"):
        scan_run(tmp_path, leaves=1)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        scan_run(tmp_path / "missing")


def test_the_big_demo_run(big_run):
    demo = big_run_script()
    table = scan_run(big_run)
    assert table.attrs["first_nonfinite_step"] == demo.FIRST_NONFINITE_STEP
    assert table.attrs["rollback_step"] == demo.ROLLBACK_STEP
    nonfinite = table[table["verdict"] == DIVERGED]
    assert list(nonfinite["step"]) == list(demo.NONFINITE_STEPS)


def test_drift_and_scan_of_a_run_on_every_storage(root):
    from run_view_fixtures import JUMP_LAYER, JUMP_STEP

    from tinax.explore import drift_table, run_table

    run = write_small_run(f"{root}/run")
    scan = scan_run(run)
    assert scan.attrs["first_nonfinite_step"] == NAN_STEP
    assert scan.attrs["rollback_step"] == ROLLBACK_STEP
    drift = drift_table(run)
    top = drift.loc[drift["rel_update"].idxmax()]
    assert (top["subtree"], top["step"]) == (JUMP_LAYER, JUMP_STEP)
    assert list(run_table(run)["step"]) == list(STEPS)
