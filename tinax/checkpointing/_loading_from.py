"""The opened checkpoints loads are reading from, for the handlers Orbax calls.

Orbax hands its handlers a directory's path; a load of tinax's opened the checkpoint
first (``tinax._paths.open_checkpoint``), and the handlers read its checkpointables
through that opened value (what it has read already, kept on it) rather than asking
the storage again.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from tinax._format.metadata.layout import Checkpoint, StoredCheckpointable

# By URL: a load of the same checkpoint opened twice at once reads through the last.
_opened_lock = threading.Lock()
_opened: dict[str, list[Checkpoint]] = {}


@contextlib.contextmanager
def reading_from(checkpoint: Checkpoint) -> Iterator[None]:
    """While the block runs, the handlers read the checkpointables of ``checkpoint``
    (opened) through it: each file read once, whoever reads it."""
    url = str(checkpoint.path).rstrip("/")
    with _opened_lock:
        _opened.setdefault(url, []).append(checkpoint)
    try:
        yield
    finally:
        with _opened_lock:
            opened = _opened[url]
            opened.remove(checkpoint)
            if not opened:
                del _opened[url]


def opened_item(directory: str) -> StoredCheckpointable | None:
    """The checkpointable of an opened checkpoint (``reading_from``) that Orbax loads
    from ``directory``; ``None`` where no load of tinax's opened it."""
    with _opened_lock:
        for url, opened in _opened.items():
            if directory.startswith(url + "/"):
                name = directory[len(url) + 1 :].strip("/")
                for item in opened[-1].checkpointables:
                    if item.name == name:
                        return item
    return None
