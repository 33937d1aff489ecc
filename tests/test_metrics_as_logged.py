"""Metrics as people log them: JAX and NumPy scalars, 0-d arrays, bfloat16, nested
dicts. They are run_table columns, TrainingRun's best_by reads them, and a restore
into a plain Python number goes ahead when the cast loses nothing (and names the fix
when it would)."""

from __future__ import annotations

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tinax.explore as ex
from tinax._format.naming import words
from tinax.checkpointing import (
    TargetMismatchError,
    TrainingRun,
    allow_lossy_casts,
    load_checkpointables,
    save_checkpointables,
)


def _iterator() -> grain.DatasetIterator:
    return iter(grain.MapDataset.range(32).to_iter_dataset())


LOSSES = {1: 0.9, 2: 0.4, 3: 0.7, 4: 0.8}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("metrics") / "run")
    it = _iterator()
    with TrainingRun(root, save_every=1, keep=1, keep_best=1, best_by="eval.loss") as run:
        for step, loss in LOSSES.items():
            next(it)
            auxiliary = {
                "loss": jnp.float32(loss),  # what a jitted step returns
                "lr": np.float32(0.5),  # a NumPy scalar (saved as a 0-d array)
                "scale": jnp.asarray(2.0, jnp.bfloat16),
                "tokens": np.asarray(step * 100),  # a 0-d integer array
                "eval": {"loss": jnp.float32(loss + 1)},  # nested: eval.loss
                "histogram": np.arange(3.0),  # not 0-d: no metric
            }
            run.save(step, {"w": np.ones(2, np.float32)}, {}, jax.random.key(0), auxiliary, it)
    return root


def test_every_0d_metric_is_a_run_table_column(run_dir):
    table = ex.run_table(run_dir)
    assert set(table.attrs["metrics"]) == {"loss", "lr", "scale", "tokens", "eval.loss"}
    newest = table.set_index("step").loc[4]
    assert newest["loss"] == pytest.approx(0.8) and newest["lr"] == 0.5
    assert newest["scale"] == 2.0 and newest["tokens"] == 400
    assert newest["eval.loss"] == pytest.approx(1.8)
    status, text = _cli("run", run_dir)
    assert status == 0 and "eval.loss" in text and "0.8" in text


def test_best_by_reads_a_nested_jax_metric(run_dir):
    # keep=1 and the best by eval.loss (step 2, 1.4): the two kept, for those reasons.
    kept = ex.retention_table(run_dir).set_index("step")["kept"].to_dict()
    assert kept == {2: words.kept_best("eval.loss"), 4: words.kept_newest(1)}


def test_a_lossless_cast_of_a_metric_restores_and_a_lossy_one_names_the_fix(run_dir):
    it = _iterator()
    with TrainingRun(run_dir, must_exist=True, handle_sigterm=False) as run:
        targets = ({"w": np.zeros(2, np.float32)}, {}, jax.random.key(0))
        restored = run.restore(
            *targets,
            {
                "loss": 0.0,
                "lr": 0.0,
                "scale": 0.0,
                "tokens": 0,
                "eval": {"loss": 0.0},
                "histogram": np.zeros(3),
            },
            it,
        )
        assert restored is not None and restored.step == 4
        aux = restored.auxiliary
        assert type(aux["loss"]) is float and aux["loss"] == pytest.approx(0.8)
        assert aux["lr"] == 0.5 and aux["scale"] == 2.0 and aux["tokens"] == 400
        # A float32 into an int loses values: refused, naming both ways out.
        with pytest.raises(TargetMismatchError) as refused:
            run.restore(*targets, {**aux, "loss": 0}, _iterator())
        message = str(refused.value)
        assert (
            "['state']['loss']: stored () float32, target () int64 (a lossy cast of a "
            "jax.Array into a Python number)" in message
        )
        assert "allow_lossy_casts()" in message and "targets of the stored dtype" in message
        with allow_lossy_casts():
            lossy = run.restore(*targets, {**aux, "loss": 0}, _iterator())
        assert lossy is not None and lossy.auxiliary["loss"] == 0


def test_compare_table_gives_the_verdict_every_load_gives(tmp_path):
    path = tmp_path / "c"
    save_checkpointables(
        path, {"m": {"f32": jnp.float32(1.5), "bf16": jnp.asarray(3.0, jnp.bfloat16), "py": 2.5}}
    ).result()
    targets = {"m": {"f32": 0.0, "bf16": 0.0, "py": np.zeros((), np.float64)}}
    table = ex.compare_table(path, targets).set_index("key")
    assert set(table["status"]) == {words.DTYPE_CAST, words.OK}
    assert not table["lossy"].fillna(False).any()
    loaded = load_checkpointables(path, targets)["m"]
    assert loaded["f32"] == 1.5 and loaded["bf16"] == 3.0 and float(loaded["py"]) == 2.5
    # A stored Python number into a JAX array: no such restore; the message says how.
    jax_target = {"m": {**targets["m"], "py": jnp.zeros((), jnp.float32)}}
    assert ex.compare_table(path, jax_target).set_index("key").loc["['py']", "status"] == (
        words.KIND_DIFFERS
    )
    with pytest.raises(TargetMismatchError, match="a Python number is stored"):
        load_checkpointables(path, jax_target)


def _cli(*args: object) -> tuple[int, str]:
    import io

    from tinax._cli.main import main

    out = io.StringIO()
    return main([str(a) for a in args], out, io.StringIO()), out.getvalue()
