"""Preemption of a two-tier run: ``run.preempted`` turns true only once the preemption
step has committed in the durable directory, whatever the moment the SIGTERM lands,
and kills never leave a local checkpoint waiting for a promotion for good.

The signal is sent at each moment of a save where a decision is taken (during the wait
for the save before, while the local save starts, inside a promotion, between two
saves), with DEBUG logging on (which once changed the timing enough to lose the save),
on a path and on gs://; kills run in real subprocesses (tests/two_tier_worker.py).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import two_tier_worker as worker
from test_two_tier_run import _event, _exact, _restore, _worker

import tinax.explore as ex
from tinax._format.naming import names, words
from tinax._format.records import tiers
from tinax.checkpointing import TrainingRun, _promotion, _run


def _sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def _once(function: Any, when: Any) -> Any:
    """``function``, sending SIGTERM to this process the first time ``when(*args)`` holds."""
    sent = []

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not sent and when(*args, **kwargs):
            sent.append(True)
            _sigterm()
        return function(*args, **kwargs)

    return wrapper


def _during_local_save(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    # While the local save of ``step`` starts: its save was decided a local one only.
    monkeypatch.setattr(
        _run,
        "start_training_save",
        _once(_run.start_training_save, lambda path, *a, **k: path.endswith(f"{step:06d}")),
    )


def _during_wait(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    # While save(step) waits for the save before it to end.
    original = TrainingRun._wait_save
    calls = []

    def wait(self: TrainingRun) -> None:
        calls.append(True)
        if len(calls) == step:
            _sigterm()
        original(self)

    monkeypatch.setattr(TrainingRun, "_wait_save", wait)


def _during_promotion(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    # On the promotion's thread, as the promotion of ``step`` starts copying.
    monkeypatch.setattr(
        _promotion,
        "promote",
        _once(_promotion.promote, lambda source, destination: source.name.endswith(f"{step:06d}")),
    )


MOMENTS = {
    "during the local save": _during_local_save,
    "during the wait for the save before": _during_wait,
    "during a promotion": _during_promotion,
    "between two saves": None,
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_preempted_turns_true_only_once_the_preemption_step_is_durable(
    moment, durable, tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.DEBUG)
    # Step 4 is promoted by the interval; step 5 is saved locally only, unless the
    # signal makes it the preemption save.
    hook = MOMENTS[moment]
    signal_at = 4 if moment == "during a promotion" else 5
    if hook is not None:
        hook(monkeypatch, signal_at)
    iterator = iter(worker.dataset())
    # Local saves at every step, a promotion every 4: only a preemption promotes the others.
    run = TrainingRun(
        durable, save_every=4, keep=2, local=tmp_path / "local", local_every=1, local_keep=2
    )
    seen = []
    try:
        for step in range(1, 12):
            batch = next(iterator)
            run.save(step, *worker.state(step), {"loss": float(batch[0])}, iterator)
            if hook is None and step == signal_at:
                _sigterm()
            if run.preempted:
                # The durable tier holds the step now, as a fresh listing finds it.
                listed = ex.list_checkpoints(durable, cache=None)
                complete = listed[listed["status"] == words.COMPLETE]
                seen = sorted(int(s) for s in complete["step"])
                break
    finally:
        run.close()
    assert run.preempted, f"never preempted ({moment})"
    assert step in seen, (moment, step, seen)
    assert step in run.durable_steps
    # Nothing is left in flight and nothing waits: the job may end here.
    assert all(p.done() for p in run._promotions)
    assert _exact(_restore(TrainingRun(durable, save_every=4, keep=2)), step)


def test_a_local_step_whose_promotion_committed_as_the_job_was_killed_is_released(
    durable, tmp_path
):
    local = tmp_path / "local"
    events = _worker(durable, local, steps=40, save_every=10, kill_after_promotion=True)
    assert _event(events, "killed")["where"] == "after promotion"
    # The kill came after the durable commit of step 10 and before the run recorded it:
    # the local tier's record still says step 10 waits.
    record = json.loads(Path(local, names.RUN_RECORD).read_text())
    assert record[tiers.PROMOTE] == [10]
    # The resumed job goes on past step 20, and the durable tier prunes step 10.
    events = _worker(durable, local, steps=21, save_every=10, keep=1)
    assert _event(events, "exit")["code"] == 0, events
    assert _event(events, "end")["durable"] == [20]
    listed = ex.list_checkpoints(local, cache=None)
    in_local = listed[listed["tier"].isin([words.TIER_LOCAL, words.TIER_BOTH])]
    assert sorted(int(s) for s in in_local["step"]) == [20, 21]
    assert not (listed["promotion"].astype("string") == words.PROMOTION_WAITING).any()
    record = json.loads(Path(local, names.RUN_RECORD).read_text())
    assert record[tiers.PROMOTE] == []
