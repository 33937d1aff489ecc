"""Where checkpoints live: one small storage interface, and a location within it.

Everything tinax reads or lists goes through a ``Location``: a storage and a path in
it. Its reads are bounded and never follow a link, and a directory walk reports
links instead of following them, so a checkpoint is read as what it is, not as
what it points to. ``LocalStorage`` is the local filesystem; ``tinax._format.storage.gcs``
implements the same few methods for Google Cloud Storage (``gs://``), and
``tinax._format.storage.locate`` picks the one a user's path or URL names (this module
imports neither).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import stat
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

FILE = "file"
DIRECTORY = "directory"
LINK = "link"
# FIFOs, sockets, devices: never part of a checkpoint.
OTHER = "other"

# URLs of Google Cloud Storage objects start with this.
GCS_SCHEME = "gs://"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One entry of a directory, as found (links not followed).

    Attributes:
      name: The entry's name in its directory.
      kind: ``file``, ``directory``, ``link`` or ``other``.
      size: Its size in bytes (files; 0 otherwise).
      stamp: Text that changes whenever the entry does (size, identity, time).
      mtime_ns: Modification time in nanoseconds since the epoch, if known.
      link_target: For a link, the absolute location it resolves to.
    """

    name: str
    kind: str
    size: int = 0
    stamp: str = ""
    mtime_ns: int | None = None
    link_target: str | None = None


class Storage(Protocol):
    """The operations tinax needs from where checkpoints are kept.

    Attributes:
      commits_by_rename: Whether Orbax commits a save here by renaming a temporary
        directory (local disk). Where it cannot (object stores), it writes into the
        final directory and marks the end with ``commit_success.txt``.
      implicit_directories: Whether a directory exists only by holding something
        (object stores: any path in a bucket can be written without making its
        parents first).
      parallel_reads: Whether reading several files side by side pays: each read is
        a round trip (object stores), not a system call on a local disk.
    """

    commits_by_rename: bool
    implicit_directories: bool
    parallel_reads: bool

    def url(self, path: str) -> str:
        """The text a user would write for ``path``."""
        ...

    def join(self, path: str, name: str) -> str:
        """``path`` with one more component."""
        ...

    def split(self, path: str) -> tuple[str, str]:
        """``(parent, name)`` of ``path``."""
        ...

    def entry(self, path: str) -> Entry | None:
        """The entry at ``path``, not following a link; ``None`` if there is none."""
        ...

    def entries(self, path: str) -> list[Entry]:
        """The entries of the directory ``path``.

        Raises:
          OSError: If ``path`` is not a directory that can be listed.
        """
        ...

    def read(self, path: str, max_bytes: int) -> bytes:
        """The bytes of the regular file ``path``, at most ``max_bytes + 1`` of them.

        Raises:
          OSError: If it cannot be read, is a link or is not a regular file.
        """
        ...

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """``length`` bytes of the regular file ``path`` from ``offset`` (fewer at its end).

        Raises:
          OSError: If it cannot be read, is a link or is not a regular file.
        """
        ...

    def inside(self, target: str, root: str) -> bool:
        """Whether the location ``target`` lies within the directory ``root``."""
        ...

    def kvstore(self, path: str) -> dict[str, Any]:
        """The tensorstore kvstore spec of the directory ``path``."""
        ...

    def remove_tree(self, path: str) -> None:
        """Removes the directory ``path`` and everything under it; nothing there is fine."""
        ...

    def write_new(self, path: str, data: bytes) -> None:
        """Writes a new file ``path`` (creating its directory), durably.

        Raises:
          OSError: If it cannot be written (locally: also if it exists).
        """
        ...

    def prefetch(self, paths: Sequence[str], max_bytes: int) -> None:
        """Fetches the files ``paths`` (each at most ``max_bytes``) side by side where
        each read is a round trip and what is read is kept (a snapshot of an object
        store), so that the reads which follow cost none; elsewhere nothing."""
        ...

    def snapshot(self, path: str) -> Location:
        """``path`` as seen now, listed in as few requests as the storage allows.

        Entries below the returned location come from one listing made now; reads
        still go to the storage. Where listing is cheap (local disk) it is ``path``
        itself, always current.
        """
        ...

    def pathlike(self, path: str) -> os.PathLike[str]:
        """``path`` as Orbax takes it (a ``pathlib`` or ``etils.epath`` path)."""
        ...


