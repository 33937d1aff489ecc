"""The states people train, through every layer: flax models and optax optimizers.

For every model and optimizer pair: a training checkpoint round-trips bit-exactly
with optax's own NamedTuple types; the stored and live tables join on every key;
the live state's own targets compare ``ok``; the restore widget enables Load, and
unticking any subtree removes exactly its rows from ``.table`` and ``.target``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax.linen as linen
import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from tinax.widgets import RestoreTargetBuilder

import tinax.explore as ex
from tinax._format.naming.keys import is_within, key_parts, parse_key
from tinax.checkpointing import (
    abstract_restore_target,
    load_training_checkpoint,
    save_training_checkpoint,
)

# -- models ------------------------------------------------------------------------------


class _NnxModel(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.dense1 = nnx.Linear(6, 16, rngs=rngs)
        self.norm = nnx.BatchNorm(16, rngs=rngs)
        self.dropout = nnx.Dropout(0.2, rngs=rngs)
        self.dense2 = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.dense2(self.dropout(nnx.relu(self.norm(self.dense1(x)))))


class _LinenModel(linen.Module):
    @linen.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = linen.relu(linen.Dense(16, name="dense1")(x))
        return linen.Dense(3, name="dense2")(x)


_BATCH = jnp.linspace(-1.0, 1.0, 4 * 6).reshape(4, 6)


def _nnx() -> tuple[Any, Any]:
    """``(model state, trainable params)`` after one training-mode forward pass.

    The pass moves BatchNorm's statistics and Dropout's RNG counter off their
    initial values; the model state holds a typed PRNG key.
    """
    model = _NnxModel(nnx.Rngs(0, dropout=1))
    model.train()
    model(_BATCH)
    return nnx.state(model), nnx.state(model, nnx.Param)


def _linen() -> tuple[Any, Any]:
    params = _LinenModel().init(jax.random.key(0), _BATCH)["params"]
    return params, params


MODELS: dict[str, Callable[[], tuple[Any, Any]]] = {"nnx": _nnx, "linen": _linen}

# -- optimizers ----------------------------------------------------------------------------


def _masked(params: Any) -> optax.GradientTransformation:
    # Momentum only for matrices: optax leaves MaskedNode() where the mask is False.
    return optax.masked(optax.sgd(0.1, momentum=0.9), jax.tree.map(lambda p: p.ndim > 1, params))


OPTIMIZERS: dict[str, Callable[[Any], optax.GradientTransformation]] = {
    "adamw": lambda _: optax.adamw(1e-3),
    "clip_adam": lambda _: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3)),
    "masked_momentum": _masked,
    "sgd": lambda _: optax.sgd(0.1),
    "adam_schedule": lambda _: optax.adam(optax.linear_schedule(1e-3, 1e-4, 100)),
    "multi_steps": lambda _: optax.MultiSteps(optax.adam(1e-3), every_k_schedule=3),
}


def _trained_optimizer_state(name: str, params: Any) -> Any:
    """The optimizer's state after two updates, so that no moment is all zeros."""
    tx = OPTIMIZERS[name](params)
    state = tx.init(params)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
    for _ in range(2):
        _, state = tx.update(grads, state, params)
    return state


def _data() -> Any:
    return grain.MapDataset.range(64).shuffle(seed=3).batch(4).to_iter_dataset()


PAIRS = [(m, o) for m in MODELS for o in OPTIMIZERS]


@pytest.fixture(scope="module", params=PAIRS, ids=[f"{m}-{o}" for m, o in PAIRS])
def trained(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    model_name, optimizer_name = request.param
    model, params = MODELS[model_name]()
    state = {
        "model": model,
        "optimizer": _trained_optimizer_state(optimizer_name, params),
        "rng": jax.random.key(7),
        "auxiliary": {"loss": 0.25, "epoch": 2},
    }
    iterator = iter(_data())
    next(iterator)
    path = tmp_path_factory.mktemp(f"{model_name}-{optimizer_name}") / "step_000005"
    save_training_checkpoint(
        path, 5, state["model"], state["optimizer"], state["rng"], state["auxiliary"], iterator
    ).result()
    return {"path": path, "state": state, "next_batch": next(iterator)}


def _bits(x: Any) -> np.ndarray:
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x)


def _assert_bit_exact(restored: Any, live: Any) -> None:
    assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(live)
    for (path, got), want in zip(
        jax.tree_util.tree_flatten_with_path(restored)[0],
        jax.tree_util.tree_leaves(live),
        strict=True,
    ):
        assert type(got) is type(want) or isinstance(got, jax.Array), path
        got_bits, want_bits = _bits(got), _bits(want)
        assert got_bits.dtype == want_bits.dtype, path
        np.testing.assert_array_equal(
            got_bits.reshape(-1).view(np.uint8), want_bits.reshape(-1).view(np.uint8)
        )


def _targets(state: dict[str, Any]) -> dict[str, Any]:
    return {name: abstract_restore_target(state[name]) for name in ("model", "optimizer", "rng")}


