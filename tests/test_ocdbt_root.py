"""An OCDBT store's B+tree node encoded by tinax is the one tensorstore encodes, byte for
byte, and a store given a new version with values written beside tensorstore reads back
through tensorstore as one store."""

from __future__ import annotations

import os

import tensorstore as ts

from tinax._format import ocdbt_root
from tinax._format.arrays import parse_location
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
