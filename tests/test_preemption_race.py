"""``run.preempted`` turns true only once the preemption save has committed: a SIGTERM
that lands between ``run.save(step)`` and ``if run.preempted: break`` is saved at the
next step, never lost. The signal is sent at that exact point, in this process and in
a training script run as a job runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import grain
import jax
import numpy as np

from tinax.checkpointing import TrainingRun


def _iterator() -> grain.DatasetIterator:
    return iter(grain.MapDataset.range(100).to_iter_dataset())


def test_a_sigterm_after_a_save_makes_the_next_save_the_preemption_save(tmp_path):
    it = _iterator()
    flags = []
    with TrainingRun(tmp_path / "r", save_every=5, keep=None) as run:
        for step in range(1, 20):
            next(it)
            run.save(step, {"w": np.full(3, step, np.float32)}, {}, jax.random.key(0), {}, it)
            if step == 7:
                # Step 7 was not saved (the interval is 5): the notice lands right
                # after save(7), before the loop looks at the flag.
                os.kill(os.getpid(), signal.SIGTERM)
                assert run.preemption_requested
            flags.append((step, run.preempted))
            if run.preempted:
                break
    # Not preempted at 7 (nothing of 6 or 7 saved yet); step 8 was the preemption
    # save, committed before the flag turned true.
    assert flags[-2:] == [(7, False), (8, True)]
    assert run.steps == [5, 8]
    assert (tmp_path / "r" / "step_000008" / "_CHECKPOINT_METADATA").exists()


def test_a_sigterm_between_should_save_and_save_is_saved_at_that_step(tmp_path):
    # The notice comes after should_save(7) decided "no" and before save(7) runs:
    # save(7) decides again and makes the preemption save.
    it = _iterator()
    with TrainingRun(tmp_path / "r", save_every=5, keep=None) as run:
        for step in range(1, 20):
            next(it)
            if run.should_save(step) or step == 7:
                if step == 7:
                    os.kill(os.getpid(), signal.SIGTERM)
                run.save(step, {"w": np.zeros(2)}, {}, jax.random.key(0), {}, it)
            if run.preempted:
                break
    assert step == 7 and run.steps == [5, 7]


_SCRIPT = """
import json, os, signal, sys
import grain, jax, numpy as np
import tinax.checkpointing as tc

data = grain.MapDataset.range(1_000).shuffle(seed=0).batch(4).to_iter_dataset()
with tc.TrainingRun(sys.argv[1], save_every=5, keep=2) as run:
    last = run.restore({"w": np.zeros(3)}, {}, jax.random.key(0), {"loss": 0.0}, batches := iter(data))
    for step, batch in zip(range(last.step + 1 if last else 1, 50), batches):
        run.save(step, {"w": np.full(3, step, np.float64)}, {}, jax.random.key(0), {"loss": 1 / step}, batches)
        if step == 7:
            os.kill(os.getpid(), signal.SIGTERM)  # the notice, between save and the check
        if run.preempted: break
print(json.dumps({"stopped": step, "steps": run.steps}))
"""


def test_a_training_script_preempted_between_save_and_check_loses_nothing(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # It went on to step 8, saved it as the preemption save, and ended cleanly.
    assert report == {"stopped": 8, "steps": [5, 8]}
    names = sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith("step_"))
    assert names == ["step_000005", "step_000008"]
