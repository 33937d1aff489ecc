"""A run that goes NaN, seen as such everywhere: diff, verify, scan, drift, run table.

Real runs (``divergence_fixtures``): a flax NNX model trained with optax's adamw whose
loss turns NaN at a known step, and a Linen model with BatchNorm statistics.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from damage import flip_bits, stored_value
from divergence_fixtures import (
    LAST_FINITE_STEP,
    LINEN_STEPS,
    NAN_STEP,
    STEPS,
    write_linen_run,
    write_nnx_run,
)
from divergence_fixtures import tinax_here as _tinax

import tinax.explore as ex
from tinax import vocabulary as words


def _name(step: int) -> str:
    return f"step_{step:06d}"


@pytest.fixture(scope="module")
def nnx_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(write_nnx_run(str(tmp_path_factory.mktemp("diverging") / "run")))


@pytest.fixture(scope="module")
def linen_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(write_linen_run(str(tmp_path_factory.mktemp("linen") / "run")))


def test_a_leaf_that_went_nan_is_changed_ranked_first_with_its_true_norm(nnx_run):
    before, after = nnx_run / _name(LAST_FINITE_STEP), nnx_run / _name(NAN_STEP)
    table = ex.diff_table(before, after)
    went = table[table["nonfinite"] == words.BECAME_NONFINITE]
    # Every weight of the model and every moment of adamw went NaN: all changed,
    # told so, and ranked before every other row.
    assert set(went["status"]) == {words.CHANGED}
    assert set(went["change"]) == {words.BECAME_NONFINITE}
    assert list(table.index[: len(went)]) == list(went.index)
    model = went[went["checkpointable"] == "model"]
    assert len(model) == 6 and (went["checkpointable"] == "optimizer").sum() == 12
    assert (went["nan_b"] > 0).all() and (went["nan_a"] == 0).all()
    # Never "0": the differences are no number, and side a's norm is its true norm.
    for column in ("rel_change", "max_abs_diff", "norm_diff", "cosine"):
        assert went[column].isna().all(), column
    assert not (table["change"] == "0 %").any()
    key = "['head']['kernel']['value']"
    row = table[(table["checkpointable"] == "model") & (table["key"] == key)].iloc[0]
    true_norm = np.linalg.norm(ex.read_leaf(before, "model", key).astype(np.float64))
    assert row["norm_a"] == pytest.approx(true_norm) and true_norm > 0.1
    # Back the other way: it became finite.
    back = ex.diff_table(after, before)
    assert set(back[back["nonfinite"].notna()]["nonfinite"]) == {words.BECAME_FINITE}
    # Between two NaN checkpoints the NaN leaves are non-finite in both.
    later = ex.diff_table(after, nnx_run / _name(NAN_STEP + 1))
    assert words.NONFINITE_BOTH in set(later["nonfinite"].dropna())


def test_a_checkpoint_whose_state_went_nan_is_diverged_never_sound(nnx_run):
    diverged = ex.verify(nnx_run / _name(NAN_STEP), data=True)
    assert diverged.status == words.DIVERGED and not diverged.ok
    assert diverged.errors.empty  # it loads
    assert diverged.verdict.startswith("diverged: ")
    assert "model" in diverged.verdict and "optimizer" in diverged.verdict
    assert "sound" not in diverged.verdict
    # Every weight, both adamw moments of each, the NaN loss and eval.loss.
    assert diverged.unread_leaves.empty and len(diverged.nonfinite_leaves) == 6 + 12 + 2
    healthy = ex.verify(nnx_run / _name(LAST_FINITE_STEP), data=True)
    assert healthy.ok and healthy.status == words.SOUND


def test_scan_run_calls_the_nan_checkpoints_diverged(nnx_run):
    table = ex.scan_run(nnx_run)
    verdicts = dict(zip(table["step"], table["verdict"], strict=True))
    assert verdicts == {s: words.DIVERGED if s >= NAN_STEP else words.FINITE for s in STEPS}
    assert table.attrs["first_nonfinite_step"] == NAN_STEP
    assert table.attrs["rollback_step"] == LAST_FINITE_STEP


def test_run_table_has_every_metric_as_logged_and_names_the_nan_ones(nnx_run):
    table = ex.run_table(nnx_run)
    metrics = {"loss", "learning_rate", "grad_scale", "eval.loss", "epoch"}
    assert metrics <= set(table.columns) and metrics <= set(table.attrs["metrics"])
    by_step = table.set_index("step")
    assert by_step.loc[1, "learning_rate"] == pytest.approx(1e-2)  # a NumPy float32
    assert by_step.loc[1, "grad_scale"] == 0.5  # bfloat16
    assert 0.5 < by_step.loc[1, "loss"] < 2.0  # a JAX float32 0-d array
    assert by_step.loc[1, "eval.loss"] == pytest.approx(2 * by_step.loc[1, "loss"], rel=1e-6)
    for step in STEPS:
        named = by_step.loc[step, "nonfinite_metrics"]
        if step >= NAN_STEP:
            assert named == "eval.loss, loss" and math.isnan(by_step.loc[step, "loss"])
        else:
            assert named is pd.NA


def test_drift_shows_the_nan_pairs_and_the_leaves_it_could_not_compare(nnx_run, tmp_path):
    table = ex.drift_table(nnx_run)
    nan_rows = table[table["step"] >= NAN_STEP]
    assert (nan_rows["nan"] > 0).all() and nan_rows["rel_update"].isna().all()
    assert table[table["step"] < NAN_STEP]["rel_update"].notna().all()
    assert (table["unreadable"] == 0).all() and table.attrs["unreadable"] == []
    # A leaf damaged in one checkpoint: counted and listed, never silently left out.
    copy = tmp_path / "run"
    shutil.copytree(nnx_run, copy)
    flip_bits(*stored_value(copy / _name(2) / "model", "layers.1.kernel.value/c/0/0"))
    damaged = ex.drift_table(copy)
    listed = pd.DataFrame(damaged.attrs["unreadable"])
    # Step 2's damaged kernel is in two pairs: 1 → 2 and 2 → 3.
    assert list(listed["step"]) == [2, 3] and set(listed["status"]) == {words.CORRUPT}
    assert set(listed["key"]) == {"['layers']['1']['kernel']['value']"}
    hit = damaged[damaged["unreadable"] > 0]
    assert list(hit["subtree"]) == ["layers.1", "layers.1"]
    assert (hit["leaves"] == 2).all()  # the damaged leaf still counts as the layer's
    # attrs hold plain data, which pandas can compare when it combines frames.
    assert damaged.dropna(subset=["rel_update"]).nlargest(2, "rel_update").attrs
    status, text, _ = _tinax("run", copy, "--drift")
    assert "not compared: 2 leaves" in text
    assert "step 1 → 2: model layers.1.kernel: corrupt" in text


def test_a_linen_models_drift_looks_through_params_and_batch_stats(linen_run):
    table = ex.drift_table(linen_run)
    layers = set(table["subtree"])
    assert layers == {
        "params.Dense_0",
        "params.Dense_1",
        "params.BatchNorm_0",
        "batch_stats.BatchNorm_0",
    }
    assert sorted(set(table["step"])) == list(LINEN_STEPS[1:])
    # An explicit depth counts below the collections, which stay in the name.
    assert set(ex.drift_table(linen_run, depth=1)["subtree"]) == layers
    deep = set(ex.drift_table(linen_run, depth=2)["subtree"])
    assert {"params.Dense_0.kernel", "batch_stats.BatchNorm_0.mean"} <= deep


def test_tinax_run_says_nan_apart_from_missing_in_text_json_and_csv(nnx_run):
    import io
    import json

    status, text, _ = _tinax("run", nnx_run)
    assert status == 0
    rows = {line.split()[0]: line.split() for line in text.splitlines() if "step_" in line}
    assert rows[_name(NAN_STEP)][-1] == "nan" and rows[_name(LAST_FINITE_STEP)][-1] != "nan"
    assert "kept all kept" not in text and "kept: all kept" in text
    record = json.loads(_tinax("run", nnx_run, "--json")[1])
    by_step = {r["step"]: r for r in record["checkpoints"]}
    # JSON has no NaN: null, and the row names it; a number otherwise, never a string.
    assert by_step[NAN_STEP]["loss"] is None
    assert by_step[NAN_STEP]["nonfinite_values"] == {"loss": "nan", "eval.loss": "nan"}
    assert isinstance(by_step[1]["loss"], float) and "nonfinite_values" not in by_step[1]
    assert by_step[1]["grad_scale"] == 0.5
    table = pd.read_csv(io.StringIO(_tinax("run", nnx_run, "--csv")[1]))
    assert math.isnan(table.set_index("step").loc[NAN_STEP, "loss"])


def test_tinax_run_drift_lists_the_nan_pairs(nnx_run, linen_run):
    status, text, _ = _tinax("run", nnx_run, "--drift")
    assert status == 0
    assert f"non-finite: 2 pairs hold NaN or Inf, the first from step {LAST_FINITE_STEP}" in text
    pairs = text.split("non-finite:", 1)[1]
    assert f"   {LAST_FINITE_STEP}     {NAN_STEP}" in pairs
    assert "nan 0" not in text and "nan: 0" not in text
    _, linen, _ = _tinax("run", linen_run, "--drift", "--depth", "2", "--top", "0")
    assert "params.Dense_0.kernel" in linen and "batch_stats.BatchNorm_0.mean" in linen
    assert _tinax("run", linen_run, "--drift", "--depth", "0")[0] == 2


def test_tinax_verify_data_is_grouped_and_says_diverged(nnx_run):
    status, text, _ = _tinax("verify", nnx_run, "--data")
    assert status == 1
    assert all(len(line) <= 80 for line in text.splitlines())
    assert f"{_name(NAN_STEP)} … {_name(STEPS[-1])}, 2 checkpoints (diverged), each:" in text
    assert "model: 6 leaves hold NaN or Inf: head.bias, head.kernel" in text
    # Keys are whole on every line: none cut mid-key, none in keystr brackets.
    assert "['" not in text and "…rnel" not in text
    assert text.splitlines()[-1].endswith("checked)")
    assert "3 of 5 checkpoints sound and healthy, 2 diverged" in text
    quiet = _tinax("verify", nnx_run, "--data", "--quiet")[1].splitlines()
    assert len(quiet) == len(STEPS)
    assert quiet[NAN_STEP - 1].startswith(f"{_name(NAN_STEP)}: diverged: ")
    one = _tinax("verify", nnx_run / _name(NAN_STEP), "--data", "--quiet")
    assert one[0] == 1 and one[1].count("\n") == 1 and "diverged" in one[1]


def test_export_warns_before_writing_nan_weights(nnx_run, tmp_path):
    from safetensors.numpy import load_file

    with pytest.warns(RuntimeWarning, match=r"6 tensors hold NaN or Inf: head\.bias \(1 NaN\)"):
        files = ex.export_safetensors(nnx_run / _name(NAN_STEP), tmp_path / "nan")
    assert np.isnan(load_file(files[0])["layers.1.kernel"]).all()
    # A finite checkpoint exports without a word.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ex.export_safetensors(nnx_run / _name(LAST_FINITE_STEP), tmp_path / "finite")
    status, _, err = _tinax("export", nnx_run / _name(NAN_STEP), tmp_path / "cli")
    assert status == 0
    assert err.startswith("tinax export: warning: export of ") and err.count("\n") == 1
    assert "layers.1.kernel (1,024 NaN)" in err


def test_tinax_diff_says_which_leaves_went_nan_at_any_width(nnx_run):
    before, after = nnx_run / _name(LAST_FINITE_STEP), nnx_run / _name(NAN_STEP)
    for columns in (80, 100, 160):
        status, text, _ = _tinax("diff", before, after, columns=columns)
        assert status == 1
        lines = text.splitlines()
        assert lines[-1].endswith("; 20 became non-finite")
        # The first row is a leaf that went NaN, told so; never a 0 % change.
        assert "became non-finite" in lines[3] and " 0 %" not in text
        if columns >= 100:
            # The later side's NaN count shows before the earlier side's zeros.
            assert "nan_b" in lines[2] and "nan_a" not in lines[2]
