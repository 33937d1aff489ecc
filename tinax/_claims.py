"""Claims on save destinations: one writer per checkpoint, and whether that writer lives.

A save first claims its destination: it takes an exclusive ``flock`` on the claim file
beside it (``<destination>.tinax-claim``, see ``names.claim_name``) and keeps it until
the save has committed or failed. The kernel drops the lock when the holding process
dies, however it dies, so a claim never outlives its writer:

- a claim file that is locked belongs to a save that is running (``in progress``);
- one that exists but is not locked was left by a save whose process was killed: its
  temporary directory is ``interrupted``, never loadable, and safe to remove;
- a temporary directory with no claim file at all was written by something that does
  not claim (Orbax used directly). Only its activity tells: changed within the last
  ``QUIET_SECONDS`` it counts as in progress, otherwise as interrupted.

The claim file holds a small JSON record of its owner (host, pid, start time) so a
refusal can say who is writing. A save removes its claim file when it ends; one whose
process was killed leaves it behind, and the next save to that destination reuses it.

Locks exist only on local (and NFS) filesystems. Elsewhere, or where the filesystem
refuses locks, ``claim`` returns ``None`` and callers fall back to refusing any
temporary directory they cannot account for. On object stores (``gs://``) Orbax
makes no temporary directory: a save writes into its final directory and commits
by writing ``commit_success.txt`` last. A final directory with neither that marker
nor ``_CHECKPOINT_METADATA`` is a save that has not committed, judged by the same
quiet rule (``uncommitted_status``): never loadable, and removed by the next save to
it once it has been quiet for ``QUIET_SECONDS``.

Imports nothing heavier than ``tinax._format``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import json
import os
import socket
import time
import weakref
from typing import TypeGuard

from tinax._format.metadata import layout
from tinax._format.naming import names, words
from tinax._format.storage.location import DIRECTORY, Location

# How long ``claim`` keeps trying while the lock is taken, in seconds. A listing
# probes a claim by locking it for a few microseconds; that must not refuse a save.
PATIENCE_SECONDS = 0.5
# A temporary directory without a claim is taken for a live save while anything under
# it changed this recently: Orbax's own barriers give up on a silent peer after 300 s.
QUIET_SECONDS = 300.0

_RECORD_FORMAT = "tinax.claim/1"
_MAX_RECORD_BYTES = 4096
# What a filesystem without advisory locks answers to flock.
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL})


@dataclasses.dataclass(frozen=True)
class Owner:
    """The process that claimed a destination.

    Attributes:
      host: Its host name.
      pid: Its process id on that host.
      started_ns: When it took the claim, in nanoseconds since the epoch.
    """

    host: str
    pid: int
    started_ns: int

    def __str__(self) -> str:
        return f"host {self.host!r}, pid {self.pid}, since {format_time(self.started_ns)}"


def format_time(nanoseconds: int) -> str:
    """A time as ``YYYY-MM-DD HH:MM:SS UTC``."""
    moment = datetime.datetime.fromtimestamp(nanoseconds / 1e9, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def claim_location(destination: Location) -> Location:
    """Where the claim file of a save to ``destination`` is."""
    return destination.parent / names.claim_name(destination.name)


def _encode(owner: Owner) -> bytes:
    record = {
        "format": _RECORD_FORMAT,
        "host": owner.host,
        "pid": owner.pid,
        "started_ns": owner.started_ns,
    }
    return json.dumps(record).encode("utf-8")


def _decode(data: bytes) -> Owner | None:
    """The owner in a claim record; ``None`` if it is empty or not tinax's record."""
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != _RECORD_FORMAT:
        return None
    host, pid, started = record.get("host"), record.get("pid"), record.get("started_ns")
    if not isinstance(host, str) or not _count(pid) or not _count(started):
        return None
    return Owner(host=host, pid=pid, started_ns=started)


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _read_owner(fd: int) -> Owner | None:
    try:
        return _decode(os.pread(fd, _MAX_RECORD_BYTES, 0))
    except OSError:
        return None


def _open_flags() -> int:
    # Never follow a link planted where the claim file goes; never block on a FIFO.
    return os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


# Claims this process holds. A forked child inherits their descriptors, and with them
# the locks: it must drop them, or the claim would outlive the process that took it.
_held: weakref.WeakSet[Claim] = weakref.WeakSet()


def _forget_in_child() -> None:
    for held in list(_held):
        held._abandon()


