"""TrainingRun: interval, retention, resume from the newest sound checkpoint, preemption,
and a script's exit waiting for the save in flight.

Loops run in real subprocesses (tests/run_worker.py: flax NNX, optax, Grain) where a
fresh process or a real signal is the point; the rest runs here.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import run_worker
from damage import biggest_data_file, flip_middle_byte

import tinax.checkpointing as tc
import tinax.explore as ex
from tinax import _paths
from tinax._format.naming import names, words
from tinax._format.storage import removal
from tinax.checkpointing import (
    TargetMismatchError,
    TrainingRun,
    abstract_restore_target,
    load_training_checkpoint,
)

WORKER = Path(run_worker.__file__)


def _dataset() -> grain.IterDataset:
    return grain.MapDataset.range(10_000).batch(4).to_iter_dataset()


def _state(step: int) -> tuple[dict, dict, jax.Array]:
    model = {"w": jnp.full((16, 16), float(step)), "b": np.arange(16, dtype=np.float32) + step}
    optimizer = {"mu": jnp.full((16, 16), step / 2), "count": np.asarray(step, np.int32)}
    return model, optimizer, jax.random.key_data(jax.random.key(step))


def _targets() -> tuple[object, object, object, dict]:
    model, optimizer, rng = _state(0)
    return (
        abstract_restore_target(model),
        abstract_restore_target(optimizer),
        abstract_restore_target(rng),
        {"loss": 0.0},
    )


def _loop(run: TrainingRun, steps: range, iterator, *, best_at: int = 100) -> None:
    for step in steps:
        next(iterator)
        model, optimizer, rng = _state(step)
        run.save(step, model, optimizer, rng, {"loss": float(abs(step - best_at))}, iterator)


def _flip_data_byte(checkpoint: Path) -> Path:
    return flip_middle_byte(biggest_data_file(checkpoint / "model"))


def _complete(root: object) -> list[str]:
    table = ex.list_checkpoints(root, cache=None)
    return sorted(table.loc[table["status"] == words.COMPLETE, "name"])


# -- interval and retention -----------------------------------------------------------------


def test_300_steps_keep_the_newest_two_plus_the_best_and_say_why(root):
    iterator = iter(_dataset())
    with TrainingRun(root, save_every=50, keep=2, keep_best=1, best_by="loss") as run:
        _loop(run, range(1, 301), iterator)
    assert run.steps == [100, 250, 300]
    assert _complete(root) == ["step_000100", "step_000250", "step_000300"]
    policy = ex.run_policy(root)
    assert policy == {
        "save_every": 50,
        "keep": 2,
        "keep_best": 1,
        "best_by": "loss",
        "best_mode": "min",
    }
    table = ex.retention_table(root)
    assert dict(zip(table["step"], table["kept"], strict=True)) == {
        100: "best loss",
        250: "newest 2",
        300: "newest 2",
    }
    # The record is a file beside the checkpoints, never listed as one.
    assert (Path(root) / names.RUN_RECORD).is_file() if not root.startswith("gs://") else True
    assert names.RUN_RECORD not in set(ex.list_checkpoints(root)["name"])


def test_best_by_a_callable_in_max_mode_and_keep_none_keeps_everything(tmp_path):
    iterator = iter(_dataset())
    with TrainingRun(
        tmp_path / "a",
        save_every=10,
        keep=1,
        keep_best=2,
        best_by=lambda a: -a["loss"],
        best_mode="max",
    ) as run:
        _loop(run, range(1, 61), iterator, best_at=20)
    # -|step - 20| is largest at 20, then 10 and 30 tie (the newer wins).
    assert run.steps == [20, 30, 60]
    with TrainingRun(tmp_path / "b", save_every=10) as every:
        _loop(every, range(1, 31), iter(_dataset()))
    assert every.steps == [10, 20, 30]
    assert set(ex.retention_table(tmp_path / "b")["kept"]) == {words.KEPT_ALL}


def test_save_is_skipped_off_the_interval_and_forced_saves_and_one_in_flight(tmp_path):
    run = TrainingRun(tmp_path / "r", save_every=5, handle_sigterm=False)
    iterator = iter(_dataset())
    model, optimizer, rng = _state(3)
    assert not run.should_save(3) and run.should_save(5) and run.should_save(0)
    assert run.save(3, model, optimizer, rng, {}, iterator) is None
    first = run.save(3, model, optimizer, rng, {}, iterator, force=True)
    second = run.save(5, model, optimizer, rng, {}, iterator)
    # The second save started only once the first had committed.
    assert first is not None and first.done()
    assert second is not None
    run.close()
    assert second.done() and run.steps == [3, 5]
    with pytest.raises(RuntimeError, match="closed"):
        run.save(10, model, optimizer, rng, {}, iterator)


def test_a_step_the_run_has_is_refused_before_anything_is_written(tmp_path, caplog):
    run = TrainingRun(tmp_path / "r", save_every=1, keep=2, handle_sigterm=False)
    _loop(run, range(1, 4), iter(_dataset()))
    run.wait()
    record = (tmp_path / "r" / names.RUN_RECORD).read_bytes()
    with caplog.at_level(logging.WARNING, logger="tinax.checkpointing"):
        # Step 1 was pruned: saving it again is allowed, and said to be odd.
        _loop(run, range(1, 2), iter(_dataset()))
        run.wait()
    assert any("did this job resume" in r.getMessage() for r in caplog.records)
    record = (tmp_path / "r" / names.RUN_RECORD).read_bytes()
    with pytest.raises(FileExistsError, match=r"step 3 already.*run\.restore"):
        _loop(run, range(3, 4), iter(_dataset()))
    assert (tmp_path / "r" / names.RUN_RECORD).read_bytes() == record
    run.close()
    assert run.steps == [2, 3]


def test_bad_arguments_are_refused_with_clear_errors(tmp_path):
    with pytest.raises(TypeError, match="save_every"):
        TrainingRun(tmp_path, save_every=True)
    with pytest.raises(ValueError, match="keep must be at least 1"):
        TrainingRun(tmp_path, keep=0)
    with pytest.raises(ValueError, match="best_by"):
        TrainingRun(tmp_path, keep=1, keep_best=1)
    with pytest.raises(ValueError, match="best_mode"):
        TrainingRun(tmp_path, best_mode="lowest")
    with pytest.raises(TypeError, match="best_by"):
        TrainingRun(tmp_path, best_by=3)
    with pytest.raises(FileNotFoundError, match="parent"):
        TrainingRun(tmp_path / "no" / "such")
    run = TrainingRun(tmp_path / "r", save_every=1, keep=1, keep_best=1, best_by="loss")
    model, optimizer, rng = _state(1)
    with pytest.raises(ValueError, match="'loss' is not a key"):
        run.save(1, model, optimizer, rng, {"accuracy": 1.0}, iter(_dataset()))
    with pytest.raises(TypeError, match="must be a number"):
        run.save(1, model, optimizer, rng, {"loss": "low"}, iter(_dataset()))
    run.close()


# -- resume -------------------------------------------------------------------------------


def test_an_empty_run_restores_none_and_step_restores_exactly_that_step(tmp_path):
    run = TrainingRun(tmp_path / "r", save_every=50, handle_sigterm=False)
    assert run.restore(*_targets(), iter(_dataset())) is None
    _loop(run, range(1, 101), iter(_dataset()))
    run.wait()
    iterator = iter(_dataset())
    restored = run.restore(*_targets(), iterator, step=50)
    assert restored is not None and restored.step == 50
    np.testing.assert_array_equal(restored.model["b"], _state(50)[0]["b"])
    assert next(iterator).tolist() == [200, 201, 202, 203]
    with pytest.raises(FileNotFoundError, match="no complete checkpoint of step 75"):
        run.restore(*_targets(), iter(_dataset()), step=75)


def test_a_flipped_data_byte_in_the_newest_falls_back_to_the_previous_with_a_warning(tmp_path):
    run = TrainingRun(tmp_path / "r", save_every=50, handle_sigterm=False)
    _loop(run, range(1, 101), iter(_dataset()))
    run.close()
    _flip_data_byte(tmp_path / "r" / "step_000100")
    # Asked for by step, the damaged one raises instead (and stays where it is).
    with pytest.raises(ValueError, match="step_000100"):
        run.restore(*_targets(), iter(_dataset()), step=100)
    assert (tmp_path / "r" / "step_000100").is_dir()
    iterator = iter(_dataset())
    with pytest.warns(RuntimeWarning, match=r"step_000100.*CorruptDataError") as caught:
        restored = run.restore(*_targets(), iterator)
    assert len([w for w in caught if str(w.message).startswith("skipping checkpoint")]) == 1
    assert restored is not None and restored.step == 50
    np.testing.assert_array_equal(np.asarray(restored.model["w"]), np.full((16, 16), 50.0))
    # The iterator moved once, to step 50's position: the failed attempt left it alone.
    assert next(iterator).tolist() == [200, 201, 202, 203]


def test_a_run_that_skipped_a_corrupt_checkpoint_sets_it_aside_and_goes_on(tmp_path):
    root = tmp_path / "r"
    run = TrainingRun(root, save_every=50, keep=3, handle_sigterm=False)
    _loop(run, range(1, 101), iter(_dataset()))
    run.close()
    _flip_data_byte(root / "step_000100")
    iterator = iter(_dataset())
    resumed = TrainingRun(root, save_every=50, keep=3, handle_sigterm=False)
    # What earlier tests of this process left for the collector goes first: a failed
    # load of theirs can leave an Orbax coroutine unstarted, and its warning must not
    # be taken for this restore's.
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = resumed.restore(*_targets(), iterator)
        gc.collect()
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "never awaited" in m], messages
    assert len([m for m in messages if m.startswith("skipping checkpoint")]) == 1
    assert restored is not None and restored.step == 50
    # Moved aside, kept for inspection, and no longer its step's checkpoint.
    aside = root / ("step_000100" + names.CORRUPT_SUFFIX)
    assert aside.is_dir() and not (root / "step_000100").exists()
    record = json.loads((aside / names.CORRUPT_RECORD).read_text())
    assert "CorruptDataError" in record["reason"] and record["name"] == "step_000100"
    table = ex.list_checkpoints(root, cache=None)
    row = table.set_index("name").loc[aside.name]
    assert row["status"] == words.FOUND_CORRUPT and row["step"] == 100
    assert "CorruptDataError" in table.attrs["errors"][str(aside)]
    assert _complete(root) == ["step_000050"]
    report = ex.verify(aside)
    assert not report.ok
    assert names.CORRUPT_RECORD in set(report.errors["part"])
    with pytest.raises(ValueError, match="found corrupt by a training run's restore"):
        load_training_checkpoint(aside, *_targets(), iter(_dataset()))
    # One open_checkpoint: it opens the set-aside checkpoint to be looked at, and a
    # load of the opened value refuses it as a load of its path does.
    opened = tc.open_checkpoint(aside)
    assert opened is not None and ex.open_checkpoint is tc.open_checkpoint
    with pytest.raises(ValueError, match="found corrupt by a training run's restore"):
        tc.load_checkpointables(opened, {"rng": np.zeros((2,), np.uint32)})
    # The resumed job saves step 100 again, and a later resume takes it.
    _loop(resumed, range(51, 151), iterator)
    resumed.close()
    assert resumed.steps == [50, 100, 150]
    again = TrainingRun(root, handle_sigterm=False).restore(*_targets(), iter(_dataset()), step=100)
    assert again is not None and again.step == 100
    # Corrupt again and found again: set aside beside the first one.
    _flip_data_byte(root / "step_000150")
    _flip_data_byte(root / "step_000100")
    with pytest.warns(RuntimeWarning, match="skipping checkpoint"):
        third = TrainingRun(root, handle_sigterm=False).restore(*_targets(), iter(_dataset()))
    assert third is not None and third.step == 50
    assert {p.name for p in root.iterdir() if p.is_dir()} == {
        "step_000050",
        aside.name,
        names.corrupt_name("step_000100", 2),
        names.corrupt_name("step_000150"),
    }
    # The command line's verify of the run names what was set aside, and passes
    # unless told to be strict.
    cli = [sys.executable, "-m", "tinax.explore", "verify", str(root)]
    verified = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.count("set aside") == 3
    strict = subprocess.run([*cli, "--strict"], capture_output=True, text=True, timeout=120)
    assert strict.returncode == 1


def test_a_skipped_checkpoint_goes_aside_on_disk_and_on_gs_and_its_step_is_saved_again(root):
    run_root = f"{root}/r"
    run = TrainingRun(run_root, save_every=50, handle_sigterm=False)
    _loop(run, range(1, 101), iter(_dataset()))
    run.close()
    # A part of the newest checkpoint's array data goes missing.
    newest = _paths.location(run.path(100)) / "model"
    data = [where for where, entry in newest.walk() if where.parent.name == "d"]
    assert data
    for where in data:
        removal.delete(where)
    with pytest.warns(RuntimeWarning, match="skipping checkpoint"):
        restored = TrainingRun(run_root, save_every=50, handle_sigterm=False).restore(
            *_targets(), iter(_dataset())
        )
    assert restored is not None and restored.step == 50
    table = ex.list_checkpoints(run_root, cache=None)
    statuses = dict(zip(table["name"], table["status"], strict=True))
    set_aside = "step_000100" + (names.CORRUPT_SUFFIX if not root.startswith("gs://") else "")
    assert statuses[set_aside] == words.FOUND_CORRUPT
    assert _complete(run_root) == ["step_000050"]
    resumed = TrainingRun(run_root, save_every=50, handle_sigterm=False)
    _loop(resumed, range(51, 101), iter(_dataset()))
    resumed.close()
    assert resumed.steps == [50, 100]
    again = resumed.restore(*_targets(), iter(_dataset()))
    assert again is not None and again.step == 100


def test_must_exist_refuses_a_missing_or_empty_run_and_a_fresh_start_is_logged(tmp_path, caplog):
    with pytest.raises(FileNotFoundError, match="rnu"):
        TrainingRun(tmp_path / "rnu", must_exist=True)
    assert not (tmp_path / "rnu").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        TrainingRun(tmp_path / "empty", must_exist=True)
    with pytest.raises(TypeError, match="must_exist"):
        TrainingRun(tmp_path / "empty", must_exist=1)
    with pytest.raises(ValueError, match="on_preemption"):
        TrainingRun(tmp_path / "empty", on_preemption="stop")
    with caplog.at_level(logging.WARNING, logger="tinax.checkpointing"):
        assert (
            TrainingRun(tmp_path / "new", handle_sigterm=False).restore(
                *_targets(), iter(_dataset())
            )
            is None
        )
    assert any(
        "fresh start" in r.getMessage()
        and str(tmp_path / "new") in r.getMessage()
        and "just created" in r.getMessage()
        for r in caplog.records
    )
    run = TrainingRun(tmp_path / "new", save_every=1, handle_sigterm=False)
    _loop(run, range(1, 2), iter(_dataset()))
    run.close()
    assert TrainingRun(tmp_path / "new", must_exist=True, handle_sigterm=False).steps == [1]


def test_a_target_mismatch_is_raised_not_skipped(tmp_path):
    run = TrainingRun(tmp_path / "r", save_every=50, handle_sigterm=False)
    _loop(run, range(1, 101), iter(_dataset()))
    run.close()
    model, optimizer, rng, aux = _targets()
    wrong = {"w": jax.ShapeDtypeStruct((8, 8), jnp.float32), "b": model["b"]}
    iterator = iter(_dataset())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TargetMismatchError):
            run.restore(wrong, optimizer, rng, aux, iterator)
    assert next(iterator).tolist() == [0, 1, 2, 3]


def test_when_nothing_loads_restore_names_every_checkpoint_and_why(tmp_path):
    run = TrainingRun(tmp_path / "r", save_every=50, handle_sigterm=False)
    _loop(run, range(1, 101), iter(_dataset()))
    run.close()
    for step in (50, 100):
        _flip_data_byte(tmp_path / "r" / f"step_{step:06d}")
    iterator = iter(_dataset())
    with pytest.warns(RuntimeWarning), pytest.raises(ValueError) as caught:
        run.restore(*_targets(), iterator)
    assert "step_000050" in str(caught.value) and "step_000100" in str(caught.value)
    # Neither failed attempt moved the iterator.
    assert next(iterator).tolist() == [0, 1, 2, 3]


def _script(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(WORKER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )


def _events(stdout: str) -> list[dict]:
    return [
        json.loads(line[len(run_worker.PREFIX) :])
        for line in stdout.splitlines()
        if line.startswith(run_worker.PREFIX)
    ]


def test_a_fresh_process_resumes_bit_exactly_and_the_iterator_continues(tmp_path):
    options = {"steps": 120, "save_every": 40, "keep": 2}
    whole = _script("train", str(tmp_path / "whole"), json.dumps(options))
    assert whole.returncode == 0, whole.stderr
    first = _script("train", str(tmp_path / "split"), json.dumps({**options, "steps": 80}))
    assert first.returncode == 0, first.stderr
    second = _script("train", str(tmp_path / "split"), json.dumps(options))
    assert second.returncode == 0, second.stderr
    saved = {e["step"]: e["digest"] for e in _events(first.stdout) if e["event"] == "save"}
    restored = next(e for e in _events(second.stdout) if e["event"] == "restored")
    assert restored["step"] == 80 and restored["digest"] == saved[80]
    losses = {e["step"]: e["loss"] for e in _events(whole.stdout) if e["event"] == "loss"}
    resumed = {e["step"]: e["loss"] for e in _events(second.stdout) if e["event"] == "loss"}
    assert sorted(resumed) == list(range(81, 121))
    assert resumed == {step: losses[step] for step in resumed}


# -- preemption -----------------------------------------------------------------------------


def test_sigterm_mid_loop_saves_at_that_step_and_chains_the_previous_handler(tmp_path):
    options = {"steps": 1000, "save_every": 50, "ready_at": 73}
    child = subprocess.Popen(
        [sys.executable, str(WORKER), "train", str(tmp_path / "r"), json.dumps(options)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith(run_worker.PREFIX) and '"ready"' in line:
                child.send_signal(signal.SIGTERM)
                break
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 0, err
    events = _events(out)
    assert {"event": "preempted", "step": 73, "committed": True} in events
    assert events[-1] == {"event": "end", "chained": True, "steps": [50, 73]}
    assert _complete(tmp_path / "r") == ["step_000050", "step_000073"]


def _preempt(tmp_path: Path, options: dict) -> tuple[subprocess.Popen, str, float]:
    """Runs the worker to ``ready_at``, sends SIGTERM, and times how long it takes to end."""
    child = subprocess.Popen(
        [sys.executable, str(WORKER), "train", str(tmp_path / "r"), json.dumps(options)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    try:
        assert child.stdout is not None
        out = ""
        for line in child.stdout:
            out += line
            if line.startswith(run_worker.PREFIX) and '"ready"' in line:
                sent = time.monotonic()
                child.send_signal(signal.SIGTERM)
                break
        rest, err = child.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        child.kill()
    return child, out + rest, took


def test_a_loop_that_does_not_break_ends_as_sigterm_would_after_the_save(tmp_path):
    options = {"steps": 1000, "save_every": 50, "ready_at": 73, "no_break": True}
    child, out, took = _preempt(tmp_path, {**options, "default_handler": True})
    # Killed by the signal itself, as without a run, at the step after the save.
    assert child.returncode == -signal.SIGTERM, child.stderr
    events = _events(out)
    assert {"event": "preempted", "step": 73, "committed": True} in events
    assert [e["step"] for e in events if e["event"] == "save"] == [50, 73]
    assert max(e["step"] for e in events if e["event"] == "loss") == 74
    assert took < 30
    assert _complete(tmp_path / "r") == ["step_000050", "step_000073"]


def test_a_loop_that_does_not_break_with_a_handler_chained_exits_143(tmp_path):
    options = {"steps": 1000, "save_every": 50, "ready_at": 73, "no_break": True}
    child, out, _ = _preempt(tmp_path, options)
    assert child.returncode == 128 + signal.SIGTERM
    events = _events(out)
    assert [e["step"] for e in events if e["event"] == "save"] == [50, 73]
    assert not [e for e in events if e["event"] == "end"]
    assert _complete(tmp_path / "r") == ["step_000050", "step_000073"]


def test_on_preemption_continue_goes_on_saving_by_the_interval(tmp_path):
    options = {
        "steps": 160,
        "save_every": 50,
        "ready_at": 73,
        "no_break": True,
        "on_preemption": "continue",
    }
    child, out, _ = _preempt(tmp_path, options)
    assert child.returncode == 0
    events = _events(out)
    # One save for the preemption, then the interval's: not one at every step.
    assert [e["step"] for e in events if e["event"] == "save"] == [50, 73, 100, 150]
    assert events[-1] == {"event": "end", "chained": True, "steps": [50, 73, 100, 150]}


def test_the_sigterm_handler_is_put_back_on_close(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    run = TrainingRun(tmp_path / "r")
    assert signal.getsignal(signal.SIGTERM) != before
    run.close()
    assert signal.getsignal(signal.SIGTERM) == before
    quiet = TrainingRun(tmp_path / "q", handle_sigterm=False)
    assert signal.getsignal(signal.SIGTERM) == before
    quiet.close()


# -- a script that ends with a save in flight -----------------------------------------------

_ENDS_IN_FLIGHT = """
import os, sys
os.environ["JAX_PLATFORMS"] = "cpu"
import grain, numpy as np
from tinax.checkpointing import TrainingRun, save_training_checkpoint
iterator = iter(grain.MapDataset.range(100).to_iter_dataset())
big = {"w": np.random.default_rng(0).standard_normal((4096, 2048)).astype(np.float32)}
if sys.argv[1] == "free":
    save_training_checkpoint(sys.argv[2], 7, big, {}, np.zeros(2, np.uint32), {}, iterator)
