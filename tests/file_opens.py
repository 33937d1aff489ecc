"""Which files in some directories a process opens or reads, told by the kernel (Linux
inotify): tensorstore's reads in C++ are seen as well as Python's.

    with FileOpens([data_dir]) as opens:
        ...
    assert opens.names() == set()
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

_IN_ACCESS = 0x001
_IN_OPEN = 0x020
_IN_NONBLOCK = os.O_NONBLOCK
_EVENT = struct.Struct("iIII")


class FileOpens:
    """The files opened or read in ``directories`` (not in their subdirectories)
    while the block runs."""

    def __init__(self, directories: Iterable[Path]) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._directories = [Path(d) for d in directories]
        self._fd = -1
        self._watches: dict[int, Path] = {}
        self.seen: list[Path] = []

    def __enter__(self) -> FileOpens:
        self._fd = self._libc.inotify_init1(_IN_NONBLOCK)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        for directory in self._directories:
            wd = self._libc.inotify_add_watch(
                self._fd, os.fsencode(directory), _IN_OPEN | _IN_ACCESS
            )
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {directory}")
            self._watches[wd] = directory
        return self

    def _drain(self) -> None:
        while self._fd >= 0:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return
            offset = 0
            while offset < len(data):
                wd, _mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size
                name = data[offset : offset + length].rstrip(b"\0").decode()
                offset += length
                if name:  # an event of the directory itself (a listing) has no name
                    self.seen.append(self._watches[wd] / name)

    def names(self) -> set[str]:
        """The names of the files opened or read so far (in the block, once it ended)."""
        self._drain()
        return {path.name for path in self.seen}

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._drain()
        os.close(self._fd)
        self._fd = -1
