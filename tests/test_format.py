"""tinax._format: key paths, storage, bounded reads, and Orbax's layout as it is today.

The last tests here save checkpoints with the pinned Orbax itself and check that
what it writes is exactly what the format module expects: every file it knows by
name, nothing it does not know, and the same shapes and dtypes as Orbax's own
metadata reader. A new Orbax that changes its layout fails them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import string
import threading
from pathlib import Path
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from orbax.checkpoint import v1 as ocp

from tinax import _paths
from tinax._format.metadata import commit_record, jsonitems, layout, pytree
from tinax._format.naming import names, words
from tinax._format.naming.keys import format_key, is_within, key_parts, parse_key
from tinax._format.storage import files
from tinax._format.storage.location import DIRECTORY, FILE, LINK, OTHER, local, tree_bytes

# -- key paths ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ((), ""),
        (("a",), "['a']"),
        ((0, "mu", "w"), "[0]['mu']['w']"),
        (("it's",), '["it\'s"]'),
        (("a]b[", "c'\"d"), "['a]b[']['c\\'\"d']"),
        (("\n\x00é",), "['\\n\\x00é']"),
        (("0",), "['0']"),
    ],
)
def test_format_and_parse_are_inverse(path: tuple, text: str) -> None:
    assert format_key(path) == text
    assert parse_key(text) == path


def test_random_key_paths_round_trip() -> None:
    rng = random.Random(0)
    alphabet = string.printable + "éü€\u2028"
    for _ in range(500):
        path = tuple(
            rng.randrange(100)
            if rng.random() < 0.3
            else "".join(rng.choice(alphabet) for _ in range(rng.randrange(6)))
            for _ in range(rng.randrange(5))
        )
        assert parse_key(format_key(path)) == path


@pytest.mark.parametrize("bad", ["x", "[", "['a'", "[a]", "['a']x", "[-1]", "[1", "['a' ]"])
def test_parse_refuses_what_format_never_writes(bad: str) -> None:
    with pytest.raises(ValueError, match="key"):
        parse_key(bad)


def test_key_parts_write_jax_key_paths_as_orbax_stores_them() -> None:
    import optax

    state = {"opt": optax.scale_by_adam().init({"w": jnp.ones(2)}), "ints": {3: [jnp.zeros(1)]}}
    keys = [key_parts(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    assert ("opt", "mu", "w") in keys  # a NamedTuple field is a name, as Orbax stores it
    assert ("ints", "3", 0) in keys  # an int dict key is stored as a string; a list index as an int
    with pytest.raises(TypeError):
        key_parts(["not a key"])


def test_subtrees_are_key_path_prefixes_not_text_prefixes() -> None:
    assert is_within(("mu", "w"), ("mu",))
    assert is_within(("mu",), ("mu",))
    assert is_within(("mu",), ())
    assert not is_within(("mu", "w"), ("m",))
    assert not is_within(("m",), ("m", "u"))


# -- storage and bounded reads --------------------------------------------------------


def test_locations_are_absolute_and_tell_what_is_there(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"12345")
    os.symlink(tmp_path / "d" / "f", tmp_path / "d" / "link")
    os.mkfifo(tmp_path / "d" / "fifo")
    where = _paths.location("x/../d")
    assert where.path == str(tmp_path / "d") and where.name == "d"
    assert where.parent.path == str(tmp_path)
    kinds = {name: entry.kind for name, entry in where.entries().items()}
    assert kinds == {"f": FILE, "link": LINK, "fifo": OTHER}
    assert (where / "nothing").entry() is None
    assert where.kind() == DIRECTORY
    assert tree_bytes(where) == 5  # the link is not counted twice, the FIFO not at all
    assert tree_bytes(where / "missing") == 0


def test_bounded_reads_refuse_links_fifos_and_oversized_files(tmp_path: Path) -> None:
    where = local(tmp_path)
    (tmp_path / "ok.json").write_text('{"a": [1, 2]}')
    (tmp_path / "big").write_bytes(b"x" * 101)
    os.symlink(tmp_path / "ok.json", tmp_path / "link.json")
    os.mkfifo(tmp_path / "fifo")
    assert files.read_json(where / "ok.json", what="a test") == {"a": [1, 2]}
    for name, problem in [
        ("link.json", "symbolic link"),
        ("fifo", "not a regular file"),
        ("missing", "missing"),
    ]:
        with pytest.raises(ValueError, match=problem):
            files.read_bytes(where / name, what="a test", max_bytes=100)
    with pytest.raises(ValueError, match="implausibly large"):
        files.read_bytes(where / "big", what="a test", max_bytes=100)
    (tmp_path / "deep.json").write_text("[" * 200 + "]" * 200)
    with pytest.raises(ValueError, match="levels deep"):
        files.read_json(where / "deep.json", what="a test")
    # Larger than one read's chunk: read whole, or to one byte past the cap.
    data = bytes(range(256)) * (3 * 2**12 + 7)
    (tmp_path / "large").write_bytes(data)
    assert files.read_bytes(where / "large", what="a test", max_bytes=len(data)) == data
    assert where.storage.read((where / "large").path, 2**20) == data[: 2**20 + 1]
    (tmp_path / "empty").write_bytes(b"")
    assert files.read_bytes(where / "empty", what="a test", max_bytes=100) == b""


def test_scan_refuses_every_link_fifo_and_non_utf8_name(tmp_path: Path) -> None:
    (tmp_path / "c" / "sub").mkdir(parents=True)
    (tmp_path / "c" / "sub" / "f").write_bytes(b"abc")
    found = files.scan(local(tmp_path / "c"))
    assert (found.nbytes, found.files) == (3, 1)
    assert [where.name for where, _ in found.found] == ["f"]
    # The listing the walk keeps is the one its entries make.
    rebuilt = dataclasses.replace(found, listed=None).listing()
    assert found.listing() == rebuilt
    assert set(rebuilt) == {str(tmp_path / "c"), str(tmp_path / "c" / "sub")}
    # A link inside the checkpoint could pass one checkpointable off as another.
    os.symlink(tmp_path / "c" / "sub" / "f", tmp_path / "c" / "inside")
    with pytest.raises(ValueError, match=r"symbolic link .*\(inside\)"):
        files.scan(local(tmp_path / "c"))
    os.remove(tmp_path / "c" / "inside")
    os.symlink(tmp_path, tmp_path / "c" / "out")
    with pytest.raises(ValueError, match="outside the checkpoint"):
        files.scan(local(tmp_path / "c"))
    os.remove(tmp_path / "c" / "out")
    os.mkfifo(tmp_path / "c" / "sub" / "fifo")
    with pytest.raises(ValueError, match="FIFO"):
        files.scan(local(tmp_path / "c"))
    os.remove(tmp_path / "c" / "sub" / "fifo")
    (tmp_path / "c" / os.fsdecode(b"bad-\xff")).write_bytes(b"")
    with pytest.raises(ValueError, match="not UTF-8"):
        files.scan(local(tmp_path / "c"))


@pytest.mark.parametrize(
    ("name", "step", "temporary"),
    [
        ("step_000120", 120, False),
        ("42", 42, False),
        ("ckpt-7.orbax-checkpoint-tmp-1234", 7, True),
        ("final", None, False),
    ],
)
def test_step_and_temporary_names(name: str, step: int | None, temporary: bool) -> None:
    assert names.step_from_name(name) == step
    assert names.is_temporary_name(name) is temporary


def test_a_huge_commit_timestamp_is_no_time_rather_than_an_error(tmp_path: Path) -> None:
    (tmp_path / names.CHECKPOINT_METADATA).write_text(
        json.dumps({"item_handlers": {}, "commit_timestamp_nsecs": 10**30})
    )
    assert commit_record.read_checkpoint_record(local(tmp_path)).committed_nsecs is None


# -- Orbax's layout, as the pinned Orbax writes it ---------------------------------------

# Every name the format module expects Orbax to write inside a pytree checkpointable.
_PYTREE_FILES = {
    names.PYTREE_METADATA,
    names.SHARDINGS,
    names.STRINGS,
    names.ARRAY_METADATAS,
    names.OCDBT_MANIFEST,
    names.OCDBT_DATA,
}


def _state() -> dict:
    return {
        "w": jnp.arange(12.0).reshape(3, 4),
        "b": np.linspace(0, 1, 5, dtype=np.float32),
        "count": 3,
        "lr": 0.5,
        "name": "tiny",
        "nothing": None,
        "empty": {},
        "layers": [np.full(2, i, np.int8) for i in range(3)],
        "key": jax.random.key_data(jax.random.key(0)),
        "bf16": jnp.ones((2, 2), jnp.bfloat16),
    }


def _iterator():
    it = iter(grain.MapDataset.range(10).to_iter_dataset())
    next(it)
    return it


def test_orbax_v1_writes_exactly_the_layout_the_format_module_expects(tmp_path: Path) -> None:
    path = tmp_path / "step_1"
    ocp.save_checkpointables(path, {"model": _state(), "data": _iterator()})
    root = local(path)

    assert set(root.entries()) == {
        names.CHECKPOINT_METADATA,
        names.COMMIT_SUCCESS,
        names.ORBAX_MARKER,
        "model",
        "data",
    }
    record = commit_record.read_checkpoint_record(root)
    assert set(record.item_handlers) == {"model", "data"}  # type: ignore[arg-type]
    assert record.committed_nsecs is not None
    assert layout.classify(root / "model") == layout.PYTREE
    assert layout.classify(root / "data") == layout.ITERATOR
    assert [n for _, _, n in jsonitems.iterator_files(layout.identify(root).get("data"))] == [
        names.iterator_file_name(0, 1)
    ]

    model = root / "model"
    found = set(model.entries())
    process_stores = {n for n in found if n.startswith(names.OCDBT_PROCESS_PREFIX)}
    assert process_stores == {f"{names.OCDBT_PROCESS_PREFIX}0"}
    assert found - process_stores == _PYTREE_FILES
    assert set((model / f"{names.OCDBT_PROCESS_PREFIX}0").entries()) == {
        names.OCDBT_MANIFEST,
        names.OCDBT_DATA,
    }

    tree = pytree.parse_layout(model)
    assert tree.ocdbt and tree.zarr3 and tree.all_chunks_stored
    kinds = {leaf.key: leaf.kind for leaf in tree.leaves}
    assert kinds["['w']"] == words.JAX_ARRAY
    assert kinds["['b']"] == words.NUMPY_ARRAY
    assert kinds["['count']"] == kinds["['lr']"] == words.SCALAR
    assert kinds["['name']"] == words.STRING
    assert kinds["['nothing']"] == words.EMPTY
    assert kinds["['empty']"] == words.EMPTY
    assert kinds["['layers'][2]"] == words.NUMPY_ARRAY
    assert set(kinds.values()) <= {
        words.JAX_ARRAY,
        words.NUMPY_ARRAY,
        words.SCALAR,
        words.STRING,
        words.EMPTY,
    }

    # The same shapes and dtypes as Orbax's own reader, from the format module's bulk read.
    from tinax._format.metadata import arrays

    in_store = [leaf for leaf in tree.leaves if leaf.kind in words.STORED_ARRAY_KINDS]
    infos = pytree.array_infos(tree, in_store, arrays.context())
    theirs = ocp.checkpointables_metadata(path).metadata["model"]
    flat = {
        format_key(key_parts(p)): m
        for p, m in jax.tree_util.tree_flatten_with_path(theirs)[0]
        if hasattr(m, "shape")
    }
    for leaf in in_store:
        if leaf.kind == words.SCALAR:
            continue
        assert infos[leaf.param].shape == tuple(flat[leaf.key].shape), leaf.key
        assert infos[leaf.param].dtype == np.dtype(flat[leaf.key].dtype).name, leaf.key
    assert pytree.read_strings(tree, ["name"]) == {"name": "tiny"}
    assert pytree.read_shardings(tree, ["w"])["w"]["sharding_type"] == "SingleDeviceSharding"


def test_a_save_in_progress_uses_the_temporary_name_the_format_module_knows(
    tmp_path: Path,
) -> None:
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(p.name for p in tmp_path.iterdir())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        ocp.save_checkpointables(
            tmp_path / "step_2", {"model": {"x": np.ones((4096, 4096), np.float32)}}
        )
    finally:
        done.set()
        watcher.join()
    temporary = [n for n in seen if n != "step_2"]
    assert temporary, seen
    assert all(names.is_temporary_name(n) and names.final_name(n) == "step_2" for n in temporary)
    assert [p.name for p in tmp_path.iterdir()] == ["step_2"]


def test_a_layout_is_parsed_once_per_opened_checkpoint(tmp_path: Path) -> None:
    ocp.save_checkpointables(tmp_path / "ckpt", {"model": {"w": np.zeros(3), "b": np.ones(2)}})
    where = local(tmp_path / "ckpt")
    model = layout.identify(where).get("model")
    first = pytree.read_layout(model)
    assert pytree.read_layout(model) is first  # parsed once, kept on the opened checkpoint
    meta = tmp_path / "ckpt" / "model" / names.PYTREE_METADATA
    document = json.loads(meta.read_text())
    entry = document["tree_metadata"].pop(next(iter(document["tree_metadata"])))
    document["tree_metadata"]["('x',)"] = {**entry, "key_metadata": [{"key": "x", "key_type": 2}]}
    meta.write_text(json.dumps(document))
    assert pytree.read_layout(model) is first  # the opened value is what was read
    # Opened again, a checkpoint is read afresh.
    second = pytree.read_layout(layout.identify(where).get("model"))
    assert second is not first and "['x']" in [leaf.key for leaf in second.leaves]
    meta.write_text('{"tree_metadata": [')
    with pytest.raises(ValueError, match="_METADATA"):
        pytree.read_layout(layout.identify(where).get("model"))


def test_the_collector_is_paused_while_metadata_is_parsed_and_restored_after() -> None:
    import gc

    assert gc.isenabled()
    with files.paused_gc():
        assert not gc.isenabled()
        with files.paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # still inside the outer pause
    assert gc.isenabled()
    gc.disable()
    try:
        with files.paused_gc():
            pass
        assert not gc.isenabled()  # left as it was found
    finally:
        gc.enable()
    with pytest.raises(ValueError, match="not valid JSON"), files.paused_gc():
        files.parse_json(b"{", path=local("/x"), what="test", max_depth=None)
    assert gc.isenabled()


# What the standard library's reader accepts or refuses, the fast path must too: documents
# msgspec is stricter about (NaN, Infinity, lone surrogates, numbers beyond a double)
# and numbers it would read differently (integers past 64 bits) among them.
_JSON_DOCUMENTS = [
    b'{"a": [1, 2.5, "x", null, true]}',
    b"[NaN, Infinity, -Infinity]",
    b'{"loss": NaN}',
    b"[1e400, -1e400, 1.5e-400, -0.0, 0.1]",
    b"[123456789012345678901234567890, -9223372036854775809, 18446744073709551616]",
    b"[9223372036854775807, -9223372036854775808, 1234567890123456789]",
    b'{"a": 1, "a": 2}',
    b'"\\ud800"',
    b'"\\u00e9\\ud83d\\ude00"',
    b'"\xff"',
    b"\xef\xbb\xbf{}",
    b"[1] x",
    b"",
    b"[1,]",
    b"[01]",
    b'"\t"',
    b"[" * 5000 + b"]" * 5000,
    b"[" * 150 + b"]" * 150,
]


def _parsed(document: bytes, max_depth: int | None) -> tuple[str, str]:
    try:
        value = files.parse_json(document, path=local("/x"), what="a test", max_depth=max_depth)
    except ValueError as e:
        return ("refused", str(e))
    return ("read", repr(value))  # repr: NaN equals NaN, -0.0 differs from 0.0, 1 from 1.0


@pytest.mark.parametrize("max_depth", [None, files.MAX_JSON_DEPTH])
def test_json_is_read_as_the_standard_library_reads_it(monkeypatch, max_depth: int | None) -> None:
    fast = [_parsed(d, max_depth) for d in _JSON_DOCUMENTS]
    monkeypatch.setattr(files, "_loads", lambda data: json.loads(data.decode("utf-8")))
    standard = [_parsed(d, max_depth) for d in _JSON_DOCUMENTS]
    assert fast == standard
    # The documents do test something: some are read, some refused, for each reason.
    assert ("read", "[nan, inf, -inf]") in standard
    assert (
        "read",
        "[123456789012345678901234567890, -9223372036854775809, 18446744073709551616]",
    ) in standard
    reasons = " ".join(text for outcome, text in standard if outcome == "refused")
    assert "not valid JSON" in reasons and "nests too deeply" in reasons
    assert ("levels deep" in reasons) == (max_depth is not None)


def test_keys_are_read_alike_however_leaves_share_their_prefixes(tmp_path: Path) -> None:
    rng = random.Random(13)
    parts = ["a", "b", "it's", "x.y", "_", 0, 1, 12]
    paths: list[tuple] = []
    for _ in range(600):
        if paths and rng.random() < 0.7:  # a sibling or a cousin of the previous leaf
            keep = rng.randint(0, len(paths[-1]))
            path = paths[-1][:keep] + tuple(rng.choice(parts) for _ in range(rng.randint(1, 3)))
        else:
            path = tuple(rng.choice(parts) for _ in range(rng.randint(1, 6)))
        paths.append(path)
    directory = tmp_path / "tree"
    directory.mkdir()
    tree = {
        f"leaf {i}": {
            "key_metadata": [
                {"key": str(p), "key_type": 1 if isinstance(p, int) else 2} for p in path
            ],
            "value_metadata": {"value_type": "None", "skip_deserialize": True},
        }
        for i, path in enumerate(paths)
    }
    document = {"tree_metadata": tree, "use_ocdbt": False, "use_zarr3": True}
    (directory / names.PYTREE_METADATA).write_text(json.dumps(document))
    read = pytree.parse_layout(local(directory)).leaves
    assert [leaf.path for leaf in read] == paths
    assert [leaf.key for leaf in read] == [format_key(path) for path in paths]
    assert [leaf.param for leaf in read] == [".".join(str(p) for p in path) for path in paths]
    # A bad key is named wherever it falls: after a leaf it shares all but its last key with.
    tree[f"leaf {len(paths)}"] = {
        "key_metadata": [*tree["leaf 0"]["key_metadata"][:-1], {"key": "x", "key_type": 1}],
        "value_metadata": {"value_type": "None"},
    }
    (directory / names.PYTREE_METADATA).write_text(json.dumps(document))
    with pytest.raises(ValueError, match=f"entry 'leaf {len(paths)}': sequence key 'x'"):
        pytree.parse_layout(local(directory))


def test_metadata_only_the_standard_library_accepts_is_read_as_orbax_s_own(
    tmp_path: Path,
) -> None:
    # Orbax's _METADATA decodes straight into typed records; a document that does not
    # (NaN where nothing is read, a key_type of the wrong type) is read the generic way.
    # Both ways give the same leaves, and refuse the same documents with one message.
    state = {"opt": ({"mu": {"w": np.ones(3)}, "count": np.array(2, np.int32)}, ()), "lr": 0.5}
    ocp.save_checkpointables(tmp_path / "ckpt", {"model": state})
    model = local(tmp_path / "ckpt" / "model")
    meta = tmp_path / "ckpt" / "model" / names.PYTREE_METADATA
    original = meta.read_text()
    typed = pytree.parse_layout(model).leaves
    assert [leaf.key for leaf in typed] == [
        "['lr']",
        "['opt'][0]['count']",
        "['opt'][0]['mu']['w']",
        "['opt'][1]",
    ]
    document = json.loads(original)
    document["custom_metadata"] = {"loss": float("nan")}
    meta.write_text(json.dumps(document))
    assert pytree.parse_layout(model).leaves == typed
    for entry in document["tree_metadata"].values():
        entry["value_metadata"]["skip_deserialize"] = int(
            entry["value_metadata"]["skip_deserialize"]
        )
    meta.write_text(json.dumps(document))
    assert pytree.parse_layout(model).leaves == typed
    for bad, message in [
        ({"key": "w", "key_type": True}, "a key is not a string"),
        ({"key": "w", "key_type": 2.0}, "unknown key_type 2.0"),
        ({"key": "w", "key_type": 7}, "unknown key_type 7"),
        ({"key": 3, "key_type": 2}, "a key is not a string"),
        (["w", 2], "a key_metadata entry is not an object"),
    ]:
        document = json.loads(original)
        entry = next(iter(document["tree_metadata"].values()))
        entry["key_metadata"][-1] = bad
        meta.write_text(json.dumps(document))
        with pytest.raises(ValueError, match=re.escape(message)):
            pytree.parse_layout(model)


def test_the_sharding_file_is_parsed_once_for_the_check_and_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tinax._format.integrity import preflight

    ocp.save_checkpointables(tmp_path / "ckpt", {"model": {"w": jnp.ones(4), "b": jnp.zeros(2)}})
    parsed: list[str] = []
    parse_json = files.parse_json

    def counting(data: bytes, *, path: Any, what: str, max_depth: int | None) -> Any:
        parsed.append(path.name)
        return parse_json(data, path=path, what=what, max_depth=max_depth)

    monkeypatch.setattr(files, "parse_json", counting)
    checkpoint = preflight.check(local(tmp_path / "ckpt"))
    tree = pytree.read_layout(checkpoint.get("model"))
    shardings = pytree.read_shardings(tree, [leaf.param for leaf in tree.leaves])
    assert set(shardings) == {"w", "b"}
    assert shardings["w"]["sharding_type"] == "SingleDeviceSharding"
    assert parsed.count(names.SHARDINGS) == 1
    (tmp_path / "ckpt" / "model" / names.SHARDINGS).write_text("[1, 2]")
    assert pytree.read_shardings(tree, ["w"]) == {"w": shardings["w"]}  # kept: not read again
    assert parsed.count(names.SHARDINGS) == 1
    # Opened again, it is read afresh.
    again = pytree.read_layout(preflight.check(local(tmp_path / "ckpt")).get("model"))
    with pytest.raises(ValueError, match="holds a JSON list, not an object"):
        pytree.read_shardings(again, ["w"])
    assert parsed.count(names.SHARDINGS) == 2


def test_a_checkpoint_being_removed_is_refused_whether_or_not_its_walk_is_given(tmp_path):
    from tinax._format.integrity import preflight

    ocp.save_checkpointables(tmp_path / "ckpt", {"model": {"w": np.zeros(3)}})
    where = local(tmp_path / "ckpt")
    assert preflight.check(where, files.scan(where)).path == where
    (tmp_path / "ckpt" / names.DELETION_MARKER).write_bytes(b"")
    for scan in (None, files.scan(where)):
        with pytest.raises(ValueError, match="being removed"):
            preflight.check(where, scan)
