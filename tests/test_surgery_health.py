"""Derived and averaged checkpoints are not made from a diverged source unawares, and
their lineage says where they came from: the source's full path, its step, its verdict.

Real runs: flax NNX models trained with optax's adamw by ``TrainingRun``
(``divergence_fixtures``): one whose logged loss turns NaN at ``NAN_STEP``, one whose
weights go NaN while the loss it logs stays finite (``test_health``'s).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from divergence_fixtures import LAST_FINITE_STEP, NAN_STEP, write_nnx_run
from test_health import SILENT_STEP, _write_silent_run

import tinax.explore as ex
from tinax import vocabulary as words
from tinax._format.integrity import health
from tinax._format.naming import names
from tinax.checkpointing import DivergedCheckpointError, average_checkpoints, derive_checkpoint


def _name(step: int) -> str:
    return f"step_{step:06d}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    made = tmp_path_factory.mktemp("surgery_health")
    return {
        "nan_loss": Path(write_nnx_run(str(made / "nan_loss"))),
        "silent": _write_silent_run(made / "silent"),
    }


@pytest.fixture(autouse=True)
def fresh() -> None:
    health.forget()


def _custom(checkpoint: Path) -> dict:
    return json.loads((checkpoint / names.CHECKPOINT_METADATA).read_text())["custom_metadata"]


def test_a_source_known_to_have_diverged_is_refused_before_a_byte_is_read(runs, tmp_path):
    source = runs["nan_loss"] / _name(NAN_STEP)
    with pytest.raises(DivergedCheckpointError) as refused:
        derive_checkpoint(source, tmp_path / "d", checkpointables="model")
    said = str(refused.value)
    assert said.startswith(f"source checkpoint {str(source)!r} diverged: its logged")
    assert "allow_diverged=True" in said and "tinax derive --allow-diverged" in said
    assert not (tmp_path / "d").exists()
    with pytest.raises(DivergedCheckpointError, match="average --allow-diverged"):
        average_checkpoints([runs["nan_loss"] / _name(1), source], tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_a_divergence_found_as_the_source_streams_is_refused_naming_the_leaves(runs, tmp_path):
    source = runs["silent"] / _name(SILENT_STEP)
    with pytest.raises(DivergedCheckpointError) as refused:
        derive_checkpoint(source, tmp_path / "d")
    said = str(refused.value)
    assert "1,024 NaN and 0 Inf in 1 leaf of model" in said
    assert "(model layers.1.kernel 1,024 NaN)" in said and "nothing was written" in said
    assert not (tmp_path / "d").exists() and list(tmp_path.iterdir()) == []


def test_allowed_the_copy_says_it_diverged_and_where_it_came_from(runs, tmp_path):
    source = runs["nan_loss"] / _name(NAN_STEP)
    made = tmp_path / "model_only"
    derive_checkpoint(source, made, checkpointables="model", allow_diverged=True)
    # The copy holds no auxiliary state: none of its source's metrics, and its health
    # is its own, recorded as it was read (no data read here, a fresh process).
    custom = _custom(made)
    assert names.METRICS_RECORD not in custom and names.HEALTH_RECORD in custom
    found = ex.checkpoint_health(made)
    assert found.verdict == words.DIVERGED and found.metrics == ()
    assert found.reason.endswith("in 6 leaves of model") and "logged" not in found.reason
    row = ex.lineage(made).iloc[0]
    assert row["source"] == str(source) and row["step"] == NAN_STEP
    assert row["health"] == words.DIVERGED
    assert row["health_reason"].endswith("leaves of model; its logged eval.loss and loss are NaN")
    summary = ex.toolkit.lineage_summary(ex.lineage(made), full_paths=True)
    assert summary.startswith(f"derived from {source} (step {NAN_STEP}, diverged: ")
    # A folder of derived checkpoints lists each with its source's step.
    listing = ex.list_checkpoints(tmp_path)
    assert list(listing["step"]) == [NAN_STEP]
    assert list(listing["health"]) == [words.DIVERGED]


def test_a_healthy_copy_keeps_what_it_holds_whole(runs, tmp_path):
    source = runs["nan_loss"] / _name(LAST_FINITE_STEP)
    derive_checkpoint(source, tmp_path / "whole")
    custom = _custom(tmp_path / "whole")
    assert names.METRICS_RECORD in custom  # its auxiliary state, kept as it was
    found = ex.checkpoint_health(tmp_path / "whole")
    assert found.verdict == words.HEALTHY and found.source == health.FROM_RECORD
    assert ex.lineage(tmp_path / "whole")["health"].tolist() == [words.HEALTHY]
    average_checkpoints(
        [runs["nan_loss"] / _name(1), runs["nan_loss"] / _name(2)],
        tmp_path / "mean",
        checkpointables=["model"],
    )
    assert names.METRICS_RECORD not in _custom(tmp_path / "mean")
    assert ex.checkpoint_health(tmp_path / "mean").verdict == words.HEALTHY
    assert ex.lineage(tmp_path / "mean")["health"].tolist() == [words.HEALTHY] * 2


def test_tinax_derive_refuses_and_allows_from_the_command_line(runs, tmp_path):
    from tinax._cli.main import main

    source = runs["nan_loss"] / _name(NAN_STEP + 1)

    def tinax(*args: object) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        os.environ["COLUMNS"] = "200"
        try:
            return main([str(a) for a in args], out, err), out.getvalue(), err.getvalue()
        finally:
            del os.environ["COLUMNS"]

    status, _, err = tinax("derive", source, tmp_path / "d", "--only", "model")
    assert status == 2 and "--allow-diverged" in err and err.count("\n") == 1
    status, out, err = tinax(
        "derive", source, tmp_path / "d", "--only", "model", "--allow-diverged"
    )
    assert status == 0, err
    assert f"derived from {source} (step {NAN_STEP + 1}, diverged:" in out
    status, out, _ = tinax("show", tmp_path / "d")
    assert status == 0 and f"derived from {source} (step {NAN_STEP + 1}, diverged:" in out
