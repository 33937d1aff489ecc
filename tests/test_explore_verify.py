"""verify on checkpoints Orbax wrote, sound and damaged: a verdict naming the broken part."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from damage import biggest_data_file, flip_middle_byte
from explore_fixtures import chunk_locations, delete_chunk_files, iterator, save_v1
from test_explore_bad_input import CASES as METADATA_CASES
from test_explore_diff import write_leaf_bytes

import tinax.explore as ex
from tinax._format.integrity import health
from tinax._format.naming import words
from tinax.checkpointing import save_checkpointables
from tinax.explore import toolkit

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A healthy checkpoint with a chunk out of line, copied for each damage."""
    rng = np.random.default_rng(0)
    state = {
        "model": {
            "w": jnp.asarray(rng.standard_normal((64, 64)).astype(np.float32)),
            "b": np.zeros(4, np.float32),
            "step": 1,
            "name": "tiny",
        },
        "iterator": iterator(),
    }
    return save_v1(tmp_path_factory.mktemp("verify") / "ckpt", state)


def _truncate_chunk_file(path: Path) -> None:
    file, offset, length = chunk_locations(path / "model")[0]
    os.truncate(file, offset + length // 2)


def _delete_data_file(path: Path) -> None:
    delete_chunk_files(path / "model")


def _iterator_of_two_processes_lacks_one(path: Path) -> None:
    # What a two-process save leaves when process 1's file is lost.
    folder = path / "iterator"
    only = next(folder.glob("process_*.json"))
    only.rename(folder / "process_0-of-2.json")


def _corrupt_chunk_bytes(path: Path) -> None:
    file, offset, _ = chunk_locations(path / "model")[0]
    with open(file, "r+b") as f:
        f.seek(offset + 16)
        f.write(b"\xa5" * 64)


def _stray_checkpointable(path: Path) -> None:
    shutil.copytree(path / "iterator", path / "stray")


# Damage → text every error finding list must contain somewhere (part or message).
NEW_CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "a chunk file truncated": (_truncate_chunk_file, "model/ocdbt.process_0/d/"),
    "a manifest pointing at a missing data file": (_delete_data_file, "is missing"),
    "an iterator file missing for one process": (
        _iterator_of_two_processes_lacks_one,
        "iterator/process_1-of-2.json",
    ),
}

# For the corpus tinax.explore's readers refuse: the part each verdict must name.
NAMED = {
    "garbled _CHECKPOINT_METADATA": "_CHECKPOINT_METADATA",
    "truncated _CHECKPOINT_METADATA": "_CHECKPOINT_METADATA",
    "_CHECKPOINT_METADATA not an object": "_CHECKPOINT_METADATA",
    "_CHECKPOINT_METADATA names a missing checkpointable": "ghost",
    "_CHECKPOINT_METADATA names a path": "_CHECKPOINT_METADATA",
    "nesting bomb in _CHECKPOINT_METADATA": "_CHECKPOINT_METADATA",
    "FIFO as _CHECKPOINT_METADATA": "_CHECKPOINT_METADATA",
    "nesting bomb in iterator state": "iterator/process_0-of-1.json",
    "deep nesting in iterator state": "iterator/process_0-of-1.json",
    "iterator state not JSON": "iterator/process_0-of-1.json",
    "iterator state not UTF-8": "iterator/process_0-of-1.json",
    "pickle as iterator state": "iterator/process_0-of-1.json",
    "_METADATA names an array that is not stored": "model ['ghost']",
    "missing array metadata file": "model/manifest.ocdbt",
    "missing iterator directory": "iterator",
    "symlink to a directory outside": "model/ocdbt.process_0",
}


def _copy(template: Path, tmp_path: Path) -> Path:
    path = tmp_path / "run" / "5"
    shutil.copytree(template, path, symlinks=True)
    return path