os.register_at_fork(after_in_child=_forget_in_child)


class Claim:
    """A destination this process has claimed; ``release`` (or ``with``) gives it up.

    Attributes:
      destination: The checkpoint destination claimed.
      owner: This process, as recorded in the claim file.
      previous: The owner recorded by an earlier claim whose process died without
        giving it up (a killed save), if there was one.
    """

    def __init__(
        self, destination: Location, fd: int, owner: Owner, previous: Owner | None = None
    ) -> None:
        self.destination = destination
        self.owner = owner
        self.previous = previous
        self._fd = fd
        _held.add(self)

    @property
    def held(self) -> bool:
        """Whether the claim is still held."""
        return self._fd >= 0

    def release(self) -> None:
        """Removes the claim file and drops the lock; a second call does nothing."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        _held.discard(self)
        try:
            # Removed while still locked, and only if it is still our file: a save
            # waiting for the lock then finds its descriptor stale and starts over.
            if _same_file(fd, claim_location(self.destination).path):
                os.unlink(claim_location(self.destination).path)
        except OSError:
            pass  # Left behind, unlocked: the next claim reuses it.
        finally:
            os.close(fd)

    def _abandon(self) -> None:
        # In a forked child: close the inherited descriptor without unlocking, since
        # the lock belongs to the parent's open file description.
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "held" if self.held else "released"
        return f"Claim({str(self.destination)!r}, {state}, {self.owner})"


def _same_file(fd: int, path: str) -> bool:
    try:
        now = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)


def _busy_message(destination: Location, owner: Owner | None) -> str:
    who = str(owner) if owner is not None else "owner unknown"
    return (
        f"checkpoint destination {str(destination)!r} is claimed by a save in progress "
        f"({who}); two saves never write one checkpoint"
    )


def claim(destination: Location, *, patience: float = PATIENCE_SECONDS) -> Claim | None:
    """Claims ``destination`` for this process.

    Args:
      destination: The checkpoint directory a save is about to write.
      patience: Seconds to keep trying while another process holds the claim.

    Returns:
      The claim, or ``None`` where claims are not possible: not local storage, or a
      filesystem without advisory locks.

    Raises:
      FileExistsError: If a live process holds the claim, naming the destination and
        that process (host, pid, start time).
      OSError: If the claim file cannot be created (the message names it).
    """
    if not destination.is_local:
        return None
    path = claim_location(destination).path
    deadline = time.monotonic() + patience
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | _open_flags(), 0o666)
        except OSError as e:
            raise OSError(
                e.errno, f"cannot create the claim file {path!r}: {e.strerror or e}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd)
            os.close(fd)
            if time.monotonic() >= deadline:
                raise FileExistsError(_busy_message(destination, owner)) from None
            time.sleep(0.01)
            continue
        except OSError as e:
            os.close(fd)
            if e.errno in _NO_LOCKS:
                return None
            raise
        if not _same_file(fd, path):
            # The previous holder removed the file after we opened it; ours is stale.
            os.close(fd)
            continue
        previous = _read_owner(fd)
        owner = Owner(host=socket.gethostname(), pid=os.getpid(), started_ns=time.time_ns())
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, _encode(owner), 0)
        except OSError:
            os.close(fd)
            raise
        return Claim(destination, fd, owner, previous)


@dataclasses.dataclass(frozen=True)
class ClaimState:
    """What a claim file says.

    Attributes:
      live: Whether a live process holds it; ``None`` where locks cannot tell.
      owner: The owner recorded in it, if readable.
    """

    live: bool | None
    owner: Owner | None


def probe(destination: Location) -> ClaimState | None:
    """The claim on ``destination``, without taking it; ``None`` if it has no claim file."""
    if not destination.is_local:
        return None
    path = claim_location(destination).path
    try:
        fd = os.open(path, os.O_RDONLY | _open_flags())
    except OSError:
        return None  # None there (or not a file tinax would have made).
    try:
        owner = _read_owner(fd)
        try:
            # Shared and released at once: two probes never conflict, and a save
            # that meets one retries for PATIENCE_SECONDS.
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return ClaimState(live=True, owner=owner)
        except OSError:
            return ClaimState(live=None, owner=owner)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return ClaimState(live=False, owner=owner)
    finally:
        os.close(fd)


@dataclasses.dataclass(frozen=True)
class Temporary:
    """An Orbax temporary directory, and whether its save is still running.

    Attributes:
      location: The temporary directory.
      destination: The checkpoint it would have committed to.
      status: ``words.IN_PROGRESS`` or ``words.INTERRUPTED``.
      owner: The process that claimed it, if a claim record was found.
      started_ns: When its save started: the claim's time, else the oldest
        modification time under it; ``None`` if neither is known.
      reason: Why it has that status, in words.
    """

    location: Location
    destination: Location
    status: str
    owner: Owner | None
    started_ns: int | None
    reason: str


def _times(directory: Location) -> tuple[int | None, int | None]:
    """Oldest and newest modification time under ``directory`` (itself included)."""
    found = [entry.mtime_ns for _, entry in directory.walk() if entry.mtime_ns is not None]
    own = directory.entry()
    if own is not None and own.mtime_ns is not None:
        found.append(own.mtime_ns)
    return (min(found), max(found)) if found else (None, None)


def temporary_status(temporary: Location, *, now_ns: int | None = None) -> Temporary:
    """Whether the save that writes ``temporary`` is alive (see the module docstring)."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    destination = temporary.parent / names.final_name(temporary.name)
    state = probe(destination)
    owner = None if state is None else state.owner
    if state is not None and state.live is not None:
        oldest = None if owner is not None else _times(temporary)[0]
        started = owner.started_ns if owner is not None else oldest
        who = str(owner) if owner is not None else "owner unknown"
        if state.live:
            return Temporary(
                temporary, destination, words.IN_PROGRESS, owner, started, f"claimed ({who})"
            )
        return Temporary(
            temporary,
            destination,
            words.INTERRUPTED,
            owner,
            started,
            f"its claim ({who}) is held by no live process",
        )
    return _by_activity(temporary, destination, owner, now_ns, "not claimed")


