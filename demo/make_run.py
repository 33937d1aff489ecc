"""Write tinax's demo run: a small JAX model trained on synthetic data through Grain.

Usage::

    python demo/make_run.py [RUN_DIR]        # default: demo_run next to demo/

The run is a directory of training checkpoints written by a
``tinax.checkpointing.TrainingRun`` every ``checkpoint_every`` steps, plus ``run.json``
(the configuration and the loss of every step)::

    demo_run/
      run.json
      tinax_run.json                           the TrainingRun's policy, and why each is kept
      step_000050/ … step_000250/              complete training checkpoints
      step_000300.orbax-checkpoint-tmp…/       the save that was interrupted
      step_000300.tinax-claim                  its claim, held by nobody since the kill

How the interrupted save is made: training runs in a child process, and that
process really is killed (SIGKILL) while Orbax is writing its step-300 checkpoint,
as soon as the first array data of that save has landed in Orbax's temporary
directory. What is left is exactly what Orbax leaves behind after a crash: a
temporary directory with part of the data and no commit marker. Since killing a
writer is a race, the finished layout is checked and the whole run is retried
(at most a few times) if the save managed to commit first.

The run is written to a staging directory next to ``RUN_DIR`` and renamed into
place only when it is complete, so ``RUN_DIR`` either holds a whole run or
nothing; a second invocation finds ``run.json`` and reuses the run.

This file is a demo script, not part of the installed packages. It trains the way a
flax NNX user does: a small ``nnx.Module`` (two ``nnx.Linear`` layers with
``nnx.BatchNorm`` and ``nnx.Dropout`` between them), optax's AdamW behind
``nnx.Optimizer``, and checkpoints of ``nnx.state(model)`` and
``nnx.state(optimizer)``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

RUN_FORMAT = "tinax-demo-run/2"
RUN_FILE = "run.json"
LOSSES_FILE = "losses.json"  # written by the training process, folded into run.json

CONFIG: dict[str, Any] = {
    "seed": 0,
    "num_examples": 2048,
    "features": 16,
    "hidden": 256,
    "batch_size": 32,
    "learning_rate": 3e-3,
    "input_noise": 0.05,
    "steps": 300,
    "checkpoint_every": 50,
}

_ATTEMPTS = 3
# How many of the newest checkpoints the run keeps: all of them.
KEEP = CONFIG["steps"] // CONFIG["checkpoint_every"]


# --- model, optimizer, data: what a flax NNX user writes -------------------------------


@functools.cache
def model_class() -> type:
    """The demo's model: a two-layer MLP with BatchNorm and Dropout, in flax NNX.

    Defined on first use, so that reusing a finished run imports neither JAX nor flax.
    """
    from flax import nnx

    class MLP(nnx.Module):
        """``features → hidden → 1`` with batch statistics and dropout in between."""

        def __init__(self, features: int, hidden: int, *, rngs: nnx.Rngs) -> None:
            self.dense1 = nnx.Linear(features, hidden, rngs=rngs)
            self.norm = nnx.BatchNorm(hidden, rngs=rngs)
            self.dropout = nnx.Dropout(0.1, rngs=rngs)
            self.dense2 = nnx.Linear(hidden, 1, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.dense2(self.dropout(nnx.relu(self.norm(self.dense1(x)))))

    return MLP


def make_training(config: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """A fresh ``(model, optimizer, rng)`` at step 0.

    The model is in training mode (batch statistics update, dropout is on); the
    optimizer is optax's AdamW behind ``nnx.Optimizer``; ``rng`` is the typed PRNG
    key the training loop draws its input noise from.
    """
    import jax
    import optax
    from flax import nnx

    seed = config["seed"]
    model = model_class()(
        config["features"], config["hidden"], rngs=nnx.Rngs(params=seed, dropout=seed + 1)
    )
    model.train()
    optimizer = nnx.Optimizer(
        model, optax.adamw(config["learning_rate"], weight_decay=1e-4), wrt=nnx.Param
    )
    return model, optimizer, jax.random.key(seed + 2)


def initial_state(config: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """What a training checkpoint stores at step 0: model state, optimizer state, RNG."""
    from flax import nnx

    model, optimizer, rng = make_training(config)
    return nnx.state(model), nnx.state(optimizer), rng


def make_dataset(config: Mapping[str, Any]) -> Any:
    """The Grain pipeline: shuffled synthetic regression examples, batched, endless.

    Every example is a fixed function of its index, so the pipeline is fully
    described by its iterator state and resumes exactly after a restore.
    """
    import grain
    import numpy as np

    rng = np.random.default_rng(config["seed"])
    n, f = config["num_examples"], config["features"]
    x = rng.normal(size=(n, f)).astype(np.float32)
    direction = rng.normal(size=(f,)).astype(np.float32) / np.sqrt(f)
    y = (np.sin(x @ direction) + 0.1 * rng.normal(size=n)).astype(np.float32)[:, None]
    return (
        grain.MapDataset.range(n)
        .shuffle(seed=config["seed"])
        .repeat(None)
        .map(lambda i: {"x": x[i], "y": y[i]})
        .batch(config["batch_size"], drop_remainder=True)
        .to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=8))
    )


def make_train_step(config: Mapping[str, Any]) -> Any:
    """A compiled step ``(model, optimizer, rng, batch) → (rng, loss)``.

    The model and optimizer are updated in place, as NNX does; the input noise
    comes from ``rng``, which is split and handed back.
    """
    import jax
    import jax.numpy as jnp
    from flax import nnx

    @nnx.jit
    def train_step(model: Any, optimizer: Any, rng: Any, batch: Any) -> Any:
        rng, noise_key = jax.random.split(rng)
        x = batch["x"] + config["input_noise"] * jax.random.normal(noise_key, batch["x"].shape)

        def loss_fn(model: Any) -> Any:
            return jnp.mean((model(x) - batch["y"]) ** 2)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return rng, loss

    return train_step


def checkpoint_name(step: int) -> str:
    """Directory name of the checkpoint written after ``step`` training steps."""
    return f"step_{step:06d}"


def train(
    run_dir: Path,
    config: Mapping[str, Any],
    *,
    start: Any = None,
    kill_at_last_save: bool = False,
) -> Iterator[tuple[int, float]]:
    """Trains, checkpointing every ``checkpoint_every`` steps; yields ``(step, loss)``.

    Args:
      run_dir: Directory the checkpoints are written to (absolute).
      config: The run configuration (see ``CONFIG``).
      start: ``None`` to start from scratch, or a ``TrainingCheckpoint`` to resume from.
      kill_at_last_save: Kill this very process with SIGKILL while the final
        checkpoint is being written (see the module docstring).
    """
    import jax
    from flax import nnx

    from tinax.checkpointing import TrainingRun

    train_step = make_train_step(config)
    model, optimizer, rng = make_training(config)
    if start is None:
        iterator = iter(make_dataset(config))
        step = 0
    else:
        nnx.update(model, start.model)
        nnx.update(optimizer, start.optimizer)
        rng, iterator, step = start.rng, start.iterator, start.step
    # Every checkpoint of the demo is kept (the newest KEEP), and the best by loss.
    with TrainingRun(
        run_dir, save_every=config["checkpoint_every"], keep=KEEP, keep_best=1, best_by="loss"
    ) as run:
        while step < config["steps"]:
            rng, loss = train_step(model, optimizer, rng, next(iterator))
            step += 1
            yield step, float(loss)
            if not run.should_save(step):
                continue
            last = step == config["steps"]
            model_state, optimizer_state = nnx.state(model), nnx.state(optimizer)
            if last and kill_at_last_save:
                run.wait()  # the previous save, and its retention, are done
                jax.block_until_ready((model_state, optimizer_state, rng))
            run.save(
                step,
                model_state,
                optimizer_state,
                rng,
                {"loss": float(loss), "learning_rate": float(config["learning_rate"])},
                iterator,
            )
            if last and kill_at_last_save:
                _die_mid_write(run_dir, checkpoint_name(step))


def _die_mid_write(run_dir: Path, name: str, timeout: float = 5.0) -> None:
    """SIGKILLs this process once the first array data of save ``name`` is on disk."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for tmp in run_dir.glob(f"{name}.orbax-checkpoint-tmp*"):
            if any((tmp / "model").glob("ocdbt.process_*/manifest.ocdbt")):
                os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.0005)
    os.kill(os.getpid(), signal.SIGKILL)


