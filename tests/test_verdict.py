"""The restore verdict: loads refuse targets that do not fit, from metadata, before any read."""

from __future__ import annotations

import gc
import threading
import warnings
from pathlib import Path

import grain
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from damage import biggest_data_file, flip_middle_byte

import tinax.explore as ex
from tinax._format.metadata.fit import MAX_LINES, cast_is_lossless
from tinax.checkpointing import (
    NumpyTarget,
    TargetMismatchError,
    abstract_restore_target,
    allow_lossy_casts,
    load_checkpointables,
    load_training_checkpoint,
    save_checkpointables,
    save_training_checkpoint,
)


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    state = {
        "model": {
            "dense1": {"kernel": jnp.ones((16, 256)), "bias": jnp.zeros(256)},
            "counts": np.array([16777217, 3], np.int32),
            "half": jnp.ones(4, jnp.bfloat16),
        }
    }
    save_checkpointables(tmp_path / "c", state).result()
    return tmp_path / "c"


def _model(**changes: object) -> dict:
    model = {
        "dense1": {
            "kernel": jax.ShapeDtypeStruct((16, 256), jnp.float32),
            "bias": jax.ShapeDtypeStruct((256,), jnp.float32),
        },
        "counts": NumpyTarget((2,), np.int32),
        "half": jax.ShapeDtypeStruct((4,), jnp.bfloat16),
    }
    model.update(changes)
    return model


def test_a_mismatch_is_refused_with_one_line_per_leaf(checkpoint: Path) -> None:
    target = _model(dense1={"kernel": jax.ShapeDtypeStruct((16, 512), jnp.float32)})
    with pytest.raises(TargetMismatchError) as caught:
        load_checkpointables(checkpoint, {"model": target})
    message = str(caught.value)
    assert message.splitlines() == [
        f"checkpoint {str(checkpoint)!r} does not fit the restore targets (2 leaves):",
        "  model: 1 stored only, 1 shape differs",
        "  model['dense1']['bias']: stored (256,) float32, not in the target",
        "  model['dense1']['kernel']: stored (16, 256) float32, target (16, 512) float32",
    ]
    # Code written against Orbax's KeyError, or against a ValueError, catches it.
    assert isinstance(caught.value, KeyError) and isinstance(caught.value, ValueError)


def test_a_missing_checkpointable_is_a_value_error_and_a_key_error(checkpoint: Path) -> None:
    with pytest.raises(KeyError, match=r"no checkpointable\(s\) \['params'\]"):
        load_checkpointables(checkpoint, {"params": _model()})
    with pytest.raises(ValueError, match="holds \\['model'\\]"):
        load_checkpointables(checkpoint, {"params": _model()})


def test_long_refusals_are_cut_at_ten_lines(tmp_path: Path) -> None:
    save_checkpointables(
        tmp_path / "c", {"m": {f"w{i:02d}": np.zeros(2) for i in range(25)}}
    ).result()
    target = {"m": {f"w{i:02d}": NumpyTarget((3,), np.float64) for i in range(25)}}
    with pytest.raises(TargetMismatchError) as caught:
        load_checkpointables(tmp_path / "c", target)
    lines = str(caught.value).splitlines()
    assert len(lines) == 1 + 1 + MAX_LINES + 1
    assert lines[1] == "  m: 25 shape differs"
    assert lines[-1] == f"  … and {25 - MAX_LINES} more"
    assert "(25 leaves)" in lines[0]


def test_a_refusal_sums_up_each_checkpointable_and_shows_every_kind_of_mismatch(
    tmp_path: Path,
) -> None:
    # A target from another optimizer: twelve leaves stored only, nine only in the target.
    stored = {"m": {"w": np.zeros(2)}, "opt": {f"mu{i:02d}": np.zeros(2) for i in range(12)}}
    save_checkpointables(tmp_path / "c", stored).result()
    target = {
        "m": {"w": NumpyTarget((3,), np.float64)},
        "opt": {f"trace{i}": NumpyTarget((2,), np.float64) for i in range(9)},
    }
    with pytest.raises(TargetMismatchError) as caught:
        load_checkpointables(tmp_path / "c", target)
    lines = str(caught.value).splitlines()
    assert lines[1] == "  m: 1 shape differs"
    assert lines[2].startswith("  opt: 12 stored only, 9 target only (the target's structure")
    shown = lines[3 : 3 + MAX_LINES]
    # The ten lines show each kind: the target's own leaves are not all hidden.
    assert any("m['w']" in line for line in shown)
    assert any("not in the target" in line for line in shown)
    assert any("not stored, target" in line for line in shown)
    assert lines[-1] == f"  … and {22 - MAX_LINES} more"


def test_a_typed_key_against_raw_key_data_is_refused_before_any_read(tmp_path: Path) -> None:
    key = jax.random.key(3)
    save_checkpointables(
        tmp_path / "c", {"rng": {"typed": key, "raw": jax.random.key_data(key)}}
    ).result()
    typed, raw = abstract_restore_target(key), abstract_restore_target(jax.random.key_data(key))
    for target in ({"typed": raw, "raw": raw}, {"typed": typed, "raw": typed}):
        with pytest.raises(TargetMismatchError, match="a typed key against raw key data"):
            load_checkpointables(tmp_path / "c", {"rng": target})
    restored = load_checkpointables(tmp_path / "c", {"rng": {"typed": typed, "raw": raw}})
    assert jnp.array_equal(jax.random.key_data(restored["rng"]["typed"]), restored["rng"]["raw"])


