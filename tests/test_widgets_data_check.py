"""The explorer's "check data": verify with data in the background, NaN/Inf per leaf."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from damage import biggest_data_file, flip_middle_byte
from tinax.widgets import CheckpointExplorer

from tinax.checkpointing import save_checkpointables


def _save(path: Path, weights: np.ndarray) -> None:
    state = {"model": {"w": weights, "b": np.zeros(4, np.float32)}, "step": np.asarray(3)}
    save_checkpointables(path, state).result()


def test_check_data_counts_nan_and_inf_per_leaf(tmp_path: Path) -> None:
    weights = np.ones((8, 8), np.float32)
    weights[0, 0], weights[1, 1], weights[2, 2] = np.nan, np.nan, np.inf
    _save(tmp_path / "step-1", weights)
    explorer = CheckpointExplorer(tmp_path)
    check = explorer.data_check
    assert check.button.disabled  # nothing open yet
    assert check.button in explorer.contents.actions.children
    explorer.open_checkpoint("step-1")
    assert not check.button.disabled
    check.start(in_thread=False)
    assert check.status == "done" and check.result is not None and check.result.data
    # A model holding NaN is diverged, never sound (verify's status).
    assert (
        'data-ok="false"' in check.label.value and "diverged: 2 NaN and 1 Inf" in check.label.value
    )
    assert "metadata and data" in check.label.value
    first = check.table.frame.iloc[0]  # the leaf with NaNs first
    assert (first["key"], first["nan_count"], first["inf_count"]) == ("['w']", 2, 1)
    assert check.table.rows[0]["background"] == "#fde7e9"
    # Only the leaf to look at is listed; the clean ones are counted in the line.
    assert check.table.frame["key"].tolist() == ["['w']"]
    assert "3 arrays" in check.label.value and "1 with NaN, Inf" in check.label.value
    # The check shows in its own section, opened where its button is: under the actions.
    body = list(explorer.contents.section.body.children)
    assert explorer.contents.data_section.shown
    assert body.index(explorer.contents.data_section) == body.index(explorer.contents.actions) + 2
    # Another checkpoint opened: the result goes with the old one.
    _save(tmp_path / "step-2", np.ones((8, 8), np.float32))
    explorer.refresh()
    explorer.open_checkpoint("step-2")
    assert check.result is None and check.label.value == ""


def test_check_data_names_a_damaged_leaf(tmp_path: Path) -> None:
    _save(tmp_path / "step-1", np.arange(4096, dtype=np.float32).reshape(64, 64))
    flip_middle_byte(biggest_data_file(tmp_path / "step-1" / "model"))
    explorer = CheckpointExplorer(tmp_path)
    explorer.open_checkpoint("step-1")
    explorer.data_check.start()
    assert explorer.data_check.wait(120)
    assert explorer.data_check.status == "done"
    assert 'data-ok="false"' in explorer.data_check.label.value
    assert "error" in explorer.data_check.findings.value


def test_a_cancelled_check_shows_nothing_of_it(tmp_path: Path) -> None:
    _save(tmp_path / "step-1", np.ones((2048, 4096), np.float32))  # 32 MiB to read
    explorer = CheckpointExplorer(tmp_path)
    explorer.open_checkpoint("step-1")
    check = explorer.data_check
    check.start()
    check.cancel()
    assert check.status == "cancelled" and check.label.value.endswith("cancelled</span>")
    assert check.wait(120)
    assert check.status == "cancelled" and check.result is None
    assert check.table.layout.display == "none" and not check.button.disabled
    check.start(in_thread=False)  # and it can run again
    assert check.status == "done" and check.result.ok


def test_a_clean_check_is_one_line(tmp_path: Path) -> None:
    _save(tmp_path / "step-1", np.ones((8, 8), np.float32))
    explorer = CheckpointExplorer(tmp_path)
    explorer.open_checkpoint("step-1")
    assert not explorer.contents.data_section.shown  # nothing to show before a check
    check = explorer.data_check
    check.start(in_thread=False)
    assert check.status == "done" and check.result.ok
    assert explorer.contents.data_section.shown
    assert 'data-ok="true"' in check.label.value and "3 arrays" in check.label.value
    assert check.findings.value == ""
    assert check.table.layout.display == "none" and check.table.frame.empty
