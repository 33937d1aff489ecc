"""Training checkpoints: exact resume, preflight before the iterator, and argument errors."""

import os

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tinax.checkpointing import (
    CorruptDataError,
    TargetMismatchError,
    TrainingCheckpoint,
    TrainingCheckpointNames,
    abstract_restore_target,
    load_training_checkpoint,
    save_checkpointables,
    save_training_checkpoint,
)

# --- a small but real training loop -----------------------------------------------------


def _dataset(seed=0):
    rng = np.random.default_rng(seed)
    xs = rng.normal(size=(256, 8)).astype(np.float32)
    ys = (xs @ rng.normal(size=(8, 1)) + 0.1).astype(np.float32)
    return (
        grain.MapDataset.range(256)
        .shuffle(seed=7)
        .map(lambda i: {"x": xs[i], "y": ys[i]})
        .batch(16)
        .repeat()
        .to_iter_dataset()
    )


def _init(seed=0):
    k1, k2 = jax.random.split(jax.random.key(seed))
    params = {
        "dense1": {"w": jax.random.normal(k1, (8, 16)) * 0.3, "b": jnp.zeros(16)},
        "dense2": {"w": jax.random.normal(k2, (16, 1)) * 0.3, "b": jnp.zeros(1)},
    }
    momentum = jax.tree.map(jnp.zeros_like, params)
    rng = jax.random.key_data(jax.random.key(seed + 1))
    aux = {"loss_ema": 0.0, "examples_seen": 0, "host_hist": np.zeros(4, np.int64)}
    return params, momentum, rng, aux


def _loss(params, batch, key):
    h = jax.nn.relu(batch["x"] @ params["dense1"]["w"] + params["dense1"]["b"])
    keep = jax.random.bernoulli(key, 0.9, h.shape)
    h = jnp.where(keep, h / 0.9, 0.0)
    pred = h @ params["dense2"]["w"] + params["dense2"]["b"]
    return jnp.mean((pred - batch["y"]) ** 2)


@jax.jit
def _update(params, momentum, rng, batch):
    key = jax.random.wrap_key_data(rng)
    key, sub = jax.random.split(key)
    loss, grads = jax.value_and_grad(_loss)(params, batch, sub)
    momentum = jax.tree.map(lambda m, g: 0.9 * m + g, momentum, grads)
    params = jax.tree.map(lambda p, m: p - 0.01 * m, params, momentum)
    return params, momentum, jax.random.key_data(key), loss


def _train(state, iterator, steps):
    params, momentum, rng, aux = state
    for _ in range(steps):
        batch = next(iterator)
        params, momentum, rng, loss = _update(params, momentum, rng, batch)
        aux = {
            "loss_ema": 0.9 * aux["loss_ema"] + 0.1 * float(loss),
            "examples_seen": aux["examples_seen"] + len(batch["y"]),
            "host_hist": aux["host_hist"]
            + np.bincount(np.minimum(batch["x"][:, 0].astype(int) + 2, 3), minlength=4),
        }
    return params, momentum, rng, aux


def _assert_bitwise_equal(a, b):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        assert type(x) is type(y) or (isinstance(x, jax.Array) and isinstance(y, jax.Array))
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), strict=True)


def test_exact_resume(root):
    """Saved on local disk, then on gs://: the same bit-exact resume."""
    n, k = 40, 17
    straight_iter = iter(_dataset())
    straight = _train(_init(), straight_iter, n)
    straight_next = next(straight_iter)

    it = iter(_dataset())
    partial = _train(_init(), it, k)
    save_training_checkpoint(f"{root}/ckpt", k, *partial, it).result()

    fresh_state = _init(seed=123)  # different values: everything must come from disk
    fresh_iter = iter(_dataset())
    restored = load_training_checkpoint(
        f"{root}/ckpt", *map(abstract_restore_target, fresh_state), fresh_iter
    )
    assert isinstance(restored, TrainingCheckpoint)
    assert restored.step == k
    assert restored.iterator is fresh_iter
    resumed_state = (restored.model, restored.optimizer, restored.rng, restored.auxiliary)
    assert type(restored.auxiliary["examples_seen"]) is int
    assert type(restored.auxiliary["host_hist"]) is np.ndarray
    resumed = _train(resumed_state, restored.iterator, n - k)
    _assert_bitwise_equal(resumed, straight)
    _assert_bitwise_equal(next(restored.iterator), straight_next)


