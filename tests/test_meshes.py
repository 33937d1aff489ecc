"""Checkpoints saved on one mesh and loaded onto others, checksums checked each way.

JAX fixes its devices when it starts, so each mesh runs in a fresh interpreter:
eight CPU devices (``--xla_force_host_platform_device_count=8``) for the meshes,
and one without the flag for a single-device job loading what eight saved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from damage import file_holding, flip_bits

pytestmark = pytest.mark.slow

_COMMON = """
import json, sys
from pathlib import Path
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding
import tinax.explore as ex
from tinax.checkpointing import CorruptDataError, load_checkpointables, save_checkpointables

root = Path(sys.argv[1])

def expected():
    rng = np.random.default_rng(7)
    return {
        "w": rng.standard_normal((64, 48)).astype(np.float32),
        "rows": rng.standard_normal((32, 16)).astype(np.float32),
        "emb": rng.standard_normal((40, 8)).astype(jnp.bfloat16),
        "step": np.arange(8, dtype=np.int32),
        "wide": rng.standard_normal((256, 4096)).astype(np.float32),
    }

def mesh(shape, names):
    count = int(np.prod(shape))
    return Mesh(np.array(jax.devices()[:count]).reshape(shape), names)

def targets(shardings):
    return {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k])
        for k, v in expected().items()
    }

def load_and_compare(path, shardings):
    out = load_checkpointables(path, {"model": targets(shardings)})["model"]
    for k, v in expected().items():
        got = out[k]
        assert got.sharding == shardings[k], (k, got.sharding)
        assert np.asarray(got).tobytes() == v.tobytes(), k
    return sorted(out)

def flipped_fails(path, shardings):
    try:
        load_checkpointables(path, {"model": targets(shardings)})
    except CorruptDataError as e:
        return str(e)
    return None
"""

_ON_MESHES = (
    _COMMON
    + """
assert jax.device_count() == 8
m42 = mesh((4, 2), ("a", "b"))
state = {
    # Split both ways; split one way and held twice (two replicas); held by all.
    "w": jax.device_put(expected()["w"], NamedSharding(m42, P("a", "b"))),
    "rows": jax.device_put(expected()["rows"], NamedSharding(m42, P("a", None))),
    "emb": jax.device_put(expected()["emb"], NamedSharding(m42, P(None, "b"))),
    "step": jax.device_put(expected()["step"], NamedSharding(m42, P())),
    "wide": jax.device_put(expected()["wide"], NamedSharding(m42, P())),
}
save_checkpointables(root / "c", {"model": state}).result()
record = json.loads((root / "c" / "model" / "tinax_checksums" / "process_0.json").read_text())
pieces = {k: sorted(p[0] for p in v["pieces"]) for k, v in record["leaves"].items()}

m81 = mesh((8, 1), ("x", "y"))
m22 = mesh((2, 2), ("x", "y"))
one = SingleDeviceSharding(jax.devices()[5])
layouts = {
    "8x1": {
        **{k: NamedSharding(m81, P("x", None)) for k in ("w", "rows", "emb")},
        "step": NamedSharding(m81, P("x")),
        # 4 MiB held by all eight, loaded in eight column blocks: every stored
        # piece is put together from eight parts read at once.
        "wide": NamedSharding(m81, P(None, "x")),
    },
    "2x2": {
        "w": NamedSharding(m22, P("y", "x")),
        "rows": NamedSharding(m22, P(None, "y")),
        "emb": NamedSharding(m22, P("x", "y")),
        "step": NamedSharding(m22, P("x")),
        "wide": NamedSharding(m22, P("y", "x")),
    },
    "one device": {k: one for k in ("w", "rows", "emb", "step", "wide")},
    "4x2 as saved": {k: state[k].sharding for k in state},
}
loaded = {name: load_and_compare(root / "c", s) for name, s in layouts.items()}
# Saved again as on an accelerator, each array written while the next is copied:
# the same pieces, the same digests, the same values.
from tinax.checkpointing import _host_copies
_host_copies.write_batch_bytes = lambda checkpointable: 1
save_checkpointables(root / "batched", {"model": state}).result()
again = json.loads((root / "batched" / "model" / "tinax_checksums" / "process_0.json").read_text())
batched = {
    "same record": again["leaves"] == record["leaves"],
    "loaded": {name: load_and_compare(root / "batched", layouts[name]) for name in ("2x2", "one device")},
}
read = {k: ex.read_leaf(root / "c", "model", f"['{k}']").tobytes() == v.tobytes()
        for k, v in expected().items()}
# The same checkpoint with one byte of "w" flipped, which every layout must refuse.
import shutil
shutil.copytree(root / "c", root / "bad")
from damage import file_holding, flip_bits
target, where = file_holding(root / "bad" / "model", expected()["w"][40, 24:].tobytes())
flip_bits(target, where + 3, 0x40)
refused = {name: flipped_fails(root / "bad", s) for name, s in layouts.items()}
print(json.dumps({
    "pieces": pieces, "loaded": loaded, "read": read, "refused": refused, "batched": batched,
}))
"""
)

_ON_ONE_DEVICE = (
    _COMMON
    + """
