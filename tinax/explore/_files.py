"""Reading a checkpoint's own files: bounded, never following a link out, never executing.

Everything tinax.explore reads from disk passes through here or through a directory
that ``scan`` has checked first. Metadata is JSON only (no pickle, no eval).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

# Orbax writes a few MiB of _METADATA per 10,000 leaves; refuse anything far beyond.
MAX_METADATA_BYTES = 256 * 1024 * 1024
# Checkpoint bookkeeping, iterator states and string leaves are small.
MAX_SMALL_JSON_BYTES = 16 * 1024 * 1024
# Orbax metadata and Grain iterator states nest a handful of levels; a deeper
# document is not one of them, and later code need not guard its recursion.
MAX_JSON_DEPTH = 100


@dataclasses.dataclass(frozen=True)
class Scan:
    """What ``scan`` found under a checkpoint directory.

    Attributes:
      nbytes: Total size of the regular files, in bytes.
      fingerprint: Digest of every entry's path, size, inode and modification
        time; it changes whenever anything under the directory does.
    """

    nbytes: int
    fingerprint: str


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def scan(directory: Path) -> Scan:
    """Walks ``directory`` without following links, checking that it is safe to read.

    Raises:
      ValueError: If a symbolic link points outside ``directory``, an entry is
        neither a regular file, a directory nor a link, or an entry cannot be
        read; the message names the entry.
    """
    real_root = os.path.realpath(directory)
    digest = hashlib.blake2b(digest_size=16)
    total = 0
    stack = [str(directory)]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as entries:
                found = sorted(entries, key=lambda e: e.name)
        except OSError as e:
            raise ValueError(f"cannot list {current!r}: {e.strerror or e}") from None
        for entry in found:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError as e:
                raise ValueError(f"cannot read {entry.path!r}: {e.strerror or e}") from None
            digest.update(
                f"{entry.path}\0{info.st_size}\0{info.st_ino}\0{info.st_mtime_ns}\n".encode(
                    "utf-8", "surrogateescape"
                )
            )
            if stat.S_ISLNK(info.st_mode):
                target = os.path.realpath(entry.path)
                if not _inside(target, real_root):
                    raise ValueError(
                        f"{entry.path!r} is a symbolic link to {target!r}, outside the "
                        f"checkpoint {str(directory)!r}; it is not followed"
                    )
                # A link within the checkpoint is counted where it points, not twice.
            elif stat.S_ISDIR(info.st_mode):
                stack.append(entry.path)
            elif stat.S_ISREG(info.st_mode):
                total += info.st_size
            else:
                raise ValueError(
                    f"{entry.path!r} is not a regular file or directory; "
                    "a checkpoint holds nothing else"
                )
    return Scan(nbytes=total, fingerprint=digest.hexdigest())


def read_bytes(path: Path, *, what: str, max_bytes: int) -> bytes:
    """Reads a regular file that is not a link, refusing one larger than ``max_bytes``.

    Raises:
      ValueError: If the file is missing, a link, not a regular file, too large
        or unreadable; the message names the path and ``what`` it should hold.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise ValueError(f"{str(path)!r} is missing; it should hold {what}") from None
    except OSError as e:
        raise ValueError(f"cannot read {str(path)!r} ({what}): {e.strerror or e}") from None
    if stat.S_ISLNK(info.st_mode):
        raise ValueError(f"{str(path)!r} ({what}) is a symbolic link; it is not followed")
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{str(path)!r} ({what}) is not a regular file")
    if info.st_size > max_bytes:
        raise ValueError(
            f"{str(path)!r} ({what}) is {info.st_size} bytes, implausibly large; "
            f"refusing to read more than {max_bytes}"
        )
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise ValueError(f"cannot read {str(path)!r} ({what}): {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise ValueError(f"{str(path)!r} ({what}) grew past {max_bytes} bytes while being read")
    return data


def _depth_exceeds(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def parse_json(data: bytes, *, path: Path, what: str, max_depth: int | None) -> Any:
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
        value = json.loads(data.decode("utf-8"))
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
    path: Path,
    *,
    what: str,
    max_bytes: int = MAX_SMALL_JSON_BYTES,
    max_depth: int | None = MAX_JSON_DEPTH,
) -> Any:
    """``read_bytes`` then ``parse_json``."""
    data = read_bytes(path, what=what, max_bytes=max_bytes)
    return parse_json(data, path=path, what=what, max_depth=max_depth)


def read_json_object(
    path: Path,
    *,
    what: str,
    max_bytes: int = MAX_SMALL_JSON_BYTES,
    max_depth: int | None = MAX_JSON_DEPTH,
) -> dict[str, Any]:
    """``read_json`` of a file that must hold a JSON object."""
    value = read_json(path, what=what, max_bytes=max_bytes, max_depth=max_depth)
    if not isinstance(value, dict):
        raise ValueError(
            f"{str(path)!r} ({what}) holds a JSON {type(value).__name__}, not an object"
        )
    return value