def _train_until_killed(run_dir: Path) -> None:
    """Child-process entry point: the training job that is killed mid-save."""
    losses: list[float] = []
    for step, loss in train(run_dir, CONFIG, kill_at_last_save=True):
        losses.append(loss)
        if step == CONFIG["steps"]:
            # Written before the final save starts: the job dies during that save.
            (run_dir / LOSSES_FILE).write_text(json.dumps(losses))


# --- building and reusing the run directory ------------------------------------------


def read_run(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``run.json`` when ``run_dir`` holds a finished demo run, else ``None``."""
    try:
        meta = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != RUN_FORMAT:
        return None
    return meta


def _check_layout(staging: Path) -> str | None:
    """What is wrong with a freshly trained run, or ``None`` when it is as intended."""
    every, steps = CONFIG["checkpoint_every"], CONFIG["steps"]
    for step in range(every, steps, every):
        if not (staging / checkpoint_name(step) / "commit_success.txt").is_file():
            return f"checkpoint {checkpoint_name(step)} did not commit"
    last = checkpoint_name(steps)
    if (staging / last).exists():
        return f"the save of {last} committed before the training process was killed"
    temporaries = list(staging.glob(f"{last}.orbax-checkpoint-tmp*"))
    if not any(any((t / "model").glob("ocdbt.process_*/manifest.ocdbt")) for t in temporaries):
        return f"the training process was killed before the save of {last} had written data"
    if not (staging / LOSSES_FILE).is_file():
        return "the training process wrote no losses"
    return None


def build_run(run_dir: Path) -> dict[str, Any]:
    """Trains the demo run into ``run_dir`` (which must not exist) and returns ``run.json``.

    Raises:
      FileExistsError: If ``run_dir`` exists.
      RuntimeError: If the run could not be built as intended.
    """
    if run_dir.exists():
        raise FileExistsError(f"{run_dir} already exists")
    problem = "not attempted"
    for attempt in range(1, _ATTEMPTS + 1):
        staging = run_dir.with_name(f"{run_dir.name}.building-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        started = time.monotonic()
        child = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--train-until-killed", str(staging)],
            check=False,
        )
        problem = (
            f"training process exited with {child.returncode}"
            if child.returncode != -signal.SIGKILL
            else _check_layout(staging) or ""
        )
        if not problem:
            losses = json.loads((staging / LOSSES_FILE).read_text())
            (staging / LOSSES_FILE).unlink()
            steps, every = CONFIG["steps"], CONFIG["checkpoint_every"]
            meta = {
                "format": RUN_FORMAT,
                "config": CONFIG,
                "losses": losses,
                "checkpoints": [checkpoint_name(s) for s in range(every, steps, every)],
                "interrupted": sorted(
                    p.name for p in staging.glob(f"{checkpoint_name(steps)}.orbax-checkpoint-tmp*")
                ),
                "seconds": round(time.monotonic() - started, 2),
            }
            # run.json last: its presence marks the run as finished.
            (staging / RUN_FILE).write_text(json.dumps(meta, indent=1), encoding="utf-8")
            staging.rename(run_dir)
            return meta
        shutil.rmtree(staging, ignore_errors=True)
        print(f"demo run attempt {attempt}: {problem}; retrying", file=sys.stderr)
    raise RuntimeError(f"could not build the demo run in {run_dir}: {problem}")


def ensure_run(run_dir: Path) -> dict[str, Any]:
    """Reuses the demo run in ``run_dir`` or builds it; returns its ``run.json``.

    Raises:
      FileExistsError: If ``run_dir`` exists but is not a finished demo run (it is
        left alone: remove it yourself to rebuild).
    """
    meta = read_run(run_dir)
    if meta is not None:
        return meta
    if run_dir.exists():
        raise FileExistsError(
            f"{run_dir} exists but is not a finished demo run (no valid {RUN_FILE}); "
            "remove it to rebuild"
        )
    return build_run(run_dir)


def _directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", nargs="?", default=str(Path(__file__).parents[1] / "demo_run"))
    parser.add_argument("--train-until-killed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir).absolute()
    if args.train_until_killed:
        _train_until_killed(run_dir)
        return 1  # not reached: the process is killed during its last save
    reused = read_run(run_dir) is not None
    meta = ensure_run(run_dir)
    how = "reusing" if reused else f"wrote in {meta['seconds']} s"
    print(
        f"demo run {run_dir} ({how}): {len(meta['checkpoints'])} checkpoints, "
        f"interrupted save {', '.join(meta['interrupted'])}, "
        f"{_directory_bytes(run_dir) / 1e6:.1f} MB, final loss {meta['losses'][-1]:.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