assert jax.device_count() == 1
one = {k: SingleDeviceSharding(jax.devices()[0]) for k in expected()}
print(json.dumps({
    "loaded": load_and_compare(root / "c", one),
    "refused": flipped_fails(root / "bad", one),
}))
"""
)


def _run(script: str, root: Path, *, devices: int | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(Path(__file__).parent)  # the scripts damage through tests/damage.py
    if devices is not None:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # The first traceback, not the tail: a failed read quotes pages of tensorstore spec.
    assert done.returncode == 0, done.stderr[:4000]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def on_meshes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    root = tmp_path_factory.mktemp("meshes")
    return root, _run(_ON_MESHES, root, devices=8)


def test_a_4x2_save_records_each_stored_piece_once(
    on_meshes: tuple[Path, dict[str, object]],
) -> None:
    pieces = on_meshes[1]["pieces"]
    assert isinstance(pieces, dict)
    shapes = {
        "['w']": (64, 48),
        "['rows']": (32, 16),
        "['emb']": (40, 8),
        "['step']": (8,),
        "['wide']": (256, 4096),
    }
    for key, shape in shapes.items():
        # The pieces tile the array: every element in exactly one piece, however
        # many devices held a copy of it (Orbax writes each replica's share once).
        covered = np.zeros(shape, np.int32)
        for bounds in pieces[key]:
            covered[tuple(slice(a, b) for a, b in bounds)] += 1
        assert (covered == 1).all(), key
    # Split 4 x 2: one piece per shard, as stored.
    assert sorted(pieces["['w']"]) == sorted(
        [[[r, r + 16], [c, c + 24]] for r in range(0, 64, 16) for c in (0, 24)]
    )


def test_it_loads_bit_identical_onto_8x1_2x2_one_device_and_its_own_mesh(
    on_meshes: tuple[Path, dict[str, object]],
) -> None:
    loaded = on_meshes[1]["loaded"]
    assert loaded == {
        name: ["emb", "rows", "step", "w", "wide"]
        for name in ("8x1", "2x2", "one device", "4x2 as saved")
    }
    assert on_meshes[1]["read"] == dict.fromkeys(("w", "rows", "emb", "step", "wide"), True)


def test_a_save_written_batch_by_batch_stores_the_same_pieces_and_values(
    on_meshes: tuple[Path, dict[str, object]],
) -> None:
    keys = ["emb", "rows", "step", "w", "wide"]
    assert on_meshes[1]["batched"] == {
        "same record": True,
        "loaded": {"2x2": keys, "one device": keys},
    }


def test_a_flipped_byte_is_refused_on_every_mesh_naming_the_leaf(
    on_meshes: tuple[Path, dict[str, object]],
) -> None:
    refused = on_meshes[1]["refused"]
    assert isinstance(refused, dict) and set(refused) == {
        "8x1",
        "2x2",
        "one device",
        "4x2 as saved",
    }
    for name, message in refused.items():
        assert message is not None, f"{name}: the flipped byte was loaded"
        assert "['w']" in message and "corrupt" in message and "'model'" in message, message


def test_a_single_device_process_loads_what_eight_devices_saved(
    on_meshes: tuple[Path, dict[str, object]],
) -> None:
    root = on_meshes[0]
    result = _run(_ON_ONE_DEVICE, root, devices=None)
    assert result["loaded"] == ["emb", "rows", "step", "w", "wide"]
    refused = result["refused"]
    assert isinstance(refused, str) and "['w']" in refused and "corrupt" in refused


def test_a_flipped_byte_is_caught_on_the_host_also_when_the_target_casts_it(
    tmp_path: Path,
) -> None:
    # The parts Orbax reads are checked in the stored dtype, before the cast the
    # target asks for: reading the cast values back could never match.
    import jax
    import jax.numpy as jnp

    from tinax.checkpointing import (
        CorruptDataError,
        load_checkpointables,
        save_checkpointables,
    )
    from tinax.checkpointing import (
        _checksummed_handler as _checksums,
    )

    values = np.random.default_rng(3).standard_normal((512, 256)).astype(jnp.bfloat16)
    save_checkpointables(tmp_path / "c", {"model": {"w": jnp.asarray(values)}}).result()
    assert _checksums._expected == {}
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {"w": jax.ShapeDtypeStruct((512, 256), jnp.float32, sharding=device)}
    loaded = load_checkpointables(tmp_path / "c", {"model": target})["model"]["w"]
    np.testing.assert_array_equal(np.asarray(loaded), values.astype(np.float32))
    data, where = file_holding(tmp_path / "c" / "model", values[300].tobytes())
    flip_bits(data, where + 11, 0x01)
    with pytest.raises(CorruptDataError, match=r"\['w'\].*corrupt"):
        load_checkpointables(tmp_path / "c", {"model": target})
    assert _checksums._loads == {}
