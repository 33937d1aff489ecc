"""Loads whose targets ask for another float dtype than the stored one: tinax's engine
reads them and casts them on the host, every bit as Orbax's own load casts them
(rounding, NaN payloads, Inf, subnormals, overflow to Inf, a float64 going to
float16); NaN and Inf are counted on the stored values; a budget holds on such a load;
a lossy cast is still refused unless allowed; casts it does not make go to Orbax."""

from __future__ import annotations

import gc
import re
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
import orbax_spy
import pytest
from orbax.checkpoint import v1 as ocp

import tinax.checkpointing as tc
from tinax._paths import open_checkpoint
from tinax.checkpointing import _casts, _checkpointables, _restore_plan
from tinax.checkpointing._nonfinite import LoadCounts

F16, BF16, F32, F64 = (
    np.dtype(t) for t in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64)
)
# What JAX holds on a device (float64 only with jax_enable_x64), and what NumPy leaves
# hold: every float dtype.
ON_DEVICE = (F16, BF16, F32)
ON_HOST = (F16, BF16, F32, F64)
_BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}

orbax_loads = orbax_spy.orbax_loads  # the fixture


def _patterns(dtype: np.dtype) -> np.ndarray:
    """Values of ``dtype`` that casts get wrong: every 16-bit pattern; for wider floats,
    random bits (NaN with payloads, subnormals, values beyond float16's and
    bfloat16's range) and the edges: ties to even, the largest finite, signalling
    and negative NaN, the subnormals of the narrower floats, a float64 that rounds
    differently to float16 directly and through float32."""
    if dtype.itemsize == 2:
        return np.arange(1 << 16, dtype=np.uint16).view(dtype).reshape(256, 256)
    rng = np.random.default_rng(dtype.itemsize)
    if dtype == F32:
        edges = np.array(
            [0x3F808000, 0x3F818000, 0x7F7FFFFF, 0xFF7F8000, 0x00008000, 0x7F800001,
             0xFFC00001, 0x7FBFFFFF, 0x477FF000, 0x477FEFFF, 0x33800000, 0x33000001,
             0x387FC000, 0x00000001, 0x80000000, 0x7F800000, 0xFF800000],
            np.uint32,
        )  # fmt: skip
        bits = rng.integers(0, 1 << 32, 256 * 256 - edges.size, dtype=np.uint64)
        return np.concatenate([edges, bits.astype(np.uint32)]).view(F32).reshape(256, 256)
    edges = np.array(
        [1609.4999791910675, 65520.0, 65519.99999, 2.0**-25, 2.0**-25 * 1.0000001,
         1 + 2.0**-8 + 2.0**-40, 3.4028235677973366e38, 1e300, 5e-324, -0.0, np.inf, -np.inf],
        np.float64,
    ).view(np.uint64)  # fmt: skip
    nans = np.array([0x7FF0000000000001, 0xFFF8000000000001, 0x7FF4000000000000], np.uint64)
    bits = rng.integers(0, 1 << 63, 256 * 256 - edges.size - nans.size, dtype=np.uint64)
    bits |= rng.integers(0, 2, bits.size, dtype=np.uint64) << np.uint64(63)
    return np.concatenate([edges, nans, bits]).view(F64).reshape(256, 256)


def _name(dtype: np.dtype) -> str:
    return dtype.name


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each float dtype's tricky values, as device arrays and as NumPy leaves."""
    path = tmp_path_factory.mktemp("casts") / "c"
    device = {_name(t): jax.device_put(_patterns(t)) for t in ON_DEVICE}
    host = {_name(t): _patterns(t) for t in ON_HOST}
    tc.save_checkpointables(path, {"device": device, "host": host}).result()
    return path


def _targets(turn: int) -> dict[str, Any]:
    """Each stored dtype's leaf restored as the dtype ``turn`` places after it."""
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return {
        "device": {
            _name(t): jax.ShapeDtypeStruct(
                (256, 256), ON_DEVICE[(i + turn) % len(ON_DEVICE)], sharding=sharding
            )
            for i, t in enumerate(ON_DEVICE)
        },
        "host": {
            _name(t): tc.NumpyTarget((256, 256), ON_HOST[(i + turn) % len(ON_HOST)])
            for i, t in enumerate(ON_HOST)
        },
    }