else:
    run = TrainingRun(sys.argv[2], save_every=7, keep=1)
    run.save(7, big, {}, np.zeros(2, np.uint32), {}, iterator)
"""


@pytest.mark.parametrize("how", ["free", "run"])
def test_a_script_ending_with_a_save_in_flight_commits_it_and_exits_cleanly(tmp_path, how):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(_ENDS_IN_FLIGHT))
    target = tmp_path / "ck" if how == "free" else tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(script), how, str(target)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "waiting for 1 tinax save(s) in flight to commit" in lines[0]
    checkpoint = target if how == "free" else target / "step_000007"
    assert str(checkpoint) in lines[0]
    restored = load_training_checkpoint(
        checkpoint,
        {"w": abstract_restore_target(np.zeros((4096, 2048), np.float32))},
        {},
        abstract_restore_target(np.zeros(2, np.uint32)),
        {},
        iter(grain.MapDataset.range(100).to_iter_dataset()),
    )
    expected = np.random.default_rng(0).standard_normal((4096, 2048)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(restored.model["w"]), expected)


# -- crash-safe removal ---------------------------------------------------------------------


@pytest.mark.parametrize("kill_at", [0, 3, -1])
def test_a_kill_during_removal_never_lists_a_half_removed_checkpoint_as_complete(tmp_path, kill_at):
    directory = tmp_path / "r"
    options = {"steps": 40, "save_every": 20, "keep": 1}
    run_worker.train(str(directory), {**options, "steps": 20})
    killed = _script("train", str(directory), json.dumps({**options, "kill_at_delete": kill_at}))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert any(e["event"] == "killed" for e in _events(killed.stdout))
    table = ex.list_checkpoints(directory, cache=None)
    statuses = dict(zip(table["name"], table["status"], strict=True))
    # step 20 was being removed once step 40 committed: never complete again.
    assert statuses["step_000040"] == words.COMPLETE
    left = sorted(p.name for p in (directory / "step_000020").iterdir())
    if left != [names.DELETION_MARKER]:  # parts of it are still there: being removed
        assert statuses["step_000020"] == words.BEING_REMOVED
    else:  # only the marker is left (the last deletion but one): nothing like a checkpoint
        assert "step_000020" not in statuses
    assert "step_000020" not in _complete(directory)
    run = TrainingRun(directory, handle_sigterm=False)  # finishes the removal
    assert run.steps == [40]
    assert sorted(p.name for p in directory.iterdir() if p.is_dir()) == ["step_000040"]
    restored = run.restore(*_worker_targets(), iter(run_worker.dataset()))
    assert restored is not None and restored.step == 40
    run.close()


def _worker_targets() -> tuple:
    from flax import nnx

    model, optimizer, rng, _ = run_worker.fresh()
    return (
        abstract_restore_target(nnx.state(model)),
        abstract_restore_target(nnx.state(optimizer)),
        abstract_restore_target(rng),
        {"loss": 0.0},
    )


# -- several processes ------------------------------------------------------------------------


def test_two_processes_save_retain_and_stop_at_the_same_step_after_a_sigterm(tmp_path):
    import cluster
    import run_cluster_worker

    script = Path(run_cluster_worker.__file__)
    loop = cluster.launch(script, "loop", tmp_path / "r", processes=2)
    assert loop.ok, "\n=====\n".join(loop.logs)
    reports = [loop.result(i, "loop") for i in range(2)]
    # Process 1 alone got the SIGTERM (at step 25); both saved at the same later step.
    stop = reports[0]["preempted_at"]
    assert stop is not None and stop >= 25 and stop == reports[1]["preempted_at"]
    # Saved every 10 steps and at the preemption; kept the newest two and the best (10).
    saved = sorted(set(range(10, stop + 1, 10)) | {stop})
    expected = sorted({10, *saved[-2:]})
    assert reports[0]["steps"] == reports[1]["steps"] == expected
    assert _complete(tmp_path / "r") == [f"step_{s:06d}" for s in expected]
    resume = cluster.launch(script, "resume", tmp_path / "r", processes=2)
    assert resume.ok, "\n=====\n".join(resume.logs)
    for i in range(2):
        report = resume.result(i, "resume")
        assert report["restored"] == stop and report["exact"] is True
        # Each process's shard of the data: 1000 examples split by process, batches of 4.
        first = 2 * 4 * stop + i
        assert report["next"] == list(range(first, first + 8, 2))


def test_a_record_write_cut_short_by_a_kill_is_cleared_by_the_next_run(tmp_path):
    directory = tmp_path / "r"
    directory.mkdir()
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    stale = directory / f"{names.RUN_RECORD}.{int(gone.stdout)}-1.tmp"
    live = directory / f"{names.RUN_RECORD}.{os.getpid()}-1.tmp"
    stale.write_text("{")
    live.write_text("{")
    TrainingRun(directory, handle_sigterm=False).close()
    assert not stale.exists() and live.exists()


def test_the_readme_example_runs_twice_in_a_row_and_resumes(tmp_path):
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    start = readme.index("```python\n") + len("```python\n")
    script = readme[start : readme.index("```", start)]
    assert "if run.preempted: break" in script
    (tmp_path / "example.py").write_text(script)
    outputs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "example.py"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
        )
        assert done.returncode == 0, done.stderr[-4000:]
        outputs.append((done.stdout, done.stderr))
    # The second run resumed at step 3, saved nothing and printed the same line.
    assert outputs[0][0] == outputs[1][0] and outputs[0][0].startswith("[2, 3] 3 ")
    assert "a fresh start" in outputs[0][1] and "a fresh start" not in outputs[1][1]
    assert "Traceback" not in outputs[1][1]
