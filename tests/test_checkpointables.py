"""save_checkpointables, load_checkpointables and abstract_restore_target on real disk."""

import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tinax.checkpointing import (
    NumpyTarget,
    abstract_restore_target,
    load_checkpointables,
    save_checkpointables,
)


def _state():
    return {
        "params": {"dense": {"w": jnp.arange(12.0).reshape(4, 3), "b": jnp.zeros(3, jnp.bfloat16)}},
        "host": np.arange(5, dtype=np.int16),
        "count": 7,
        "lr": 0.125,
        "enabled": True,
        "label": "run-a",
        "nothing": None,
    }


def _entries(path):
    return sorted(os.listdir(path))


def test_round_trip_keeps_values_types_and_dtypes(root):
    state = _state()
    response = save_checkpointables(f"{root}/c", {"state": state})
    assert response.result(timeout=60) is None
    restored = load_checkpointables(f"{root}/c", {"state": abstract_restore_target(state)})
    out = restored["state"]
    assert isinstance(out["params"]["dense"]["w"], jax.Array)
    np.testing.assert_array_equal(out["params"]["dense"]["w"], state["params"]["dense"]["w"])
    assert out["params"]["dense"]["b"].dtype == jnp.bfloat16
    assert type(out["host"]) is np.ndarray and out["host"].dtype == np.int16
    np.testing.assert_array_equal(out["host"], state["host"])
    assert type(out["count"]) is int and out["count"] == 7
    assert type(out["lr"]) is float and out["lr"] == 0.125
    assert type(out["enabled"]) is bool and out["enabled"] is True
    assert out["label"] == "run-a"
    assert out["nothing"] is None


def test_response_is_an_orbax_async_response(tmp_path):
    from orbax.checkpoint import v1 as ocp

    response = save_checkpointables(tmp_path / "c", {"x": {"a": np.ones(3)}})
    assert ocp.AsyncResponse in type(response).__mro__
    seen = []
    done = threading.Event()
    response.on_complete(lambda value: (seen.append(value), done.set()))
    response.result(timeout=60)
    assert done.wait(10)
    assert seen == [None]
    assert response.done() and response.exception() is None
    # A callback registered after completion still runs.
    late = []
    response.on_complete(late.append)
    assert late == [None]
    assert (tmp_path / "c" / "_CHECKPOINT_METADATA").is_file()


def test_several_checkpointables_load_together_and_by_subset(tmp_path):
    values = {"a": {"x": np.ones(2)}, "b": {"y": jnp.full((2, 2), 3.0)}, "c": {"z": "s"}}
    save_checkpointables(tmp_path / "c", values).result()
    both = load_checkpointables(
        tmp_path / "c", abstract_restore_target({"a": values["a"], "c": values["c"]})
    )
    assert list(both) == ["a", "c"]
    assert both["c"] == {"z": "s"}
    np.testing.assert_array_equal(both["a"]["x"], np.ones(2))


def test_abstract_restore_target_keeps_sharding_and_static_leaves():
    mesh_sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    state = {
        "j": jax.device_put(jnp.ones((2, 3)), mesh_sharding),
        "n": np.zeros((4,), np.uint8),
        "i": 3,
        "f": 2.5,
        "b": False,
        "s": "t",
        "none": None,
    }
    target = abstract_restore_target(state)
    assert isinstance(target["j"], jax.ShapeDtypeStruct)
    assert target["j"].shape == (2, 3) and target["j"].dtype == jnp.float32
    assert target["j"].sharding == mesh_sharding
    assert target["n"] == NumpyTarget((4,), np.dtype(np.uint8))
    assert target["i"] == 3 and target["f"] == 2.5 and target["b"] is False
    assert target["s"] == "t" and target["none"] is None
    # A target of a target is itself.
    assert abstract_restore_target(target) == target


def test_numpy_target_restores_numpy_of_its_dtype(tmp_path):
    save_checkpointables(tmp_path / "c", {"x": {"a": np.arange(4, dtype=np.float32)}}).result()
    out = load_checkpointables(tmp_path / "c", {"x": {"a": NumpyTarget((4,), np.float64)}})
    assert type(out["x"]["a"]) is np.ndarray and out["x"]["a"].dtype == np.float64


