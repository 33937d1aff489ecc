"""Processes of a real JAX job meeting through tinax: one decision for all, and no wait
without a deadline.

One job of three processes (tests/waits_worker.py) on localhost: a decision made on
process 0 and returned everywhere, an error of the decider raised everywhere, then a
stalled process: the others end with one error naming it and the wait, within the
deadline, and leave without JAX's shutdown barrier (which would hold them for
minutes). JAX's own heartbeat is set far beyond the deadline, so that what ends the
processes is tinax's deadline, not JAX noticing a dead process.
"""

from __future__ import annotations

from pathlib import Path

import cluster
import pytest
import waits_worker

from tinax.checkpointing import ProcessTimeoutError

DEADLINE = 8
PROCESSES = 3


@pytest.fixture(scope="module")
def job() -> cluster.Outcome:
    return cluster.launch(
        Path(waits_worker.__file__),
        DEADLINE,
        processes=PROCESSES,
        devices=1,
        timeout=180,
        grace=60,
        heartbeat=120,
    )


def test_one_decision_made_on_process_0_is_returned_on_every_process(job):
    for i in range(PROCESSES):
        assert job.result(i, "decided")["chosen"] == {"largest": 2, "words": ["w0", "w1", "w2"]}
        # The decider's error, the same on every process (the decider named).
        assert job.result(i, "refused")["error"] == "no choice among 3 reports [process 0 of 3]"


def test_a_stalled_process_ends_every_other_with_one_error_naming_it_within_the_deadline(job):
    stalled = PROCESSES - 1
    began = job.result(stalled, "stalled")["at"] - job.launched
    for i in range(stalled):
        error = job.result(i, "error")
        assert error["missing"] == [stalled]
        assert error["message"] == (
            "process 2 of 3 did not reach the save of step 7 within 8 s (processes 0 and 1 "
            "did): it has died or stalled"
        )
        # Ended by the uncaught error, with status 1, soon after the deadline: not
        # held at JAX's shutdown barrier (5 minutes) nor by the stalled process.
        assert job.returncodes[i] == 1, str(job)
        waited = job.ended[i] - (error["at"] - job.launched)
        assert DEADLINE <= waited < DEADLINE + 12, (waited, str(job))
        assert "leaves the job without JAX's shutdown barrier" in job.logs[i]
        assert job.logs[i].count("ProcessTimeoutError: process 2 of 3") == 1
    # The stalled process ends too once process 0, which holds the coordination
    # service, has gone; not at the launcher's timeout.
    assert not job.timed_out and job.ended[stalled] - began < 60, str(job)


def test_a_process_already_lost_is_not_waited_for_again(monkeypatch):
    """Once a wait has named a process lost, a later wait on it (a promotion's meeting
    still running beside the save that found the loss) raises at once instead of
    waiting out its own deadline: bench/pod_campaign.py's survivors of a kill inside
    a promotion left 10 s later than the others before."""
    from tinax.checkpointing import _processes

    earlier = ProcessTimeoutError(
        "process 1 of 2 did not reach the save of step 23 within 10 s",
        missing=[1],
        what="the save of step 23",
        timeout=10,
    )
    monkeypatch.setattr(_processes, "_loss", (earlier, [0]))
    with pytest.raises(ProcessTimeoutError) as raised:
        _processes._check_not_lost([0, 1], what="the promotion of step 20", timeout=10)
    assert str(raised.value).endswith(
        "cannot reach the promotion of step 20: already lost in the save of step 23"
    )
    assert raised.value.missing == (1,)
    _processes._check_not_lost([0, 2], what="another wait", timeout=10)  # nobody lost there
    monkeypatch.setattr(_processes, "_loss", None)
    _processes._check_not_lost([0, 1], what="a wait before any loss", timeout=10)
