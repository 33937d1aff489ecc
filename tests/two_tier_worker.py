"""A training loop with a two-tier ``TrainingRun``, driven by tests/test_two_tier_run.py.

    python two_tier_worker.py DURABLE LOCAL OPTIONS_JSON

It resumes (``run.restore``), then trains to ``steps``, saving at every step (the run
decides), and prints one JSON line per event (``TINAX-2T {...}``): ``resumed`` (the
step, 0 for a fresh start, and the next batch), ``preempted`` (the step saved for the
preemption, and the run's durable steps when the save returned), ``end``. Options:

- ``steps``, ``save_every`` (10), ``local_every`` (1), ``keep``, ``local_keep`` (2):
  the loop and the run's policy;
- ``kill_in_copy``: SIGKILL this process in the middle of its first promotion's
  copy, once half of the checkpoint's files are copied;
- ``kill_before_promotion``: SIGKILL this process when its first promotion would
  start (the local checkpoint committed, its promotion recorded as waiting);
- ``kill_before_marker``: SIGKILL this process when its first promotion to ``gs://``
  has written the commit record but not yet ``commit_success.txt``;
- ``kill_after_promotion``: SIGKILL this process as its first promotion has committed,
  before the run has recorded it;
- ``sigterm_at``: at this step this process sends itself SIGTERM, and the loop ends
  when ``run.preempted``.

Every value of the state is a fixed function of the step (``state``), so a test can
check a restored checkpoint bit for bit, and the batch after it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import grain
import jax
import jax.numpy as jnp
import numpy as np

from tinax.checkpointing import TrainingRun, abstract_restore_target

PREFIX = "TINAX-2T "


def state(step: int) -> tuple[dict[str, Any], dict[str, Any], jax.Array]:
    """The model, optimizer and RNG of ``step``."""
    model = {"w": jnp.full((32, 32), float(step)), "b": np.arange(8, dtype=np.float32) + step}
    optimizer = {"mu": jnp.full((32, 32), step / 4), "count": np.asarray(step, np.int32)}
    return model, optimizer, jax.random.key_data(jax.random.key(step))


def targets() -> tuple[Any, Any, Any, dict[str, float]]:
    model, optimizer, rng = state(0)
    return (
        abstract_restore_target(model),
        abstract_restore_target(optimizer),
        abstract_restore_target(rng),
        {"loss": 0.0},
    )


def dataset() -> grain.IterDataset:
    return grain.MapDataset.range(100_000).batch(4).to_iter_dataset()


_emitting = threading.Lock()


def emit(event: str, **values: object) -> None:
    # One write per line, under a lock: a promotion's thread emits too, and a print's
    # text and newline are two writes another thread's line could come between.
    with _emitting:
        sys.stdout.write(PREFIX + json.dumps({"event": event, **values}) + "\n")
        sys.stdout.flush()


def _kill_in_copy() -> None:
    from tinax._format.storage import transfer

    copy = transfer.copy_files

    def copy_half_then_die(source: Any, files: Any, destination: Any) -> None:
        files = list(files)
        if len(files) > 1:
            copy(source, files[: len(files) // 2], destination)
            emit("killed", where="copy")
            os.kill(os.getpid(), signal.SIGKILL)
        copy(source, files, destination)

    transfer.copy_files = copy_half_then_die


def _kill_before_marker() -> None:
    from tinax._format.naming import names
    from tinax._format.storage import transfer

    copy = transfer.copy_files

    def copy_then_die(source: Any, files: Any, destination: Any) -> None:
        files = list(files)
        copy(source, files, destination)
        if [f.relative for f in files] == [(names.CHECKPOINT_METADATA,)]:
            emit("killed", where="before the marker")
            os.kill(os.getpid(), signal.SIGKILL)

    transfer.copy_files = copy_then_die


def _kill_before_promotion() -> None:
    from tinax.checkpointing import _promotion

    def die(source: Any, destination: Any) -> None:
        emit("killed", where="before promotion")
        os.kill(os.getpid(), signal.SIGKILL)

    _promotion.promote = die


def _kill_after_promotion() -> None:
    from tinax.checkpointing import _promotion

    promote = _promotion.promote

    def promote_then_die(source: Any, destination: Any) -> None:
        promote(source, destination)
        emit("killed", where="after promotion")
        os.kill(os.getpid(), signal.SIGKILL)

    _promotion.promote = promote_then_die


def train(durable: str, local: str, options: dict[str, Any]) -> None:
    if options.get("kill_in_copy"):
        _kill_in_copy()
    if options.get("kill_before_promotion"):
        _kill_before_promotion()
    if options.get("kill_before_marker"):
        _kill_before_marker()
    if options.get("kill_after_promotion"):
        _kill_after_promotion()
    run = TrainingRun(
        durable,
        save_every=options.get("save_every", 10),
        keep=options.get("keep"),
        local=local,
        local_every=options.get("local_every", 1),
        local_keep=options.get("local_keep", 2),
    )
    iterator = iter(dataset())
    restored = run.restore(*targets(), iterator)
    start = 0 if restored is None else restored.step
    emit("resumed", step=start)
    for step in range(start + 1, options["steps"] + 1):
        batch = next(iterator)
        if step == options.get("sigterm_at"):
            os.kill(os.getpid(), signal.SIGTERM)
        model, optimizer, rng = state(step)
        run.save(step, model, optimizer, rng, {"loss": float(batch[0])}, iterator)
        if run.preempted:
            emit("preempted", step=step, durable=run.durable_steps)
            break
    run.close()
    emit("end", durable=run.durable_steps, local=run.local_steps)


if __name__ == "__main__":
    train(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