def _by_activity(
    directory: Location, destination: Location, owner: Owner | None, now_ns: int, why: str
) -> Temporary:
    """The quiet rule: a save is taken for live while anything under it changed recently."""
    oldest, newest = _times(directory)
    quiet = None if newest is None else (now_ns - newest) / 1e9
    if quiet is not None and quiet < QUIET_SECONDS:
        status, reason = words.IN_PROGRESS, f"{why}; changed {quiet:.0f} s ago"
    else:
        status = words.INTERRUPTED
        reason = f"{why}; unchanged for longer than a live save stays silent"
    return Temporary(directory, destination, status, owner, oldest, reason)


def uncommitted_status(directory: Location, *, now_ns: int | None = None) -> Temporary | None:
    """Whether the save writing ``directory`` in place is alive; ``None`` if it committed.

    Where Orbax cannot rename (object stores, see ``layout.is_uncommitted``), a save
    writes straight into its final directory, and nothing can be locked there: only
    its activity tells, as for a temporary directory without a claim.
    """
    if not layout.is_uncommitted(directory):
        return None
    now_ns = time.time_ns() if now_ns is None else now_ns
    return _by_activity(directory, directory, None, now_ns, "no commit marker")


def remove_interrupted(temporary: Location) -> Temporary:
    """Removes the temporary directory of an interrupted save.

    The destination is claimed for the removal, so no save to it can start meanwhile.

    Args:
      temporary: An Orbax temporary directory.

    Returns:
      What was removed, with the status it had.

    Raises:
      ValueError: If ``temporary`` is not an Orbax temporary directory.
      FileNotFoundError: If it does not exist.
      FileExistsError: If its save is still in progress (naming who writes it).
    """
    kind = temporary.kind()
    in_place = not names.is_temporary_name(temporary.name) and kind == DIRECTORY
    found_in_place = uncommitted_status(temporary.snapshot()) if in_place else None
    if not names.is_temporary_name(temporary.name) and found_in_place is None:
        raise ValueError(
            f"{str(temporary)!r} is not an Orbax temporary directory or a save that has "
            "not committed"
        )
    if kind is None:
        raise FileNotFoundError(f"{str(temporary)!r} does not exist")
    if kind != DIRECTORY:
        raise ValueError(f"{str(temporary)!r} is not a directory")
    found = found_in_place or temporary_status(temporary)
    if found.status != words.INTERRUPTED:
        raise FileExistsError(
            f"{str(temporary)!r} belongs to a save in progress ({found.reason}); it is not removed"
        )
    held = claim(found.destination)
    try:
        temporary.remove_tree()
    finally:
        if held is not None:
            held.release()
    return found
