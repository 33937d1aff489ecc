"""Google Cloud Storage (``gs://``) behind the storage interface, through gcsfs.

Credentials and endpoints are gcsfs's own: the standard Google environment
(``GOOGLE_APPLICATION_CREDENTIALS``, ``STORAGE_EMULATOR_HOST``, …) and fsspec's
``gcs`` configuration (``FSSPEC_GCS``, fsspec config files). tinax adds none, except
that listings are never served from gcsfs's cache: a run that is being written
must be listed as it is now.

An object store has no directories, links or renames: a "directory" is a key
prefix, a walk never meets a link, and Orbax commits a save by writing
``commit_success.txt`` last into the final directory (``commits_by_rename`` is
false). Every remote call has a deadline, so an unreachable endpoint or a
credential probe that never answers becomes an ``OSError`` naming the URL, not a
hang. ``snapshot`` lists a whole tree in one request per thousand objects, and
everything below it is then answered from that listing.

Imported only when a ``gs://`` path is used; gcsfs (the ``gcs`` extra) is imported on the
first call, and its absence is a ``ModuleNotFoundError`` saying what to install.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tinax._format.storage import gcs_listing
from tinax._format.storage.location import DIRECTORY, FILE, GCS_SCHEME, Entry, Location

# Seconds a listing, a metadata request or a small read may take, retries included.
# gcsfs retries transient failures with back-off; this bounds them all.
REQUEST_TIMEOUT = 15.0
# Reads of array data get this much longer per byte (a slow link still finishes).
_SECONDS_PER_BYTE = 1 / (4 * 1024 * 1024)

_T = TypeVar("_T")

# gcsfs (with aiohttp and Google's client libraries) comes with the gcs extra only.
INSTALL_HINT = "gs:// paths need gcsfs, installed with: pip install 'tinax[gcs]'"


def split_url(url: str) -> tuple[str, str]:
    """``(bucket, key)`` of a ``gs://`` URL, the key normalised (no ``.``, ``..`` or ``//``).

    Raises:
      ValueError: If the URL names no bucket, or its key climbs above the bucket.
    """
    rest = url[len(GCS_SCHEME) :]
    bucket, _, key = rest.partition("/")
    if not bucket or bucket in (".", ".."):
        raise ValueError(f"{url!r} names no bucket; write gs://BUCKET/PATH")
    parts: list[str] = []
    for part in key.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise ValueError(f"{url!r} climbs above its bucket")
            parts.pop()
            continue
        parts.append(part)
    return bucket, "/".join(parts)


def location(url: str) -> Location:
    """The ``Location`` of a ``gs://`` URL.

    Raises:
      ValueError: As for ``split_url``.
    """
    bucket, key = split_url(url)
    return Location(GCS, f"{bucket}/{key}" if key else bucket)


def _mtime_ns(info: dict[str, Any]) -> int | None:
    stamp = info.get("updated") or info.get("timeCreated")
    if not isinstance(stamp, str):
        return None
    try:
        # RFC 3339 with a trailing "Z", which fromisoformat reads since Python 3.11.
        moment = datetime.datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return int(moment.timestamp() * 1e9)


def _entry(name: str, info: dict[str, Any]) -> Entry:
    if info.get("type") == "directory":
        return Entry(name=name, kind=DIRECTORY)
    return _file_entry(name, info)


def _file_entry(name: str, info: dict[str, Any]) -> Entry:
    size = int(info.get("size") or 0)
    return Entry(
        name=name,
        kind=FILE,
        size=size,
        stamp=f"{size}:{info.get('generation', '')}:{info.get('updated', '')}",
        mtime_ns=_mtime_ns(info),
    )


class GcsStorage:
    """Google Cloud Storage. Paths are ``bucket/key`` without the scheme."""

    commits_by_rename = False
    implicit_directories = True
    parallel_reads = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fs: Any = None

    def filesystem(self) -> Any:
        """The gcsfs filesystem, made on first use from the standard configuration."""
        with self._lock:
            if self._fs is None:
                try:
                    import gcsfs
                except ImportError as e:
                    raise ModuleNotFoundError(INSTALL_HINT, name=e.name) from e

                # Listings must be current; fsspec's configuration supplies the rest.
                self._fs = gcsfs.GCSFileSystem(use_listings_cache=False)
            return self._fs

    def _call(self, path: str, what: str, action: Callable[[Any], _T], *, seconds: float) -> _T:
        """Runs ``action(fs)`` for ``path``, turning every failure into a clear ``OSError``."""
        url = self.url(path)
        try:
            fs = self.filesystem()
            return action(fs)
        except (FileNotFoundError, ImportError):
            raise
        except TimeoutError as e:
            raise TimeoutError(
                f"cannot {what} {url!r}: no answer from Google Cloud Storage within "
                f"{seconds:.0f} s (check the network, STORAGE_EMULATOR_HOST and credentials)"
            ) from e
        except Exception as e:
            reason = _reason(e)
            # gcsfs says "Forbidden" for HTTP 403.
            if isinstance(e, PermissionError) or reason.startswith("Forbidden"):
                raise PermissionError(
                    errno.EACCES, f"cannot {what} {url!r}: permission denied ({reason})"
                ) from e
            number = e.errno if isinstance(e, OSError) else None
            message = f"cannot {what} {url!r}: {reason}"
            raise (OSError(number, message) if number else OSError(message)) from e

    def url(self, path: str) -> str:
        return GCS_SCHEME + path

    def join(self, path: str, name: str) -> str:
        return f"{path.rstrip('/')}/{name}"

    def split(self, path: str) -> tuple[str, str]:
        if "/" not in path:
            return "", path
        parent, name = path.rsplit("/", 1)
        return parent, name

    def _missing(self, path: str) -> None:
        """Raises ``FileNotFoundError`` naming the bucket if it is not there or not visible."""
        bucket = path.split("/", 1)[0]

        def probe(fs: Any) -> bool:
            return bool(fs.exists(bucket, timeout=REQUEST_TIMEOUT))

        if not self._call(bucket, "reach", probe, seconds=REQUEST_TIMEOUT):
            raise FileNotFoundError(
                f"{self.url(path)!r}: bucket {bucket!r} does not exist or these "
                "credentials cannot see it"
            )

    def entry(self, path: str) -> Entry | None:
        try:
            info = self._call(
                path,
                "look at",
                lambda fs: fs.info(path, timeout=REQUEST_TIMEOUT),
                seconds=REQUEST_TIMEOUT,
            )
        except FileNotFoundError:
            self._missing(path)
            return None
        return _entry(self.split(path)[1], info)

    def entries(self, path: str) -> list[Entry]:
        def listing(fs: Any) -> list[dict[str, Any]]:
            return list(fs.ls(path, detail=True, timeout=REQUEST_TIMEOUT))

        found = self._call(path, "list", listing, seconds=REQUEST_TIMEOUT)
        prefix = path.rstrip("/") + "/"
        out = []
        for info in found:
            name = str(info["name"]).rstrip("/")
            if not name.startswith(prefix) or name == path:
                continue  # a directory marker object of ``path`` itself
            out.append(_entry(name[len(prefix) :], info))
        if not out and not found and self.entry(path) is None:
            raise FileNotFoundError(f"{self.url(path)!r} does not exist")
        return out

    def read(self, path: str, max_bytes: int) -> bytes:
        def fetch(fs: Any) -> bytes:
            return bytes(fs.cat_file(path, start=0, end=max_bytes + 1, timeout=seconds))

        seconds = REQUEST_TIMEOUT + max_bytes * _SECONDS_PER_BYTE
        return self._call(path, "read", fetch, seconds=seconds)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""

        def fetch(fs: Any) -> bytes:
            return bytes(fs.cat_file(path, start=offset, end=offset + length, timeout=seconds))

        seconds = REQUEST_TIMEOUT + length * _SECONDS_PER_BYTE
        return self._call(path, "read", fetch, seconds=seconds)

    def inside(self, target: str, root: str) -> bool:
        return target == root or target.startswith(root.rstrip("/") + "/")

    def kvstore(self, path: str) -> dict[str, Any]:
        bucket, _, key = path.partition("/")
        return {"driver": "gcs", "bucket": bucket, "path": key.rstrip("/") + "/" if key else ""}

    def remove_tree(self, path: str) -> None:
        def remove(fs: Any) -> None:
            with contextlib.suppress(FileNotFoundError):
                fs.rm(path, recursive=True, timeout=REQUEST_TIMEOUT)

        self._call(path, "remove", remove, seconds=REQUEST_TIMEOUT)

    def write_new(self, path: str, data: bytes) -> None:
        seconds = REQUEST_TIMEOUT + len(data) * _SECONDS_PER_BYTE
        self._call(
            path, "write", lambda fs: fs.pipe_file(path, data, timeout=seconds), seconds=seconds
        )

    def prefetch(self, paths: Sequence[str], max_bytes: int) -> None:
        """Nothing: only a snapshot keeps what it read."""

    def snapshot(self, path: str) -> Location:
        def listing(fs: Any) -> dict[str, dict[str, Any]]:
            # A large tree's pages are read side by side (``gcs_listing``).
            return gcs_listing.list_tree(fs, path, REQUEST_TIMEOUT)

        found = self._call(path, "list", listing, seconds=REQUEST_TIMEOUT)
        return Location(Snapshot(self, path, found), path)

    def pathlike(self, path: str) -> os.PathLike[str]:
        from etils import epath

        return epath.Path(self.url(path))


GCS = GcsStorage()


def _reason(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text.splitlines()[0] if text else type(error).__name__


# A snapshot keeps the metadata files it read, up to this much in all: the preflight,
# the restore verdict, Orbax's handlers and the tables then parse the same bytes,
# fetched once (a checkpoint of 50,000 leaves has some 30 MB of metadata).
_KEPT_FILE_BYTES = 64 * 1024 * 1024
_KEPT_TOTAL_BYTES = 256 * 1024 * 1024
# Files a prefetch asks for at once (each a round trip of its own): as many as the
# connections gcsfs's HTTP session keeps open.
_PREFETCH_BATCH = 100


class Snapshot(GcsStorage):
    """A tree under ``root`` as one listing found it; reads go to the bucket.

    Small files read through it are kept: a committed checkpoint's files never
    change, and what a check read is what the reader after it parses.

    Attributes:
      root: The path that was listed.
      tree: Every directory under ``root`` (itself included) → its entries by name.
    """

    def __init__(self, base: GcsStorage, root: str, objects: dict[str, dict[str, Any]]) -> None:
        super().__init__()
        self._fs = base.filesystem()
        self.root = root = root.rstrip("/")
        tree: dict[str, dict[str, Entry]] = {}
        for key, info in objects.items():
            name = str(info.get("name", key))
            marker = name.endswith("/")
            name = name.rstrip("/")
            if not name.startswith(root + "/"):
                if name == root and marker:
                    tree.setdefault(root, {})
                continue
            tree.setdefault(root, {})
            # Every prefix between root and the object is a directory.
            where = name
            while True:
                up, leaf = where.rsplit("/", 1)
                if where != name or marker:
                    tree.setdefault(up, {}).setdefault(leaf, Entry(leaf, DIRECTORY))
                    tree.setdefault(where, {})
                else:
                    tree.setdefault(up, {})[leaf] = _file_entry(leaf, info)
                if up == root:
                    break
                where = up
        self.tree = tree
        self._kept: dict[str, bytes] = {}
        self._kept_bytes = 0

    def read(self, path: str, max_bytes: int) -> bytes:
        with self._lock:
            kept = self._kept.get(path)
        if kept is not None:
            return kept[: max_bytes + 1]
        data = GcsStorage.read(self, path, max_bytes)
        # Only a whole file is kept (what was read is not past the cap).
        if len(data) <= min(max_bytes, _KEPT_FILE_BYTES):
            self._keep(path, data)
        return data

    def _keep(self, path: str, data: bytes) -> None:
        with self._lock:
            if path not in self._kept and self._kept_bytes + len(data) <= _KEPT_TOTAL_BYTES:
                self._kept[path] = data
                self._kept_bytes += len(data)

    def prefetch(self, paths: Sequence[str], max_bytes: int) -> None:
        """Reads the listed files of ``paths`` no larger than ``max_bytes`` side by side, and
        keeps them: the reads that follow are answered without a request each.

        What cannot be fetched is left for the read that asks for it to report.
        """
        wanted, sizes = [], []
        for path in dict.fromkeys(paths):
            entry = self.entry(path)
            with self._lock:
                kept = path in self._kept
            if (
                not kept
                and entry is not None
                and entry.kind == FILE
                and entry.size <= min(max_bytes, _KEPT_FILE_BYTES)
            ):
                wanted.append(path)
                sizes.append(entry.size)
        if not wanted:
            return
        # A deadline for each batch of requests made at once: a run of 1,000 checkpoints
        # is 10 of them, one after another.
        batches = -(-len(wanted) // _PREFETCH_BATCH)
        seconds = REQUEST_TIMEOUT * batches + sum(sizes) * _SECONDS_PER_BYTE

        def fetch(fs: Any) -> list[Any]:
            # Ranges, not ``cat``: a name is never taken for a pattern to expand.
            return list(
                fs.cat_ranges(
                    wanted,
                    [0] * len(wanted),
                    [None] * len(wanted),
                    batch_size=_PREFETCH_BATCH,
                    on_error="return",
                    timeout=seconds,
                )
            )

        try:
            found = self._call(wanted[0], "read", fetch, seconds=seconds)
        except OSError:
            return
        for path, data in zip(wanted, found, strict=True):
            if isinstance(data, bytes | bytearray):
                self._keep(path, bytes(data))

    def _within(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + "/")

    def entry(self, path: str) -> Entry | None:
        if not self._within(path):
            return GcsStorage.entry(self, path)
        if path in self.tree:
            return Entry(self.split(path)[1], DIRECTORY)
        parent, name = self.split(path)
        return self.tree.get(parent, {}).get(name)

    def entries(self, path: str) -> list[Entry]:
        if not self._within(path):
            return GcsStorage.entries(self, path)
        found = self.tree.get(path)
        if found is None:
            raise FileNotFoundError(f"{self.url(path)!r} is not a directory")
        return list(found.values())

    def snapshot(self, path: str) -> Location:
        if self._within(path):
            return Location(self, path)
        return GcsStorage.snapshot(self, path)