def test_training_checkpoint_layout_and_custom_names(tmp_path):
    params, momentum, rng, aux = _init()
    it = iter(_dataset())
    next(it)
    names = TrainingCheckpointNames(
        model="params", optimizer="opt", rng="key", auxiliary="extra", iterator="data"
    )
    save_training_checkpoint(tmp_path / "c", 3, params, (), rng, {}, it, names=names).result()
    assert {"params", "opt", "key", "extra", "data"} <= set(os.listdir(tmp_path / "c"))
    fresh = iter(_dataset())
    out = load_training_checkpoint(
        tmp_path / "c",
        abstract_restore_target(params),
        (),
        abstract_restore_target(rng),
        {},
        fresh,
        names=names,
    )
    assert out.step == 3 and out.optimizer == () and out.auxiliary == {}
    with pytest.raises(ValueError, match="not a training checkpoint"):
        load_training_checkpoint(tmp_path / "c", params, (), rng, {}, iter(_dataset()))


class CountingIterator(grain.DatasetIterator):
    """A Grain iterator that records how it is used."""

    def __init__(self, parent):
        super().__init__(parent)
        self.set_state_calls = 0
        self.prefetch_calls = 0

    def __next__(self):
        return next(self._parent)

    def get_state(self):
        return self._parent.get_state()

    def set_state(self, state):
        self.set_state_calls += 1
        self._parent.set_state(state)

    def start_prefetch(self):
        self.prefetch_calls += 1
        super().start_prefetch()


def _saved_after(tmp_path, batches):
    """A training checkpoint saved after ``batches`` batches at ``tmp_path / "c"``: its
    restore targets, and the iterator it was saved from."""
    params, momentum, rng, aux = _init()
    it = iter(_dataset())
    for _ in range(batches):
        next(it)
    save_training_checkpoint(tmp_path / "c", batches, params, momentum, rng, aux, it).result()
    return [abstract_restore_target(x) for x in (params, momentum, rng, aux)], it


def test_restored_iterator_is_the_one_passed_in_with_prefetch_started(tmp_path):
    targets, it = _saved_after(tmp_path, 5)
    mine = CountingIterator(iter(_dataset()))
    out = load_training_checkpoint(tmp_path / "c", *targets, mine)
    assert out.iterator is mine
    assert mine.set_state_calls == 1
    assert mine.prefetch_calls >= 1
    _assert_bitwise_equal(next(mine), next(it))


def test_an_iterator_state_file_that_does_not_match_its_checksum_leaves_the_iterator_as_it_was(
    tmp_path,
):
    targets, _ = _saved_after(tmp_path, 3)
    state_file = tmp_path / "c" / "iterator" / "process_0-of-1.json"
    # Still a state Grain resumes from: only its checksum tells.
    state_file.write_text(state_file.read_text().replace('"next_index": 3', '"next_index": 5'))
    mine = CountingIterator(iter(_dataset()))
    with pytest.raises(CorruptDataError, match=r"'process_0-of-1\.json' is corrupt.*checksum"):
        load_training_checkpoint(tmp_path / "c", *targets, mine)
    assert mine.set_state_calls == 0
    _assert_bitwise_equal(next(mine), next(iter(_dataset())))


def test_a_load_checks_the_iterator_state_it_reads_and_no_other_process_s(tmp_path):
    targets, it = _saved_after(tmp_path, 3)
    folder = tmp_path / "c" / "iterator"
    beyond = '{"next_index": 99999999999999999999999}'
    # Another process's state (of another job size), not one Grain resumes from: not
    # this process's to read (on a bucket, a large job's every process would read all).
    (folder / "process_1-of-2.json").write_text(beyond)
    mine = CountingIterator(iter(_dataset()))
    load_training_checkpoint(tmp_path / "c", *targets, mine)
    _assert_bitwise_equal(next(mine), next(it))
    # Its own is refused, naming the file, before anything is restored.
    (folder / "process_0-of-1.json").write_text(beyond)
    mine = CountingIterator(iter(_dataset()))
    with pytest.raises(ValueError, match=r"process_0-of-1\.json' is not a Grain iterator state"):
        load_training_checkpoint(tmp_path / "c", *targets, mine)
    assert mine.set_state_calls == 0