@pytest.mark.timeout(60)
@pytest.mark.parametrize("data", [False, True], ids=["metadata", "data"])
@pytest.mark.parametrize("case", list(METADATA_CASES) + list(NEW_CASES))
def test_damage_gives_a_failing_verdict_naming_the_broken_part(template, tmp_path, case, data):
    path = _copy(template, tmp_path)
    if case in NEW_CASES:
        damage, named = NEW_CASES[case]
    else:
        damage, named = METADATA_CASES[case], NAMED.get(case, "model/_METADATA")
    damage(path)
    result = ex.verify(path, data=data)
    assert not result.ok
    assert result.verdict.startswith("not sound")
    errors = result.errors
    assert len(errors), result.findings
    text = " ".join(f"{p} {m}" for p, m in zip(errors["part"], errors["message"], strict=True))
    assert named in text, result.findings.to_string()


def test_a_sound_checkpoint(template):
    result = ex.verify(template)
    assert result.ok and result.verdict == "sound (metadata checked), health not yet known"
    assert result.integrity == words.SOUND and result.health.verdict == words.HEALTH_UNKNOWN
    assert (result.findings["severity"] != words.ERROR).all()
    assert result.leaves.empty
    progress: list[tuple[int, int]] = []
    result = ex.verify(template, data=True, progress=lambda d, t: progress.append((d, t)))
    assert result.ok, result.findings
    leaves = result.leaves.set_index("key")
    assert set(leaves.index) == {"['w']", "['b']", "['step']"}
    assert leaves["read"].all() and (leaves["nan_count"] == 0).all()
    assert leaves.loc["['w']", "nbytes"] == 64 * 64 * 4
    assert progress[-1][0] == progress[-1][1] == int(leaves["nbytes"].sum())


def test_chunk_bytes_overwritten_are_found_only_by_reading_data(template, tmp_path):
    path = _copy(template, tmp_path)
    _corrupt_chunk_bytes(path)
    assert ex.verify(path).ok
    result = ex.verify(path, data=True)
    assert not result.ok
    assert list(result.errors["part"]) == ["model ['w']"]
    # The chunk no longer decodes: the stored data of that leaf is corrupt.
    assert "corrupt: it does not decode" in result.errors["message"].iloc[0]
    leaves = result.leaves.set_index("key")
    assert not leaves.loc["['w']", "read"] and leaves.loc["['b']", "read"]


def test_the_checkpointables_present_are_checked_when_one_is_missing(template, tmp_path):
    path = _copy(template, tmp_path)
    shutil.rmtree(path / "iterator")
    _truncate_chunk_file(path)
    result = ex.verify(path)
    parts = list(result.errors["part"])
    assert parts[0] == "iterator" and parts[1].startswith("model/ocdbt.process_0/d/"), parts


def test_a_stray_checkpointable_is_a_warning(template, tmp_path):
    path = _copy(template, tmp_path)
    _stray_checkpointable(path)
    result = ex.verify(path)
    assert result.ok
    warnings = result.findings[result.findings["severity"] == words.WARNING]
    assert list(warnings["part"]) == ["stray"]


def test_the_demo_run(demo_run, tmp_path):
    for step in ("step_000050", "step_000250"):
        result = ex.verify(demo_run / step, data=True)
        assert result.ok, result.findings
        assert set(result.leaves["checkpointable"]) == {"model", "optimizer", "rng", "auxiliary"}
    interrupted = next(demo_run.glob("step_000300.orbax-checkpoint-tmp*"))
    result = ex.verify(interrupted, data=True)
    assert not result.ok
    assert "temporary directory" in result.verdict
    # NaNs injected into one leaf: a warning with the count, not a broken checkpoint.
    poisoned = tmp_path / "nan"
    shutil.copytree(demo_run / "step_000050", poisoned)
    kernel = ex.read_leaf(poisoned, "model", "['dense1']['kernel']['value']")
    kernel[0, :4] = np.nan
    kernel[1, 0] = -np.inf
    write_leaf_bytes(poisoned / "model", "dense1.kernel.value", kernel)
    result = ex.verify(poisoned, data=True)
    # Written behind tinax's back: the recorded checksum no longer matches ...
    assert not result.ok
    errors = result.errors
    assert list(errors["part"]) == ["model ['dense1']['kernel']['value']"]
    assert "does not match the checksum" in errors["message"].iloc[0]
    # ... and the NaNs are counted all the same.
    warnings = result.findings[result.findings["severity"] == words.WARNING]
    assert list(warnings["part"]) == ["model ['dense1']['kernel']['value']"]
    assert "4 NaN and 1 Inf" in warnings["message"].iloc[0]
    leaves = result.leaves.set_index(["checkpointable", "key"])
    assert leaves.loc[("model", "['dense1']['kernel']['value']"), "nan_count"] == 4
    assert leaves.loc[("model", "['dense1']['bias']['value']"), "nan_count"] == 0