def test_the_training_checkpoint_round_trips_bit_exactly(trained: dict[str, Any]) -> None:
    state = trained["state"]
    targets = _targets(state)
    restored = load_training_checkpoint(
        trained["path"],
        targets["model"],
        targets["optimizer"],
        targets["rng"],
        {"loss": 0.0, "epoch": 0},
        iter(_data()),
    )
    assert restored.step == 5
    for name in ("model", "optimizer", "rng"):
        _assert_bit_exact(getattr(restored, name), state[name])
    # optax's own NamedTuple types come back, not dicts standing in for them.
    live_types = {type(x) for x in jax.tree_util.tree_leaves(state["optimizer"], is_leaf=_node)}
    got_types = {type(x) for x in jax.tree_util.tree_leaves(restored.optimizer, is_leaf=_node)}
    assert live_types == got_types
    assert restored.auxiliary == {"loss": 0.25, "epoch": 2}
    np.testing.assert_array_equal(next(restored.iterator), trained["next_batch"])


def _empty(x: Any) -> bool:
    return x is None or (isinstance(x, tuple | dict | list) and not x)


def _node(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


def test_stored_and_live_tables_join_on_every_key(trained: dict[str, Any]) -> None:
    state = trained["state"]
    stored = ex.checkpoint_table(trained["path"])
    live = ex.state_table({n: state[n] for n in ("model", "optimizer", "rng")})
    stored_keys = set(zip(stored["checkpointable"], stored["key"], strict=True))
    live_keys = set(zip(live["checkpointable"], live["key"], strict=True))
    assert live_keys <= stored_keys, sorted(live_keys - stored_keys)[:5]
    joined = live.merge(stored, on=["checkpointable", "key"], suffixes=("_live", "_stored"))
    assert len(joined) == len(live)
    assert (joined["kind_live"] == joined["kind_stored"]).all()
    # optax's empty states and masked leaves are their own kind on both sides.
    empties = live[live["kind"] == "empty"]
    if OPTIMIZERS and len(empties):
        assert set(zip(empties["checkpointable"], empties["key"], strict=True)) <= stored_keys


def test_the_live_states_own_targets_compare_ok(trained: dict[str, Any]) -> None:
    state = trained["state"]
    targets = {
        **_targets(state),
        "auxiliary": {"step": 0, "state": {"loss": 0.0, "epoch": 0}},
        "iterator": iter(_data()),
    }
    compared = ex.compare_table(trained["path"], targets)
    assert (compared["status"] == "ok").all(), compared[compared["status"] != "ok"]


def test_the_restore_builder_enables_load_and_unticks_exact_subtrees(
    trained: dict[str, Any],
) -> None:
    state = {n: trained["state"][n] for n in ("model", "optimizer")}
    builder = RestoreTargetBuilder(state, trained["path"], load_in_thread=False)
    assert builder.reason == "" and not builder.load_button.disabled, builder.reason
    full = builder.table
    assert builder.subtree_checkboxes
    for (name, key), box in builder.subtree_checkboxes.items():
        subtree = parse_key(key)
        box.value = False
        inside = full[
            (full["checkpointable"] == name)
            & full["key"].map(lambda k, s=subtree: is_within(parse_key(k), s))
        ]
        assert len(inside), (name, key)
        remaining = builder.table
        assert len(remaining) == len(full) - len(inside), (name, key)
        assert not set(zip(remaining["checkpointable"], remaining["key"], strict=True)) & set(
            zip(inside["checkpointable"], inside["key"], strict=True)
        )
        siblings = [k for (n, k) in builder.subtree_checkboxes if n == name]
        if len(siblings) == 1:
            # Its only subtree unticked: the checkpointable itself is left out, visibly.
            assert not builder.checkboxes[name].value and name not in builder.target
            box.value = True  # ticks it again
            assert builder.checkboxes[name].value
            continue
        target = builder.target[name]
        left_out = [
            leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(target, is_leaf=_empty)[0]
            if is_within(key_parts(path), subtree)
        ]
        # Array leaves become Orbax's placeholder; an empty state has nothing to read.
        assert len(left_out) == len(inside), (name, key)
        assert all(leaf is ... or _empty(leaf) for leaf in left_out), (name, key)
        assert builder.reason == "", (name, key, builder.reason)
        box.value = True
    assert len(builder.table) == len(full)
    builder.load_button.click()
    assert builder.status == "loaded", builder.error
    _assert_bit_exact(builder.result["optimizer"], state["optimizer"])  # type: ignore[index]


def test_nnx_optimizer_state_round_trips_and_compares_ok(tmp_path: Path) -> None:
    model = _NnxModel(nnx.Rngs(0, dropout=1))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    state = {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}
    from tinax.checkpointing import load_checkpointables, save_checkpointables

    save_checkpointables(tmp_path / "c", state).result()
    targets = {n: abstract_restore_target(s) for n, s in state.items()}
    assert (ex.compare_table(tmp_path / "c", targets)["status"] == "ok").all()
    restored = load_checkpointables(tmp_path / "c", targets)
    for name in state:
        _assert_bit_exact(restored[name], state[name])
