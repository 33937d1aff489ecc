"""Going on from a good step: a run restored at an earlier step than its newest saves the
steps after it again; the checkpoints of the branch it leaves are set aside (kept,
listed as abandoned, never resumed from) and its record says from which step it went
on. ``set_aside_diverged`` (``tinax set-aside``) clears a run's diverged checkpoints.

Real runs: a flax NNX model trained with optax's adamw by ``TrainingRun``, with a
Grain iterator, whose loss turns NaN at ``NAN_STEP`` (``divergence_fixtures``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from divergence_fixtures import LAST_FINITE_STEP, NAN_STEP, STEPS, Mlp, write_nnx_run
from flax import nnx

import tinax.explore as ex
from tinax import vocabulary as words
from tinax._format.integrity import health
from tinax.checkpointing import TrainingRun, set_aside_diverged

ABANDONED = ".tinax-abandoned"


def _name(step: int) -> str:
    return f"step_{step:06d}"


def _pipeline() -> grain.DatasetIterator:
    return iter(grain.MapDataset.range(64).batch(4).to_iter_dataset())


class _Training:
    """The fixture's model, optimizer and auxiliary state, to restore into and save."""

    def __init__(self) -> None:
        self.model = Mlp(nnx.Rngs(1))
        self.optimizer = nnx.Optimizer(self.model, optax.adamw(1e-2), wrt=nnx.Param)
        self.auxiliary = {
            "loss": jnp.float32(0),
            "learning_rate": np.float32(0),
            "grad_scale": jnp.asarray(0, jnp.bfloat16),
            "eval": {"loss": 0.0},
            "epoch": 0,
        }
        self.iterator = _pipeline()

    def restore(self, run: TrainingRun, **kwargs: object) -> int | None:
        state = (nnx.state(self.model), nnx.state(self.optimizer), jax.random.key(0))
        restored = run.restore(*state, self.auxiliary, self.iterator, **kwargs)
        if restored is None:
            return None
        nnx.update(self.model, restored.model)
        return restored.step

    def save(self, run: TrainingRun, step: int) -> None:
        state = (nnx.state(self.model), nnx.state(self.optimizer), jax.random.key(step))
        run.save(step, *state, {**self.auxiliary, "loss": jnp.float32(0.5)}, self.iterator)


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(write_nnx_run(str(tmp_path_factory.mktemp("going_on") / "run")))


@pytest.fixture
def run(nan_run: Path, tmp_path: Path) -> Path:
    health.forget()
    shutil.copytree(nan_run, tmp_path / "run")
    return tmp_path / "run"


def test_a_run_restored_at_an_earlier_step_saves_the_steps_after_it_again(run, caplog):
    training = _Training()
    with TrainingRun(run, save_every=1, keep=None) as first:
        assert training.restore(first, step=2) == 2
        for step in (3, 4, 5):
            training.save(first, step)  # no FileExistsError: the old 3-5 are set aside
        went_on = first.went_on_from
    assert [(w["from_step"], w["set_aside"]) for w in went_on] == [(2, [3, 4, 5])]
    assert "going on from step 2" in caplog.text
    listing = ex.list_checkpoints(run)
    rows = dict(zip(listing["name"], listing["status"], strict=True))
    for step in (3, 4, 5):
        assert rows[_name(step)] == words.COMPLETE
        assert rows[_name(step) + ABANDONED] == words.ABANDONED
    # The branch left keeps its verdict; the new checkpoints are the run's own.
    aside = listing[listing["status"] == words.ABANDONED].set_index("step")
    assert aside.loc[NAN_STEP, "health"] == words.DIVERGED
    assert aside.loc[NAN_STEP, "integrity"] == words.SOUND
    assert list(aside.index) == [3, 4, 5]
    # A resume takes the new step 5, never a checkpoint of the branch left.
    with TrainingRun(run, save_every=1, keep=None) as second:
        assert _Training().restore(second) == 5
        assert second.steps == list(STEPS)
        assert second.went_on_from == went_on
    record = json.loads((run / "tinax_run.json").read_text())
    assert record["went_on"][0]["from_step"] == 2
    # The command line lists the branch left, and says so under the table.
    from tinax._cli.main import main

    out = io.StringIO()
    os.environ["COLUMNS"] = "80"
    try:
        assert main(["ls", str(run)], out, io.StringIO()) == 0
    finally:
        del os.environ["COLUMNS"]
    assert "abandoned: steps 3, 4, 5, set aside when the run went on" in " ".join(
        out.getvalue().split()
    )