@pytest.mark.parametrize("turn", [1, 2, 3])
def test_every_float_cast_loads_through_the_engine_bit_identical_to_orbax(
    saved: Path, orbax_loads: list[list[str]], turn: int
) -> None:
    targets = _targets(turn)
    with tc.allow_lossy_casts():
        back = tc.load_checkpointables(saved, targets)
    assert orbax_loads == []  # the engine read and cast every leaf
    theirs = ocp.load_checkpointables(saved, targets)
    for name, tree in targets.items():
        for key, target in tree.items():
            got, want = back[name][key], theirs[name][key]
            assert type(got) is type(want) and got.dtype == want.dtype == target.dtype
            bits = _BITS[target.dtype.itemsize]
            np.testing.assert_array_equal(
                np.asarray(got).view(bits), np.asarray(want).view(bits), err_msg=f"{name}/{key}"
            )
            # Every kind of value was there to be cast: NaN, Inf, subnormals.
            if key == "float32" and target.dtype == F16:
                assert np.isinf(np.asarray(got)).sum() > np.isinf(_patterns(F32)).sum()


def test_nan_and_inf_are_counted_on_the_stored_values(saved: Path) -> None:
    counts = LoadCounts()
    targets = {"host": _targets(1)["host"]}  # float32 -> float64, float64 -> float16, ...
    with tc.allow_lossy_casts():
        _checkpointables.restore_checkpointables(open_checkpoint(saved), targets, counts)
    found = {leaf.key: (leaf.nan, leaf.inf) for leaf in counts.leaves()}
    for t in ON_HOST:
        with np.errstate(invalid="ignore"):
            stored = _patterns(t).astype(np.float64)
        # float64 cast to float16 overflows to Inf: what is counted is what was stored.
        assert found[f"['{_name(t)}']"] == (np.isnan(stored).sum(), np.isinf(stored).sum())


def test_a_lossy_cast_is_still_refused_unless_allowed(
    saved: Path, orbax_loads: list[list[str]]
) -> None:
    narrowing = {"host": {"float64": tc.NumpyTarget((256, 256), F32)}}
    with pytest.raises(tc.TargetMismatchError, match="lossy cast"):
        tc.load_checkpointables(saved, narrowing)
    with (
        tc.allow_lossy_casts(),
        tc.allow_lossy_casts(False),
        pytest.raises(tc.TargetMismatchError, match="lossy cast"),
    ):
        tc.load_checkpointables(saved, narrowing)
    # Widening keeps every value: no permission needed, and the engine casts it.
    widening = {"host": {"bfloat16": tc.NumpyTarget((256, 256), F32)}}
    back = tc.load_checkpointables(saved, {"host": {**_targets(0)["host"], **widening["host"]}})
    assert orbax_loads == []
    assert back["host"]["bfloat16"].tobytes() == _patterns(BF16).astype(F32).tobytes()


def _reader(path: Path, targets: dict[str, Any]) -> dict[str, str]:
    planned = _restore_plan.plan_restore(open_checkpoint(path), targets)
    planned.close()
    return planned.plan.readers


def test_casts_the_engine_does_not_make_are_left_to_orbax_with_the_reason(
    tmp_path: Path, saved: Path, orbax_loads: list[list[str]]
) -> None:
    # A float64 device target: JAX (without jax_enable_x64) holds it as float32.
    device = _targets(0)["device"]
    wide = {
        **device,
        "float32": jax.ShapeDtypeStruct((256, 256), F64, sharding=device["float32"].sharding),
    }
    assert re.search(
        r"Orbax \(leaf .*float32.*: JAX holds float64 as float32\)",
        _reader(saved, {"device": wide})["device"],
    )
    # An integer cast.
    tc.save_checkpointables(tmp_path / "i", {"i": {"x": np.arange(6, dtype=np.int8)}}).result()
    target = {"i": {"x": tc.NumpyTarget((6,), np.dtype(np.int32))}}
    assert "a cast from int8 to int32 is left to Orbax" in _reader(tmp_path / "i", target)["i"]
    back = tc.load_checkpointables(tmp_path / "i", target)
    assert orbax_loads == [["i"]] and back["i"]["x"].dtype == np.int32
    assert back["i"]["x"].tolist() == list(range(6))


