"""Saves that write each batch of arrays while the next ones are copied to the host.

On an accelerator tinax has Orbax write the state batch by batch during its save
call (``tinax.checkpointing._host_copies``). A CPU's arrays are in host memory
already and are saved in Orbax's own order, so these tests ask for small batches
on the CPU: the writes, files and checksums are the real ones.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from damage import biggest_data_file, flip_middle_byte
from flax import nnx
from orbax.checkpoint import v1 as ocp
from orbax.checkpoint._src.serialization import replica_slices

import tinax.explore as ex
from tinax.checkpointing import (
    CorruptDataError,
    _host_copies,
    _orbax,
    abstract_restore_target,
    compression,
    load_checkpointables,
    save_checkpointables,
)
from tinax.checkpointing import (
    _checksummed_handler as _checksums,
)


class _Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.blocks = nnx.List([nnx.Linear(64, 64, rngs=rngs) for _ in range(6)])
        self.norm = nnx.LayerNorm(64, rngs=rngs)
        self.head = nnx.Linear(64, 10, rngs=rngs)


def _state() -> dict[str, Any]:
    model = _Model(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    return {"model": nnx.state(model), "opt": nnx.state(optimizer)}


class _Copies:
    """Counts Orbax's host copies, and looks at the destination when each starts."""

    def __init__(self, destination: Path) -> None:
        self.destination = destination
        self.calls = 0
        self.directories_then: list[bool] = []
        self.fail_at: int | None = None

    def __call__(self, inner: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        temporaries = list(self.destination.parent.glob(f"{self.destination.name}*"))
        self.directories_then.append(any((t / "model").is_dir() for t in temporaries))
        if self.fail_at == self.calls:
            raise RuntimeError("the device went away")
        return inner(*args, **kwargs)


@pytest.fixture
def batched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Copies]:
    """Saves in this test write batches of at least 4 KiB, and their copies are counted."""
    copies = _Copies(tmp_path / "c")
    monkeypatch.setattr(_host_copies, "write_batch_bytes", lambda checkpointable: 4096)
    # Installed first, so that the counter sits outside tinax's own observer.
    _orbax.observe_host_copies(_checksums._on_host_copy)
    inner = replica_slices.transfer_arrays_to_host

    def counted(*args: Any, **kwargs: Any) -> Any:
        return copies(inner, *args, **kwargs)

    counted.__dict__.update(inner.__dict__)
    counted.__wrapped__ = getattr(inner, "__wrapped__", inner)  # type: ignore[attr-defined]
    monkeypatch.setattr(replica_slices, "transfer_arrays_to_host", counted)
    yield copies


def _same(a: Any, b: Any) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.asarray(x).dtype == np.asarray(y).dtype
        and np.asarray(x).tobytes() == np.asarray(y).tobytes()
        for x, y in zip(la, lb, strict=True)
    )


def test_batch_bounds_cover_every_array_once_in_order() -> None:
    assert _orbax.batch_bounds([5, 5, 5, 5, 5], 10) == [(0, 2), (2, 4), (4, 5)]
    assert _orbax.batch_bounds([30, 1, 1], 10) == [(0, 1), (1, 3)]
    assert _orbax.batch_bounds([1, 2, 3], 100) == [(0, 3)]
    assert _orbax.batch_bounds([], 10) == []


def test_only_an_accelerators_arrays_are_batched() -> None:
    # A CPU's arrays are in host memory: Orbax's order, the directories in the background.
    assert _host_copies.write_batch_bytes(_state()) is None
    assert _host_copies.write_batch_bytes({"x": np.zeros(4), "n": 3}) is None


def test_a_batched_save_is_what_orbax_writes_checksummed_and_restored_bit_exactly(
    tmp_path: Path, batched: _Copies
) -> None:
    state = _state()
    save_checkpointables(tmp_path / "c", state).result()
    arrays = len(jax.tree.leaves(state["model"]))
    # Written in several batches, each copy made with the directories already there.
    assert batched.calls >= 4
    assert all(batched.directories_then)

    back = load_checkpointables(tmp_path / "c", abstract_restore_target(state))
    assert _same(back, state)
    # Raw Orbax reads it too, and its array metadata names every array once.
    raw = ocp.load_checkpointables(tmp_path / "c", abstract_restore_target(state))
    assert _same(raw, state)
    metadata = (tmp_path / "c" / "model" / "array_metadatas" / "process_0").read_text()
    assert metadata.count('"param_name"') == arrays
    # Every array was digested from its host copy, and the data check passes.
    report = ex.verify(tmp_path / "c", data=True)
    assert report.ok, report
    record = ex.checkpoint_table(tmp_path / "c")
    assert record.attrs["checksums"] == {"model": True, "opt": True}