def test_a_restore_that_passed_diverged_steps_over_goes_on_past_them(run):
    training = _Training()
    with TrainingRun(run, save_every=1, keep=None) as again:
        assert training.restore(again) == LAST_FINITE_STEP
        training.save(again, NAN_STEP)
        assert again.went_on_from[0]["set_aside"] == [NAN_STEP, STEPS[-1]]
    names = sorted(p.name for p in run.iterdir())
    assert _name(NAN_STEP) in names and _name(NAN_STEP) + ABANDONED in names


def test_two_tiers_set_the_branch_aside_in_both(tmp_path):
    durable, local = tmp_path / "durable", tmp_path / "local"
    training = _Training()
    with TrainingRun(durable, save_every=2, keep=None, local=local, local_every=1) as one:
        training.restore(one)
        for step in range(1, 6):
            training.save(one, step)
    with TrainingRun(durable, save_every=2, keep=None, local=local, local_every=1) as two:
        assert training.restore(two, step=2) == 2
        training.save(two, 3)
        training.save(two, 4)
        two.wait()
        assert two.durable_steps == [2, 4] and two.local_steps == [3, 4]
    # The local tier kept its 2 newest (4 and 5), the durable one every even step.
    in_durable = sorted(p.name for p in durable.iterdir() if ABANDONED in p.name)
    in_local = sorted(p.name for p in local.iterdir() if ABANDONED in p.name)
    assert in_durable == [_name(4) + ABANDONED]
    assert in_local == [_name(s) + ABANDONED for s in (4, 5)]
    listing = ex.list_checkpoints(durable)
    assert (listing["status"] == words.ABANDONED).sum() == 3


def test_set_aside_diverged_clears_the_way_back(run, tmp_path):
    # A dry run changes nothing.
    planned = set_aside_diverged(run, dry_run=True)
    assert [(d.step, d.now) for d in planned] == [(NAN_STEP, None), (STEPS[-1], None)]
    assert (run / _name(NAN_STEP)).is_dir()
    done = set_aside_diverged(run)
    assert [d.step for d in done] == [NAN_STEP, STEPS[-1]]
    assert done[0].reason == "its logged eval.loss and loss are NaN"
    assert done[0].now == str(run / (_name(NAN_STEP) + ABANDONED))
    assert not (run / _name(NAN_STEP)).exists()
    # Nothing left to set aside; a resume takes the newest healthy step unread.
    assert set_aside_diverged(run) == []
    with TrainingRun(run, save_every=1, keep=None) as again:
        assert _Training().restore(again) == LAST_FINITE_STEP
        assert again.passed_over == ()
    # Removed instead, from the command line.
    from tinax._cli.main import main

    copy = tmp_path / "again"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns(f"*{ABANDONED}"))
    shutil.copytree(run / (_name(NAN_STEP) + ABANDONED), copy / _name(NAN_STEP))
    (copy / _name(NAN_STEP) / "_TINAX_ABANDONED").unlink()
    out = io.StringIO()
    assert main(["set-aside", str(copy), "--remove", "--json"], out, io.StringIO()) == 0
    said = json.loads(out.getvalue())
    assert said["removed"] and [c["step"] for c in said["checkpoints"]] == [NAN_STEP]
    assert not (copy / _name(NAN_STEP)).exists()
    assert not any(ABANDONED in p.name for p in copy.iterdir())