def test_a_lossy_cast_names_allow_lossy_casts(checkpoint: Path) -> None:
    with pytest.raises(TargetMismatchError) as caught:
        load_checkpointables(checkpoint, {"model": _model(counts=NumpyTarget((2,), np.float32))})
    assert "with tinax.checkpointing.allow_lossy_casts():" in str(caught.value).splitlines()[-1]


def test_a_lossy_cast_is_refused_unless_allowed(checkpoint: Path) -> None:
    # Orbax alone casts silently: 16777217 comes back as 16777216.0.
    target = _model(counts=NumpyTarget((2,), np.float32))
    with pytest.raises(
        TargetMismatchError, match=r"stored \(2,\) int32, target \(2,\) float32 \(a lossy cast\)"
    ):
        load_checkpointables(checkpoint, {"model": target})
    compared = ex.compare_table(checkpoint, {"model": target})
    (row,) = compared[compared["key"] == "['counts']"].itertuples()
    assert (row.status, row.lossy) == ("dtype cast", True)
    with allow_lossy_casts():
        restored = load_checkpointables(checkpoint, {"model": target})
    assert restored["model"]["counts"].dtype == np.float32
    assert restored["model"]["counts"][0] == np.float32(16777216.0)
    with allow_lossy_casts(), allow_lossy_casts(False), pytest.raises(TargetMismatchError):
        load_checkpointables(checkpoint, {"model": target})


def test_a_lossless_cast_goes_ahead(checkpoint: Path) -> None:
    target = _model(half=jax.ShapeDtypeStruct((4,), jnp.float32))
    compared = ex.compare_table(checkpoint, {"model": target})
    (row,) = compared[compared["key"] == "['half']"].itertuples()
    assert (row.status, row.lossy) == ("dtype cast", False)
    restored = load_checkpointables(checkpoint, {"model": target})
    assert restored["model"]["half"].dtype == jnp.float32


@pytest.mark.parametrize(
    ("stored", "target", "lossless"),
    [
        ("bfloat16", "float32", True),
        ("float32", "bfloat16", False),
        ("int32", "float32", False),
        ("int32", "float64", True),
        ("int64", "float64", False),
        ("uint8", "bfloat16", True),
        ("int16", "bfloat16", False),
        ("int8", "int32", True),
        ("uint32", "int32", False),
        ("bool", "float16", True),
        ("float16", "bfloat16", False),
        ("float32", "int64", False),
        ("float32", "complex64", True),
        ("complex64", "float32", False),
        ("float32", "float8_e4m3fn", False),
    ],
)
def test_which_casts_lose_values(stored: str, target: str, lossless: bool) -> None:
    assert cast_is_lossless(stored, target) is lossless
    if lossless:
        # Spot-check the extremes round-trip exactly.
        src = np.dtype(getattr(ml_dtypes, stored, None) or stored)
        info = ml_dtypes.iinfo(src) if src.kind in "iu" else None
        if info is not None:
            extremes = np.array([info.min, info.max], src)
            back = extremes.astype(np.dtype(getattr(ml_dtypes, target, None) or target))
            assert (back.astype(src) == extremes).all()


def test_no_cast_between_keys_strings_and_numbers() -> None:
    assert cast_is_lossless("float32", "key<fry>") is None
    assert cast_is_lossless("bogus", "float32") is None


def test_a_refused_load_leaves_no_warning_coroutine_or_thread(checkpoint: Path) -> None:
    target = _model(dense1={"kernel": jnp.zeros((2, 2)), "bias": jnp.zeros(256)})
    before = set(threading.enumerate())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            with pytest.raises(TargetMismatchError):
                load_checkpointables(checkpoint, {"model": target})
        gc.collect()  # an un-awaited coroutine warns when it is collected
    assert set(threading.enumerate()) <= before


def test_corrupt_data_in_the_first_part_leaves_no_coroutine_never_awaited(tmp_path: Path) -> None:
    # Orbax awaits each part's load in turn and drops the others once one fails.
    parts = {
        name: {"w": np.random.default_rng(i).normal(size=65536)} for i, name in enumerate("abcd")
    }
    save_checkpointables(tmp_path / "c", parts).result()
    flip_middle_byte(biggest_data_file(tmp_path / "c" / "a"))
    targets = {name: abstract_restore_target(tree) for name, tree in parts.items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with pytest.raises(ValueError, match="'a'"):
                load_checkpointables(tmp_path / "c", targets)
        gc.collect()
    assert not [str(w.message) for w in caught if "never awaited" in str(w.message)]


def test_a_refused_training_load_never_touches_the_iterator(tmp_path: Path) -> None:
    data = grain.MapDataset.range(20).batch(2).to_iter_dataset()
    it = iter(data)
    next(it)
    model = {"w": jnp.ones((3, 3))}
    save_training_checkpoint(tmp_path / "t", 1, model, {}, jax.random.key(0), {"a": 1}, it).result()
    fresh = iter(data)
    state_before = fresh.get_state()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TargetMismatchError, match=r"model\['w'\]: stored \(3, 3\) float32"):
            load_training_checkpoint(
                tmp_path / "t",
                {"w": jax.ShapeDtypeStruct((4, 4), jnp.float32)},
                {},
                abstract_restore_target(jax.random.key(0)),
                {"a": 0},
                fresh,
            )
    assert fresh.get_state() == state_before
