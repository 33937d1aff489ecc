"""Small real runs that go wrong, for the tests of non-finite values everywhere: a flax
NNX model trained with optax's adamw whose loss turns NaN at a known step (the NaN
then spreads to every weight and to adamw's moments, as in a real divergence), and a
Linen model with BatchNorm statistics (``params`` and ``batch_stats``). Both log
their metrics the way people do: JAX and NumPy scalars, ``bfloat16``, nested dicts.
"""

from __future__ import annotations

from typing import Any

import flax.linen as linen
import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tinax.checkpointing import TrainingRun

# The NNX run: a checkpoint every step; the loss of NAN_STEP is NaN and so is its
# gradient with respect to every weight, so that every weight and adamw moment is NaN
# from that step on.
STEPS = (1, 2, 3, 4, 5)
NAN_STEP = 4
LAST_FINITE_STEP = 3


class Mlp(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        # layers.1's kernel (32 × 32) is large enough for Orbax to keep it in a data
        # file rather than inline in the store's index (tests damage it there).
        self.layers = nnx.List([nnx.Linear(4, 32, rngs=rngs), nnx.Linear(32, 32, rngs=rngs)])
        self.head = nnx.Linear(32, 1, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = nnx.relu(layer(x))
        return self.head(x)


def _pipeline() -> Any:
    return iter(grain.MapDataset.range(64).batch(4).to_iter_dataset())


def write_nnx_run(root: str) -> str:
    """The NNX run under ``root``: NaN from ``NAN_STEP`` on."""
    model = Mlp(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)

    @nnx.jit
    def train_step(
        model: Mlp, optimizer: nnx.Optimizer, x: jax.Array, poison: jax.Array
    ) -> jax.Array:
        def loss_fn(model: Mlp) -> jax.Array:
            # ``poison`` is 0, or NaN at the step the run diverges: then the loss and
            # its gradient with respect to every weight are NaN.
            weights = jax.tree.leaves(nnx.state(model, nnx.Param))
            penalty = sum(jnp.sum(w) for w in weights) * poison
            return jnp.mean((model(x) - 1.0) ** 2) + penalty

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    batches = _pipeline()
    with TrainingRun(root, save_every=1, keep=None, best_by="loss") as run:
        for step in STEPS:
            raw = np.asarray(next(batches), np.float32)
            x = np.tile(raw[:, None], (1, 4)) / 64.0
            poison = np.float32(np.nan if step == NAN_STEP else 0.0)
            loss = train_step(model, optimizer, jnp.asarray(x), jnp.asarray(poison))
            auxiliary = {
                "loss": loss,  # a JAX float32 0-d array, as a jitted step returns it
                "learning_rate": np.float32(1e-2),  # a NumPy scalar
                "grad_scale": jnp.asarray(0.5, jnp.bfloat16),
                "eval": {"loss": float(loss) * 2.0},  # nested: eval.loss
                "epoch": 0,
            }
            run.save(
                step,
                nnx.state(model),
                nnx.state(optimizer),
                jax.random.key(step),
                auxiliary,
                batches,
            )
    return root


class LinenNet(linen.Module):
    @linen.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        x = linen.Dense(8)(x)
        x = linen.BatchNorm(use_running_average=not train)(x)
        x = linen.relu(x)
        return linen.Dense(1)(x)


LINEN_STEPS = (1, 2, 3)


def write_linen_run(root: str) -> str:
    """A Linen run: ``{"params": …, "batch_stats": …}`` as the model, adamw's state."""
    net = LinenNet()
    x = jnp.linspace(-1.0, 1.0, 16).reshape(4, 4)
    variables = net.init(jax.random.key(0), x)
    params, stats = variables["params"], variables["batch_stats"]
    tx = optax.adamw(1e-2)
    opt_state = tx.init(params)

    @jax.jit
    def train_step(params: Any, stats: Any, opt_state: Any) -> tuple[Any, Any, Any, Any]:
        def loss_fn(params: Any) -> tuple[jax.Array, Any]:
            out, moved = net.apply(
                {"params": params, "batch_stats": stats}, x, mutable=["batch_stats"]
            )
            return jnp.mean((out - 1.0) ** 2), moved["batch_stats"]

        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), stats, opt_state, loss

    batches = _pipeline()
    with TrainingRun(root, save_every=1, keep=None) as run:
        for step in LINEN_STEPS:
            next(batches)
            params, stats, opt_state, loss = train_step(params, stats, opt_state)
            run.save(
                step,
                {"params": params, "batch_stats": stats},
                opt_state,
                jax.random.key_data(jax.random.key(step)),
                {"loss": np.asarray(loss)},  # a 0-d NumPy array
                batches,
            )
    return root


def tinax_here(*args: object, columns: int = 80) -> tuple[int, str, str]:
    """``tinax ARGS`` run in this process at a terminal ``columns`` wide: its status,
    stdout and stderr."""
    import io
    import os

    from tinax._cli.main import main

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)
    try:
        out, err = io.StringIO(), io.StringIO()
        status = main([str(a) for a in args], out, err)
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return status, out.getvalue(), err.getvalue()
