"""An OCDBT store's B+tree node encoded by tinax is the one tensorstore encodes, byte for
byte, and a store given a new version with values written beside tensorstore reads back
through tensorstore as one store."""

from __future__ import annotations

import os

import tensorstore as ts

from tinax._format.metadata.arrays import parse_location
from tinax._format.writing import ocdbt_root
from tinax._paths import location


def _store(path: str, config: dict) -> ts.KvStore:
    spec = {"driver": "ocdbt", "base": {"driver": "file", "path": f"{path}/"}, "config": config}
    return ts.KvStore.open(spec).result()


def test_a_leaf_node_is_encoded_as_tensorstore_encodes_it(tmp_path):
    # Uncompressed, so that the bytes compare: keys sharing prefixes, values inline
    # and out of line, two data files.
    store = _store(str(tmp_path), {"max_inline_value_bytes": 8, "compression": None})
    for batch in ([("a/c/0/0", b"x" * 40), ("a/zarr.json", b"{}")], [("a/c/1/0", b"y" * 20)]):
        txn = ts.Transaction()
        for key, value in batch:
            store.with_transaction(txn)[key] = value
        txn.commit_async().result()
    store["bb/zarr.json"] = b"12345"
    base = ts.KvStore.open({"driver": "file", "path": f"{tmp_path}/"}).result()
    root = ts.ocdbt.dump(base).result()["versions"][-1]["root"]["location"]
    node = ts.ocdbt.dump(base, root).result()
    entries = {
        e["key"]: e["inline_value"] if "inline_value" in e else parse_location(e["indirect_value"])
        for e in node["entries"]
    }
    assert len({v.file for v in entries.values() if not isinstance(v, bytes)}) == 2
    ref = parse_location(root)
    with open(tmp_path / ref.file, "rb") as f:
        f.seek(ref.offset)
        stored = f.read(ref.length)
    assert ocdbt_root.encode_leaf(entries) == stored


def test_a_new_version_adds_values_written_in_a_data_file_of_its_own(tmp_path):
    store = _store(str(tmp_path), {})
    store["m/zarr.json"] = b'{"a": 1}'
    store["m/c/0"] = b"t" * 5000
    where = location(str(tmp_path))
    data = ocdbt_root.DataFile(where)
    origin = tmp_path / "origin"
    origin.write_bytes(b"-" * 10 + b"k" * 3000)
    fd = os.open(origin, os.O_RDONLY)
    try:
        added = {
            b"m/c/1": data.append(b"z" * 4000),
            b"m/c/2": data.append(b"k" * 3000, origin=(fd, 10)),
        }
    finally:
        os.close(fd)
    data.close()
    ocdbt_root.add_version(where, added)
    fresh = _store(str(tmp_path), {})
    assert sorted(fresh.list().result()) == [b"m/c/0", b"m/c/1", b"m/c/2", b"m/zarr.json"]
    assert fresh["m/c/0"] == b"t" * 5000
    assert fresh["m/c/1"] == b"z" * 4000
    assert fresh["m/c/2"] == b"k" * 3000
    assert fresh["m/zarr.json"] == b'{"a": 1}'


def test_lent_buffers_are_written_behind_and_used_again_once_written(tmp_path):
    ring = ocdbt_root.BufferRing(keep_bytes=3 * 4096)
    where = location(str(tmp_path))
    data = ocdbt_root.DataFile(where)
    refs, seen = [], set()
    for i in range(6):
        lent = ring.lend(4096)
        seen.add(id(lent._buffer))
        memoryview(lent.view)[:] = bytes([65 + i]) * 4096
        refs.append(data.append(lent))
        data._wait_oldest()  # written: the buffer is back in the ring
    data.close()
    # Each buffer came back once written: the six writes needed one.
    assert len(seen) == 1
    with open(tmp_path / refs[0].file, "rb") as f:
        written = f.read()
    assert written == b"".join(bytes([65 + i]) * 4096 for i in range(6))
    assert [r.offset for r in refs] == [4096 * i for i in range(6)]


def test_a_ring_keeps_no_more_free_than_it_may():
    ring = ocdbt_root.BufferRing(keep_bytes=10_000)
    lent = [ring.lend(n) for n in (4000, 4000, 4000, 100)]
    for each in lent:
        each.give_back()
        each.give_back()  # a second time does nothing
    free = sorted(b.nbytes for b in ring._free)
    assert sum(free) <= 10_000 and 4000 in free
    # A buffer is lent again only to a request it fits without wasting half of it.
    assert len(ring.lend(4000).view) == 4000
    assert ring.lend(1000).view.nbytes == 1000 and len(ring._free) == 2