def _encode_limits(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The ``data_copy_concurrency`` limit of every tensorstore context Orbax makes
    while the test runs (``None`` where it sets none: one thread a core). Orbax's
    contexts are those with its 128 file I/O threads (tinax's own reads make others)."""
    from orbax.checkpoint._src.serialization import tensorstore_utils

    limits: list[object] = []
    made = tensorstore_utils.ts.Context

    def context(spec: Any = None, *args: Any, **kwargs: Any) -> Any:
        if isinstance(spec, dict) and spec.get("file_io_concurrency") == {"limit": 128}:
            limits.append(spec.get("data_copy_concurrency", {}).get("limit"))
        return made(spec, *args, **kwargs)

    monkeypatch.setattr(tensorstore_utils.ts, "Context", context)
    return limits


def test_a_save_from_an_accelerator_leaves_cores_free_for_the_training_loop(
    tmp_path: Path, batched: _Copies, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As from an accelerator (the fixture batches), the save compresses on all but
    # FREE_CORES of the cores, and is what it would be otherwise.
    limits = _encode_limits(monkeypatch)
    state = _state()
    with compression():
        save_checkpointables(tmp_path / "c", state).result()
    cores = len(os.sched_getaffinity(0))
    assert max(1, cores - _host_copies.FREE_CORES) in limits
    assert _same(load_checkpointables(tmp_path / "c", abstract_restore_target(state)), state)
    # A CPU's save leaves tensorstore its default, and so does a load.
    limits.clear()
    monkeypatch.setattr(_host_copies, "write_batch_bytes", lambda checkpointable: None)
    save_checkpointables(tmp_path / "d", state).result()
    load_checkpointables(tmp_path / "c", abstract_restore_target(state))
    assert limits and set(limits) == {None}


def test_encode_threads_refuses_a_limit_below_one() -> None:
    with pytest.raises(ValueError, match="limit must be positive, got 0"), _orbax.encode_threads(0):
        pass


def test_a_flipped_byte_in_a_batched_save_is_refused_naming_the_leaf(
    tmp_path: Path, batched: _Copies
) -> None:
    state = _state()
    save_checkpointables(tmp_path / "c", state).result()
    flip_middle_byte(biggest_data_file(tmp_path / "c" / "model"))
    with pytest.raises(CorruptDataError, match=r"'model'.*leaf .*corrupt"):
        load_checkpointables(tmp_path / "c", abstract_restore_target(state))


def test_a_copy_that_fails_in_a_later_batch_fails_the_save_and_leaves_nothing(
    tmp_path: Path, batched: _Copies
) -> None:
    state = _state()
    batched.fail_at = 3
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(RuntimeError, match="the device went away"):
        save_checkpointables(tmp_path / "c", state)
    # Orbax saves the two checkpointables side by side: the other one's copies all
    # went on, and its writer was writing into the temporary directory when the
    # call failed. The save's writers end before the directory is removed.
    assert batched.calls > 3
    deadline = time.monotonic() + 30
    while any(
        t.name == "array_type_handler" and t.ident not in before for t in threading.enumerate()
    ):
        assert time.monotonic() < deadline, "the writer thread did not end"
        time.sleep(0.05)
    assert not (tmp_path / "c").exists()
    assert [p.name for p in tmp_path.iterdir()] == []
    # The same destination saves cleanly after it.
    batched.fail_at = None
    save_checkpointables(tmp_path / "c", state).result()
    assert _same(load_checkpointables(tmp_path / "c", abstract_restore_target(state)), state)


def test_starting_host_copies_skips_what_cannot_be_copied() -> None:
    gone = jnp.ones(8)
    gone.delete()
    # Left to the save's own checks, which name the leaf.
    _host_copies.start_host_copies([{"gone": gone, "kept": jnp.zeros(3), "n": 1}])
