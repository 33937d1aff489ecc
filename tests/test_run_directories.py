"""A training run given a directory it cannot use: one clear paragraph, nothing left
behind. A read-only run directory (a read-only file system for root, which file modes
do not stop; a directory without write permission otherwise), and ``local=`` naming a
file.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grain
import jax
import numpy as np
import pytest

from tinax.checkpointing import TrainingRun


def _save(run: TrainingRun, step: int) -> None:
    it = iter(grain.MapDataset.range(8).to_iter_dataset())
    run.save(step, {"w": np.ones(3, np.float32)}, {}, jax.random.key(0), {}, it)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A directory holding ``run`` (one checkpoint, step 1), then made read-only."""
    where = tmp_path / "ro"
    where.mkdir()
    if os.geteuid() == 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], check=True)
    try:
        with TrainingRun(where / "run", save_every=1) as run:
            _save(run, 1)
        if os.geteuid() == 0:
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        else:
            for path in (where / "run", where):
                path.chmod(0o555)
        yield where
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(where)], check=True)
        else:
            for path in (where, where / "run"):
                path.chmod(0o755)


def test_a_read_only_run_directory_says_so_and_writes_nothing(read_only):
    before = sorted(p.name for p in (read_only / "run").iterdir())
    with TrainingRun(read_only / "run", save_every=1) as run:
        assert run.steps == [1]
        with pytest.raises(PermissionError) as refused:
            _save(run, 2)
    said = str(refused.value)
    assert said.startswith(f"cannot save step 2: the run directory {str(read_only / 'run')!r} is")
    assert "Nothing was written" in said and "[Errno" not in said and "\n" not in said
    assert sorted(p.name for p in (read_only / "run").iterdir()) == before
    # A new run directory under it cannot be made: said, and nothing is made.
    with pytest.raises(PermissionError, match="its parent .* is read-only for this process"):
        TrainingRun(read_only / "new", save_every=1)
    assert not (read_only / "new").exists()


def test_local_naming_a_file_says_so_and_leaves_no_durable_directory(tmp_path):
    (tmp_path / "notes").write_text("not a directory")
    with pytest.raises(NotADirectoryError) as refused:
        TrainingRun(tmp_path / "run", save_every=2, local=tmp_path / "notes", local_every=1)
    said = str(refused.value)
    assert said.startswith(f"TrainingRun(local={str(tmp_path / 'notes')!r}): that is a file")
    assert "Nothing was created" in said and "[Errno" not in said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]
