"""Files written to a local disk made durable: in the background as they are done, and
all of them before a commit.

Tensorstore can sync each file it writes (its ``file_io_sync``), but then every
commit of a store waits for the disk before the next can start. A new checkpoint is
written without that wait instead: the files a commit wrote are synced on one
background thread while the next batch is read and written (``BackgroundSync``),
and before the checkpoint commits every file and directory under it is synced
(``sync_tree``; quick for those already synced). The checkpoint is as durable as
with tensorstore's own syncs, and reading the next batch overlaps the disk's writes.

Object stores have nothing to sync: everything here does nothing there.
"""

from __future__ import annotations

import concurrent.futures
import os

from tinax._format.storage.location import Location

# Set as the ``file_io_sync`` resource of the writer's tensorstore context.
TENSORSTORE_SYNC = False


def _sync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _files(directory: str) -> list[str]:
    found: list[str] = []
    for root, _dirs, names in os.walk(directory):
        found.extend(os.path.join(root, name) for name in names)
    return found


class BackgroundSync:
    """Syncs, on one background thread, the files that appear under a directory."""

    def __init__(self, directory: Location) -> None:
        self.directory = directory
        self._synced: set[str] = set()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[concurrent.futures.Future[None]] = []
        if directory.storage.commits_by_rename:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tinax-sync")

    def written(self) -> None:
        """Syncs (in the background) the files that are there now and were not synced.

        Call it once the writes that made them are complete: a file still being
        written is synced again by ``sync_tree`` before the commit anyway.
        """
        if self._pool is not None:
            self._pending.append(self._pool.submit(self._pass))

    def _pass(self) -> None:
        for path in _files(self.directory.path):
            if path not in self._synced:
                try:
                    _sync(path)
                except FileNotFoundError:
                    continue  # a lock file of a write still under way, gone since
                self._synced.add(path)

    def close(self) -> None:
        """Waits for the syncs started; raises the first that failed."""
        if self._pool is None:
            return
        try:
            for future in self._pending:
                future.result()
        finally:
            self._pending = []
            self._pool.shutdown(wait=True)
            self._pool = None


def sync_tree(directory: Location) -> None:
    """Syncs every file and directory under ``directory`` (itself too), deepest first.

    Raises:
      OSError: If one cannot be synced.
    """
    if not directory.storage.commits_by_rename:
        return
    for root, dirs, names in os.walk(directory.path, topdown=False):
        for name in names:
            _sync(os.path.join(root, name))
        for name in dirs:
            _sync(os.path.join(root, name))
    _sync(directory.path)
