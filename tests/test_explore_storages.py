"""Every tinax.explore function, and the CLI, on local disk and on gs:// alike.

The same tests run twice: once on a local directory and once on a ``gs://`` prefix
of a real fake-gcs-server (``tests/gcs.py``). The run holds steps written by Orbax's
own ``training.Checkpointer`` and a checkpoint saved by tinax with a flax NNX model,
an optax optimizer state and a Grain iterator.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
import pytest
from conftest import BUCKET
from explore_fixtures import iterator, save_v1_run
from flax import nnx

import tinax.explore as ex
from tinax._format.naming import words
from tinax.checkpointing import abstract_restore_target, save_checkpointables


class _Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.dense = nnx.Linear(4, 3, rngs=rngs)
        self.norm = nnx.BatchNorm(3, rngs=rngs)


def _state(scale: float) -> dict[str, Any]:
    model = _Model(nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    params = jax.tree.map(lambda x: x * scale, params)
    optimizer = optax.adam(1e-3).init(params)
    return {"model": nnx.to_pure_dict(params), "opt": optimizer, "iterator": iterator(int(scale))}


@pytest.fixture(scope="module", params=["local", "gs"])
def run(request, tmp_path_factory) -> str:
    if request.param == "local":
        root = str(tmp_path_factory.mktemp("storages") / "run")
    else:
        request.getfixturevalue("gcs")
        root = f"gs://{BUCKET}/storages-{uuid.uuid4().hex[:8]}/run"
    save_v1_run(root, steps=(0, 5))  # type: ignore[arg-type]
    save_checkpointables(f"{root}/ckpt_a", _state(1.0)).result()
    save_checkpointables(f"{root}/ckpt_b", _state(2.0)).result()
    return root


def test_list_checkpoints(run):
    table = ex.list_checkpoints(run, cache=None)
    assert list(table["name"]) == ["0", "5", "ckpt_a", "ckpt_b"]
    assert list(table["status"]) == [words.COMPLETE] * 4
    assert list(table["path"]) == [f"{run}/{n}" for n in table["name"]]
    assert list(table["step"][:2]) == [0, 5] and table["step"][2:].isna().all()
    assert table["checkpointables"][0] == ("iterator", "pytree")
    # A training save's names first, in the order it saves them, then the others by
    # name, whether the commit record (local) or the listing (gs://) named them.
    assert table["checkpointables"][2] == ("model", "iterator", "opt")
    assert (table["nbytes"] > 0).all() and table["committed"].notna().all()
    # The cached listing of an unchanged run is the same table.
    pd.testing.assert_frame_equal(
        ex.list_checkpoints(run).drop(columns="age"), table.drop(columns="age")
    )
    # A checkpoint itself lists as its one row.
    assert list(ex.list_checkpoints(f"{run}/5")["name"]) == ["5"]
    # What a quick listing of a bucket takes from the listing alone (the folders, the
    # commit marker's time) agrees with what the full check reads from each commit
    # record: the same checkpointables, commit times within the commit's own seconds.
    deep = ex.list_checkpoints(run, cache=None, deep=True)
    assert list(deep["checkpointables"]) == list(table["checkpointables"])
    apart = (deep["committed"] - table["committed"]).abs()
    assert (apart < pd.Timedelta(seconds=5)).all(), apart


def test_checkpoint_table_joins_the_live_state(run):
    state = _state(1.0)
    stored = ex.checkpoint_table(f"{run}/ckpt_a")
    live = ex.state_table(state)
    joined = stored.merge(live, on=["checkpointable", "key"], suffixes=("", "_live"))
    assert len(joined) == len(stored) == len(live)
    assert list(joined["shape"]) == list(joined["shape_live"])
    assert list(joined["dtype"].astype(str)) == list(joined["dtype_live"].astype(str))
    iterator_row = stored[stored["checkpointable"] == "iterator"].iloc[0]
    assert iterator_row["value"] == state["iterator"].get_state()


def test_compare_table_of_the_saved_targets_is_all_ok(run):
    targets = jax.tree.map(abstract_restore_target, _state(3.0))
    targets["iterator"] = iterator(0)
    table = ex.compare_table(f"{run}/ckpt_a", targets)
    assert set(table["status"]) == {words.OK}


def test_read_leaf_returns_the_saved_values(run):
    state = _state(2.0)
    kernel = ex.read_leaf(f"{run}/ckpt_b", "model", "['dense']['kernel']")
    np.testing.assert_array_equal(kernel, state["model"]["dense"]["kernel"])
    assert ex.read_leaf(f"{run}/0", "pytree", "['step']") == 0
    assert ex.read_leaf(f"{run}/ckpt_b", "iterator", "") == state["iterator"].get_state()
    np.testing.assert_array_equal(
        ex.read_leaf(f"{run}/5", "pytree", "['w']"), np.full((2, 2), 5, np.int32)
    )
    with pytest.raises(FileNotFoundError, match="absent"):
        ex.read_leaf(f"{run}/absent", "model", "")


def test_diff_table_of_two_checkpoints(run):
    table = ex.diff_table(f"{run}/ckpt_a", f"{run}/ckpt_b")
    kernel = table[(table["checkpointable"] == "model") & (table["key"] == "['dense']['kernel']")]
    a, b = _state(1.0)["model"]["dense"]["kernel"], _state(2.0)["model"]["dense"]["kernel"]
    assert kernel["status"].item() == words.CHANGED
    assert kernel["max_abs_diff"].item() == pytest.approx(float(jnp.max(jnp.abs(a - b))))
    same = ex.diff_table(f"{run}/ckpt_a", f"{run}/ckpt_a")
    assert set(same["status"]) == {words.SAME}


def test_verify_reads_every_chunk(run):
    result = ex.verify(f"{run}/ckpt_a", data=True)
    assert result.ok, result.findings
    assert result.data and len(result.leaves) > 0
    assert result.path == f"{run}/ckpt_a"


def test_the_cli_lists_a_run_and_shows_a_checkpoint(run):
    def explore(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "tinax.explore", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    listing = explore(run, "--json")
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)
    assert [row["name"] for row in rows] == ["0", "5", "ckpt_a", "ckpt_b"]
    shown = explore(f"{run}/5")
    assert shown.returncode == 0, shown.stderr
    assert any(line.split()[:1] == ["w"] for line in shown.stdout.splitlines())
    assert "pytree" in shown.stdout