_LOCAL_KINDS = {stat.S_IFLNK: LINK, stat.S_IFDIR: DIRECTORY, stat.S_IFREG: FILE}


class LocalStorage:
    """The local filesystem. Paths are absolute and free of ``..``."""

    commits_by_rename = True
    implicit_directories = False
    parallel_reads = False

    def url(self, path: str) -> str:
        return path

    # os.path.join and os.path.split, for the absolute, normalised paths of this class
    # and names without a trailing "/": a listing joins and splits tens of thousands.
    def join(self, path: str, name: str) -> str:
        if name.startswith("/"):
            return name
        return path + name if path.endswith("/") else f"{path}/{name}"

    def split(self, path: str) -> tuple[str, str]:
        cut = path.rfind("/") + 1
        head = path[:cut]
        if head.strip("/"):
            head = head.rstrip("/")
        return head, path[cut:]

    def entry(self, path: str) -> Entry | None:
        try:
            info = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return self._entry(os.path.basename(path), path, info)

    @staticmethod
    def _entry(name: str, path: str, info: os.stat_result) -> Entry:
        # Made for every file of a run (tens of thousands): one lookup tells the kind.
        kind = _LOCAL_KINDS.get(stat.S_IFMT(info.st_mode), OTHER)
        size = info.st_size
        return Entry(
            name,
            kind,
            size if kind == FILE else 0,
            f"{size}:{info.st_ino}:{info.st_mtime_ns}",
            info.st_mtime_ns,
            os.path.realpath(path) if kind == LINK else None,
        )

    def entries(self, path: str) -> list[Entry]:
        found = []
        with os.scandir(path) as it:
            for item in it:
                try:
                    info = item.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # gone since it was listed
                found.append(self._entry(item.name, item.path, info))
        return found

    @staticmethod
    def _open_regular(path: str) -> int:
        return LocalStorage._open_regular_sized(path)[0]

    @staticmethod
    def _open_regular_sized(path: str) -> tuple[int, int]:
        """An open descriptor of the regular file ``path``, and its size as opened."""
        # O_NONBLOCK: a FIFO swapped in after the caller looked must not block the open.
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise OSError(f"{path!r} is not a regular file")
        return fd, info.st_size

    def read(self, path: str, max_bytes: int) -> bytes:
        fd, size = self._open_regular_sized(path)
        try:
            chunks: list[bytes] = []
            remaining = max_bytes + 1
            # The whole file in one read where it is no larger than it was when opened
            # (megabytes of metadata are not copied again to join chunks), then reads
            # of a mebibyte until its end, however much it has grown meanwhile.
            first = min(remaining, size + 1)
            while remaining > 0:
                chunk = os.read(fd, first if not chunks else min(remaining, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        finally:
            os.close(fd)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        fd = self._open_regular(path)
        try:
            chunks = []
            while length > 0:
                chunk = os.pread(fd, min(length, 1 << 24), offset)
                if not chunk:
                    break
                chunks.append(chunk)
                offset += len(chunk)
                length -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def inside(self, target: str, root: str) -> bool:
        real_root = os.path.realpath(root)
        return target == real_root or target.startswith(real_root.rstrip(os.sep) + os.sep)

    def kvstore(self, path: str) -> dict[str, Any]:
        return {"driver": "file", "path": path.rstrip(os.sep) + os.sep}

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def write_new(self, path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_synced(path, data, os.O_EXCL)

    def prefetch(self, paths: Sequence[str], max_bytes: int) -> None:
        pass

    def snapshot(self, path: str) -> Location:
        return Location(self, path)

    def pathlike(self, path: str) -> os.PathLike[str]:
        return pathlib.Path(path)


LOCAL = LocalStorage()


@dataclasses.dataclass(frozen=True)
class Location:
    """A path within a storage.

    Attributes:
      storage: Where the path is.
      path: The path, in the storage's own form (absolute, for local disk).
    """

    storage: Storage
    path: str

    def __str__(self) -> str:
        return self.storage.url(self.path)

    def __truediv__(self, name: str) -> Location:
        return Location(self.storage, self.storage.join(self.path, name))

    @property
    def name(self) -> str:
        """The final component."""
        return self.storage.split(self.path)[1]

    @property
    def parent(self) -> Location:
        """The directory holding this location."""
        return Location(self.storage, self.storage.split(self.path)[0])

    @property
    def is_local(self) -> bool:
        """Whether this is a path on the local filesystem."""
        return isinstance(self.storage, LocalStorage)

    def entry(self) -> Entry | None:
        """What is here, links not followed; ``None`` if nothing is."""
        return self.storage.entry(self.path)

    def exists(self) -> bool:
        """Whether anything (a dangling link too) is here."""
        return self.entry() is not None

    def kind(self) -> str | None:
        """``file``, ``directory``, ``link``, ``other``, or ``None`` if nothing is here."""
        found = self.entry()
        return None if found is None else found.kind

    def is_dir(self) -> bool:
        """Whether a directory (not a link to one) is here."""
        return self.kind() == DIRECTORY

    def is_file(self) -> bool:
        """Whether a regular file (not a link to one) is here."""
        return self.kind() == FILE

    def entries(self) -> dict[str, Entry]:
        """The entries of this directory by name; empty if it cannot be listed."""
        try:
            return {e.name: e for e in self.storage.entries(self.path)}
        except OSError:
            return {}

    def walk(self) -> Iterator[tuple[Location, Entry]]:
        """Every entry below this directory, depth first, links not followed.

        Directories that vanish or cannot be listed while walking are skipped;
        ``scan`` is the strict walk.
        """
        stack = [self]
        while stack:
            directory = stack.pop()
            try:
                found = sorted(directory.storage.entries(directory.path), key=lambda e: e.name)
            except OSError:
                continue
            for item in found:
                where = directory / item.name
                yield where, item
                if item.kind == DIRECTORY:
                    stack.append(where)

    def read_range(self, offset: int, length: int) -> bytes:
        """``length`` bytes of this regular file from ``offset``; fewer at its end.

        Raises:
          OSError: If it cannot be read, is a link or is not a regular file.
        """
        return self.storage.read_range(self.path, offset, length)

    def kvstore(self) -> dict[str, Any]:
        """The tensorstore kvstore spec of this directory."""
        return self.storage.kvstore(self.path)

    def remove_tree(self) -> None:
        """Removes this directory and everything under it."""
        self.storage.remove_tree(self.path)

    def write_new(self, data: bytes) -> None:
        """Writes ``data`` as this new file, durably (see ``Storage.write_new``)."""
        self.storage.write_new(self.path, data)

    def snapshot(self) -> Location:
        """This location as seen now, listed at once (see ``Storage.snapshot``)."""
        return self.storage.snapshot(self.path)

    def pathlike(self) -> os.PathLike[str]:
        """This location as Orbax takes it."""
        return self.storage.pathlike(self.path)


def tree_bytes(location: Location) -> int:
    """Total size of the regular files under ``location`` (0 if nothing is there).

    Files may appear and vanish meanwhile (a save in progress); those are skipped.
    The one directory-size function of the project.
    """
    found = location.entry()
    if found is None:
        return 0
    if found.kind == FILE:
        return found.size
    return sum(entry.size for _, entry in location.snapshot().walk() if entry.kind == FILE)


def local(path: str | os.PathLike[str]) -> Location:
    """The local ``Location`` of ``path``, made absolute with ``..`` resolved.

    Tensorstore refuses paths with ``..`` components, and link checks compare
    absolute locations.
    """
    return Location(LOCAL, os.path.abspath(os.fspath(path)))


def write_synced(path: str, data: bytes, flags: int = 0) -> None:
    """Writes ``data`` to the local file ``path`` (created, mode 0644) and syncs it.

    Args:
      path: The file.
      data: Its bytes.
      flags: ``os.open`` flags beyond writing, creating and close-on-exec
        (``O_EXCL``, ``O_TRUNC``, ``O_NOFOLLOW``).

    Raises:
      OSError: As ``os.open`` and ``os.write`` raise it.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | flags, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
