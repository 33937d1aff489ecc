"""drift_table: how far each layer moved between consecutive checkpoints, cached per pair."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from run_view_fixtures import (
    JUMP_LAYER,
    JUMP_STEP,
    LAYERS,
    NAN_STEP,
    STEPS,
    big_run_script,
    write_small_run,
)
from run_view_fixtures import model as small_model

from tinax.explore import drift_table
from tinax.explore._run_view import drift as _drift


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> str:
    return write_small_run(str(tmp_path_factory.mktemp("drift") / "run"))


def _expected(step: int, layer: int) -> tuple[float, float]:
    """rel_update and cosine of layers.<layer> between step - 1 and step, from the values."""
    a, b = small_model(step - 1)["layers"][layer], small_model(step)["layers"][layer]
    va = np.concatenate([a["w"].ravel(), a["b"].ravel()]).astype(np.float64)
    vb = np.concatenate([b["w"].ravel(), b["b"].ravel()]).astype(np.float64)
    rel = np.linalg.norm(vb - va) / np.linalg.norm(va)
    return float(rel), float(va @ vb / np.linalg.norm(va) / np.linalg.norm(vb))


def test_layers_by_default_and_the_planted_jump(small_run):
    table = drift_table(small_run)
    assert table.attrs["checkpointable"] == "model"
    assert list(table.columns[:7]) == [
        "step",
        "previous_step",
        "subtree",
        "key",
        "rel_update",
        "cosine",
        "max_abs_diff",
    ]
    # One row per consecutive pair and layer (indices), plus the top-level module.
    subtrees = [f"layers.{i}" for i in range(LAYERS)]
    assert list(table[table["step"] == 2]["subtree"]) == ["embed", *subtrees]
    assert sorted(set(table["step"])) == list(STEPS[1:])
    assert (table["previous_step"] == table["step"] - 1).all()
    finite = table[table["rel_update"].notna()]
    top = finite.loc[finite["rel_update"].idxmax()]
    assert (top["subtree"], top["step"]) == (JUMP_LAYER, JUMP_STEP)
    rel, cosine = _expected(JUMP_STEP, 2)
    assert top["rel_update"] == pytest.approx(rel, rel=1e-5)
    assert top["cosine"] == pytest.approx(cosine, abs=1e-6)
    assert top["key"] == "['layers'][2]"
    quiet = table[(table["subtree"] == "layers.1") & (table["step"] == 2)].iloc[0]
    assert quiet["rel_update"] == pytest.approx(_expected(2, 1)[0], rel=1e-5)
    # An unchanged module: no update at all.
    embed = table[table["subtree"] == "embed"]
    assert (embed["rel_update"] == 0).all() and (embed["max_abs_diff"] == 0).all()


def test_a_layer_holding_nan_has_nan_statistics_and_counts(small_run):
    table = drift_table(small_run)
    hit = table[(table["subtree"] == "layers.0") & (table["step"] >= NAN_STEP)]
    assert hit["rel_update"].isna().all() and (hit["nan"] > 0).all()
    # One NaN element in each checkpoint from NAN_STEP on: the later side's count is
    # what a scan of that checkpoint finds; both sides together count it twice.
    assert list(hit["nan_b"]) == [1] * len(hit) and list(hit["nan"]) == [1, *[2] * (len(hit) - 1)]
    assert (hit["inf_b"] == 0).all()
    clean = table[(table["subtree"] == "layers.1")]
    assert (clean["nan"] == 0).all() and clean["rel_update"].notna().all()


def test_a_second_call_reads_nothing(small_run, monkeypatch):
    drift_table(small_run)

    def refuse(*args, **kwargs):
        raise AssertionError("a pair was read again")

    monkeypatch.setattr(_drift, "pair_drift", refuse)
    again = drift_table(small_run, depth=1)
    assert sorted(set(again["subtree"])) == ["embed", "layers"]
    whole = again[(again["subtree"] == "layers") & (again["step"] == 2)].iloc[0]
    assert whole["leaves"] == 2 * LAYERS
    assert _drift.cached_pairs() >= len(STEPS) - 1


def test_depth_and_checkpointable(small_run):
    deep = drift_table(small_run, depth=3)
    assert "layers.2.w" in set(deep["subtree"])
    other = drift_table(small_run, checkpointable="optimizer")
    # The optimizer's counter is an integer: no floating-point leaf to compare.
    assert len(other) == 0
    with pytest.raises(ValueError, match="no checkpointable 'nope'"):
        drift_table(small_run, checkpointable="nope")


def test_progress_and_cancel(small_run, tmp_path):
    seen: list[tuple[int, int]] = []
    drift_table(small_run, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (len(STEPS) - 1, len(STEPS) - 1)
    stop = threading.Event()
    calls = []

    def progress(done: int, total: int) -> None:
        calls.append(done)
        if done == 2:
            stop.set()

    other = write_small_run(str(tmp_path / "run"))
    partial = drift_table(other, progress=progress, cancel=stop)
    assert partial.attrs["cancelled"] is True
    assert sorted(set(partial["step"])) == [2, 3]
    assert drift_table(other, cancel=lambda: True).empty


def test_bad_input(small_run, tmp_path):
    with pytest.raises(TypeError, match="depth"):
        drift_table(small_run, depth="2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="depth"):
        drift_table(small_run, depth=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="depth must be at least 1"):
        drift_table(small_run, depth=0)
    with pytest.raises(FileNotFoundError):
        drift_table(tmp_path / "missing")
    assert drift_table(tmp_path).empty


def test_the_big_demo_run(big_run):
    demo = big_run_script()
    table = drift_table(big_run)
    finite = table[table["rel_update"].notna()]
    top = finite.loc[finite["rel_update"].idxmax()]
    assert (top["subtree"], top["step"]) == (demo.JUMP_LAYER, demo.JUMP_STEP)
    assert top["rel_update"] == pytest.approx(demo.JUMP_SCALE, rel=0.05)
    # Every other layer and pair moved far less.
    rest = finite.drop(index=top.name)
    assert rest["rel_update"].max() < demo.JUMP_SCALE / 10
    assert len(set(table["subtree"])) == demo.BLOCKS + 2  # blocks.N, embed, head
    # Every pair into or between NaN checkpoints; later NaN layers saved with the same
    # bytes are the same by their checksums, and keep the counts found before them.
    nan_rows = table[table["step"] >= demo.FIRST_NONFINITE_STEP]
    assert nan_rows["rel_update"].isna().all() and (nan_rows["nan"] > 0).all()
    assert all(
        math.isfinite(v) for v in table[table["step"] < demo.FIRST_NONFINITE_STEP]["rel_update"]
    )


def test_layers_below_a_shared_wrapper_as_linen_saves_them(tmp_path):
    from tinax.checkpointing import save_checkpointables

    rng = np.random.default_rng(0)
    base = {
        f"Dense_{i}": {"kernel": rng.standard_normal((4, 4)).astype(np.float32)} for i in range(3)
    }
    for step in (1, 2):
        params = {
            name: {"kernel": layer["kernel"] * (5.0 if name == "Dense_1" and step == 2 else 1.0)}
            for name, layer in base.items()
        }
        save_checkpointables(tmp_path / f"step_{step}", {"params": {"params": params}}).result()
    table = drift_table(tmp_path)
    assert table.attrs["checkpointable"] == "params"
    assert list(table["subtree"]) == ["params.Dense_0", "params.Dense_1", "params.Dense_2"]
    moved = table.set_index("subtree")["rel_update"]
    assert moved["params.Dense_1"] == pytest.approx(4.0) and moved["params.Dense_0"] == 0