def test_empty_pytrees_save_and_restore(tmp_path):
    from typing import NamedTuple

    class EmptyState(NamedTuple):
        pass

    values = {
        "sgd": (),
        "extra": {},
        "nested": {"a": [], "b": ((), {})},
        "opt": (EmptyState(), EmptyState()),
    }
    save_checkpointables(tmp_path / "c", values).result()
    out = load_checkpointables(tmp_path / "c", values)
    assert out == values
    assert type(out["opt"][0]) is EmptyState
    with pytest.raises(ValueError, match=r"could not restore|does not match"):
        load_checkpointables(tmp_path / "c", {"extra": ()})


def test_existing_destination_is_refused_and_left_intact(tmp_path):
    save_checkpointables(tmp_path / "c", {"x": {"a": np.ones(3)}}).result()
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "c").rglob("*")}
    with pytest.raises(FileExistsError, match="already exists"):
        save_checkpointables(tmp_path / "c", {"x": {"a": np.zeros(3)}})
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "c").rglob("*")} == before
    out = load_checkpointables(tmp_path / "c", {"x": {"a": NumpyTarget((3,), np.float64)}})
    np.testing.assert_array_equal(out["x"]["a"], np.ones(3))
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError):
        save_checkpointables(tmp_path / "file", {"x": {"a": 1}})


@pytest.mark.parametrize(
    "suffix",
    [
        ".orbax-checkpoint-tmp",
        ".orbax-checkpoint-tmp-1234",
        ".orbax-checkpoint-tmp/",
        ".orbax-checkpoint-tmp-7/.",
    ],
)
def test_temporary_suffix_is_refused_for_saves_and_loads(tmp_path, suffix):
    path = str(tmp_path / "c") + suffix
    with pytest.raises(ValueError, match="temporary suffix"):
        save_checkpointables(path, {"x": {"a": 1}})
    with pytest.raises(ValueError, match="temporary suffix"):
        load_checkpointables(path, {"x": {"a": 1}})
    assert _entries(tmp_path) == []


def test_suffix_only_matters_in_the_final_component(tmp_path):
    parent = tmp_path / "x.orbax-checkpoint-tmp-but-not"
    parent.mkdir()
    save_checkpointables(parent / "c", {"x": {"a": 1}}).result()
    assert load_checkpointables(parent / "c", {"x": {"a": 0}}) == {"x": {"a": 1}}


@pytest.mark.parametrize(
    ("checkpointables", "error", "match"),
    [
        ([("x", 1)], TypeError, "mapping"),
        ("x", TypeError, "mapping"),
        ({}, ValueError, "empty"),
        ({1: {"a": 1}}, TypeError, "must be strings"),
        ({"a/b": {"a": 1}}, ValueError, "reserved character"),
        ({"Model": {"a": 1}, "model": {"a": 1}}, ValueError, "must be portable and distinct"),
        ({"x": None}, ValueError, "None"),
        ({"x": {"f": lambda: 1}}, TypeError, r"'x' leaf \['f'\].*callable"),
        (
            {"x": {"deep": [1, {"obj": object()}]}},
            TypeError,
            r"'x' leaf \['deep'\]\[1\]\['obj'\].*builtins.object",
        ),
        ({"x": object()}, TypeError, r"'x' leaf <root>"),
    ],
)
def test_bad_saves_raise_and_write_nothing(tmp_path, checkpointables, error, match):
    threads = set(threading.enumerate())
    with pytest.raises(error, match=match):
        save_checkpointables(tmp_path / "c", checkpointables)
    assert _entries(tmp_path) == []
    assert set(threading.enumerate()) <= threads


def test_bad_path_types(tmp_path):
    with pytest.raises(TypeError, match="path"):
        save_checkpointables(3, {"x": {"a": 1}})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="path"):
        load_checkpointables(None, {"x": {"a": 1}})  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="parent directory"):
        save_checkpointables(tmp_path / "no" / "c", {"x": {"a": 1}})
    assert _entries(tmp_path) == []


@pytest.fixture
def saved(tmp_path):
    save_checkpointables(tmp_path / "c", {"x": {"a": np.ones(3)}, "y": {"b": 2}}).result()
    return tmp_path / "c"


