"""The restore-target builder shows the restore plan of what is chosen before Load, and
disables Load, saying why, when the load would not fit in memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from tinax.widgets import RestoreTargetBuilder

import tinax.checkpointing as tc


def _state() -> dict[str, Any]:
    return {
        "model": {
            "dense": {"w": jnp.ones((1024, 512)), "b": jnp.zeros(512)},
            "norm": {"scale": jnp.ones(128)},
        },
        "optimizer": {"mu": np.ones((1024, 512), np.float32), "count": 3},
    }


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "step-1"
    tc.save_checkpointables(path, _state()).result()
    return path


def test_the_plan_of_what_is_chosen_shows_before_load(checkpoint: Path) -> None:
    builder = RestoreTargetBuilder(_state(), checkpoint)
    plan = builder.plan
    assert plan is not None and plan.attrs["fits"]
    assert builder.reason == "" and not builder.load_button.disabled
    assert builder.plan_view.layout.display == ""
    text = builder.plan_view.summary.value
    state_bytes = 2 * 1024 * 512 * 4 + 512 * 4 + 128 * 4
    assert "<b>Reads</b>" in text and "<b>Peak host memory</b>" in text
    assert "<b>Per device</b> up to" in text
    assert plan.attrs["kept_host_bytes"] == state_bytes
    assert list(plan["device"]) == ["host", "cpu:0"]
    # What is unticked is not read: the plan follows the ticks.
    builder.tick("optimizer", "", False)
    builder.tick("model", "['norm']", False)
    smaller = builder.plan
    assert smaller is not None
    assert smaller.attrs["kept_host_bytes"] == 1024 * 512 * 4 + 512 * 4
    assert smaller.attrs["read_bytes"] < plan.attrs["read_bytes"]
    builder.apply_preset("everything")
    assert builder.plan is not None and builder.plan.attrs["kept_host_bytes"] == state_bytes


def test_load_is_disabled_with_the_reason_when_the_restore_does_not_fit(
    checkpoint: Path,
) -> None:
    with tc.memory_budget(4 << 20):
        builder = RestoreTargetBuilder(_state(), checkpoint)
        assert builder.load_button.disabled
        assert builder.reason.startswith("it does not fit in memory: it needs 6."), builder.reason
        assert "max_host_bytes is 4.0 MiB" in builder.reason
        assert "Cannot load:" in builder.reason_html.value
        assert "Does not fit:" in builder.plan_view.summary.value
        # A click does nothing: the load would only be refused.
        builder.load_button.click()
        assert builder.status == "" and builder.result is None
        # Less chosen, it fits.
        builder.tick("optimizer", "", False)
        builder.tick("model", "['dense']", False)
        assert builder.reason == "" and not builder.load_button.disabled
        builder.load_button.click()
        assert builder.progress is not None and builder.progress.wait(60) == "done"
    assert builder.status == "loaded"
    assert builder.result is not None
    assert np.asarray(builder.result["model"]["norm"]["scale"]).tolist() == [1.0] * 128
