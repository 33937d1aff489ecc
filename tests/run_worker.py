"""A training script driven by tests/test_training_run.py: a flax NNX model, optax's
AdamW and a Grain pipeline, trained and checkpointed with ``TrainingRun``.

    python run_worker.py train DIRECTORY OPTIONS_JSON

resumes from the run's newest sound checkpoint (if any), trains to ``steps`` and
prints one JSON line per event (``TINAX-RUN {...}``): where it started, the digest of
the state at each save, each step's loss. Options:

- ``steps``, ``save_every``, ``keep``, ``keep_best``: the loop and the run's policy
  (the metric ``loss`` is ``|step - best_at|``, so the best step is known);
- ``ready_at``: at this step, print ``ready`` and wait (polling) for a SIGTERM; a
  handler of the script's own is chained unless ``default_handler``;
- ``no_break``: the loop does not ``break`` when ``run.preempted``;
- ``on_preemption``: passed to ``TrainingRun``;
- ``kill_at_delete``: SIGKILL this process at the n-th deletion of a removal (``-1``:
  at the deletion of the marker, the last);
- ``no_wait``: end the script without waiting for the last save.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tinax.checkpointing import TrainingRun, abstract_restore_target

PREFIX = "TINAX-RUN "


class Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.dense1 = nnx.Linear(4, 8, rngs=rngs)
        self.dropout = nnx.Dropout(0.1, rngs=rngs)
        self.dense2 = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.dense2(self.dropout(nnx.relu(self.dense1(x))))


@nnx.jit
def train_step(model: Model, optimizer: nnx.Optimizer, rng: jax.Array, batch: dict) -> tuple:
    rng, noise = jax.random.split(rng)
    x = batch["x"] + 0.01 * jax.random.normal(noise, batch["x"].shape)
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - batch["y"]) ** 2))(model)
    optimizer.update(model, grads)
    return rng, loss


def dataset() -> grain.IterDataset:
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(256, 4)).astype(np.float32)
    ys = (xs @ rng.normal(size=(4, 1))).astype(np.float32)
    return (
        grain.MapDataset.range(256)
        .shuffle(seed=1)
        .repeat(None)
        .map(lambda i: {"x": xs[i], "y": ys[i]})
        .batch(8, drop_remainder=True)
        .to_iter_dataset()
    )


def fresh() -> tuple[Model, nnx.Optimizer, jax.Array, grain.DatasetIterator]:
    model = Model(nnx.Rngs(params=0, dropout=1))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)
    return model, optimizer, jax.random.key(5), iter(dataset())


def digest(*trees: object) -> str:
    """A digest of every leaf's bytes (typed keys as their key data)."""
    h = hashlib.sha256()
    for tree in trees:
        for leaf in jax.tree.leaves(tree):
            if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                leaf = jax.random.key_data(leaf)
            h.update(np.asarray(leaf).tobytes())
    return h.hexdigest()


def emit(event: str, **values: object) -> None:
    print(PREFIX + json.dumps({"event": event, **values}), flush=True)


def metric(step: int, best_at: int) -> float:
    return float(abs(step - best_at))


def train(directory: str, options: dict) -> None:
    if options.get("kill_at_delete") is not None:
        from tinax._format.naming import names
        from tinax._format.storage import removal

        calls = {"n": 0}
        delete = removal.delete

        def delete_or_die(where: object) -> None:
            at = options["kill_at_delete"]
            marker = str(where).endswith(names.DELETION_MARKER)
            if calls["n"] == at or (at == -1 and marker):
                emit("killed", at=str(where))
                os.kill(os.getpid(), signal.SIGKILL)
            calls["n"] += 1
            delete(where)

        removal.delete = delete_or_die  # type: ignore[assignment]
    chained = {"called": False}
    if options.get("ready_at") is not None and not options.get("default_handler"):
        signal.signal(signal.SIGTERM, lambda *_: chained.update(called=True))

    run = TrainingRun(
        directory,
        save_every=options.get("save_every"),
        keep=options.get("keep"),
        keep_best=options.get("keep_best", 0),
        best_by="loss" if options.get("keep_best") else None,
        on_preemption=options.get("on_preemption", "exit"),
    )
    model, optimizer, rng, iterator = fresh()
    restored = run.restore(
        abstract_restore_target(nnx.state(model)),
        abstract_restore_target(nnx.state(optimizer)),
        abstract_restore_target(rng),
        {"loss": 0.0},
        iterator,
    )
    start = 0
    if restored is not None:
        nnx.update(model, restored.model)
        nnx.update(optimizer, restored.optimizer)
        rng, start = restored.rng, restored.step
        emit(
            "restored",
            step=start,
            digest=digest(nnx.state(model), nnx.state(optimizer), rng),
        )
    for step in range(start + 1, options["steps"] + 1):
        rng, loss = train_step(model, optimizer, rng, next(iterator))
        emit("loss", step=step, loss=float(loss).hex())
        if step == options.get("ready_at"):
            emit("ready", step=step)
            deadline = time.monotonic() + 60
            while not run.preemption_requested and time.monotonic() < deadline:
                time.sleep(0.01)
        if run.should_save(step):
            emit("save", step=step, digest=digest(nnx.state(model), nnx.state(optimizer), rng))
        response = run.save(
            step,
            nnx.state(model),
            nnx.state(optimizer),
            rng,
            {"loss": metric(step, options.get("best_at", 0))},
            iterator,
        )
        if run.preempted:
            emit("preempted", step=step, committed=response is not None and response.done())
            if not options.get("no_break"):
                break
    if options.get("no_wait"):
        emit("end")
        return
    run.close()
    emit("end", chained=chained["called"], steps=run.steps)


if __name__ == "__main__":
    train(sys.argv[2], json.loads(sys.argv[3]))