class OwnLoadIterator(CountingIterator):
    """An iterator whose class loads its state in a way of its own."""

    loads = 0

    async def load(self, directory):
        OwnLoadIterator.loads += 1
        return await super().load(directory)


def test_an_iterator_with_a_load_of_its_own_is_restored_by_it(tmp_path):
    targets, it = _saved_after(tmp_path, 4)
    mine = OwnLoadIterator(iter(_dataset()))
    load_training_checkpoint(tmp_path / "c", *targets, mine)
    assert OwnLoadIterator.loads == 1 and mine.set_state_calls == 1
    _assert_bitwise_equal(next(mine), next(it))


@pytest.mark.parametrize(
    "which", ["model_shape", "model_structure", "optimizer_numpy_shape", "auxiliary_missing_key"]
)
def test_incompatible_target_raises_before_the_iterator_is_touched(tmp_path, which):
    params, momentum, rng, aux = _init()
    it = iter(_dataset())
    save_training_checkpoint(tmp_path / "c", 1, params, momentum, rng, aux, it).result()
    targets = [abstract_restore_target(x) for x in (params, momentum, rng, aux)]
    if which == "model_shape":
        targets[0]["dense1"]["w"] = jax.ShapeDtypeStruct((8, 32), jnp.float32)
    elif which == "model_structure":
        targets[0]["dense3"] = targets[0]["dense2"]
    elif which == "optimizer_numpy_shape":
        targets[3]["host_hist"] = abstract_restore_target(np.zeros(9, np.int64))
    else:
        targets[3]["not_saved"] = 1.0
    mine = CountingIterator(iter(_dataset()))
    for _ in range(3):
        next(mine)
    state_before = mine.get_state()
    with pytest.raises(ValueError, match=str(tmp_path / "c")):
        load_training_checkpoint(tmp_path / "c", *targets, mine)
    assert mine.set_state_calls == 0
    assert mine.prefetch_calls == 0
    assert mine.get_state() == state_before


@pytest.mark.parametrize(
    ("step", "error"),
    [(True, TypeError), (1.0, TypeError), ("3", TypeError), (None, TypeError), (-1, ValueError)],
)
def test_bad_steps_are_refused_before_writing(tmp_path, step, error):
    with pytest.raises(error, match="step"):
        save_training_checkpoint(
            tmp_path / "c", step, {"a": 1}, {"b": 1}, {"c": 1}, {}, iter(_dataset())
        )
    assert os.listdir(tmp_path) == []


def test_numpy_integer_step_is_accepted(tmp_path):
    save_training_checkpoint(
        tmp_path / "c", np.int64(4), {"a": 1}, (), {"c": 1}, {}, iter(_dataset())
    ).result()
    out = load_training_checkpoint(tmp_path / "c", {"a": 0}, (), {"c": 0}, {}, iter(_dataset()))
    assert out.step == 4 and type(out.step) is int


def test_bad_iterators_and_names(tmp_path):
    with pytest.raises(TypeError, match="grain.DatasetIterator"):
        save_training_checkpoint(tmp_path / "c", 0, {"a": 1}, (), {}, {}, iter(range(3)))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="grain.DatasetIterator"):
        save_training_checkpoint(tmp_path / "c", 0, {"a": 1}, (), {}, {}, _dataset())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="TrainingCheckpointNames"):
        save_training_checkpoint(
            tmp_path / "c", 0, {"a": 1}, (), {}, {}, iter(_dataset()), names={"model": "m"}
        )  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="leaf"):
        save_training_checkpoint(tmp_path / "c", 0, {"a": object()}, (), {}, {}, iter(_dataset()))
    assert os.listdir(tmp_path) == []
    save_training_checkpoint(
        tmp_path / "c", 0, {"a": 1}, (), {"r": 1}, {}, iter(_dataset())
    ).result()
    with pytest.raises(TypeError, match="grain.DatasetIterator"):
        load_training_checkpoint(tmp_path / "c", {"a": 0}, (), {"r": 0}, {}, [1, 2])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="TrainingCheckpointNames"):
        load_training_checkpoint(
            tmp_path / "c", {"a": 0}, (), {"r": 0}, {}, iter(_dataset()), names="x"
        )  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="temporary suffix"):
        load_training_checkpoint(
            str(tmp_path / "c") + ".orbax-checkpoint-tmp-3", {"a": 0}, (), {}, {}, iter(_dataset())
        )
    with pytest.raises(FileNotFoundError):
        load_training_checkpoint(tmp_path / "none", {"a": 0}, (), {}, {}, iter(_dataset()))


