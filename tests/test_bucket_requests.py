"""How many requests each operation asks of a bucket: counted against the emulator.

On ``gs://`` every request is a round trip of 10-150 ms, so an operation's cost is its
request count. A small run of a flax NNX model with optax's AdamW (two blocks, some
hundred leaves) is written by ``TrainingRun`` to the session's fake-gcs-server, with
raw Orbax's save of the same state beside it; each operation is counted through the
emulator's proxy with every cache of this process emptied first, as in a fresh
process, and held to the bounds ``bench/bucket.py`` measures at 30 ms a request. A
change that makes a layer open a checkpoint again, or read leaf by leaf, fails here.
"""

from __future__ import annotations

import io
import uuid
from typing import Any

import grain
import jax
import pytest
from conftest import BUCKET
from orbax.checkpoint import v1 as ocp

import tinax.checkpointing as tc
import tinax.explore as ex

CHECKPOINTS = 4


def _model_and_optimizer(seed: int) -> tuple[Any, Any]:
    import optax
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.norm = nnx.LayerNorm(16, rngs=rngs)
            self.up = nnx.Linear(16, 32, rngs=rngs)
            self.down = nnx.Linear(32, 16, rngs=rngs)

    class Model(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.blocks = nnx.List([Block(rngs) for _ in range(2)])
            self.head = nnx.Linear(16, 1, rngs=rngs)

    model = Model(nnx.Rngs(seed))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    return nnx.state(model), nnx.state(optimizer)


def _fresh() -> None:
    """Forgets what this process kept of earlier reads, as a fresh process has nothing."""
    from tinax._format.arraydata import blocks
    from tinax.explore._run_view import drift, scan

    blocks.clear()
    drift._pairs.clear()
    scan._scanned.clear()


@pytest.fixture(scope="module")
def run(gcs: Any) -> dict[str, Any]:
    root = f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"
    batches = iter(grain.MapDataset.range(100).batch(4).to_iter_dataset())
    with tc.TrainingRun(f"{root}/run", save_every=1) as training:
        for step in range(1, CHECKPOINTS + 1):
            model, optimizer = _model_and_optimizer(step)
            next(batches)
            auxiliary = {"loss": 1 / step, "phase": "warmup"}
            training.save(step, model, optimizer, jax.random.key(step), auxiliary, batches)
    ocp.save_checkpointables(f"{root}/orbax", {"model": model, "optimizer": optimizer})
    steps = training.steps
    return {
        "run": f"{root}/run",
        "orbax": f"{root}/orbax",
        "newest": f"{root}/run/step_{steps[-1]:06d}",
        "previous": f"{root}/run/step_{steps[-2]:06d}",
        "targets": {
            "model": tc.abstract_restore_target(model),
            "optimizer": tc.abstract_restore_target(optimizer),
        },
    }


def _count(gcs: Any, operation: Any) -> int:
    _fresh()
    with gcs.counting() as made:
        operation()
    return len(made)


def test_a_load_asks_no_more_than_orbax_s_own(gcs: Any, run: dict[str, Any]) -> None:
    targets = run["targets"]
    orbax = _count(gcs, lambda: ocp.load_checkpointables(run["orbax"], targets))
    tinax = _count(gcs, lambda: tc.load_checkpointables(run["newest"], targets))
    assert tinax <= 1.2 * orbax, (tinax, orbax)
    # The same load of a checkpoint opened once: nothing listed or read twice.
    opened = tc.open_checkpoint(run["newest"])
    again = _count(gcs, lambda: tc.load_checkpointables(opened, targets))
    assert again < tinax, (again, tinax)


def test_a_run_is_listed_from_prefix_listings(gcs: Any, run: dict[str, Any]) -> None:
    from tinax._cli.main import main

    # The listing alone tells: not a request per checkpoint, however many there are.
    listing = _count(gcs, lambda: ex.list_checkpoints(run["run"]))
    assert listing <= 3, listing
    shown = io.StringIO()
    ls = _count(gcs, lambda: main(["ls", run["run"]], shown, io.StringIO()))
    assert "step_000004" in shown.getvalue() and ls <= 3, ls
    table = _count(gcs, lambda: ex.run_table(run["run"]))
    assert table <= 4 * CHECKPOINTS, table


def test_a_checkpoint_s_tables_and_checks(gcs: Any, run: dict[str, Any]) -> None:
    assert _count(gcs, lambda: ex.checkpoint_table(run["newest"])) <= 30
    assert _count(gcs, lambda: ex.verify(run["newest"])) <= 40
    diff = _count(gcs, lambda: ex.diff_table(run["previous"], run["newest"]))
    assert diff <= 150, diff


def test_a_run_scanned_and_its_drift(gcs: Any, run: dict[str, Any]) -> None:
    scanned = _count(gcs, lambda: ex.scan_run(run["run"]))
    assert scanned <= 40 * CHECKPOINTS, scanned
    drift = _count(gcs, lambda: ex.drift_table(run["run"]))
    assert drift <= 40 * CHECKPOINTS, drift


def test_a_resume_asks_little_more_than_its_model_and_optimizer(
    gcs: Any, run: dict[str, Any]
) -> None:
    # The RNG key, the auxiliary state (a string in it too) and the iterator are a few
    # small files more.
    targets = run["targets"]
    load = _count(gcs, lambda: tc.load_checkpointables(run["newest"], targets))
    iterator = iter(grain.MapDataset.range(100).batch(4).to_iter_dataset())
    resume = _count(
        gcs,
        lambda: tc.load_training_checkpoint(
            run["newest"],
            targets["model"],
            targets["optimizer"],
            jax.random.key(0),
            {"loss": 0.0, "phase": ""},
            iterator,
        ),
    )
    # Through Orbax, the three took some 145 requests more (existence checks).
    assert resume <= load + 10, (resume, load)
    assert next(iterator).tolist() == [16, 17, 18, 19]  # where the saved run's was