def _status() -> dict[str, int]:
    text = Path("/proc/self/status").read_text()
    return {k: int(re.search(rf"{k}:\s+(\d+)", text).group(1)) * 1024 for k in ("VmRSS", "VmHWM")}


def test_a_budget_holds_on_a_cast_load(tmp_path: Path, orbax_loads: list[list[str]]) -> None:
    # 24 float32 leaves of 1 MiB restored as bfloat16, on the device and as NumPy arrays.
    values = {f"w{i}": np.full((512, 512), i + 0.5, np.float32) for i in range(24)}
    tc.save_checkpointables(tmp_path / "c", {"m": values}).result()
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    targets = {
        "m": {
            k: jax.ShapeDtypeStruct(v.shape, BF16, sharding=device)
            if i % 2
            else tc.NumpyTarget(v.shape, BF16)
            for i, (k, v) in enumerate(values.items())
        }
    }
    checkpoint = open_checkpoint(tmp_path / "c")
    with tc.allow_lossy_casts():
        free = _restore_plan.plan_restore(checkpoint, targets)
        free.close()
        peak = free.plan.hosts[0]
        # Kept: the restored values in bfloat16; in flight: float32 parts being read.
        assert peak.kept == 24 * (512 * 512 * 2) and peak.in_flight >= 1 << 20
        budget = peak.kept + peak.scratch + peak.overhead + (2 << 20)
        within = _restore_plan.plan_restore(checkpoint, targets, max_host_bytes=budget)
        within.close()
        assert within.plan.fits and within.plan.hosts[0].peak <= budget
        assert within.plan.limits.reading_bytes <= 2 << 20  # two parts read at once
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")
        before = _status()
        with tc.memory_budget(budget):
            back = tc.load_checkpointables(checkpoint, targets)
        grew = _status()["VmHWM"] - before["VmRSS"]
    assert orbax_loads == []
    assert grew <= budget, (grew, budget)
    assert back["m"]["w3"].dtype == back["m"]["w4"].dtype == BF16
    assert float(back["m"]["w3"][0, 0]) == 3.5 and isinstance(back["m"]["w4"], np.ndarray)
    # Half the restored values alone: refused.
    with (
        tc.allow_lossy_casts(),
        tc.memory_budget(peak.kept // 2),
        pytest.raises(tc.RestoreTooLargeError),
    ):
        tc.load_checkpointables(checkpoint, targets)


def test_only_float_dtypes_are_cast_by_the_engine() -> None:
    assert _casts.why_not(F32, BF16, on_device=True) is None
    assert _casts.why_not(F64, F16, on_device=False) is None
    assert "left to Orbax" in str(_casts.why_not(np.dtype(np.int32), F32, on_device=False))
    assert "left to Orbax" in str(
        _casts.why_not(F32, np.dtype(ml_dtypes.float8_e4m3fn), on_device=False)
    )


def test_a_cast_through_a_reused_host_buffer_is_bit_identical_to_orbax(
    saved: Path, orbax_loads: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on an accelerator: parts read as stored into slices of one small arena, cast
    into buffers of their own, copied to their devices, the slices reused."""
    from tinax.checkpointing import _fast_load

    monkeypatch.setattr(_fast_load, "_copied_to_devices", lambda plans: True)
    monkeypatch.setattr(_fast_load, "DEVICE_HOST_BUFFER_BYTES", 300 << 10)
    targets = {"device": _targets(2)["device"]}
    with tc.allow_lossy_casts():
        back = tc.load_checkpointables(saved, targets)
    assert orbax_loads == []
    theirs = ocp.load_checkpointables(saved, targets)
    for key, target in targets["device"].items():
        bits = _BITS[target.dtype.itemsize]
        got, want = np.asarray(back["device"][key]), np.asarray(theirs["device"][key])
        assert got.dtype == want.dtype == target.dtype
        np.testing.assert_array_equal(got.view(bits), want.view(bits), err_msg=key)