def _write_with_auxiliary(path, auxiliary):
    it = iter(_dataset())
    save_checkpointables(
        path,
        {
            "model": {"a": 1},
            "optimizer": (),
            "rng": {"r": 1},
            "auxiliary": auxiliary,
            "iterator": it,
        },
    ).result()


@pytest.mark.parametrize(
    ("auxiliary", "error", "match"),
    [
        ([1, 2], TypeError, "does not restore as a mapping"),
        ({"state": {"x": 1}}, ValueError, "missing 'step'"),
        ({"step": 2}, ValueError, "missing 'state'"),
        ({"step": -3, "state": {}}, ValueError, "negative"),
    ],
)
def test_auxiliary_layout_errors(tmp_path, auxiliary, error, match):
    _write_with_auxiliary(tmp_path / "c", auxiliary)
    mine = CountingIterator(iter(_dataset()))
    with pytest.raises(error, match=match):
        load_training_checkpoint(tmp_path / "c", {"a": 0}, (), {"r": 0}, {}, mine)
    assert mine.set_state_calls == 0


def test_training_checkpoint_dataclass_validates():
    it = iter(_dataset())
    ok = TrainingCheckpoint(step=2, model={}, optimizer=(), rng=None, auxiliary={}, iterator=it)
    assert ok.step == 2
    with pytest.raises(TypeError, match="step"):
        TrainingCheckpoint(step=False, model={}, optimizer=(), rng=None, auxiliary={}, iterator=it)
    with pytest.raises(ValueError, match="non-negative"):
        TrainingCheckpoint(step=-1, model={}, optimizer=(), rng=None, auxiliary={}, iterator=it)
    with pytest.raises(TypeError, match="grain.DatasetIterator"):
        TrainingCheckpoint(
            step=1, model={}, optimizer=(), rng=None, auxiliary={}, iterator=iter([])
        )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "step",
    [jnp.asarray(4), np.asarray(4, np.uint16), jnp.asarray(4, jnp.int8), np.int32(4)],
    ids=["jax", "numpy-0d", "jax-int8", "numpy-scalar"],
)
def test_zero_d_integer_arrays_are_steps(tmp_path, step):
    save_training_checkpoint(
        tmp_path / "c", step, {"a": 1}, (), {"c": 1}, {}, iter(_dataset())
    ).result()
    out = load_training_checkpoint(tmp_path / "c", {"a": 0}, (), {"c": 0}, {}, iter(_dataset()))
    assert out.step == 4 and type(out.step) is int


@pytest.mark.parametrize(
    "step",
    [jnp.asarray(True), np.asarray([4]), jnp.asarray(4.0), np.asarray(-1)],
    ids=["bool", "1-d", "float", "negative"],
)
def test_other_arrays_are_not_steps(tmp_path, step):
    with pytest.raises((TypeError, ValueError), match="step"):
        save_training_checkpoint(tmp_path / "c", step, {"a": 1}, (), {}, {}, iter(_dataset()))
    assert os.listdir(tmp_path) == []


def test_numpy_scalars_are_saved_as_zero_d_arrays(tmp_path):
    aux = {"loss": np.float32(0.25), "seen": np.int64(7), "flag": np.bool_(True)}
    save_training_checkpoint(
        tmp_path / "c", 1, {"a": 1}, (), {"c": 1}, aux, iter(_dataset())
    ).result()
    target = {"loss": np.float32(0), "seen": np.int64(0), "flag": np.bool_(False)}
    out = load_training_checkpoint(tmp_path / "c", {"a": 0}, (), {"c": 0}, target, iter(_dataset()))
    for key, value in aux.items():
        got = out.auxiliary[key]
        assert isinstance(got, np.ndarray) and got.shape == () and got.dtype == value.dtype
        assert got == value


