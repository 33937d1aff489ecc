"""The files of a local checkpoint being copied, and how each is read safely.

What ``transfer`` (to a disk) and ``gcs_upload`` (to a bucket) share: the files listed
once, largest first, each opened only if it is a regular file, and a file that changed
while it was read is an error naming it.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat

from tinax._format.storage.location import DIRECTORY, FILE, Location


@dataclasses.dataclass(frozen=True)
class SourceFile:
    """One file of the checkpoint being copied.

    Attributes:
      relative: Its path components below the checkpoint's directory.
      size: Its size in bytes when it was listed.
    """

    relative: tuple[str, ...]
    size: int


def source_files(source: Location) -> list[SourceFile]:
    """Every file under the local directory ``source``, largest first.

    Raises:
      ValueError: If anything under it is neither a regular file nor a directory
        (a link, a FIFO): a checkpoint holds none, and none is copied.
    """
    found: list[SourceFile] = []
    stack: list[tuple[Location, tuple[str, ...]]] = [(source, ())]
    while stack:
        directory, relative = stack.pop()
        for name, entry in sorted(directory.entries().items()):
            if entry.kind == DIRECTORY:
                stack.append((directory / name, (*relative, name)))
            elif entry.kind == FILE:
                found.append(SourceFile((*relative, name), entry.size))
            else:
                raise ValueError(
                    f"{str(directory / name)!r} is a {entry.kind}, not a file or directory: "
                    "a checkpoint holds none, and it is not copied"
                )
    # The largest first, so that the long transfers start at once.
    found.sort(key=lambda f: (-f.size, f.relative))
    return found


def within(root: Location, relative: tuple[str, ...]) -> Location:
    where = root
    for part in relative:
        where = where / part
    return where


def open_regular(path: str) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{path!r} is not a regular file")
    return fd


def changed(path: str, listed: int, found: int) -> OSError:
    return OSError(
        errno.EIO,
        f"{path!r} changed while it was copied ({listed} bytes when listed, {found} read)",
    )
