"""One health verdict, computed once and said alike everywhere: healthy, diverged or not
yet known, beside integrity; and restores that never resume into NaN.

Real runs: flax NNX models trained with optax's adamw, saved by ``TrainingRun`` with a
Grain iterator (``divergence_fixtures``), one whose logged loss turns NaN and one whose
weights do while the loss it logs stays finite.
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from divergence_fixtures import LAST_FINITE_STEP, NAN_STEP, STEPS, Mlp, write_nnx_run
from divergence_fixtures import tinax_here as _tinax
from flax import nnx

import tinax.explore as ex
from tinax import vocabulary as words
from tinax._format.integrity import health
from tinax.checkpointing import DivergedCheckpointError, TrainingRun, load_checkpointables

# The run whose weights go NaN at this step while the loss it logs stays finite.
SILENT_STEP = 3


def _name(step: int) -> str:
    return f"step_{step:06d}"


def _pipeline() -> grain.DatasetIterator:
    return iter(grain.MapDataset.range(64).batch(4).to_iter_dataset())


def _targets(silent: bool = False) -> tuple[object, object, object, object]:
    model = Mlp(nnx.Rngs(1))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)
    auxiliary = {
        "loss": jnp.float32(0),
        "learning_rate": np.float32(0),
        "grad_scale": jnp.asarray(0, jnp.bfloat16),
        "eval": {"loss": 0.0},
        "epoch": 0,
    }
    if silent:
        auxiliary = {"loss": jnp.float32(0)}
    return nnx.state(model), nnx.state(optimizer), jax.random.key(0), auxiliary


def _write_silent_run(root: Path) -> Path:
    """Steps 1-4, saved every step: from ``SILENT_STEP`` on the model's weights are NaN
    (a bad batch's update, say) while the loss each save logs stays finite."""
    model = Mlp(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)
    batches = _pipeline()
    with TrainingRun(root, save_every=1, keep=None) as run:
        for step in range(1, 5):
            next(batches)
            if step == SILENT_STEP:
                kernel = model.layers[1].kernel
                kernel[...] = jnp.full_like(kernel[...], jnp.nan)
            auxiliary = {"loss": jnp.float32(1.0 / step)}
            run.save(
                step,
                nnx.state(model),
                nnx.state(optimizer),
                jax.random.key(step),
                auxiliary,
                batches,
            )
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    made = tmp_path_factory.mktemp("health")
    return {
        "nan_loss": Path(write_nnx_run(str(made / "nan_loss"))),
        "silent": _write_silent_run(made / "silent"),
    }


@pytest.fixture
def fresh() -> None:
    """A process that has read no checkpoint's data yet."""
    health.forget()
    yield
    health.forget()


def _copy(runs: dict[str, Path], which: str, tmp_path: Path) -> Path:
    shutil.copytree(runs[which], tmp_path / which)
    return tmp_path / which


# -- the verdict itself --------------------------------------------------------------------


def test_the_verdict_from_what_is_known():
    unknown = health.judge(metrics={"loss": 0.5})
    assert unknown.verdict == words.HEALTH_UNKNOWN and unknown.nan is None
    assert unknown.reason == "its data has not been read"
    logged = health.judge(metrics={"loss": math.nan, "lr": 1e3, "scale": -math.inf})
    assert logged.verdict == words.DIVERGED and logged.source == health.FROM_METRICS
    assert logged.reason == "its logged loss is NaN and scale is -Inf"
    both = health.judge(metrics={"a": math.nan, "b": math.nan}).reason
    assert both == "its logged a and b are NaN"
    counted = health.counts_of(
        [
            health.LeafCount("optimizer", "['mu']", 3, 1),
            health.LeafCount("model", "['w']", 2, 0),
            health.LeafCount("model", "['b']", 0, 0),
            health.LeafCount("auxiliary", "['loss']", 1, 0),
        ],
        ["rng"],
    )
    found = health.judge(metrics={"loss": math.nan}, counts=counted)
    # Each leaf once; the state's sums apart from the metrics'; stored order.
    assert (found.nan, found.inf, found.nonfinite_leaves) == (6, 1, 3)
    assert found.state == health.Counts(5, 1, 2)
    assert found.diverged_parts == ("model", "optimizer")
    assert found.reason == (
        "5 NaN and 1 Inf in 2 leaves of model, optimizer; its logged loss is NaN"
    )
    healthy = health.judge(counts=health.counts_of([], ["model"]), metrics={"loss": 1.0})
    assert healthy.verdict == words.HEALTHY and healthy.nan == 0
    partly = health.judge(counts=health.counts_of([], ["model"]), complete=False)
    assert partly.verdict == words.HEALTH_UNKNOWN
    # A run's record of it: the sums, for the save that committed then only.
    entry = health.record_entry(found, 1234)
    again = health.from_record(entry, 1234)
    assert again is not None and again.verdict == words.DIVERGED
    assert again.source == health.FROM_RECORD and again.counts == found.counts
    assert health.from_record(entry, 999) is None  # the step saved again since
    assert health.from_record({"committed_ns": 1234, "counts": {"m": [1, "x", 0]}}, 1234) is None
    assert health.overall(words.DAMAGED, words.HEALTH_UNKNOWN) == words.DAMAGED
    assert health.overall(words.SOUND, words.DIVERGED) == words.DIVERGED


# -- one word everywhere -------------------------------------------------------------------


def test_a_nan_logged_loss_is_diverged_everywhere_without_reading_data(runs, fresh):
    run = runs["nan_loss"]
    expected = {s: words.DIVERGED if s >= NAN_STEP else words.HEALTH_UNKNOWN for s in STEPS}
    listing = ex.list_checkpoints(run)
    table = ex.run_table(run)
    for frame in (listing, table):
        assert dict(zip(frame["step"], frame["health"], strict=True)) == expected
        assert set(frame["integrity"]) == {words.SOUND} and frame["nan"].isna().all()
    reason = "its logged eval.loss and loss are NaN"
    assert set(listing.loc[listing["step"] >= NAN_STEP, "health_reason"]) == {reason}
    for step in STEPS:
        checked = ex.verify(run / _name(step))
        assert checked.health.verdict == expected[step]
        assert ex.checkpoint_health(run / _name(step)).verdict == expected[step]
        # Never "sound" beside "diverged".
        assert (checked.status == words.DIVERGED) == (expected[step] == words.DIVERGED)
        assert checked.ok == (expected[step] != words.DIVERGED)
    assert ex.verify(run / _name(NAN_STEP)).verdict == (
        f"diverged: {reason} (metadata checked; it loads)"
    )
    # The command line: the same words, a note under ls, verify exits 1.
    status, text, _ = _tinax("ls", run)
    assert status == 0 and all(len(line) <= 80 for line in text.splitlines())
    assert f"diverged: steps {NAN_STEP}, {STEPS[-1]}: {reason}" in " ".join(text.split())
    status, text, _ = _tinax("verify", run)
    assert status == 1
    assert "3 of 5 checkpoints sound, 2 diverged (metadata checked; the health of 3" in (
        " ".join(text.split())
    )


def test_reading_the_data_counts_each_leaf_once_and_every_view_agrees(runs, fresh):
    run = runs["nan_loss"]
    scan = ex.scan_run(run).set_index("step")
    # Read now in this process: every table says what the data showed, with one count.
    listing = ex.list_checkpoints(run).set_index("step")
    table = ex.run_table(run).set_index("step")
    for step in STEPS:
        one = ex.checkpoint_health(run / _name(step))
        assert one.source == health.FROM_DATA
        verdict = words.DIVERGED if step >= NAN_STEP else words.HEALTHY
        for frame in (scan, listing, table):
            assert frame.loc[step, "health"] == verdict == one.verdict
            assert frame.loc[step, "nan"] == one.nan and frame.loc[step, "inf"] == one.inf
            assert frame.loc[step, "health_reason"] == one.reason
    diverged = ex.checkpoint_health(run / _name(NAN_STEP))
    # Every weight and both adamw moments of each: 6 + 12 leaves of the state; the NaN
    # loss and eval.loss are the logged metrics, counted in the totals too.
    assert diverged.state.leaves == 18 and diverged.nonfinite_leaves == 20
    assert diverged.diverged_parts == ("model", "optimizer")
    assert diverged.reason.startswith(f"{diverged.state.nan:,} NaN and 0 Inf in 18 leaves")
    assert diverged.nan == sum(leaf.nan for leaf in diverged.leaves)
    data = ex.verify(run / _name(NAN_STEP), data=True)
    assert int(data.leaves["nan_count"].sum()) == diverged.nan
    # pandas deep-copies a table's attrs at every operation (a row, a slice): the
    # verdicts there are shared, not copied leaf count by leaf count each time.
    listed = ex.list_checkpoints(run)
    verdicts = listed.attrs["health"]
    assert verdicts[str(run / _name(NAN_STEP))].leaves
    for frame in (listed.iloc[0], listed[listed["step"] >= NAN_STEP], listed.copy(deep=True)):
        assert all(frame.attrs["health"][p] is v for p, v in verdicts.items())


def test_loads_of_one_checkpointable_at_a_time_add_up_to_one_count(runs, fresh):
    # A script (or the restore-target builder) loading a checkpoint part by part is
    # told the count a read of it whole gives, not the last part's alone.
    path = runs["nan_loss"] / _name(NAN_STEP)
    model, optimizer, _, _ = _targets()
    load_checkpointables(path, {"model": model})
    after_model = ex.checkpoint_health(path)
    assert after_model.diverged_parts == ("model",)
    load_checkpointables(path, {"optimizer": optimizer})
    after_both = ex.checkpoint_health(path)
    health.forget()
    whole = ex.checkpoint_health(path, data=True)
    assert after_both.diverged_parts == ("model", "optimizer")
    assert after_both.state == whole.state and after_both.state.leaves == 18
    assert after_both.reason.split(";")[0] == whole.reason.split(";")[0]


def test_a_silent_divergence_is_found_by_the_data_alone(runs, fresh):
    run = runs["silent"]
    assert ex.checkpoint_health(run / _name(SILENT_STEP)).verdict == words.HEALTH_UNKNOWN
    found = ex.checkpoint_health(run / _name(SILENT_STEP), data=True)
    # The kernel (32 × 32) and nothing else: adamw's moments stay finite this step.
    assert found.verdict == words.DIVERGED and found.metrics == ()
    assert found.reason == "1,024 NaN and 0 Inf in 1 leaf of model"
    assert [(leaf.checkpointable, leaf.nan) for leaf in found.leaves] == [("model", 1024)]
    assert "kernel" in found.leaves[0].key


# -- restores that do not resume into NaN --------------------------------------------------


def test_restore_passes_over_what_diverged_and_says_why(runs, fresh, tmp_path, caplog):
    run = _copy(runs, "nan_loss", tmp_path)
    with (
        caplog.at_level(logging.WARNING, logger="tinax.checkpointing"),
        TrainingRun(run, save_every=1, keep=None, best_by="loss") as training,
    ):
        restored = training.restore(*_targets(), _pipeline())
        passed = training.passed_over
    assert restored is not None and restored.step == LAST_FINITE_STEP
    assert math.isfinite(float(restored.auxiliary["loss"]))
    assert [(p.step, p.why) for p in passed] == [(5, "diverged"), (4, "diverged")]
    assert passed[0].reason == "its logged eval.loss and loss are NaN"
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"resumed from step {LAST_FINITE_STEP}" in said
    assert "passed over steps 5, 4 (diverged: its logged eval.loss and loss are NaN)" in said
    # What the load found is in the run's record: a new process knows it without reading.
    health.forget()
    listing = ex.list_checkpoints(run).set_index("step")
    assert listing.loc[LAST_FINITE_STEP, "health"] == words.HEALTHY
    assert listing.loc[LAST_FINITE_STEP, "nan"] == 0
    assert ex.checkpoint_health(run / _name(LAST_FINITE_STEP)).source == health.FROM_RECORD
    # Taken all the same when asked.
    with TrainingRun(run, save_every=1, keep=None) as training:
        newest = training.restore(*_targets(), _pipeline(), allow_diverged=True)
    assert newest is not None and newest.step == STEPS[-1]
    assert math.isnan(float(newest.auxiliary["loss"]))


def test_restore_reads_a_silent_divergence_and_leaves_the_iterator_alone(runs, fresh, tmp_path):
    run = _copy(runs, "silent", tmp_path)
    iterator = _pipeline()
    with TrainingRun(run, save_every=1, keep=None) as training:
        restored = training.restore(*_targets(silent=True), iterator)
        passed = training.passed_over
    assert restored is not None and restored.step == SILENT_STEP - 1
    assert [p.step for p in passed] == [4, 3]
    assert passed[-1].reason == "1,024 NaN and 0 Inf in 1 leaf of model"
    # The iterator is where step 2 left it: two batches read.
    assert int(next(iterator)[0]) == 8
    # Recorded: a listing in a fresh process says so, from the run's record.
    health.forget()
    listing = ex.list_checkpoints(run).set_index("step")
    assert listing.loc[SILENT_STEP, "health"] == words.DIVERGED
    assert listing.loc[SILENT_STEP, "nan"] == 1024
    assert listing.loc[SILENT_STEP, "health_reason"] == "1,024 NaN and 0 Inf in 1 leaf of model"


def test_restore_refuses_when_nothing_is_healthy_naming_each(runs, fresh, tmp_path):
    run = _copy(runs, "nan_loss", tmp_path)
    with TrainingRun(run, save_every=1, keep=None) as training:
        with pytest.raises(DivergedCheckpointError, match=r"steps? 4 \(diverged: its logged"):
            training.restore(*_targets(), _pipeline(), step=NAN_STEP)
        for step in STEPS[:LAST_FINITE_STEP]:
            shutil.rmtree(run / _name(step))
        with pytest.raises(DivergedCheckpointError) as refused:
            training.restore(*_targets(), _pipeline())
    said = str(refused.value)
    assert "no checkpoint of run" in said and "steps 5, 4 (diverged:" in said
    assert "allow_diverged=True" in said
    assert isinstance(refused.value, ValueError)


def test_drift_and_scan_say_the_same_count(runs, fresh):
    run = runs["nan_loss"]
    status, text, _ = _tinax("run", run, "--drift", "--scan", columns=200)
    assert status == 0
    scan = ex.scan_run(run)
    first = scan.attrs["first_nonfinite_step"]
    path = scan.loc[scan["step"] == first, "path"].iloc[0]
    model = scan.attrs["health"][path].counts["model"]
    said = " ".join(text.split())
    # The pair that went NaN counts its later checkpoint's model as the scan does.
    assert f"from step {first - 1} to {first}, whose model holds {model.nan:,} NaN" in said
    assert f"step {first}: model {model.nan:,} NaN, optimizer" in said
    # Each leaf once: the scan's total is the sum of its checkpointables'.
    found = scan.attrs["health"][path]
    assert found.nan == sum(c.nan for c in found.counts.values())


def test_reading_nan_says_nothing_on_stderr(runs, tmp_path):
    # NaN and Inf are what is being counted: no NumPy RuntimeWarning about them (a sum
    # of +Inf and -Inf is one NumPy warns of).
    import subprocess
    import sys

    from tinax.checkpointing import save_checkpointables

    weights = np.full((64, 64), 1e30, np.float32)
    weights[0, :3] = [np.inf, -np.inf, np.nan]
    save_checkpointables(tmp_path / "inf", {"model": {"w": weights}}).result()
    run = str(runs["nan_loss"])
    for args in (
        ("verify", str(tmp_path / "inf"), "--data"),
        ("verify", run, "--data"),
        ("run", run, "--drift", "--scan"),
    ):
        done = subprocess.run(
            [sys.executable, "-W", "default", "-m", "tinax.explore", *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode in (0, 1), done.stderr
        assert "Warning" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_divergence_one_process_finds_is_raised_as_itself_on_every_process():
    # What another process of a job receives of the refusal (``_processes.agree``):
    # the same class, so that each passes the checkpoint over alike.
    from tinax.checkpointing import _processes

    sent = _processes._record(DivergedCheckpointError("step 60: its logged loss is NaN"))
    received = _processes._agreed_error(sent, 1)
    assert type(received) is DivergedCheckpointError
    assert str(received).startswith("step 60: its logged loss is NaN [process 1 of ")
