"""The explorer's "check data": verify with data in the background, NaN/Inf per leaf."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from damage import biggest_data_file, flip_middle_byte
from tinax.widgets import CheckpointExplorer
from tinax.widgets._data_check import _unread_text
from tinax.widgets._nonfinite import NONFINITE_BACKGROUND, NONFINITE_COLOR

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
    # NaN in the model: diverged, in its own colour, never the green "sound".
    label = check.label.value
    assert 'data-status="diverged"' in label and 'data-ok="false"' in label
    assert NONFINITE_COLOR in label and "✔" not in label and "metadata and data" in label
    first = check.table.frame.iloc[0]  # the leaf with NaNs first
    assert (first["key"], first["nan_count"], first["inf_count"]) == ("['w']", 2, 1)
    assert check.table.rows[0]["background"] == NONFINITE_BACKGROUND
    # Only the leaf to look at is listed; the line counts the arrays read, and its NaN
    # and Inf are the verdict's, in the library's one count.
    assert check.table.frame["key"].tolist() == ["['w']"]
    assert "3 arrays" in label and "diverged: 2 NaN and 1 Inf in 1 leaf of model" in label
    assert "with NaN or Inf" not in label  # no second count beside it
    # Its counts are said in its row, not again as a finding above the table.
    assert "holds 2 NaN" not in check.findings.value
    assert "not read" not in label
    # The checkpoint's verdict line follows the data read.
    verdict = explorer.contents.verdict.value
    assert 'data-status="diverged"' in verdict and "2 NaN and 1 Inf" in verdict
    # Its export warns before writing them.
    explorer.contents.export_button.click()
    (panel,) = explorer.contents.export_box.children
    assert "model holds 2 NaN and 1 Inf (data read)" in panel.warning.value
    assert panel.export_button.description == "Export anyway"
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
    findings = explorer.data_check.findings.value
    # The damaged leaf named dotted, its exact key on hover.
    assert "error" in findings and ">model w</code>" in findings
    assert 'title="model [&#x27;w&#x27;]"' in findings


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


def test_regions_not_read_are_counted_apart_from_the_verdicts_nan() -> None:
    leaves = pd.DataFrame(
        {
            "key": ["['a']", "['b']", "['c']", "['d']"],
            "nan_count": [3, 0, None, 0],
            "inf_count": [0, 2, None, 0],
            "read": [True, True, False, True],
        }
    )
    assert _unread_text(leaves) == "1 with regions not read"
    assert _unread_text(leaves.iloc[3:]) == ""
