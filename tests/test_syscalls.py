"""Opened once, all the way down: the file-system calls of tinax's reads of a run,
counted with ``strace -f`` (``tests/syscalls.py``) on a local run of five checkpoints
written by ``TrainingRun``.

In one call no file of a checkpoint is opened twice and no directory listed twice; a
listing opens at most three files and lists at most two directories a checkpoint, and
``run_table`` opens at most four files a checkpoint.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import syscalls

from tinax._format.naming import names

# Every call the count covers: the five, and the other reads of a run.
CALLS = list(syscalls.CALLS)


@pytest.fixture(scope="module")
def syscall_counts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, syscalls.Counts]:
    assert shutil.which("strace"), "strace is missing: `make test` installs Debian's strace"
    where = tmp_path_factory.mktemp("syscalls")
    root, warm = where / "run", where / "warm"
    for run in (root, warm):
        run.mkdir()
        syscalls.write_run(run)
    return syscalls.count(CALLS, str(root), str(warm))


@pytest.mark.parametrize("call", CALLS)
def test_no_file_is_opened_twice_and_no_directory_listed_twice(
    syscall_counts: dict[str, syscalls.Counts], call: str
) -> None:
    found = syscall_counts[call]
    assert found.file_opens, f"{call} opened no file: the count sees nothing"
    assert found.most_opened()[1] == 1, f"{call}: {found.most_opened()}"
    assert found.most_listed()[1] == 1, f"{call}: {found.most_listed()}"


def test_a_listing_reads_a_few_files_a_checkpoint(
    syscall_counts: dict[str, syscalls.Counts],
) -> None:
    listing = syscall_counts["list_checkpoints"]
    assert sum(listing.file_opens.values()) <= 3 * syscalls.CHECKPOINTS
    assert sum(listing.listings.values()) <= 2 * syscalls.CHECKPOINTS
    # Of each checkpoint: its commit record and its save's record, nothing under it.
    for path in listing.file_opens:
        assert Path(path).name in (names.CHECKPOINT_METADATA, names.SAVE_TIMES, names.RUN_RECORD)
    assert sum(syscall_counts["run_table"].file_opens.values()) <= 4 * syscalls.CHECKPOINTS


def test_the_count_finds_a_file_opened_twice_and_a_directory_listed_twice() -> None:
    root = "/runs/r"
    trace = "\n".join(
        [
            f'1 access("{syscalls.MARK_BEGIN}x", F_OK) = -1 ENOENT',
            f'1 openat(AT_FDCWD, "{root}/a/_METADATA", O_RDONLY|O_CLOEXEC) = 3',
            f'2 openat(AT_FDCWD, "{root}/a", O_RDONLY|O_NONBLOCK|O_CLOEXEC|O_DIRECTORY) = 4',
            f'2 openat(AT_FDCWD, "{root}/a/_METADATA", O_RDONLY <unfinished ...>',
            f'1 newfstatat(AT_FDCWD, "{root}/a", {{st_mode=S_IFDIR}}, AT_SYMLINK_NOFOLLOW) = 0',
            f'1 openat(AT_FDCWD, "{root}/a", O_RDONLY|O_DIRECTORY) = 5',
            '1 openat(AT_FDCWD, "/elsewhere/b", O_RDONLY) = 6',
            f'1 access("{syscalls.MARK_END}x", F_OK) = -1 ENOENT',
            f'1 openat(AT_FDCWD, "{root}/a/_METADATA", O_RDONLY) = 7',
        ]
    )
    found = syscalls.parse(trace, root, "x")
    assert found.most_opened() == (f"{root}/a/_METADATA", 2)
    assert found.most_listed() == (f"{root}/a", 2)
    assert found.stats == 1