@pytest.mark.parametrize(
    ("targets", "error", "match"),
    [
        ([("x", 1)], TypeError, "mapping"),
        ({}, ValueError, "empty"),
        ({2: {"a": 1}}, TypeError, "must be strings"),
        ({"..": {"a": 1}}, ValueError, "dot"),
        ({"x": {"a": 1}, "X": {"a": 1}}, ValueError, "must be portable and distinct"),
        ({"x": None}, ValueError, "None"),
        ({"missing": {"a": 1}}, ValueError, r"no checkpointable\(s\) \['missing'\]"),
        (
            {"x": {"a": NumpyTarget((4,), np.float64)}},
            ValueError,
            r"x\['a'\]: stored \(3,\) float64, target \(4,\) float64",
        ),
    ],
)
def test_bad_loads_raise_clear_errors(saved, targets, error, match):
    with pytest.raises(error, match=match):
        load_checkpointables(saved, targets)


def test_loading_a_missing_or_non_checkpoint_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpointables(tmp_path / "nope", {"x": {"a": 1}})
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="not an Orbax checkpoint"):
        load_checkpointables(tmp_path / "plain", {"x": {"a": 1}})
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        load_checkpointables(tmp_path / "f", {"x": {"a": 1}})


class _FailingWriter:
    """A stateful checkpointable whose background write fails like a full disk."""

    async def save(self, directory):
        async def write():
            await directory.await_creation()
            raise OSError(28, "No space left on device")

        return write()

    async def load(self, directory):
        async def read():
            return None

        return read()


def _wait_for_threads(baseline, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        extra = [t for t in threading.enumerate() if t not in baseline and t.is_alive()]
        if not extra:
            return []
        time.sleep(0.1)
    return extra


def test_failed_background_save_leaves_no_temporary_directory(tmp_path):
    # Orbax keeps a process-wide event-loop thread once used; start it before the baseline.
    save_checkpointables(tmp_path / "warm", {"x": {"a": np.ones(2)}}).result()
    baseline = set(threading.enumerate())
    response = save_checkpointables(
        tmp_path / "c", {"x": {"a": np.ones(1024)}, "w": _FailingWriter()}
    )
    with pytest.raises(OSError, match="No space left"):
        response.result(timeout=60)
    assert isinstance(response.exception(), OSError)
    assert _entries(tmp_path) == ["warm"]
    assert _wait_for_threads(baseline) == []


def test_failed_save_cleans_up_even_if_nobody_waits(tmp_path):
    save_checkpointables(tmp_path / "warm", {"x": {"a": 1}}).result()
    response = save_checkpointables(tmp_path / "c", {"w": _FailingWriter()})
    deadline = time.monotonic() + 30
    while not response.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert response.done()
    assert _entries(tmp_path) == ["warm"]


def test_refused_saves_start_no_threads(tmp_path):
    baseline = set(threading.enumerate())
    for bad in ({"x": {"f": print}}, {}, {"x": None}):
        with pytest.raises((TypeError, ValueError)):
            save_checkpointables(tmp_path / "c", bad)
    # What Orbax alone refuses ("Found empty item") tinax saves, and cleans up after.
    save_checkpointables(tmp_path / "c", {"x": {}}).result()
    assert (
        _wait_for_threads(
            baseline | {t for t in threading.enumerate() if t.name.startswith("asyncio")}
        )
        == []
    )


def test_relative_paths_save_and_load(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    response = save_checkpointables("run/a", {"m": {"x": np.arange(3.0)}})
    response.result()
    assert (tmp_path / "run" / "a" / "_CHECKPOINT_METADATA").is_file()
    out = load_checkpointables("run/a", {"m": {"x": NumpyTarget((3,), np.float64)}})
    np.testing.assert_array_equal(out["m"]["x"], np.arange(3.0))


def test_typed_prng_keys_round_trip(tmp_path):
    rng = {"key": jax.random.key(42), "data": jax.random.key_data(jax.random.key(1))}
    save_checkpointables(tmp_path / "c", {"rng": rng}).result()
    out = load_checkpointables(tmp_path / "c", {"rng": abstract_restore_target(rng)})
    assert jax.dtypes.issubdtype(out["rng"]["key"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(
        jax.random.key_data(out["rng"]["key"]), jax.random.key_data(rng["key"])
    )
    np.testing.assert_array_equal(
        jax.random.uniform(out["rng"]["key"], (3,)), jax.random.uniform(rng["key"], (3,))
    )
