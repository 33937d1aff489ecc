"""Removing a checkpoint so that no reader ever takes a half-removed one for complete,
and the few whole-file writes a run's bookkeeping needs.

A removal writes the deletion marker (``names.DELETION_MARKER``) into the checkpoint
first, then deletes its commit records (``_CHECKPOINT_METADATA``,
``commit_success.txt``), then everything else, and the marker last. A directory
holding the marker is being removed: listings say so and loads refuse it. A removal
cut short at any instant leaves the marker in place (or nothing that looks like a
checkpoint), and ``finish_removal`` completes it later.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import threading

from tinax._format.naming import names
from tinax._format.storage.location import FILE, Location, write_synced

# ``replace_file`` writes ``<name>.<pid>-<thread>.tmp`` first.
_TEMPORARY = ".tmp"


def make_directory(where: Location) -> None:
    """Creates the directory ``where`` if it is missing; object stores need none.

    Raises:
      FileNotFoundError: If its parent does not exist.
      PermissionError: If its parent is read-only for this process (the message says
        which).
    """
    if where.storage.implicit_directories or where.exists():
        return
    try:
        os.mkdir(where.path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"cannot create the directory {str(where)!r}: its parent does not exist"
        ) from None
    except FileExistsError:
        pass
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise PermissionError(
            f"cannot create the directory {str(where)!r}: its parent "
            f"{os.path.dirname(where.path)!r} is read-only for this process "
            f"({os.strerror(e.errno)}); give a directory it can write. Nothing was created",
        ) from None


def replace_file(where: Location, data: bytes) -> None:
    """Writes the file ``where`` whole: a reader sees the old file or the new one.

    On disk through a temporary file renamed over it; an object store replaces an
    object whole by itself.
    """
    if not where.storage.commits_by_rename:
        where.storage.write_new(where.path, data)
        return
    temporary = f"{where.path}.{os.getpid()}-{threading.get_ident()}{_TEMPORARY}"
    try:
        write_synced(temporary, data, os.O_TRUNC | os.O_NOFOLLOW)
        os.replace(temporary, where.path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def mark_for_removal(checkpoint: Location) -> None:
    """Writes the deletion marker into ``checkpoint``: from now on it is being removed."""
    marker = checkpoint / names.DELETION_MARKER
    if not marker.exists():
        replace_file(marker, b"")


def delete(where: Location) -> None:
    """Deletes one file or directory tree: one step of a removal."""
    if where.storage.commits_by_rename:
        if os.path.isdir(where.path) and not os.path.islink(where.path):
            shutil.rmtree(where.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(where.path)
    else:
        where.remove_tree()


def finish_removal(checkpoint: Location) -> None:
    """Removes a checkpoint that holds the deletion marker, the marker last."""
    for record in (names.CHECKPOINT_METADATA, names.COMMIT_SUCCESS):
        if (checkpoint / record).exists():
            delete(checkpoint / record)
    for name in sorted(checkpoint.entries()):
        if name != names.DELETION_MARKER:
            delete(checkpoint / name)
    delete(checkpoint / names.DELETION_MARKER)
    if checkpoint.storage.commits_by_rename:
        with contextlib.suppress(FileNotFoundError, OSError):
            os.rmdir(checkpoint.path)


def remove_stale_temporaries(where: Location) -> None:
    """Removes what a ``replace_file`` of ``where`` left when its process was killed.

    Only files of processes that no longer run on this host are removed.
    """
    if not where.storage.commits_by_rename:
        return
    pattern = re.compile(re.escape(where.name) + r"\.(\d+)-\d+" + re.escape(_TEMPORARY) + "$")
    for name, entry in where.parent.entries().items():
        match = pattern.match(name)
        if match is None or entry.kind != FILE or _alive(int(match.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink((where.parent / name).path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process: alive
    return True