# --- flax NNX as users write it ----------------------------------------------------------


def _nnx_state():
    import optax
    from flax import nnx

    model = nnx.Linear(8, 4, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    return nnx, model, optimizer


def test_an_nnx_module_or_optimizer_is_refused_at_save_naming_nnx_state(tmp_path):
    nnx, model, optimizer = _nnx_state()
    rng = jax.random.key(0)
    for args in ((model, nnx.state(optimizer)), (nnx.state(model), optimizer)):
        with pytest.raises(TypeError, match=r"not its state: pass nnx\.state\(model\)"):
            save_training_checkpoint(tmp_path / "c", 1, *args, rng, {}, iter(_dataset()))
    with pytest.raises(TypeError, match=r"GraphDef.*nnx\.state\(model\)"):
        save_training_checkpoint(
            tmp_path / "c", 1, nnx.split(model), nnx.state(optimizer), rng, {}, iter(_dataset())
        )
    with pytest.raises(TypeError, match=r"checkpointable 'm'\['inner'\].*Linear"):
        save_checkpointables(tmp_path / "c", {"m": {"inner": model}})
    assert os.listdir(tmp_path) == []


def test_an_nnx_module_as_target_is_a_type_error_without_orbax_traceback(tmp_path):
    nnx, model, optimizer = _nnx_state()
    rng = jax.random.key(0)
    save_training_checkpoint(
        tmp_path / "c", 1, nnx.state(model), nnx.state(optimizer), rng, {}, iter(_dataset())
    ).result()
    targets = [abstract_restore_target(x) for x in (nnx.state(model), nnx.state(optimizer), rng)]
    iterator = iter(_dataset())
    for index, wrong in ((0, model), (1, optimizer), (0, nnx.split(model))):
        given = list(targets)
        given[index] = wrong
        with pytest.raises(TypeError, match=r"nnx\.state\(model\)") as caught:
            load_training_checkpoint(tmp_path / "c", *given, {}, iterator)
        assert caught.value.__cause__ is None and caught.value.__context__ is None
    assert next(iterator)["x"].shape == (16, 8)  # untouched: the first batch
    restored = load_training_checkpoint(tmp_path / "c", *targets, {}, iter(_dataset()))
    nnx.update(model, restored.model)


def test_an_eval_shape_target_restores_without_orbax_warnings(tmp_path, recwarn):
    nnx, model, optimizer = _nnx_state()
    rng = jax.random.key(0)
    save_training_checkpoint(
        tmp_path / "c", 1, nnx.state(model), nnx.state(optimizer), rng, {}, iter(_dataset())
    ).result()
    import optax

    abstract = nnx.eval_shape(lambda: nnx.Linear(8, 4, rngs=nnx.Rngs(1)))
    abstract_opt = nnx.eval_shape(
        lambda: nnx.Optimizer(nnx.Linear(8, 4, rngs=nnx.Rngs(1)), optax.adamw(1e-3), wrt=nnx.Param)
    )
    recwarn.clear()
    restored = load_training_checkpoint(
        tmp_path / "c",
        nnx.state(abstract),
        nnx.state(abstract_opt),
        abstract_restore_target(rng),
        {},
        iter(_dataset()),
    )
    assert not [str(w.message) for w in recwarn if "Sharding" in str(w.message)]
    np.testing.assert_array_equal(
        np.asarray(restored.model["kernel"].value), np.asarray(model.kernel.value)
    )


def test_a_typed_key_saved_and_key_data_as_target_is_refused_before_the_iterator_moves(tmp_path):
    save_training_checkpoint(
        tmp_path / "c", 1, {"a": 1}, (), jax.random.key(0), {}, iter(_dataset())
    ).result()
    iterator = iter(_dataset())
    raw = abstract_restore_target(jax.random.key_data(jax.random.key(0)))
    with pytest.raises(TargetMismatchError, match="typed key against raw key data"):
        load_training_checkpoint(tmp_path / "c", {"a": 0}, (), raw, {}, iterator)
    first = next(iter(_dataset()))["x"]
    np.testing.assert_array_equal(next(iterator)["x"], first)
