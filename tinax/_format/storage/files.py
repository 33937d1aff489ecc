"""Reading a checkpoint's own files: bounded, never following a link, never executing.

Every metadata file tinax reads, on the way to a table or to a load, passes through
``read_bytes``; metadata is JSON only (no pickle, no eval), with one size cap for
Orbax's metadata and a smaller one for everything else. ``scan`` checks a whole
checkpoint directory before anything in it is read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import json
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import msgspec

from tinax._format.storage.location import DIRECTORY, FILE, LINK, Entry, Location

# Orbax writes a few MiB of _METADATA per 10,000 leaves; refuse anything far beyond.
MAX_METADATA_BYTES = 256 * 1024 * 1024
# Checkpoint bookkeeping, iterator states and string leaves are small.
MAX_SMALL_JSON_BYTES = 16 * 1024 * 1024
# Orbax metadata and Grain iterator states nest a handful of levels; a deeper
# document is not one of them, and later code need not guard its recursion.
MAX_JSON_DEPTH = 100


_GC_LOCK = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = False


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pauses Python's cycle collector while metadata is parsed into objects.

    Parsing the metadata of tens of thousands of leaves allocates millions of
    objects, and each allocation burst sets off a full collection that walks all
    of them again: it doubles the time a large checkpoint takes to open. Parsed
    metadata holds no reference cycles, so nothing is lost; reference counting
    frees garbage as usual, and the collector runs again once the last pause (of
    any thread) ends, unless it was off before.
    """
    pause_gc()
    try:
        yield
    finally:
        resume_gc()


def pause_gc() -> None:
    """Starts a pause of the cycle collector that ``resume_gc`` ends (``paused_gc``)."""
    global _gc_pauses, _gc_was_enabled
    with _GC_LOCK:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1


def resume_gc() -> None:
    """Ends one ``pause_gc``; the collector runs again when the last one ends."""
    global _gc_pauses
    with _GC_LOCK:
        _gc_pauses -= 1
        if _gc_pauses == 0 and _gc_was_enabled:
            gc.enable()


@dataclasses.dataclass(frozen=True)
class Scan:
    """What ``scan`` found under a checkpoint directory.

    Attributes:
      nbytes: Total size of the regular files, in bytes.
      fingerprint: Digest of every entry's path, size, identity and modification
        time; it changes whenever anything under the directory does.
      files: Number of regular files.
      found: Every regular file, with its entry, in walk order.
      directories: Every directory below the one scanned, with its entry. With
        ``found`` it is everything under the directory (the scan refuses all else).
    """

    nbytes: int
    fingerprint: str
    files: int
    found: tuple[tuple[Location, Entry], ...] = ()
    directories: tuple[tuple[Location, Entry], ...] = ()
    # ``listing()``, as the walk made it (not compared: it follows from the rest).
    listed: dict[str, dict[str, Entry]] | None = dataclasses.field(
        default=None, compare=False, repr=False
    )

    def listing(self) -> dict[str, dict[str, Entry]]:
        """The entries of every directory the scan walked (its own too), by path.

        Do not modify the result: it is the scan's own.
        """
        if self.listed is not None:
            return self.listed
        listed: dict[str, dict[str, Entry]] = {}
        for where, entry in (*self.directories, *self.found):
            parent, name = where.storage.split(where.path)
            listed.setdefault(parent, {})[name] = entry
        return listed


