"""Write tinax's many-leaf demo run: 24 narrow blocks, with a planted jump and a NaN.

Usage::

    python demo/make_big_run.py [RUN_DIR]     # default: demo_big_run next to demo/

A flax NNX model of ``BLOCKS`` narrow transformer-like blocks (attention ``q``/``k``/
``v``/``o`` ``nnx.Linear``, an MLP and two ``nnx.LayerNorm`` each), trained with
optax's AdamW behind ``nnx.Optimizer`` on synthetic data through Grain, and written
by a ``tinax.checkpointing.TrainingRun`` every ``CHECKPOINT_EVERY`` steps (model and
optimizer: about 1,200 leaves, a few MB per checkpoint)::

    demo_big_run/
      big_run.json                       configuration, planted events, loss of every step
      tinax_run.json                     the TrainingRun's policy, and why each is kept
      step_000010/ … step_000120/        complete training checkpoints

Two events are planted, so that a tool looking at the run after the fact has a
known answer to find:

- ``JUMP_LAYER`` (``blocks.7``) jumps at step ``JUMP_STEP``: right after that
  step's update, every parameter of that block is multiplied by ``1 + JUMP_SCALE``.
  Between the checkpoints ``JUMP_STEP - CHECKPOINT_EVERY`` and ``JUMP_STEP`` its
  relative update ``‖b − a‖ / ‖a‖`` is about ``JUMP_SCALE``; every other block's,
  and every other pair's, stays far below.
- From training step ``NAN_STEP`` on, the inputs carry a NaN: the loss, the
  gradients, and with them every parameter and AdamW moment become NaN. The
  first checkpoint holding NaN is ``FIRST_NONFINITE_STEP``; the newest sound one
  before it, where to roll back to, is ``ROLLBACK_STEP``.

The auxiliary state of each checkpoint is ``{"loss": …, "learning_rate": …}``.

Seeds and the data order are fixed (losses may differ in their last digits from one
machine or thread count to another; the planted events do not). The run is written to
a staging directory next to ``RUN_DIR`` and renamed into place only when complete,
so ``RUN_DIR`` holds a whole run or nothing; a second invocation finds
``big_run.json`` and reuses the run.

This file is a demo script, not part of the installed packages; tests import its
constants with ``importlib`` (see ``tests/test_run_table.py``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RUN_FORMAT = "tinax-demo-big-run/1"
RUN_FILE = "big_run.json"

BLOCKS = 24
WIDTH = 16
STEPS = 120
CHECKPOINT_EVERY = 10
CHECKPOINT_STEPS = tuple(range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY))

# The planted events (see the module docstring).
JUMP_BLOCK = 7
JUMP_LAYER = f"blocks.{JUMP_BLOCK}"
JUMP_STEP = 50
JUMP_SCALE = 2.0
NAN_STEP = 91
FIRST_NONFINITE_STEP = 100
ROLLBACK_STEP = 90
NONFINITE_STEPS = tuple(s for s in CHECKPOINT_STEPS if s >= FIRST_NONFINITE_STEP)

CONFIG: dict[str, Any] = {
    "seed": 0,
    "blocks": BLOCKS,
    "width": WIDTH,
    "features": 8,
    "sequence": 8,
    "num_examples": 1024,
    "batch_size": 16,
    "learning_rate": 1e-3,
    "steps": STEPS,
    "checkpoint_every": CHECKPOINT_EVERY,
    "jump": {"layer": JUMP_LAYER, "step": JUMP_STEP, "scale": JUMP_SCALE},
    "nan": {
        "from_step": NAN_STEP,
        "first_nonfinite_checkpoint": FIRST_NONFINITE_STEP,
        "rollback_step": ROLLBACK_STEP,
    },
}


def checkpoint_name(step: int) -> str:
    """Directory name of the checkpoint written after ``step`` training steps."""
    return f"step_{step:06d}"


# --- model, optimizer, data: what a flax NNX user writes -------------------------------


@functools.cache
def model_class() -> type:
    """The demo's model, defined on first use (reusing a run imports no JAX or flax)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    class Block(nnx.Module):
        """Single-head self-attention and an MLP, each behind a LayerNorm, residual."""

        def __init__(self, width: int, *, rngs: nnx.Rngs) -> None:
            self.attn_norm = nnx.LayerNorm(width, rngs=rngs)
            self.q = nnx.Linear(width, width, rngs=rngs)
            self.k = nnx.Linear(width, width, rngs=rngs)
            self.v = nnx.Linear(width, width, rngs=rngs)
            self.o = nnx.Linear(width, width, rngs=rngs)
            self.mlp_norm = nnx.LayerNorm(width, rngs=rngs)
            self.up = nnx.Linear(width, 2 * width, rngs=rngs)
            self.down = nnx.Linear(2 * width, width, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            h = self.attn_norm(x)
            q, k, v = self.q(h), self.k(h), self.v(h)
            weights = jax.nn.softmax(q @ jnp.swapaxes(k, -1, -2) / jnp.sqrt(q.shape[-1]))
            x = x + self.o(weights @ v)
            return x + self.down(nnx.gelu(self.up(self.mlp_norm(x))))

    class Model(nnx.Module):
        """``features → width``, ``blocks`` blocks, then a mean-pooled scalar head."""

        def __init__(self, features: int, width: int, blocks: int, *, rngs: nnx.Rngs) -> None:
            self.embed = nnx.Linear(features, width, rngs=rngs)
            self.blocks = nnx.List([Block(width, rngs=rngs) for _ in range(blocks)])
            self.head = nnx.Linear(width, 1, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x.mean(axis=-2))

    return Model


def make_training(config: Mapping[str, Any]) -> tuple[Any, Any]:
    """A fresh ``(model, optimizer)`` at step 0: AdamW behind ``nnx.Optimizer``."""
    import optax
    from flax import nnx

    model = model_class()(
        config["features"], config["width"], config["blocks"], rngs=nnx.Rngs(config["seed"])
    )
    optimizer = nnx.Optimizer(
        model, optax.adamw(config["learning_rate"], weight_decay=1e-4), wrt=nnx.Param
    )
    return model, optimizer


def make_dataset(config: Mapping[str, Any]) -> Any:
    """The Grain pipeline: shuffled synthetic sequences with a scalar target, endless."""
    import grain
    import numpy as np

    rng = np.random.default_rng(config["seed"])
    n, s, f = config["num_examples"], config["sequence"], config["features"]
    x = rng.normal(size=(n, s, f)).astype(np.float32)
    direction = rng.normal(size=(f,)).astype(np.float32) / np.sqrt(f)
    y = np.tanh((x @ direction).mean(axis=-1, keepdims=True)).astype(np.float32)
    return (
        grain.MapDataset.range(n)
        .shuffle(seed=config["seed"])
        .repeat(None)
        .map(lambda i: {"x": x[i], "y": y[i]})
        .batch(config["batch_size"], drop_remainder=True)
        .to_iter_dataset()
    )


def make_train_step(model: Any, optimizer: Any) -> tuple[Any, Any]:
    """``(step, state)``: a compiled pure step ``(state, batch) → (state, loss)`` over the
    state of ``(model, optimizer)``, and that state at the start.

    The loop carries the split state, not the modules: ``nnx.update((model,
    optimizer), state)`` brings the modules up to date where a checkpoint needs them,
    and the step costs no graph traversal in Python.
    """
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, state = nnx.split((model, optimizer))

    @jax.jit
    def train_step(state: Any, batch: Any) -> Any:
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(model: Any) -> Any:
            return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    return train_step, state


def _jump(model: Any) -> None:
    """The planted jump: every parameter of ``JUMP_LAYER`` scaled by ``1 + JUMP_SCALE``."""
    import jax
    from flax import nnx

    block = model.blocks[JUMP_BLOCK]
    state = nnx.state(block, nnx.Param)
    nnx.update(block, jax.tree.map(lambda p: p * (1.0 + JUMP_SCALE), state))


def train(run_dir: Path, config: Mapping[str, Any]) -> list[float]:
    """Trains ``config["steps"]`` steps into ``run_dir``; returns every step's loss."""
    import jax
    import numpy as np
    from flax import nnx

    from tinax.checkpointing import TrainingRun

    model, optimizer = make_training(config)
    train_step, state = make_train_step(model, optimizer)
    rng = jax.random.key(config["seed"] + 1)
    iterator = iter(make_dataset(config))
    losses: list[float] = []
    # Every checkpoint is kept (the newest of them all), and the best by loss besides.
    with TrainingRun(
        run_dir,
        save_every=config["checkpoint_every"],
        keep=len(CHECKPOINT_STEPS),
        keep_best=1,
        best_by="loss",
    ) as run:
        for step in range(1, config["steps"] + 1):
            batch = next(iterator)
            if step >= NAN_STEP:
                x = np.array(batch["x"])
                x.flat[0] = np.nan
                batch = {**batch, "x": x}
            state, loss = train_step(state, batch)
            if step == JUMP_STEP:
                nnx.update((model, optimizer), state)
                _jump(model)
                state = nnx.state((model, optimizer))
            losses.append(float(loss))
            if not run.should_save(step):
                continue
            nnx.update((model, optimizer), state)
            run.save(
                step,
                nnx.state(model),
                nnx.state(optimizer),
                rng,
                {"loss": losses[-1], "learning_rate": float(config["learning_rate"])},
                iterator,
            )
    return losses


# --- building and reusing the run directory ------------------------------------------


def read_run(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``big_run.json`` when ``run_dir`` holds a finished run, else ``None``."""
    try:
        meta = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != RUN_FORMAT:
        return None
    return meta


def build_run(run_dir: Path) -> dict[str, Any]:
    """Trains the run into ``run_dir`` (which must not exist) and returns its ``big_run.json``.

    Raises:
      FileExistsError: If ``run_dir`` exists.
      RuntimeError: If a checkpoint the run should have is missing.
    """
    if run_dir.exists():
        raise FileExistsError(f"{run_dir} already exists")
    staging = run_dir.with_name(f"{run_dir.name}.building-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        losses = train(staging, CONFIG)
        missing = [
            checkpoint_name(s)
            for s in CHECKPOINT_STEPS
            if not (staging / checkpoint_name(s) / "commit_success.txt").is_file()
        ]
        if missing:
            raise RuntimeError(f"the big demo run did not commit {', '.join(missing)}")
        meta = {
            "format": RUN_FORMAT,
            "config": CONFIG,
            "losses": [None if loss != loss else loss for loss in losses],  # NaN is not JSON
            "checkpoints": [checkpoint_name(s) for s in CHECKPOINT_STEPS],
            "seconds": round(time.monotonic() - started, 2),
        }
        # The run file last: its presence marks the run as finished.
        (staging / RUN_FILE).write_text(json.dumps(meta, indent=1), encoding="utf-8")
        staging.rename(run_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return meta


def ensure_run(run_dir: Path) -> dict[str, Any]:
    """Reuses the run in ``run_dir`` or builds it; returns its ``big_run.json``.

    Raises:
      FileExistsError: If ``run_dir`` exists but is not a finished big demo run (it is
        left alone: remove it yourself to rebuild).
    """
    meta = read_run(run_dir)
    if meta is not None:
        return meta
    if run_dir.exists():
        raise FileExistsError(
            f"{run_dir} exists but is not a finished big demo run (no valid {RUN_FILE}); "
            "remove it to rebuild"
        )
    return build_run(run_dir)


def _directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "run_dir", nargs="?", default=str(Path(__file__).parents[1] / "demo_big_run")
    )
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir).absolute()
    reused = read_run(run_dir) is not None
    meta = ensure_run(run_dir)
    how = "reusing" if reused else f"wrote in {meta['seconds']} s"
    print(
        f"big demo run {run_dir} ({how}): {len(meta['checkpoints'])} checkpoints, "
        f"{_directory_bytes(run_dir) / 1e6:.1f} MB; {JUMP_LAYER} jumps at step {JUMP_STEP}, "
        f"NaN from checkpoint {FIRST_NONFINITE_STEP}, roll back to {ROLLBACK_STEP}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
