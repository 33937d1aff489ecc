"""One process of a job whose processes meet through tinax, each wait with a deadline.

Started N times by ``cluster.launch`` (see tests/test_process_waits.py)::

    python waits_worker.py TIMEOUT

Every process reports its index and a word; process 0 decides (the largest index,
and every word in process order) and every process reports the decision. Then a
decision whose chooser raises: every process reports the error. Then the last
process stalls (it sleeps, alive, its heartbeats going on) where the others agree on
a save's verdict with a deadline of TIMEOUT seconds: each of them reports the error
and how long it waited, and lets the error end it as it would end a training script
(uncaught, without ``cluster.main``, so that tinax's exit is the one tested).
"""

from __future__ import annotations

import sys
import time

import cluster

from tinax.checkpointing import ProcessTimeoutError, _processes


def _decisions() -> None:
    me = cluster.index()
    chosen = _processes.decide(
        {"index": me, "word": f"w{me}"},
        lambda reports: {
            "largest": max(r["index"] for r in reports),
            "words": [r["word"] for r in reports],
        },
        what="a test decision",
        timeout=60,
    )
    cluster.report("decided", chosen=chosen)

    def refuse(reports: list[object]) -> None:
        raise ValueError(f"no choice among {len(reports)} reports")

    try:
        _processes.decide(me, refuse, what="a refused decision", timeout=60)
        cluster.report("refused", error=None)
    except ValueError as e:
        cluster.report("refused", error=str(e))


def _stall(timeout: float) -> None:
    me, last = cluster.index(), cluster.count() - 1
    began = time.time()
    if me == last:
        cluster.report("stalled", at=began)
        time.sleep(600)
    try:
        _processes.agree(None, what="the save of step 7", timeout=timeout)
    except ProcessTimeoutError as e:
        cluster.report("error", message=str(e), missing=list(e.missing), at=began)
        raise
    cluster.report("error", message=None)


if __name__ == "__main__":
    cluster.join()
    _decisions()
    _stall(float(sys.argv[1]))