def is_utf8(name: str) -> bool:
    """Whether a file name (as ``os`` decodes it) is UTF-8."""
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def scan(
    directory: Location,
    top: Iterable[Entry] | None = None,
    listed: Mapping[str, Mapping[str, Entry]] | None = None,
) -> Scan:
    """Walks ``directory`` without following links, checking that it is safe to read.

    Orbax writes regular files and directories only, with UTF-8 names; anything
    else under a checkpoint is refused before a reader (tinax's, or Orbax's, which
    would follow a link or block on a FIFO) gets to it. ``top`` are the entries of
    ``directory`` itself, if the caller has just listed them; ``listed`` the entries
    of every directory under it by path (``walk``), if the caller has walked it.

    Raises:
      ValueError: If an entry is a symbolic link, neither a regular file nor a
        directory (a FIFO, socket or device), or has a name that is not UTF-8,
        or a directory cannot be listed; the message names the entry.
    """
    # What the fingerprint digests, one line per entry, digested at once at the end.
    stamps: list[str] = []
    total = 0
    found_files: list[tuple[Location, Entry]] = []
    found_directories: list[tuple[Location, Entry]] = []
    listed_by_path: dict[str, dict[str, Entry]] = {}
    stack = [directory]
    while stack:
        current = stack.pop()
        try:
            if top is not None and current is directory:
                entries: Iterable[Entry] = top
            elif listed is not None:
                entries = listed.get(current.path, {}).values()
            else:
                entries = current.storage.entries(current.path)
            found = sorted(entries, key=lambda e: e.name)
        except OSError as e:
            raise ValueError(f"cannot list {str(current)!r}: {e.strerror or e}") from None
        if found:
            # Keyed as ``Scan.listing`` keys it: the parent of its entries' paths.
            parent = current.storage.split(current.storage.join(current.path, found[0].name))[0]
            listed_by_path[parent] = {entry.name: entry for entry in found}
        for entry in found:
            where = current / entry.name
            if not is_utf8(entry.name):
                raise ValueError(
                    f"{str(where)!r} has a name that is not UTF-8; a checkpoint holds none"
                )
            stamps.append(f"{where.path}\0{entry.stamp}\n")
            if entry.kind == LINK:
                target = entry.link_target or ""
                place = (
                    "inside"
                    if directory.storage.inside(target, directory.path)
                    else f"outside the checkpoint {str(directory)!r}"
                )
                raise ValueError(
                    f"{str(where)!r} is a symbolic link to {target!r} ({place}); a "
                    "checkpoint holds none, and links are not followed"
                )
            if entry.kind == DIRECTORY:
                stack.append(where)
                found_directories.append((where, entry))
            elif entry.kind == FILE:
                total += entry.size
                found_files.append((where, entry))
            else:
                raise ValueError(
                    f"{str(where)!r} is not a regular file or directory (a FIFO, socket "
                    "or device); a checkpoint holds nothing else"
                )
    digest = hashlib.blake2b("".join(stamps).encode(), digest_size=16)
    return Scan(
        nbytes=total,
        fingerprint=digest.hexdigest(),
        files=len(found_files),
        found=tuple(found_files),
        directories=tuple(found_directories),
        listed=listed_by_path,
    )


def walk(directory: Location) -> dict[str, dict[str, Entry]]:
    """The entries of ``directory`` and of every directory under it, by path, each listed
    once, links not followed; what is there whatever it is (``scan`` then says whether
    it is safe to read, without listing anything again). A directory that cannot be
    listed has no entries.
    """
    listed: dict[str, dict[str, Entry]] = {}
    stack = [directory]
    while stack:
        current = stack.pop()
        try:
            found = current.storage.entries(current.path)
        except OSError:
            found = []
        listed[current.path] = {entry.name: entry for entry in found}
        stack.extend(current / entry.name for entry in found if entry.kind == DIRECTORY)
    return listed


def read_bytes(path: Location, *, what: str, max_bytes: int) -> bytes:
    """Reads a regular file that is not a link, refusing one larger than ``max_bytes``.

    Raises:
      ValueError: If the file is missing, a link, not a regular file, too large
        or unreadable; the message names the path and ``what`` it should hold.
    """
    return read_listed_bytes(path, path.entry(), what=what, max_bytes=max_bytes)


def read_listed_bytes(path: Location, entry: Entry | None, *, what: str, max_bytes: int) -> bytes:
    """``read_bytes`` of a file whose entry a walk found already (``None``: none there),
    without asking the storage after it again.

    Raises:
      As ``read_bytes``.
    """
    if entry is None:
        raise ValueError(f"{str(path)!r} is missing; it should hold {what}")
    if entry.kind == LINK:
        raise ValueError(f"{str(path)!r} ({what}) is a symbolic link; it is not followed")
    if entry.kind != FILE:
        raise ValueError(f"{str(path)!r} ({what}) is not a regular file")
    if entry.size > max_bytes:
        raise ValueError(
            f"{str(path)!r} ({what}) is {entry.size} bytes, implausibly large; "
            f"refusing to read more than {max_bytes}"
        )
    try:
        data = path.storage.read(path.path, max_bytes)
    except OSError as e:
        raise ValueError(f"cannot read {str(path)!r} ({what}): {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise ValueError(f"{str(path)!r} ({what}) grew past {max_bytes} bytes while being read")
    return data


def _depth_exceeds(value: Any, limit: int) -> bool:
    # Level by level over containers only: metadata holds hundreds of thousands of
    # scalars, which a walk of every value would visit one by one.
    level = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [
            child
            for item in level
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, dict | list)
        ]
    return False