def test_nans_saved_with_the_checkpoint_are_a_warning_and_the_checkpoint_diverged(tmp_path):
    weights = np.ones((64, 64), np.float32)
    weights[3, :5] = np.nan
    save_checkpointables(tmp_path / "c", {"model": {"w": weights}}).result()
    result = ex.verify(tmp_path / "c", data=True)
    # It loads (no error), but a model holding NaN is never called sound.
    assert result.errors.empty
    assert not result.ok and result.status == words.DIVERGED
    assert result.verdict.startswith("diverged: 5 NaN and 0 Inf in 1 leaf of model")
    warnings = result.findings[result.findings["severity"] == words.WARNING]
    assert list(warnings["part"]) == ["model ['w']"] and "5 NaN" in warnings["message"].iloc[0]
    assert list(result.nonfinite_leaves["key"]) == ["['w']"] and result.unread_leaves.empty
    # What the data showed is remembered: metadata alone now knows it too.
    again = ex.verify(tmp_path / "c")
    assert again.status == words.DIVERGED and again.health.source == health.FROM_DATA
    assert again.health.nan == 5 and again.verdict.startswith("diverged: 5 NaN and 0 Inf")
    # In a fresh process metadata alone cannot tell: sound, its health not yet known.
    health.forget()
    fresh = ex.verify(tmp_path / "c")
    assert fresh.status == words.SOUND and fresh.health.verdict == words.HEALTH_UNKNOWN
    # A NaN metric in the auxiliary state is a logged metric gone NaN: diverged too,
    # though its model is finite, and the reason names the metric.
    save_checkpointables(
        tmp_path / "m", {"model": {"w": np.ones(4, np.float32)}, "auxiliary": {"loss": np.nan}}
    ).result()
    metric = ex.verify(tmp_path / "m", data=True)
    assert metric.status == words.DIVERGED and len(metric.nonfinite_leaves) == 1
    assert metric.health.state.leaves == 0 and metric.health.nan == 1
    assert metric.health.reason == "1 NaN and 0 Inf in 1 leaf of auxiliary"


def test_a_flipped_byte_in_array_data_fails_verify_with_data(tmp_path):
    big = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    save_checkpointables(tmp_path / "c", {"model": {"w": big, "b": np.zeros(3)}}).result()
    assert ex.verify(tmp_path / "c", data=True).ok
    flip_middle_byte(biggest_data_file(tmp_path / "c" / "model"), 0x10)
    assert ex.verify(tmp_path / "c").ok  # metadata alone cannot see it
    result = ex.verify(tmp_path / "c", data=True)
    assert not result.ok
    assert list(result.errors["part"]) == ["model ['w']"]
    assert "corrupt" in result.verdict


def test_a_checkpoint_without_checksums_says_so(tmp_path):
    from orbax.checkpoint import v1 as ocp

    ocp.save_checkpointables(tmp_path / "c", {"model": {"w": np.ones(4)}})
    result = ex.verify(tmp_path / "c", data=True)
    assert result.ok
    info = result.findings[result.findings["severity"] == words.INFO]
    assert any("no checksums recorded for 'model'" in m for m in info["message"])


