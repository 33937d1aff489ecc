"""Copying a committed checkpoint's files to another directory, each file read once and streamed.

A two-tier run promotes a local checkpoint by copying every file of it to the durable
tier. Each file is read once, a block at a time, and each block is sent on as soon as
it is read, so memory holds a bounded amount of file data whatever the checkpoint's
size (``gcs_upload.IN_FLIGHT_BYTES`` on ``gs://``, ``LOCAL_THREADS`` blocks on a disk):

- to a local directory (a disk, NFS): by a few threads, each file created new,
  written and fsynced; then every directory made is fsynced;
- to ``gs://``: many requests at once, each large, each checked against the CRC32C
  the bucket computed of what it stored (``gcs_upload``).

Where the copy lands is the caller's to decide and to commit (a temporary directory
renamed, or files written in place with the commit marker last); a failed copy
leaves its partial files for the caller to remove.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
from collections.abc import Sequence

from tinax._format.storage.copied_files import SourceFile, changed, open_regular, within
from tinax._format.storage.location import Location

# Bytes one read of a local file takes in.
BLOCK_BYTES = 8 << 20
# Files copied at once between local directories.
LOCAL_THREADS = 4


def copy_files(source: Location, files: Sequence[SourceFile], destination: Location) -> None:
    """Copies ``files`` of the local directory ``source`` to ``destination``.

    Args:
      source: A local directory (the checkpoint copied).
      files: What to copy (``source_files``, or some of them).
      destination: A local directory made here (it must not exist yet), or a
        ``gs://`` prefix; further calls may add files to one made before.

    Raises:
      OSError: If a file cannot be read or written, changed while it was read, or
        arrived corrupt in the bucket (its CRC32C differs); the message names it.
    """
    if not source.is_local:
        raise ValueError(f"a copy reads a local directory, not {str(source)!r}")
    if destination.is_local:
        _copy_local(source, files, destination)
    else:
        from tinax._format.storage import gcs_upload

        gcs_upload.copy_to_bucket(source, files, destination)


# -- to a local directory -----------------------------------------------------------------


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_local(source: Location, files: Sequence[SourceFile], destination: Location) -> None:
    made = []
    if not os.path.isdir(destination.path):
        os.mkdir(destination.path)
        made.append(destination.path)
    for parts in sorted({f.relative[:-1] for f in files}, key=len):
        for depth in range(1, len(parts) + 1):
            path = within(destination, parts[:depth]).path
            if not os.path.isdir(path):
                # Processes copying their own files into one directory make the
                # directories they share side by side.
                with contextlib.suppress(FileExistsError):
                    os.mkdir(path)
                made.append(path)
    with concurrent.futures.ThreadPoolExecutor(
        LOCAL_THREADS, thread_name_prefix="tinax-copy"
    ) as pool:
        copies = [
            pool.submit(
                _copy_one,
                within(source, f.relative).path,
                within(destination, f.relative).path,
                f,
            )
            for f in files
        ]
        for copy in copies:
            copy.result()
    # The files' names are durable once their directories are.
    for path in sorted({os.path.dirname(within(destination, f.relative).path) for f in files}):
        _fsync_directory(path)
    for path in reversed(made):
        _fsync_directory(os.path.dirname(path))


def _copy_one(source: str, destination: str, listed: SourceFile) -> None:
    fd_in = open_regular(source)
    try:
        fd_out = os.open(
            destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
        )
        try:
            buffer = bytearray(min(BLOCK_BYTES, max(listed.size, 1)))
            view = memoryview(buffer)
            total = 0
            while True:
                count = os.readv(fd_in, [buffer])
                if not count:
                    break
                total += count
                pending = view[:count]
                while pending:
                    pending = pending[os.write(fd_out, pending) :]
            if total != listed.size:
                raise changed(source, listed.size, total)
            os.fsync(fd_out)
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)
