"""Checksums, the load preflight, honest errors and a full disk."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from damage import biggest_data_file, flip_bits, flip_middle_byte, stored_value
from orbax.checkpoint import v1 as ocp

import tinax.explore as ex
from tinax.checkpointing import (
    CorruptDataError,
    abstract_restore_target,
    load_checkpointables,
    save_checkpointables,
)


def _state() -> dict[str, Any]:
    rng = np.random.default_rng(1)
    return {
        "w": jnp.asarray(rng.standard_normal((128, 128)), jnp.float32),
        "h": rng.standard_normal((64, 64)).astype(np.float32),
        "key": jax.random.key(3),
        "n": 4,
        "s": "label",
    }


def test_a_flipped_byte_in_array_data_fails_the_load_naming_checkpoint_and_leaf(
    tmp_path: Path,
) -> None:
    state = _state()
    save_checkpointables(tmp_path / "c", {"model": state}).result()
    flip_middle_byte(biggest_data_file(tmp_path / "c" / "model"))
    with pytest.raises(CorruptDataError) as caught:
        load_checkpointables(tmp_path / "c", {"model": abstract_restore_target(state)})
    message = str(caught.value)
    assert str(tmp_path / "c") in message and "'model'" in message
    assert "['w']" in message and "corrupt" in message
    # tinax.explore reads the same leaf and says the same.
    with pytest.raises(ValueError, match=r"\['w'\].*corrupt"):
        ex.read_leaf(tmp_path / "c", "model", "['w']")
    assert ex.checkpoint_table(tmp_path / "c").attrs["checksums"] == {"model": True}


def test_a_compressed_chunk_that_no_longer_decodes_is_the_leafs_corruption(
    tmp_path: Path,
) -> None:
    # zstd finds most flipped bytes of its frame before tinax sees the values: the
    # codec's complaint must still be the leaf's CorruptDataError, not tensorstore's.
    from tinax.checkpointing import compression

    w = jnp.arange(1 << 18, dtype=jnp.float32).reshape(512, 512) * 0.37
    state = {"w": w, "b": jnp.ones(7)}
    with compression():
        save_checkpointables(tmp_path / "c", {"model": state}).result()
    data, start = stored_value(tmp_path / "c" / "model", "w/c/0/0")
    flip_bits(data, start + 10)  # inside the zstd frame of w's one chunk
    with pytest.raises(CorruptDataError) as caught:
        load_checkpointables(tmp_path / "c", {"model": abstract_restore_target(state)})
    message = str(caught.value)
    assert str(tmp_path / "c") in message and "'model'" in message
    assert "leaf ['w']: the stored data is corrupt: it does not decode (ZSTD" in message
    with pytest.raises(ValueError, match=r"leaf \['w'\]: the stored data is corrupt: it does not"):
        ex.read_leaf(tmp_path / "c", "model", "['w']")
    verdict = ex.verify(tmp_path / "c", data=True)
    assert not verdict.ok
    assert "corrupt: it does not decode" in " ".join(verdict.findings["message"])
    # diff_table reads a changed leaf through the same chunk reader and says the same.
    save_checkpointables(tmp_path / "a", {"model": {**state, "w": w + 1}}).result()
    with pytest.raises(ValueError, match=r"\['w'\].*the stored data is corrupt: it does not"):
        ex.diff_table(tmp_path / "a", tmp_path / "c")
    # The rest of the checkpoint is as it was.
    assert np.array_equal(ex.read_leaf(tmp_path / "c", "model", "['b']"), np.ones(7))


CORRUPT_LOADS = textwrap.dedent(
    """
    import gc, sys
    from pathlib import Path
    import jax.numpy as jnp
    from damage import biggest_data_file, flip_bits
    import tinax.checkpointing as tc

    where = Path(sys.argv[1])
    state = {
        f"layer{i}": {"w": jnp.arange(1 << 20, dtype=jnp.float32).reshape(1024, 1024) * (i + 0.37)}
        for i in range(32)
    }
    target = tc.abstract_restore_target(state)
    for compressed in (False, True):
        c = where / f"c{int(compressed)}"
        with tc.compression(compressed):
            tc.save_checkpointables(c, {"model": state}).result()
        tc.save_checkpointables(where / f"ok{int(compressed)}", {"model": state}).result()
        data = biggest_data_file(c / "model")
        flip_bits(data, data.stat().st_size // 3)
        try:
            tc.load_checkpointables(c, {"model": target})
        except tc.CorruptDataError as e:
            print("REFUSED", str(e)[:120])
        back = tc.load_checkpointables(where / f"ok{int(compressed)}", {"model": target})
        assert float(back["model"]["layer3"]["w"][1, 1]) == float(state["layer3"]["w"][1, 1])
        gc.collect()
    print("DONE")
    """
)


def _run_quietly(script: str, where: Path) -> str:
    """Runs ``script`` (with ``where`` as its argument, tests/ importable) in a fresh
    interpreter on the CPU; its standard output, once it printed nothing but
    warnings on stderr."""
    path = where / "script.py"
    path.write_text(script)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(Path(__file__).parent)}
    result = subprocess.run(
        [sys.executable, str(path), str(where)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    noise = [line for line in result.stderr.splitlines() if "WARNING" not in line]
    assert noise == [], "\n".join(noise[:40])
    return result.stdout


def test_a_corrupt_load_fails_once_and_prints_nothing_else(tmp_path: Path) -> None:
    # The first read to fail waits for the others under way: Orbax's event loop is
    # not closed with reads suspended in it, which printed a traceback per read.
    out = _run_quietly(CORRUPT_LOADS, tmp_path)
    assert out.count("REFUSED") == 2 and "DONE" in out, out
    assert "corrupt" in out


LATE_READS = textwrap.dedent(
    """
    import asyncio, functools, sys, time
    from pathlib import Path
    import jax.numpy as jnp
    import numpy as np
    from damage import file_holding, flip_bits
    from orbax.checkpoint._src.serialization import serialization
    import tinax.checkpointing as tc
    from tinax.checkpointing import _checksummed_handler as _checksums, _orbax

    where = Path(sys.argv[1])
    rng = np.random.default_rng(5)
    state = {k: jnp.asarray(rng.standard_normal(1 << 14), jnp.float32) for k in "abc"}
    tc.save_checkpointables(where / "c", {"model": state}).result()
    data, at = file_holding(where / "c" / "model", np.asarray(state["a"][100:200]).tobytes())
    flip_bits(data, at + 1, 0x10)

    # Orbax's reads, delayed in the order that lost the load's first failure: b's
    # read starts once a's has failed, while a's waits for the reads under way;
    # c's is still under way when b's is refused.
    _orbax.check_host_reads(_checksums._READ_HOOKS)
    checked = serialization._read_shard

    async def until_a_failed():
        give_up = time.monotonic() + 60
        while not any(load.failed for load in list(_checksums._loads.values())):
            assert time.monotonic() < give_up, "the read of a never failed"
            await asyncio.sleep(0)

    @functools.wraps(checked)
    async def in_that_order(t, **kwargs):
        name = _orbax._array_path(t).rstrip("/").rsplit("/", 1)[-1]
        if name == "b":
            await until_a_failed()
        values = await checked(t, **kwargs)
        if name == "c":
            await until_a_failed()
            await asyncio.sleep(0.5)
        return values

    serialization._read_shard = in_that_order
    try:
        tc.load_checkpointables(where / "c", {"model": tc.abstract_restore_target(state)})
    except tc.CorruptDataError as e:
        print("REFUSED", e)
    import gc
    gc.collect()
    print("DONE")
    """
)


def test_a_read_refused_after_the_first_failure_reports_that_failure(tmp_path: Path) -> None:
    # A read that starts once another has failed is refused at once. Its error
    # could reach Orbax first: the load then failed as unreadable data naming the
    # wrong array, and closed its event loop on the reads still under way.
    out = _run_quietly(LATE_READS, tmp_path)
    assert "DONE" in out, out
    assert "REFUSED" in out and "leaf ['a']: the stored data is corrupt" in out


def test_checkpoints_without_checksums_load_and_explore_says_so(tmp_path: Path) -> None:
    state = _state()
    ocp.save_checkpointables(tmp_path / "raw", {"model": state})
    restored = load_checkpointables(tmp_path / "raw", {"model": abstract_restore_target(state)})
    np.testing.assert_array_equal(restored["model"]["h"], state["h"])
    assert ex.checkpoint_table(tmp_path / "raw").attrs["checksums"] == {"model": False}


def test_each_leaf_kind_is_checked(tmp_path: Path) -> None:
    state = _state()
    save_checkpointables(tmp_path / "c", {"model": state}).result()
    record = (tmp_path / "c" / "model" / "tinax_checksums" / "process_0.json").read_text()
    for key in ("['w']", "['h']", "['key']", "['n']", "['s']"):
        assert f'"{key}"' in record
    # A string leaf edited in place is caught too.
    strings = tmp_path / "c" / "model" / "_strings.json"
    strings.write_text(strings.read_text().replace("label", "lapel"))
    with pytest.raises(CorruptDataError, match=r"\['s'\]"):
        load_checkpointables(tmp_path / "c", {"model": abstract_restore_target(state)})


def test_checksum_records_decode_typed_and_refuse_in_the_field_by_field_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tinax._format.integrity import checksums

    state = _state()
    save_checkpointables(tmp_path / "c", {"model": state}).result()
    record = tmp_path / "c" / "model" / "tinax_checksums" / "process_0.json"
    data = record.read_bytes()
    # Opening a checkpoint tinax wrote decodes its records typed, leaf by leaf in C: the
    # field-by-field read (a dict per leaf and per piece) is not used.
    generic: list[str] = []
    leaf = checksums._leaf
    monkeypatch.setattr(
        checksums, "_leaf", lambda key, entry, where: generic.append(key) or leaf(key, entry, where)
    )
    typed = checksums.read_checksums(ex.open_checkpoint(tmp_path / "c").get("model"))
    assert typed is not None and set(typed) == {"['w']", "['h']", "['key']", "['n']", "['s']"}
    assert generic == []
    document = json.loads(data)
    where = repr(str(record))
    assert typed == {k: leaf(k, e, where) for k, e in document["leaves"].items()}
    # What the typed decode does not accept is read field by field, refused in its words.
    bad = {
        "has no shape": {"shape": [-1]},
        "has no shape ": {"shape": [True]},
        "has no kind and dtype": {"kind": "tensor"},
        "does not fit shape": {"pieces": [[[[0, 129], [0, 128]], "00"]]},
        "a piece is not": {"pieces": [[[[0, 128]]]]},
    }
    for i, (why, change) in enumerate(bad.items()):
        broken = json.loads(data)
        broken["leaves"]["['w']"].update(change)
        copy = tmp_path / f"bad{i}"
        shutil.copytree(tmp_path / "c", copy)
        (copy / "model" / "tinax_checksums" / "process_0.json").write_text(json.dumps(broken))
        with pytest.raises(ValueError, match=rf"leaf \['w'\].*{why.strip()}"):
            ex.open_checkpoint(copy)
    assert set(generic) >= {"['w']"}


@pytest.mark.parametrize(
    ("damage", "named", "why"),
    [
        ("link inside", "model", "symbolic link"),
        ("fifo", "d", "FIFO"),
        ("huge", "_sharding", "implausibly large"),
        ("bomb", "process_0", "no array_metadatas list"),
    ],
)
def test_the_preflight_refuses_before_anything_is_read(
    tmp_path: Path, damage: str, named: str, why: str
) -> None:
    state = _state()
    save_checkpointables(tmp_path / "c", {"model": state, "other": state}).result()
    model = tmp_path / "c" / "model"
    if damage == "link inside":
        shutil.rmtree(model)
        os.symlink(tmp_path / "c" / "other", model)
    elif damage == "fifo":
        target = biggest_data_file(model)
        target.unlink()
        os.mkfifo(target)
    elif damage == "huge":
        os.truncate(model / "_sharding", 1 << 30)
    else:
        (model / "array_metadatas" / "process_0").write_text("[" * 200 + "]" * 200)
    with pytest.raises(ValueError, match=why) as caught:
        load_checkpointables(tmp_path / "c", {"model": abstract_restore_target(state)})
    assert str(tmp_path / "c") in str(caught.value) and named in str(caught.value)


def test_listing_survives_anything_in_the_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    save_checkpointables(run / "step_1", {"model": _state()}).result()
    shutil.copytree(run / "step_1", run / "step_2")
    meta = run / "step_2" / "_CHECKPOINT_METADATA"
    meta.write_text(meta.read_text().replace('"commit_timestamp_nsecs": ', '"x": '))
    shutil.copytree(run / "step_1", run / "step_3")
    (run / "step_3" / "model" / "_METADATA").unlink()
    (run / os.fsdecode(b"step_4-\xff")).mkdir()
    shutil.copytree(run / "step_1", run / ("step_" + "9" * 40))
    table = ex.list_checkpoints(run, cache=None, deep=True)
    status = dict(zip(table["name"], table["status"], strict=True))
    assert status["step_1"] == "complete"
    assert status["step_3"] == "invalid"
    assert "_METADATA" in table.attrs["errors"][str(run / "step_3")]
    assert table["step"].isna().sum() >= 1  # the 40-digit name is no step


DISK_FULL = textwrap.dedent(
    """
    import errno, os, sys
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax.numpy as jnp
    from tinax.checkpointing import save_checkpointables
    where = sys.argv[1]
    try:
        save_checkpointables(os.path.join(where, "big"), {"p": {"w": jnp.ones((4 << 20,))}}).result()
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
        assert os.path.join(where, "big") in str(e), e
        print("ENOSPC", flush=True)
    assert os.listdir(where) == [], os.listdir(where)
    save_checkpointables(os.path.join(where, "small"), {"p": {"w": jnp.ones((1024,))}}).result()
    print("SMALL OK", sorted(os.listdir(where)), flush=True)
    """
)


def test_a_full_disk_is_enospc_naming_the_destination_with_one_log_line(tmp_path: Path) -> None:
    # A real 8 MiB tmpfs, mounted in a private mount namespace that vanishes with it.
    mount = tmp_path / "small-disk"
    mount.mkdir()
    script = tmp_path / "fill.py"
    script.write_text(DISK_FULL)
    shell = f"mount -t tmpfs -o size=8m tmpfs {mount} && exec {sys.executable} {script} {mount}"
    result = subprocess.run(
        ["unshare", "--map-root-user", "--mount", "sh", "-c", shell],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ENOSPC" in result.stdout and "SMALL OK" in result.stdout
    stderr = [line for line in result.stderr.splitlines() if "WARNING" not in line]
    assert len(stderr) <= 2, "\n".join(stderr)
    assert any("no space left on device" in line for line in stderr)