class _SumCheck(toolkit.Check):
    """A plugged-in check: sums every array's values as they are read."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}

    def structure(self, target: toolkit.VerifyTarget) -> list[toolkit.Finding]:
        return [toolkit.Finding("", words.INFO, f"looked at {target.path.name}")]

    def leaf(self, target: toolkit.VerifyTarget, array: toolkit.StoredArray) -> toolkit.LeafScan:
        sums = self.sums
        sums[array.key] = 0.0

        class Scan(toolkit.LeafScan):
            def update(self, box, values):
                sums[array.key] += float(np.asarray(values, np.float64).sum())

            def finish(self):
                return (
                    [toolkit.Finding(array.part, words.ERROR, "summed")]
                    if array.key == "['b']"
                    else []
                )

        return Scan()


def test_a_check_plugs_in(template):
    check = _SumCheck()
    result = ex.verify(template, data=True, checks=[*(c() for c in toolkit.DEFAULT_CHECKS), check])
    w = ex.read_leaf(template, "model", "['w']")
    assert check.sums["['w']"] == pytest.approx(float(w.astype(np.float64).sum()))
    assert not result.ok and list(result.errors["part"]) == ["model ['b']"]
    assert "looked at ckpt" in set(result.findings["message"])
    with pytest.raises(TypeError):
        ex.verify(template, checks=[object()])  # type: ignore[list-item]


def test_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError):
        ex.verify(tmp_path / "absent")
    with pytest.raises(TypeError):
        ex.verify(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ex.verify(tmp_path, data=1)  # type: ignore[arg-type]
    (tmp_path / "file").write_text("x")
    assert not ex.verify(tmp_path / "file").ok
    assert not ex.verify(tmp_path).ok


def _cli(*args: object) -> subprocess.CompletedProcess[str]:
    # Wide enough that no line wraps: these tests read what is said, not its layout
    # (tests/test_explore_cli.py checks the layout at 80 columns).
    return subprocess.run(
        [sys.executable, "-m", "tinax.explore", "verify", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "1000"},
    )


def test_the_cli_exit_status(template, tmp_path):
    sound = _cli(template, "--data")
    assert sound.returncode == 0, sound.stdout + sound.stderr
    assert sound.stdout.strip().endswith("sound and healthy (metadata and data checked)")
    broken = _copy(template, tmp_path)
    _truncate_chunk_file(broken)
    result = _cli(broken)
    assert result.returncode == 1
    assert "not sound" in result.stdout and "model/ocdbt.process_0/d/" in result.stdout
    record = json.loads(_cli(broken, "--json").stdout)
    assert record["ok"] is False and record["findings"][0]["severity"] == "error"
    assert _cli(tmp_path / "absent").returncode == 2


@pytest.mark.parametrize(
    "boxes",
    [
        [(slice(0, 3), slice(0, 6)), (slice(3, 8), slice(0, 6))],  # whole rows, in order
        [(slice(0, 8), slice(0, 2)), (slice(0, 8), slice(2, 6))],  # columns: assembled
    ],
)
def test_checksum_pieces_are_digested_from_regions_in_any_layout(boxes):
    from tinax._format.integrity import checksums
    from tinax._format.metadata.arrays import ArrayInfo
    from tinax.explore._verify.integrity import _ChecksumScan

    values = np.arange(48, dtype=np.float32).reshape(8, 6)
    halves = [((0, 4), (0, 6)), ((4, 8), (0, 6))]
    record = checksums.LeafRecord(
        checksums.ARRAY,
        "float32",
        (8, 6),
        tuple(
            checksums.Piece(b, checksums.digest(values[b[0][0] : b[0][1], b[1][0] : b[1][1]]))
            for b in halves
        ),
    )
    array = toolkit.StoredArray("m", "['w']", "w", ArrayInfo((8, 6), "float32", 4, (8, 6)))
    for damaged, expected in ((False, []), (True, [words.ERROR])):
        scan = _ChecksumScan(array, record, np.dtype(np.float32))
        data = values.copy()
        if damaged:
            data[6, 5] += 1
        for box in boxes:
            scan.update(box, data[box])
        assert [f.severity for f in scan.finish()] == expected
