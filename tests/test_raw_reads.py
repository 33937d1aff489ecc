"""Arrays read straight from their data files (``rawread``) read as tensorstore reads them,
and damage to them is reported as tensorstore reports it."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts

import tinax.explore as ex
from tinax._format.arraydata import chunks, rawread
from tinax._format.metadata import arrays, pytree
from tinax._format.naming import names
from tinax._format.storage.location import local
from tinax.checkpointing import save_checkpointables
from tinax.explore import open_checkpoint


def _state(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((1024, 512), dtype=np.float32),
        "v": rng.integers(0, 1000, size=(100, 33, 40), dtype=np.int64),
        "b": np.arange(3, dtype=np.float32),
    }


def _raw(path: Path, key: str) -> rawread.RawArray | None:
    item = open_checkpoint(path).get("model")
    tree = pytree.read_layout(item)
    leaf = tree.find(key, name="model")
    where = pytree.storage_path(leaf.param)
    contents = chunks.store_contents(tree, [where], ctx=arrays.context())
    metadata = contents.other[(where + names.ZARR3_METADATA).encode()]
    assert isinstance(metadata, bytes)
    info = pytree.array_infos(tree, [leaf], arrays.context())[leaf.param]
    dtype = arrays.numpy_dtype(info.dtype)
    return rawread.plan(tree.directory, metadata, contents.chunks.get(where), where, dtype)


def _flip_in_chunk(path: Path, key: str) -> None:
    raw = _raw(path, key)
    assert raw is not None
    ref = next(iter(raw.values.values()))
    with open(Path(str(raw.directory)) / ref.file, "r+b") as f:
        f.seek(ref.offset + 64)
        byte = f.read(1)
        f.seek(ref.offset + 64)
        f.write(bytes([byte[0] ^ 0x40]))


def test_uncompressed_arrays_read_raw_as_saved(tmp_path: Path) -> None:
    state = _state(0)
    save_checkpointables(tmp_path / "a", {"model": state}).result()
    # 'b' is kept inline in the B+tree: read from the bytes its walk brought, no file.
    inline = _raw(tmp_path / "a", "['b']")
    assert inline is not None and len(inline.inline) == 1
    assert all(ref.file in inline.inline for ref in inline.values.values())
    for key, name in (("['w']", "w"), ("['v']", "v"), ("['b']", "b")):
        raw = _raw(tmp_path / "a", key)
        assert raw is not None, key
        out = np.empty(raw.shape, raw.dtype)
        for box in chunks.regions(raw.shape, raw.chunk_shape, raw.dtype.itemsize, 1 << 20):
            raw.read_into(box, out[box])
        np.testing.assert_array_equal(out, state[name])
        np.testing.assert_array_equal(ex.read_leaf(tmp_path / "a", "model", key), state[name])
    result = ex.verify(tmp_path / "a", data=True)
    assert result.ok and result.leaves["read"].all(), result.findings


@pytest.mark.parametrize("columns", [34, 67])
@pytest.mark.parametrize("sharded", [True, False])
def test_chunks_cut_at_the_array_end_read_raw(tmp_path: Path, sharded: bool, columns: int) -> None:
    value = np.random.default_rng(3).standard_normal((301, 67, 50)).astype(np.float32)
    plain = [{"name": "bytes", "configuration": {"endian": "little"}}]
    codecs = (
        [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": [50, columns, 50],
                    "codecs": plain,
                    "index_codecs": [*plain, {"name": "crc32c"}],
                },
            }
        ]
        if sharded
        else plain
    )
    grid = [100, 2 * columns, 50] if sharded else [50, columns, 50]
    store = {"driver": "ocdbt", "base": f"file://{tmp_path}/", "path": "w/"}
    spec = {
        "driver": "zarr3",
        "kvstore": store,
        "metadata": {
            "shape": list(value.shape),
            "data_type": "float32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": grid}},
            "codecs": codecs,
        },
        "create": True,
    }
    ts.open(spec).result().write(value).result()
    store = pytree.PyTreeLayout(
        local(tmp_path), (), ocdbt=True, zarr3=True, all_chunks_stored=False
    )
    contents = chunks.store_contents(store, ["w/"], ctx=arrays.context())
    metadata = chunks._value_bytes(local(tmp_path), contents.other[b"w/zarr.json"])
    raw = rawread.plan(local(tmp_path), metadata, contents.chunks["w/"], "w/", value.dtype)
    assert raw is not None and raw.sharded == sharded
    # One chunk per region (the edge ones cut on two axes, through a scratch
    # buffer), then many per region.
    for region_bytes in (40_000, 4 << 20):
        out = np.zeros(raw.shape, raw.dtype)
        for box in chunks.regions(raw.shape, raw.chunk_shape, 4, region_bytes):
            raw.read_into(box, out[box])
        np.testing.assert_array_equal(out, value)
    # Chunks of whole rows are read a row range at a time, across chunks.
    assert raw.unit == ((1, 67, 50) if columns == 67 else raw.chunk_shape)
    if columns == 67:
        out = np.zeros(raw.shape, raw.dtype)
        for start, stop in ((0, 37), (37, 163), (163, 300), (300, 301)):
            raw.read_into((slice(start, stop), slice(0, 67), slice(0, 50)), out[start:stop])
        np.testing.assert_array_equal(out, value)


def test_a_raw_read_diff_matches_the_values(tmp_path: Path) -> None:
    before, after = _state(0), _state(0)
    after["w"] = after["w"] + np.float32(0.5)
    save_checkpointables(tmp_path / "a", {"model": before}).result()
    save_checkpointables(tmp_path / "b", {"model": after}).result()
    table = ex.diff_table(tmp_path / "a", tmp_path / "b").set_index("key")
    row = table.loc["['w']"]
    assert row["status"] == "changed" and row["decided_by"] == "data"
    diff = after["w"] - before["w"]
    assert row["max_abs_diff"] == pytest.approx(float(np.abs(diff).max()))
    assert row["norm_a"] == pytest.approx(float(np.linalg.norm(before["w"].astype(np.float64))))
    assert table.loc["['v']", "status"] == "same"


def test_a_flipped_byte_in_a_raw_chunk_is_reported_by_every_reader(tmp_path: Path) -> None:
    save_checkpointables(tmp_path / "a", {"model": _state(0)}).result()
    save_checkpointables(tmp_path / "b", {"model": _state(1)}).result()
    _flip_in_chunk(tmp_path / "a", "['w']")
    with pytest.raises(ValueError, match=r"leaf \['w'\].*corrupt"):
        ex.read_leaf(tmp_path / "a", "model", "['w']")
    result = ex.verify(tmp_path / "a", data=True)
    assert not result.ok
    errors = result.findings[result.findings["severity"] == "error"]
    assert errors["message"].str.contains("does not match the checksum").any(), errors
    table = ex.diff_table(tmp_path / "a", tmp_path / "b").set_index("key")
    assert table.loc["['w']", "status"] == "corrupt"
    assert table.loc["['v']", "status"] == "changed"


def test_a_damaged_shard_index_falls_back_to_tensorstore(tmp_path: Path) -> None:
    state = _state(0)
    save_checkpointables(tmp_path / "a", {"model": state}).result()
    raw = _raw(tmp_path / "a", "['w']")
    assert raw is not None and raw.sharded
    ref = next(iter(raw.values.values()))
    with open(Path(str(raw.directory)) / ref.file, "r+b") as f:
        f.seek(ref.offset + ref.length - 20)  # the index's first entry: the chunk's offset
        f.write((1 << 40).to_bytes(8, "little"))
    # The shard index no longer matches its digest: tensorstore cannot decode it.
    with pytest.raises(ValueError, match=r"leaf \['w'\]: the stored data is corrupt: it does no"):
        ex.read_leaf(tmp_path / "a", "model", "['w']")
    result = ex.verify(tmp_path / "a", data=True)
    assert not result.ok
    found = result.findings["message"].str.contains("Error decoding shard index")
    assert found.any(), result.findings


def test_raw_plans_refuse_what_is_not_byte_for_byte(tmp_path: Path) -> None:
    directory = local(tmp_path)
    ref = arrays.ValueRef("d/x", 0, 16, "")
    meta = (
        b'{"zarr_format":3,"node_type":"array","shape":[4],"data_type":"float32",'
        b'"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[4]}},'
        b'"chunk_key_encoding":{"name":"default"},"fill_value":0,'
        b'"codecs":[{"name":"bytes","configuration":{"endian":"%s"}}]}'
    )
    f4 = np.dtype(np.float32)
    assert rawread.plan(directory, meta % b"little", {b"x/c/0": ref}, "x/", f4) is not None
    assert rawread.plan(directory, meta % b"little", {b"x/c/0": ref}, "x/", f4, (4,)) is not None
    assert rawread.plan(directory, meta % b"little", {b"x/c/0": ref}, "x/", f4, (2, 2)) is None
    assert rawread.plan(directory, meta % b"big", {b"x/c/0": ref}, "x/", f4) is None
    # Inline bytes of the wrong size plan, and are refused when read.
    short = rawread.plan(directory, meta % b"little", {b"x/c/0": b"inline"}, "x/", f4)
    assert short is not None
    with pytest.raises(rawread.Unsupported, match="not of the size"):
        short.read_into((slice(0, 4),), np.empty(4, np.float32))
    whole = np.arange(4, dtype="<f4").tobytes()
    kept = rawread.plan(directory, meta % b"little", {b"x/c/0": whole}, "x/", f4)
    assert kept is not None
    out = np.empty(4, np.float32)
    kept.read_into((slice(0, 4),), out)
    np.testing.assert_array_equal(out, np.arange(4, dtype=np.float32))
    assert rawread.plan(directory, meta % b"little", {}, "x/", f4) is None
    zstd = meta.replace(b"}}]}", b'}},{"name":"zstd"}]}')
    assert rawread.plan(directory, zstd % b"little", {b"x/c/0": ref}, "x/", f4) is None


def test_a_digest_sees_every_region_in_order_on_the_reading_threads(tmp_path: Path) -> None:
    state = _state(0)
    save_checkpointables(tmp_path / "a", {"model": state}).result()
    raw = _raw(tmp_path / "a", "['w']")
    assert raw is not None and raw.unit == (1, 512)
    seen: list[tuple[int, bytes]] = []
    digest = rawread.Digest(lambda box, values: seen.append((box[0].start, values.tobytes())))
    boxes = chunks.regions(raw.shape, raw.unit, 4, 64 << 10)  # 32 rows each
    opened = rawread.PooledArray(raw, rawread.BufferPool(), digest)
    read = chunks.read_arrays([chunks.ArrayRead(0, opened, boxes, 4)], in_flight_bytes=1 << 20)
    starts = [box[0].start for _, box, _ in read]
    assert starts == [box[0].start for box in boxes] and len(starts) == 32
    assert [start for start, _ in seen] == starts and not digest.failed
    assert b"".join(data for _, data in seen) == state["w"].tobytes()


def test_leaf_after_leaf_of_one_checkpoint_walks_its_store_once(tmp_path, monkeypatch) -> None:

    walks = []
    walk = chunks.store_contents
    monkeypatch.setattr(
        chunks, "store_contents", lambda *a, **k: walks.append(k.get("under")) or walk(*a, **k)
    )
    sorted_keys = []
    array_of = chunks._array_of
    monkeypatch.setattr(
        chunks, "_array_of", lambda key, *a: sorted_keys.append(key) or array_of(key, *a)
    )
    state = _state(0)
    save_checkpointables(tmp_path / "a", {"model": state}).result()
    # The walk is kept on the opened checkpoint: leaf after leaf read from it walk once.
    opened = ex.open_checkpoint(tmp_path / "a")
    for name in ("w", "v", "b", "w"):
        value = ex.read_leaf(opened, "model", f"['{name}']")
        np.testing.assert_array_equal(value, state[name])
    assert len(walks) == 1
    # The same path written again: opened again, walked again, its new values read.
    shutil.rmtree(tmp_path / "a")
    again = _state(1)
    save_checkpointables(tmp_path / "a", {"model": again}).result()
    reopened = ex.open_checkpoint(tmp_path / "a")
    for name in ("w", "v"):
        np.testing.assert_array_equal(ex.read_leaf(reopened, "model", f"['{name}']"), again[name])
    assert len(walks) == 2
    # Nothing is kept by the process: a path read again is opened afresh. Read for that
    # leaf alone, a small array's keys are looked up in the store (no walk), a large
    # one's alone sorted out of a walk.
    looked_up = []
    look_up = chunks.array_contents
    monkeypatch.setattr(
        chunks,
        "array_contents",
        lambda tree, path, *a, **k: looked_up.append(path) or look_up(tree, path, *a, **k),
    )
    sorted_keys.clear()
    np.testing.assert_array_equal(ex.read_leaf(tmp_path / "a", "model", "['b']"), again["b"])
    assert looked_up == ["b/"] and len(walks) == 2
    assert sorted_keys and all(key.startswith(b"b/") for key in sorted_keys)
    sorted_keys.clear()
    np.testing.assert_array_equal(ex.read_leaf(tmp_path / "a", "model", "['w']"), again["w"])
    assert looked_up == ["b/"] and walks == [None, None, "w/"]
    assert sorted_keys and all(key.startswith(b"w/") for key in sorted_keys)


def test_one_leaf_read_from_a_path_decodes_its_record_and_visits_its_keys_alone(
    tmp_path, monkeypatch
) -> None:
    import json

    from tinax._format.integrity import checksums

    decoded = []
    typed = checksums._typed_leaf
    monkeypatch.setattr(checksums, "_typed_leaf", lambda entry: decoded.append(1) or typed(entry))
    visited = []
    array_of = chunks._array_of
    monkeypatch.setattr(
        chunks, "_array_of", lambda key, *a: visited.append(key) or array_of(key, *a)
    )
    walked = []
    walk = arrays.walk_ocdbt
    monkeypatch.setattr(arrays, "walk_ocdbt", lambda *a: walked.append(1) or walk(*a))
    wide = {f"w{i:03d}": np.full((4,), i, np.float32) for i in range(48)}
    save_checkpointables(tmp_path / "c", {"model": wide}).result()
    # Opened, every leaf's record is decoded; read from its path, one leaf's record and
    # its array's keys (its chunk and its metadata) alone, and the store is not walked.
    ex.open_checkpoint(tmp_path / "c")
    assert len(decoded) == 48
    decoded.clear()
    np.testing.assert_array_equal(ex.read_leaf(tmp_path / "c", "model", "w017"), wide["w017"])
    assert len(decoded) == 1 and not walked
    assert sorted(visited) == [b"w017/c/0", b"w017/zarr.json"]
    # Its own record is still checked, and refused in the field-by-field words; every
    # stored value must still have one.
    record = tmp_path / "c" / "model" / "tinax_checksums" / "process_0.json"
    document = json.loads(record.read_bytes())
    document["leaves"]["['w017']"]["shape"] = [-1]
    record.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=r"leaf \['w017'\] has no shape"):
        ex.read_leaf(tmp_path / "c", "model", "w017")
    del document["leaves"]["['w017']"]
    record.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=r"leaf \['w017'\] has no checksum"):
        ex.read_leaf(tmp_path / "c", "model", "w001")


def _scan_of_w(tmp_path: Path, digest_left, digest_right, region: int = 64 << 10):
    from tinax.explore import _raw_scan

    a, b = _state(0), _state(0)
    b["w"] = b["w"] * np.float32(1.5)
    save_checkpointables(tmp_path / "a", {"model": a}).result()
    save_checkpointables(tmp_path / "b", {"model": b}).result()
    left, right = _raw(tmp_path / "a", "['w']"), _raw(tmp_path / "b", "['w']")
    assert left is not None and right is not None
    boxes = chunks.regions(left.shape, left.unit, 4, region)
    return a["w"], b["w"], _raw_scan.RawScan(left, boxes, digest_left, right, digest_right)


def test_pairs_read_raw_are_compared_on_every_worker_and_digested_in_order(
    tmp_path: Path, monkeypatch
) -> None:
    from tinax.explore import _raw_scan
    from tinax.explore._numeric import PairStats

    seen: dict[str, list[tuple[int, bytes]]] = {"left": [], "right": []}

    def digest(side: str):
        return lambda box, values: seen[side].append((box[0].start, values.tobytes()))

    a, b, pair = _scan_of_w(tmp_path, digest("left"), digest("right"))
    assert len(pair.boxes) == 32
    # Reads slow enough that every worker gets regions while the first is busy.
    threads: set[str] = set()
    read_into = rawread.RawArray.read_into

    def slow(self, box, out):
        threads.add(threading.current_thread().name)
        time.sleep(0.002)
        read_into(self, box, out)

    monkeypatch.setattr(rawread.RawArray, "read_into", slow)
    done: list[int] = []
    _raw_scan.scan([pair], done.append)
    assert len(threads) == _raw_scan.workers() >= 1
    starts = [box[0].start for box in pair.boxes]
    for side, values in (("left", a), ("right", b)):
        assert [start for start, _ in seen[side]] == starts
        assert b"".join(data for _, data in seen[side]) == values.tobytes()
    assert not pair.failed and done == sorted(done) and done[-1] == 2 * a.nbytes
    whole = PairStats(a.dtype)
    whole.update(a, b)
    assert pair.stats is not None and not pair.stats.equal
    assert pair.stats.norm_diff == pytest.approx(whole.norm_diff, rel=1e-6)
    assert pair.stats.max_abs_diff == whole.max_abs_diff
    assert pair.stats.rel_change == pytest.approx(0.5, rel=1e-6)


def test_a_pair_cut_short_mid_scan_fails_and_a_workers_error_stops_the_scan(
    tmp_path: Path,
) -> None:
    from tinax.explore import _raw_scan

    _, _, pair = _scan_of_w(tmp_path, lambda *_: None, lambda *_: None)
    ref = max(pair.right.values.values(), key=lambda r: r.offset)
    with open(Path(str(pair.right.directory)) / ref.file, "r+b") as f:
        f.truncate(ref.offset + ref.length // 2)
    _raw_scan.scan([pair])
    assert pair.failed  # the caller then reads the pair through tensorstore
    # diff_table then says what tensorstore finds, and names the leaf.
    with pytest.raises(ValueError, match=r"cannot read leaf \['w'\]"):
        ex.diff_table(tmp_path / "a", tmp_path / "b")

    calls = []

    def broken(box, values):
        calls.append(box)
        if len(calls) == 3:
            raise RuntimeError("digest broke")

    (tmp_path / "again").mkdir()
    _, _, again = _scan_of_w(tmp_path / "again", broken, lambda *_: None)
    with pytest.raises(RuntimeError, match="digest broke"):
        _raw_scan.scan([again])
    assert len(calls) == 3  # no region digested after the error


def test_verify_counts_nan_and_inf_of_arrays_read_raw_on_every_worker(
    tmp_path: Path, monkeypatch
) -> None:
    from tinax.explore import _raw_scan

    state = _state(0)
    state["w"][7, :5] = np.nan
    state["w"][900, 3] = -np.inf
    save_checkpointables(tmp_path / "a", {"model": state}).result()
    scanned: list[str] = []
    scan = _raw_scan.scan
    monkeypatch.setattr(
        _raw_scan, "scan", lambda arrays, *a: scanned.extend(map(str, arrays)) or scan(arrays, *a)
    )
    result = ex.verify(tmp_path / "a", data=True)
    assert scanned  # read raw, on every worker
    # It loads (no error), and its model holds NaN: diverged, never sound.
    assert result.errors.empty and result.status == "diverged", result.findings
    leaves = result.leaves.set_index("key")
    assert (leaves.loc["['w']", "nan_count"], leaves.loc["['w']", "inf_count"]) == (5, 1)
    warnings = result.findings[result.findings["severity"] == "warning"]
    assert warnings["message"].str.contains("5 NaN and 1 Inf").any(), result.findings


def test_a_checkpoint_against_live_values_is_compared_raw_either_way_round(
    tmp_path: Path, monkeypatch
) -> None:
    import jax.numpy as jnp

    from tinax.explore import _raw_scan

    stored = _state(0)
    save_checkpointables(tmp_path / "a", {"model": stored}).result()
    live = _state(0)
    live["w"] = jnp.asarray(live["w"] * np.float32(2.0))  # JAX, on the CPU
    live["v"] = live["v"] + 1  # NumPy
    scanned: list[object] = []
    scan = _raw_scan.scan
    monkeypatch.setattr(
        _raw_scan, "scan", lambda arrays, *a: scanned.extend(arrays) or scan(arrays, *a)
    )
    forward = ex.diff_table(tmp_path / "a", {"model": live}).set_index("key")
    # w, v and b (inline in the B+tree), read raw
    assert sorted(s.swapped for s in scanned) == [False, False, False]
    scanned.clear()
    backward = ex.diff_table({"model": live}, tmp_path / "a").set_index("key")
    assert sorted(s.swapped for s in scanned) == [True, True, True]
    w = stored["w"].astype(np.float64)
    for table, (a, b) in ((forward, (w, 2 * w)), (backward, (2 * w, w))):
        row = table.loc["['w']"]
        assert row["status"] == "changed" and row["decided_by"] == "data"
        assert row["norm_a"] == pytest.approx(np.linalg.norm(a), rel=1e-6)
        assert row["norm_b"] == pytest.approx(np.linalg.norm(b), rel=1e-6)
        assert row["rel_change"] == pytest.approx(
            np.linalg.norm(b - a) / np.linalg.norm(a), rel=1e-6
        )
        assert table.loc["['v']", "max_abs_diff"] == 1.0
        assert table.loc["['b']", "status"] == "same"
    # A stored side that does not match its checksums is read again and called corrupt.
    _flip_in_chunk(tmp_path / "a", "['w']")
    damaged = ex.diff_table(tmp_path / "a", {"model": live}).set_index("key")
    assert damaged.loc["['w']", "status"] == "corrupt"


def test_a_raw_side_against_a_compressed_one_is_read_raw_and_checked(
    tmp_path: Path, monkeypatch
) -> None:
    from tinax.checkpointing import compression

    before, after = _state(0), _state(0)
    after["w"] = after["w"] * np.float32(3.0)
    save_checkpointables(tmp_path / "raw", {"model": before}).result()
    with compression():
        save_checkpointables(tmp_path / "zstd", {"model": after}).result()
    assert _raw(tmp_path / "raw", "['w']") is not None
    assert _raw(tmp_path / "zstd", "['w']") is None
    pooled: list[object] = []
    init = rawread.PooledArray.__init__
    monkeypatch.setattr(
        rawread.PooledArray, "__init__", lambda self, *a: pooled.append(a) or init(self, *a)
    )
    table = ex.diff_table(tmp_path / "raw", tmp_path / "zstd").set_index("key")
    assert pooled  # the uncompressed side read raw, beside tensorstore's decoding
    row = table.loc["['w']"]
    w = before["w"].astype(np.float64)
    assert row["status"] == "changed" and row["rel_change"] == pytest.approx(2.0, rel=1e-6)
    assert row["norm_a"] == pytest.approx(np.linalg.norm(w), rel=1e-6)
    assert table.loc["['v']", "status"] == "same"
    # Damage on the raw side: read again through tensorstore, and called corrupt.
    _flip_in_chunk(tmp_path / "raw", "['w']")
    damaged = ex.diff_table(tmp_path / "raw", tmp_path / "zstd").set_index("key")
    assert damaged.loc["['w']", "status"] == "corrupt"
