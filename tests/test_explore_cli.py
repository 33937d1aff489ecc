"""``python -m tinax.explore``, run as a terminal or a script would run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from explore_fixtures import iterator, save_v1, save_v1_run


def explore(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tinax.explore", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = save_v1_run(tmp_path_factory.mktemp("cli") / "run", steps=(0, 5))
    (root / "9").mkdir()  # Looks like a step, holds nothing: invalid.
    return root


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    values = np.array([[1.0, 2.0], [np.nan, 4.0]], np.float32)
    state = {
        "model": {"dense": {"w": jnp.asarray(values)}, "step": 3, "name": "tiny"},
        "iterator": iterator(2),
    }
    return save_v1(tmp_path_factory.mktemp("cli") / "ckpt", state)


def test_a_run_directory_prints_its_checkpoints(run):
    result = explore(run)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "name",
        "path",
        "step",
        "status",
        "checkpointables",
        "nbytes",
        "committed",
        "age",
    ]
    assert "complete" in lines[1] and str(run / "0") in lines[1]
    assert "invalid" in lines[3] and str(run / "9") in lines[3]
    assert f"invalid: {run / '9'}:" in result.stderr


def test_a_run_directory_as_json(run):
    result = explore(run, "--json")
    assert result.returncode == 0, result.stderr
    records = json.loads(result.stdout)
    assert [r["step"] for r in records] == [0, 5, 9]
    assert records[0]["checkpointables"] == ["iterator", "pytree"]
    assert records[0]["status"] == "complete" and records[0]["error"] is None
    assert records[0]["committed"].endswith("+00:00")
    assert records[2]["status"] == "invalid" and records[2]["error"]
    assert records[2]["committed"] is None
    # Age in seconds since the commit; unknown for what cannot be read.
    assert 0 <= records[0]["age"] < 600 and records[2]["age"] is None


def test_a_checkpoint_prints_its_leaves(checkpoint):
    result = explore(checkpoint)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["checkpointable", "key", "kind", "shape"]
    w = next(line for line in lines if "['dense']['w']" in line)
    assert "jax.Array" in w and "(2, 2)" in w and "float32" in w
    assert any("['name']" in line and "tiny" in line for line in lines)
    assert any("iterator" in line and "next_index" in line for line in lines)


def test_a_checkpoint_as_json(checkpoint):
    result = explore(checkpoint, "--json")
    assert result.returncode == 0, result.stderr
    records = {(r["checkpointable"], r["key"]): r for r in json.loads(result.stdout)}
    w = records[("model", "['dense']['w']")]
    assert (w["shape"], w["dtype"], w["nbytes"], w["value"]) == ([2, 2], "float32", 16, None)
    assert records[("model", "['step']")]["value"] == 3
    assert records[("iterator", "")]["value"]["next_index"] == 2


def test_one_leaf_summary(checkpoint):
    result = explore(checkpoint, "--leaf", "model", "['dense']['w']")
    assert result.returncode == 0, result.stderr
    fields = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert fields["shape"] == "(2, 2)"
    assert fields["dtype"] == "float32"
    assert (fields["min"], fields["max"], fields["nan_count"]) == ("1.0", "4.0", "1")
    assert float(fields["mean"]) == pytest.approx(7 / 3)


def test_one_leaf_as_json(checkpoint):
    result = explore(checkpoint, "--leaf", "model", "['dense']['w']", "--json")
    summary = json.loads(result.stdout)
    assert summary["shape"] == [2, 2] and summary["inf_count"] == 0
    assert "value" not in summary
    result = explore(checkpoint, "--leaf", "model", "['name']", "--json")
    assert json.loads(result.stdout)["value"] == "tiny"
    result = explore(checkpoint, "--leaf", "iterator", "")
    assert "next_index" in result.stdout


def test_errors_go_to_stderr_with_status_1(tmp_path, checkpoint):
    result = explore(tmp_path / "absent")
    assert result.returncode == 1
    assert "does not exist" in result.stderr and not result.stdout
    result = explore(checkpoint, "--leaf", "model", "['nope']")
    assert result.returncode == 1
    assert "no leaf" in result.stderr
    (checkpoint.parent / "broken").mkdir()
    (checkpoint.parent / "broken" / "_CHECKPOINT_METADATA").write_text("{")
    result = explore(checkpoint.parent / "broken")
    assert result.returncode == 1 and "not valid JSON" in result.stderr
    assert explore().returncode == 2
