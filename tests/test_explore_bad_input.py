"""tinax.explore on bad input: a clear error naming the path, never a hang, a crash or code run."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from explore_fixtures import iterator, save_v1

import tinax.explore as ex

MARKER = Path("/tmp/tinax-explore-test-pickle-ran")


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A healthy checkpoint, copied for each case."""
    state = {
        "model": {"w": jnp.ones((64, 64)), "b": np.zeros(4, np.float32), "step": 1},
        "iterator": iterator(),
    }
    return save_v1(tmp_path_factory.mktemp("template") / "ckpt", state)


@pytest.fixture
def run(tmp_path, template) -> Path:
    """A run with a healthy checkpoint ``1`` and checkpoint ``5``, which a case then damages."""
    root = tmp_path / "run"
    shutil.copytree(template, root / "1", symlinks=True)
    shutil.copytree(template, root / "5", symlinks=True)
    return root


def _write(relative: str, data: bytes | str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        target = path / relative
        target.unlink()
        if isinstance(data, str):
            target.write_text(data)
        else:
            target.write_bytes(data)

    return damage


def _truncate(relative: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = (path / relative).read_bytes()
        (path / relative).write_bytes(data[: len(data) // 2])

    return damage


def _iterator_file(path: Path) -> Path:
    return next((path / "iterator").glob("process_*.json"))


def _iterator_state(data: str | bytes) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        raw = data.encode() if isinstance(data, str) else data
        _iterator_file(path).write_bytes(raw)

    return damage


def _remove(pattern: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        found = list(path.glob(pattern))
        assert found, pattern
        for item in found:
            shutil.rmtree(item) if item.is_dir() else item.unlink()

    return damage


def _edit_metadata(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    """Edits ``model/_METADATA`` in place (what ``edit`` returns is ignored)."""

    def damage(path: Path) -> None:
        meta_file = path / "model" / "_METADATA"
        meta = json.loads(meta_file.read_text())
        edit(meta)
        meta_file.write_text(json.dumps(meta))

    return damage


def _first_entry(meta: dict) -> dict:
    return next(iter(meta["tree_metadata"].values()))


def _link_out(relative: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        target = path / relative
        outside = path.parent.parent / f"outside-{target.name}"
        shutil.move(target, outside)
        os.symlink(outside, target)

    return damage


def _fifo(relative: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        (path / relative).unlink()
        os.mkfifo(path / relative)

    return damage


class _RunsCode:
    """Unpickling this creates MARKER: proof that a reader unpickled it."""

    def __reduce__(self):
        return (Path.touch, (MARKER,))


BOMB = "[" * 100_000 + "]" * 100_000
# Shallow enough for the parser, far deeper than any Orbax metadata or iterator state.
DEEP = "[" * 500 + "]" * 500

CASES = {
    "garbled _METADATA": _write("model/_METADATA", b"\x00\xff{garbage"),
    "truncated _METADATA": _truncate("model/_METADATA"),
    "garbled _CHECKPOINT_METADATA": _write("_CHECKPOINT_METADATA", "item_handlers: model"),
    "truncated _CHECKPOINT_METADATA": _truncate("_CHECKPOINT_METADATA"),
    "_CHECKPOINT_METADATA not an object": _write("_CHECKPOINT_METADATA", "[1, 2]"),
    "_CHECKPOINT_METADATA names a missing checkpointable": _write(
        "_CHECKPOINT_METADATA", json.dumps({"item_handlers": {"model": "x", "ghost": "x"}})
    ),
    "_CHECKPOINT_METADATA names a path": _write(
        "_CHECKPOINT_METADATA", json.dumps({"item_handlers": {"../1": "x"}})
    ),
    "nesting bomb in _METADATA": _write("model/_METADATA", BOMB),
    "nesting bomb inside tree_metadata": _write(
        "model/_METADATA", '{"tree_metadata": {"x": ' + BOMB + "}}"
    ),
    "deep nesting inside tree_metadata": _write(
        "model/_METADATA", '{"tree_metadata": {"x": ' + DEEP + "}}"
    ),
    "nesting bomb in _CHECKPOINT_METADATA": _write("_CHECKPOINT_METADATA", BOMB),
    "nesting bomb in iterator state": _iterator_state(BOMB),
    "deep nesting in iterator state": _iterator_state(DEEP),
    "iterator state not JSON": _iterator_state("next_index=3"),
    "iterator state not UTF-8": _iterator_state(b'{"next_index": "\xff"}'),
    "_METADATA without tree_metadata": _write("model/_METADATA", '{"use_ocdbt": true}'),
    "_METADATA entry without key_metadata": _edit_metadata(
        lambda m: _first_entry(m).pop("key_metadata")
    ),
    "_METADATA entry without value_type": _edit_metadata(
        lambda m: _first_entry(m)["value_metadata"].pop("value_type")
    ),
    "_METADATA key of the wrong type": _edit_metadata(
        lambda m: _first_entry(m)["key_metadata"][0].update(key=3)
    ),
    "_METADATA key that climbs out": _edit_metadata(
        lambda m: _first_entry(m)["key_metadata"][0].update(key="..")
    ),
    "_METADATA names an array that is not stored": _edit_metadata(
        lambda m: _first_entry(m)["key_metadata"][0].update(key="ghost")
    ),
    "missing array manifest": _remove("model/manifest.ocdbt"),
    "missing array metadata file": _remove("model/d/*"),
    "missing iterator directory": _remove("iterator"),
    "symlink to a file outside": _link_out("model/_METADATA"),
    "symlink to a directory outside": _link_out("model/ocdbt.process_0"),
    "FIFO as _METADATA": _fifo("model/_METADATA"),
    "FIFO as _CHECKPOINT_METADATA": _fifo("_CHECKPOINT_METADATA"),
    "pickle as _METADATA": _write("model/_METADATA", pickle.dumps(_RunsCode())),
    "pickle as iterator state": _iterator_state(pickle.dumps(_RunsCode())),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(CASES))
def test_damage_is_a_value_error_naming_the_path_and_listing_marks_it_invalid(run, case):
    MARKER.unlink(missing_ok=True)
    broken = run / "5"
    CASES[case](broken)
    with pytest.raises(ValueError) as caught:
        ex.checkpoint_table(broken)
    assert str(broken) in str(caught.value), caught.value
    listing = ex.list_checkpoints(run, deep=True)
    assert list(listing["status"]) == ["complete", "invalid"]
    assert str(broken) in listing.attrs["errors"]
    assert not MARKER.exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "case",
    [
        "iterator state not JSON",
        "nesting bomb in iterator state",
        "symlink to a directory outside",
        "missing array manifest",
        "garbled _METADATA",
    ],
)
def test_read_leaf_on_damage_is_a_value_error(run, case):
    broken = run / "5"
    CASES[case](broken)
    key = {"iterator state not JSON": "", "nesting bomb in iterator state": ""}.get(case)
    checkpointable = "iterator" if key == "" else "model"
    with pytest.raises(ValueError, match=re.escape(str(broken))):
        ex.read_leaf(broken, checkpointable, "" if key == "" else "['w']")


def test_missing_path_is_file_not_found(tmp_path):
    for call in (ex.checkpoint_table, ex.list_checkpoints):
        with pytest.raises(FileNotFoundError, match="absent"):
            call(tmp_path / "absent")
    with pytest.raises(FileNotFoundError):
        ex.compare_table(tmp_path / "absent", {"x": 1})


def test_a_directory_that_is_not_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="not an Orbax checkpoint"):
        ex.checkpoint_table(tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "sub").mkdir()
    with pytest.raises(ValueError, match=re.escape(str(tmp_path))):
        ex.checkpoint_table(tmp_path)
    (tmp_path / "notes.txt").unlink()
    with pytest.raises(ValueError, match="not a directory"):
        ex.checkpoint_table(Path(__file__))


def test_a_run_directory_is_not_a_checkpoint(run):
    with pytest.raises(ValueError, match="list_checkpoints"):
        ex.checkpoint_table(run)


def test_a_temporary_directory_is_not_a_checkpoint(run):
    tmp = run.parent / "7.orbax-checkpoint-tmp-1"
    shutil.copytree(run / "1", tmp)
    with pytest.raises(ValueError, match="temporary"):
        ex.checkpoint_table(tmp)


def test_wrong_argument_types_are_type_errors():
    with pytest.raises(TypeError):
        ex.checkpoint_table(None)
    with pytest.raises(TypeError):
        ex.checkpoint_table(b"/tmp")
    with pytest.raises(ValueError):
        ex.checkpoint_table("")


def test_the_package_has_no_way_to_run_stored_code():
    forbidden = re.compile(
        r"^\s*(import|from)\s+(pickle|marshal|shelve|dill|cloudpickle|joblib)\b"
        r"|\b(eval|exec|np\.load|torch\.load)\(|allow_pickle",
        re.MULTILINE,
    )
    for module in Path(ex.__file__).parent.glob("*.py"):
        assert not forbidden.search(module.read_text()), module.name


def test_importing_explore_loads_no_widgets_and_no_jax():
    import subprocess
    import sys

    code = (
        "import sys, tinax.explore;"
        "assert 'ipywidgets' not in sys.modules;"
        "assert 'jax' not in sys.modules;"
        "assert 'orbax' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
