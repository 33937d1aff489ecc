"""What the widgets learn from the filesystem: bytes landed, free names, bytes read."""

from __future__ import annotations

import re
from collections.abc import Callable

from tinax._claims import temporary_status, uncommitted_status
from tinax._format.layout import looks_like_checkpoint
from tinax._format.names import TEMPORARY_SUFFIX, final_name, is_temporary_name, step_from_name
from tinax._format.storage import DIRECTORY, Location, tree_bytes
from tinax._format.words import IN_PROGRESS
from tinax._paths import temporary_siblings
from tinax.checkpointing import validate_checkpointable_name

_TRAILING_DIGITS = re.compile(r"\d+$")


def bytes_landed(destination: Location) -> int:
    """Bytes written so far by a save headed for ``destination``.

    Counts the Orbax temporary directories first and the final directory once the
    save has renamed it, so the count keeps growing across the commit.
    """
    return sum(tree_bytes(p) for p in temporary_siblings(destination)) + tree_bytes(destination)


def process_bytes_read() -> int | None:
    """Bytes this process has read through system calls so far (Linux), else ``None``.

    Loads read a checkpoint's array data with ordinary reads, so the growth of this
    counter while a load runs measures the load's progress.
    """
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            for line in f:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def next_free_step_name(directory: Location) -> str:
    """The name of the run's next checkpoint, written in the run's own pattern.

    The step is one interval past the highest step among the run's checkpoints
    (the interval is the gap between the two highest steps; 1 when there are
    fewer), written with the prefix and zero padding of the checkpoint that has the
    highest step: ``step_000400`` after ``step_000050 … step_000350``, ``42`` after
    ``41``. Steps are read as the listing reads them (``step_from_name``). Saves
    still in progress and interrupted ones count; other directories (``logs_2026``)
    do not, though no name already taken is proposed. ``step-0`` in an empty run.
    """
    entries = directory.entries()
    taken = {final_name(name) for name in entries}
    candidates = sorted(
        (
            (step, final_name(name), is_temporary_name(name))
            for name, entry in entries.items()
            if entry.kind == DIRECTORY and (step := step_from_name(name)) is not None
        ),
        reverse=True,
    )
    # From the highest step down, the first two that are checkpoints (or saves of
    # one) are enough: only they decide the pattern and the interval.
    found: list[tuple[int, str]] = []
    for step, name, temporary in candidates:
        if found and step == found[-1][0]:
            continue
        if temporary or looks_like_checkpoint(directory / name):
            found.append((step, name))
            if len(found) == 2:
                break
    if not found:
        return "step-0"
    highest, pattern = found[0]
    interval = highest - found[1][0] if len(found) > 1 else 1
    digits = _TRAILING_DIGITS.search(pattern)
    assert digits is not None  # step_from_name found them
    prefix, width = pattern[: digits.start()], len(digits.group())
    padded = digits.group().startswith("0") and width > 1
    step = highest + interval
    while True:
        name = prefix + (str(step).zfill(width) if padded else str(step))
        if name not in taken:
            return name
        step += interval


def check_new_checkpoint_name(directory: Location, name: object) -> str:
    """Checks that ``name`` can become a new checkpoint directory under ``directory``.

    Args:
      directory: The run directory the checkpoint is saved in.
      name: The proposed checkpoint directory name.

    Returns:
      ``name``, unchanged.

    Raises:
      TypeError: If ``name`` is not a string.
      ValueError: If ``name`` is not a portable path component, uses Orbax's
        temporary suffix, or is already taken by a checkpoint, a file or a save in
        progress. What an interrupted save left does not take it: the save removes it.
    """
    if not isinstance(name, str):
        raise TypeError(f"checkpoint name must be a str, got {type(name).__name__}")
    if not name.strip():
        raise ValueError("checkpoint name must not be empty")
    try:
        validate_checkpointable_name(name)
    except ValueError as e:
        # The checkpointable-name rules are exactly the portable path component rules.
        raise ValueError(str(e).replace("checkpointable name", "checkpoint name")) from None
    if TEMPORARY_SUFFIX in name:
        raise ValueError(
            f"checkpoint name {name!r} uses Orbax's reserved temporary marker {TEMPORARY_SUFFIX!r}"
        )
    target = directory / name
    if target.exists():
        # On object stores a save writes in place; one that never committed is judged
        # like a temporary directory.
        unfinished = uncommitted_status(target.snapshot())
        if unfinished is None:
            raise ValueError(f"{name!r} is already taken in {str(directory)!r}")
        if unfinished.status == IN_PROGRESS:
            raise ValueError(f"a save to {name!r} is already in progress in {str(directory)!r}")
    if any(temporary_status(t).status == IN_PROGRESS for t in temporary_siblings(target)):
        raise ValueError(f"a save to {name!r} is already in progress in {str(directory)!r}")
    return name


def process_memory() -> int | None:
    """This process's resident memory in bytes (Linux), else ``None``."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def load_meter() -> Callable[[], int | None] | None:
    """A counter of the bytes a load has brought into this process, from now on.

    A load reads the stored bytes (counted by ``process_bytes_read``, but only
    when each read call returns) and then decodes them into new arrays, which
    grows resident memory as it goes. The counter reports whichever has grown
    more, so that a load of one large array moves too. It is an estimate: other
    work in the process adds to both. ``None`` where neither is available.
    """
    read0, memory0 = process_bytes_read(), process_memory()
    if read0 is None and memory0 is None:
        return None

    def count() -> int | None:
        read, memory = process_bytes_read(), process_memory()
        grown = [
            now - then
            for now, then in ((read, read0), (memory, memory0))
            if now is not None and then is not None
        ]
        return max(grown) if grown else None

    return count