def _loads(data: bytes) -> Any:
    """``json.loads`` of UTF-8 bytes, through msgspec where it gives the same value.

    msgspec parses these documents faster than the standard library (a third less
    time than orjson on a 10,000-leaf checkpoint's metadata) and keeps integers of
    any length exact, as ``json`` does. It is strict where the standard library is
    lenient: it refuses NaN and Infinity, lone surrogates and numbers beyond a
    double; those documents (and any other it refuses) are read by ``json`` as
    before, so what is accepted, refused and returned is the standard library's.
    Either parser refuses a nesting bomb; documents walked by later code are held
    to ``MAX_JSON_DEPTH`` after parsing.
    """
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return json.loads(data.decode("utf-8"))


def parse_json(data: bytes, *, path: Location, what: str, max_depth: int | None) -> Any:
    """Parses JSON bytes read from ``path``.

    Args:
      data: The bytes.
      path: Where they were read from, for messages.
      what: What the file should hold, for messages.
      max_depth: Deepest nesting accepted, for documents whose values are later
        walked or printed; ``None`` for metadata only picked apart field by field
        (the parser itself refuses a nesting bomb either way).

    Raises:
      ValueError: If the bytes are not UTF-8 JSON, or nest deeper than
        ``max_depth``; the message names the path and ``what`` it should hold.
    """
    try:
        with paused_gc():
            value = _loads(data)
    except RecursionError:
        raise ValueError(
            f"{str(path)!r} ({what}) nests too deeply to be checkpoint metadata"
        ) from None
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{str(path)!r} ({what}) is not valid JSON: {e}") from None
    if max_depth is not None and _depth_exceeds(value, max_depth):
        raise ValueError(
            f"{str(path)!r} ({what}) nests more than {max_depth} levels deep; "
            "it is not checkpoint metadata"
        )
    return value


def read_json(
    path: Location,
    *,
    what: str,
    max_bytes: int = MAX_SMALL_JSON_BYTES,
    max_depth: int | None = MAX_JSON_DEPTH,
) -> Any:
    """``read_bytes`` then ``parse_json``."""
    data = read_bytes(path, what=what, max_bytes=max_bytes)
    return parse_json(data, path=path, what=what, max_depth=max_depth)


def read_json_object(
    path: Location,
    *,
    what: str,
    max_bytes: int = MAX_SMALL_JSON_BYTES,
    max_depth: int | None = MAX_JSON_DEPTH,
) -> dict[str, Any]:
    """``read_json`` of a file that must hold a JSON object."""
    data = read_bytes(path, what=what, max_bytes=max_bytes)
    return parse_json_object(data, path=path, what=what, max_depth=max_depth)


def read_record(path: Location, *, what: str, format: str, max_bytes: int) -> dict[str, Any] | None:
    """The JSON object at ``path`` whose ``"format"`` is ``format``; None where there is
    none, it cannot be read or parsed, or it is another thing (a record tinax wrote for
    itself, whose absence or damage is never an error)."""
    try:
        record = read_json(path, what=what, max_bytes=max_bytes)
    except (ValueError, OSError):
        return None
    if not isinstance(record, dict) or record.get("format") != format:
        return None
    return record


def parse_json_object(
    data: bytes, *, path: Location, what: str, max_depth: int | None
) -> dict[str, Any]:
    """``parse_json`` of bytes that must hold a JSON object.

    Raises:
      ValueError: As ``parse_json``, or if the document is not an object.
    """
    value = parse_json(data, path=path, what=what, max_depth=max_depth)
    if not isinstance(value, dict):
        raise ValueError(
            f"{str(path)!r} ({what}) holds a JSON {type(value).__name__}, not an object"
        )
    return value
