"""diff_table on checkpoints Orbax wrote: two steps of the demo run, a leaf edited in place."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts
from explore_fixtures import save_v1

import tinax.explore as ex
from tinax._format.integrity import checksums
from tinax._format.naming import words
from tinax.explore import display

REPO = Path(__file__).resolve().parents[1]
STEPS = ("step_000050", "step_000100")


def write_leaf(checkpointable: Path, param: str, values: np.ndarray, key: str) -> None:
    """Overwrites a stored array in place, through tensorstore, as a repair tool would,
    and the checksum saved for it (else the new bytes are damage, and the leaf corrupt)."""
    write_leaf_bytes(checkpointable, param, values)
    for record in sorted((checkpointable / "tinax_checksums").glob("*.json")):
        document = json.loads(record.read_bytes())
        entry = document["leaves"].pop(key, None)
        if entry is not None and record.name == "process_0.json":
            bounds = [[0, n] for n in values.shape]
            entry["pieces"] = [[bounds, checksums.digest(np.ascontiguousarray(values))]]
            document["leaves"][key] = entry
        record.write_text(json.dumps(document))


def write_leaf_bytes(checkpointable: Path, param: str, values: np.ndarray) -> None:
    spec = {
        "driver": "zarr3",
        "kvstore": {
            "driver": "ocdbt",
            "base": {"driver": "file", "path": str(checkpointable) + "/"},
            "path": param + "/",
        },
    }
    array = ts.open(spec, read=True, write=True).result()
    array.write(values).result()


def test_two_steps_of_the_demo_run(demo_run):
    a, b = (demo_run / step for step in STEPS)
    table = ex.diff_table(a, b)
    assert list(table.columns[:3]) == ["checkpointable", "key", "status"]
    rows = {(r.checkpointable, r.key): r for r in table.itertuples()}
    assert set(rows) == {(r.checkpointable, r.key) for r in ex.checkpoint_table(a).itertuples()}
    kernel = rows[("model", "['dense1']['kernel']['value']")]
    assert kernel.status == words.CHANGED and kernel.decoded
    before = ex.read_leaf(a, "model", "['dense1']['kernel']['value']").astype(np.float64)
    after = ex.read_leaf(b, "model", "['dense1']['kernel']['value']").astype(np.float64)
    assert kernel.max_abs_diff == pytest.approx(np.abs(after - before).max())
    assert kernel.rel_change == pytest.approx(
        np.linalg.norm(after - before) / np.linalg.norm(before), rel=1e-6
    )
    assert kernel.cosine == pytest.approx(
        (before * after).sum() / np.linalg.norm(before) / np.linalg.norm(after), rel=1e-9
    )
    assert (kernel.nan_a, kernel.nan_b, kernel.inf_a, kernel.inf_b) == (0, 0, 0, 0)
    # The learning rate is the same at both steps; the step count is not.
    assert rows[("auxiliary", "['state']['learning_rate']")].status == words.SAME
    step = rows[("auxiliary", "['step']")]
    assert step.status == words.CHANGED and step.max_abs_diff == 50
    assert rows[("iterator", "")].status == words.CHANGED
    # The model, then the rest of the state, then the optimizer's; in each, sorted by
    # relative change, largest first, then the rest.
    pairs = zip(table["checkpointable"], table["key"], strict=True)
    parts = [display.state_part(c, k) for c, k in pairs]
    assert parts == sorted(parts) and set(parts) == {0, 1, 2}
    for part in (0, 1, 2):
        rows = table[[p == part for p in parts]]
        changed = rows[rows["status"] == words.CHANGED]["rel_change"].dropna()
        assert list(changed) == sorted(changed, reverse=True)
    assert table[[p == 1 for p in parts]]["status"].iloc[-1] == words.SAME


def test_a_checkpoint_against_itself_is_recognised_on_disk(demo_run):
    a = demo_run / STEPS[0]
    table = ex.diff_table(a, a, sort=False)
    assert set(table["status"]) == {words.SAME}
    arrays = table[table["kind_a"].isin(sorted(words.ARRAY_KINDS))]
    assert len(arrays) > 5 and not arrays["decoded"].any()
    assert arrays["rel_change"].isna().all()


def test_a_leaf_edited_in_place_is_the_only_change(demo_run, tmp_path):
    a = demo_run / STEPS[0]
    b = tmp_path / "edited"
    shutil.copytree(a, b)
    kernel = ex.read_leaf(a, "model", "['dense2']['kernel']['value']")
    edited = kernel.copy()
    edited[7, 0] += 0.5
    write_leaf(b / "model", "dense2.kernel.value", edited, "['dense2']['kernel']['value']")
    table = ex.diff_table(a, b)
    changed = table[table["status"] != words.SAME]
    assert list(zip(changed["checkpointable"], changed["key"], strict=True)) == [
        ("model", "['dense2']['kernel']['value']")
    ]
    row = changed.iloc[0]
    assert row["max_abs_diff"] == pytest.approx(0.5)
    assert row["rel_change"] == pytest.approx(0.5 / np.linalg.norm(kernel.astype(np.float64)))
    # Everything else is recognised from the stored bytes, without decoding.
    same_arrays = table[(table["status"] == words.SAME) & table["kind_a"].isin(["jax.Array"])]
    assert len(same_arrays) > 5 and not same_arrays["decoded"].any()


def test_nans_injected_into_one_leaf_are_counted(demo_run, tmp_path):
    a = demo_run / STEPS[0]
    b = tmp_path / "nan"
    shutil.copytree(a, b)
    bias = ex.read_leaf(a, "model", "['dense1']['bias']['value']")
    poisoned = bias.copy()
    poisoned[:3] = np.nan
    poisoned[5] = np.inf
    poisoned[6] += 1.0
    write_leaf(b / "model", "dense1.bias.value", poisoned, "['dense1']['bias']['value']")
    row = ex.diff_table(a, b).iloc[0]
    assert (row["key"], row["status"]) == ("['dense1']['bias']['value']", words.CHANGED)
    assert (row["nan_a"], row["inf_a"], row["nan_b"], row["inf_b"]) == (0, 0, 3, 1)
    assert row["nonfinite"] == words.BECAME_NONFINITE == row["change"]
    # No number measures a change to NaN: the differences are NaN, never 0 or the
    # change of the finite part alone; each side's norm is that of its finite values.
    assert all(math.isnan(row[c]) for c in ("max_abs_diff", "rel_change", "norm_diff", "cosine"))
    assert row["norm_a"] == pytest.approx(np.linalg.norm(bias.astype(np.float64)))
    finite = np.ones(bias.shape, bool)
    finite[[0, 1, 2, 5]] = False
    assert row["norm_b"] == pytest.approx(np.linalg.norm(poisoned[finite].astype(np.float64)))


def test_checkpoint_against_live_state(tmp_path):
    state = {
        "model": {
            "w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4),
            "b": np.linspace(0, 1, 5, dtype=np.float32),
            "e": jnp.ones((4, 2), jnp.bfloat16),
            "key": jax.random.key(0),
            "step": 7,
            "name": "tiny",
        }
    }
    path = save_v1(tmp_path / "ckpt", state)
    table = ex.diff_table(path, state)
    assert set(table["status"]) == {words.SAME}, table[["key", "status"]]
    assert table[table["key"] == "['w']"]["decoded"].iloc[0]
    live = {"model": {**state["model"], "w": state["model"]["w"].at[0, 0].set(-1.0)}}
    live["model"]["extra"] = np.zeros(2)
    live["model"].pop("name")
    table = ex.diff_table(path, live)
    rows = table.set_index("key")
    assert rows.loc["['w']", "status"] == words.CHANGED
    assert rows.loc["['w']", "max_abs_diff"] == 1.0
    assert rows.loc["['extra']", "status"] == words.ONLY_IN_B
    assert rows.loc["['name']", "status"] == words.ONLY_IN_A
    assert rows.loc["['key']", "status"] == words.SAME
    with pytest.raises(ValueError, match="abstract"):
        ex.diff_table(path, {"model": {"w": jax.ShapeDtypeStruct((3, 4), jnp.float32)}})


def test_shape_dtype_and_kind_differences(tmp_path):
    a = save_v1(
        tmp_path / "a",
        {"m": {"w": np.zeros((2, 3), np.float32), "d": np.zeros(3, np.float32), "s": "x"}},
    )
    b = save_v1(
        tmp_path / "b",
        {"m": {"w": np.zeros((3, 2), np.float32), "d": np.zeros(3, np.int32), "s": 1.5}},
    )
    rows = ex.diff_table(a, b).set_index("key")["status"]
    assert rows["['w']"] == words.SHAPE_DIFFERS
    assert rows["['d']"] == words.DTYPE_DIFFERS
    assert rows["['s']"] == words.KIND_DIFFERS


def test_progress_reaches_the_total(demo_run):
    seen: list[tuple[int, int]] = []
    ex.diff_table(*(demo_run / s for s in STEPS), progress=lambda d, t: seen.append((d, t)))
    assert seen and seen[-1][0] == seen[-1][1] > 0
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_bad_arguments():
    with pytest.raises(TypeError, match="mapping"):
        ex.diff_table(3, {})
    with pytest.raises(FileNotFoundError):
        ex.diff_table("/nonexistent/checkpoint", {})


def test_the_cli_diff(demo_run):
    a, b = (str(demo_run / s) for s in STEPS)
    run = [sys.executable, "-m", "tinax.explore", "diff", a, b]
    text = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert text.returncode == 1, text.stderr  # as diff(1): they differ
    lines = text.stdout.splitlines()
    assert lines[2].split()[:3] == ["key", "status", "change"]
    assert "changed" in lines[-1] and "same" in lines[-1]
    records = json.loads(
        subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=120).stdout
    )
    # Ranked as diff_table ranks: the model's leaves, the rest, then the optimizer's.
    for part in (0, 1, 2):
        changes = [
            r["rel_change"]
            for r in records
            if r["status"] == words.CHANGED
            and display.state_part(r["checkpointable"], r["key"]) == part
        ]
        numbers = [c for c in changes if c is not None]
        assert numbers == sorted(numbers, reverse=True)
    assert {"nan_a", "inf_b", "cosine", "decoded"} <= set(records[0])
