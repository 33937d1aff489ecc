"""Copying a committed checkpoint's files to ``gs://``: many large requests at once.

``transfer.copy_files`` to a bucket (gcsfs, the ``gcs`` extra). A file of up to
``SINGLE_UPLOAD_BYTES`` is one request; a larger one a resumable upload in chunks of
``CHUNK_BYTES``, the next chunk read while one is sent; one larger than
``COMPOSITE_BYTES`` is uploaded as parts side by side, which the bucket then composes
into one object (the parts are deleted after). The CRC32C of the bytes read is
compared with the one the bucket computed of what it stored (each object, each part),
so bytes damaged on the way are an error, never a checkpoint. File data read and not
yet acknowledged is at most ``IN_FLIGHT_BYTES``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import errno
import math
import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from tinax._format.naming import names
from tinax._format.storage.copied_files import SourceFile, changed, open_regular, within
from tinax._format.storage.location import Location

# gs://: a file (or part) of up to this size is sent in one request; a larger one as a
# resumable upload in chunks of ``CHUNK_BYTES`` (a multiple of 256 KiB, as the bucket
# wants), the next chunk read while one is sent.
SINGLE_UPLOAD_BYTES = 64 << 20
CHUNK_BYTES = 64 << 20
# gs://: a file larger than this is uploaded as parts of about ``PART_BYTES`` side by
# side and composed (a resumable upload is one stream, which a large file would wait on).
COMPOSITE_BYTES = 1 << 30
PART_BYTES = 256 << 20
# gs://: file data read and not yet acknowledged by the bucket, at most.
IN_FLIGHT_BYTES = 256 << 20
# gs://: requests made at once, at most.
MAX_REQUESTS = 64
# gs://: how many objects one compose request joins (Google's limit).
COMPOSE_SOURCES = 32
# gs://: seconds a request may take beyond the time its bytes need at this rate.
_REQUEST_SECONDS = 30.0
_SECONDS_PER_BYTE = 1 / (4 * 1024 * 1024)


# -- to gs:// -------------------------------------------------------------------------------


def _crc32c(data: bytes) -> str:
    """The CRC32C of ``data`` as Cloud Storage writes it (base64 of the big-endian value)."""
    import google_crc32c

    return _crc_text(google_crc32c.Checksum(data))


def _crc_text(checksum: Any) -> str:
    return base64.b64encode(checksum.digest()).decode("ascii")


def _read_range(path: str, offset: int, length: int) -> bytes:
    """``length`` bytes of ``path`` from ``offset`` (on a worker thread).

    Raises:
      OSError: If the file is shorter than that (it changed since it was listed).
    """
    fd = open_regular(path)
    try:
        data = os.pread(fd, length, offset)
        while len(data) < length:
            more = os.pread(fd, length - len(data), offset + len(data))
            if not more:
                raise changed(path, offset + length, offset + len(data))
            data += more
        return data
    finally:
        os.close(fd)


class _Budget:
    """Bytes of file data that may be held at once (made inside the event loop)."""

    def __init__(self, total: int) -> None:
        self._free = total
        self._total = total
        self._changed = asyncio.Condition()

    async def take(self, nbytes: int) -> int:
        nbytes = min(nbytes, self._total)
        async with self._changed:
            await self._changed.wait_for(lambda: self._free >= nbytes)
            self._free -= nbytes
        return nbytes

    async def give(self, nbytes: int) -> None:
        async with self._changed:
            self._free += nbytes
            self._changed.notify_all()


class _Stopped(Exception):
    """An upload not made because another failed first."""


@dataclasses.dataclass
class _Upload:
    """What one copy to a bucket shares: the filesystem, where, and its limits."""

    fs: Any
    bucket: str
    prefix: str
    budget: _Budget
    requests: asyncio.Semaphore
    # Set once an upload has failed: no request starts after it.
    failed: bool = False

    def url(self, key: str) -> str:
        return f"gs://{self.bucket}/{key}"

    async def request(
        self, key: str, what: str, nbytes: int, call: Any, *, cleanup: bool = False
    ) -> Any:
        """Runs one request, with a deadline, its failure an ``OSError`` naming ``key``.

        Raises:
          _Stopped: If another upload has failed (``call`` is not made), unless the
            request cleans up (``cleanup``: a deletion).
        """
        seconds = _REQUEST_SECONDS + nbytes * _SECONDS_PER_BYTE
        async with self.requests:
            if self.failed and not cleanup:
                call.close()
                raise _Stopped(key)
            try:
                return await asyncio.wait_for(call, seconds)
            except TimeoutError as e:
                raise TimeoutError(
                    f"cannot {what} {self.url(key)!r}: no answer within {seconds:.0f} s"
                ) from e
            except OSError:
                raise
            except Exception as e:
                raise OSError(f"cannot {what} {self.url(key)!r}: {e}") from e

    async def read(self, path: str, offset: int, length: int) -> tuple[bytes, int]:
        """Bytes of ``path`` read within the budget; give back the count it returns."""
        held = await self.budget.take(length)
        try:
            return await asyncio.to_thread(_read_range, path, offset, length), held
        except BaseException:
            await self.budget.give(held)
            raise

    async def send(self, key: str, path: str, offset: int, length: int) -> None:
        """Uploads ``length`` bytes of ``path`` from ``offset`` as the object ``key``, in
        one request up to ``SINGLE_UPLOAD_BYTES``, else as a resumable upload in chunks
        (the next chunk read while one is sent), checking that the bucket stored what
        was read."""
        if length <= SINGLE_UPLOAD_BYTES:
            data, held = await self.read(path, offset, length)
            try:
                crc = await asyncio.to_thread(_crc32c, data)
                stored = await self.request(key, "upload", length, self._media(key, data))
            finally:
                await self.budget.give(held)
            _check_stored(self.url(key), stored, length, crc)
            return
        await self._resumable(key, path, offset, length)

    async def _media(self, key: str, data: bytes) -> Any:
        """Stores ``data`` as the object ``key`` in one request whose body is the bytes
        alone (an upload of type ``media``): no copy of them is made to wrap them with
        the object's metadata, which it does not need (its name is in the query)."""
        return await self.fs._call(
            "POST",
            f"{self.fs._location}/upload/storage/v1/b/{quote(self.bucket)}/o",
            uploadType="media",
            name=key,
            data=data,
            headers={"Content-Type": "application/octet-stream"},
            json_out=True,
        )

    async def _resumable(self, key: str, path: str, offset: int, length: int) -> None:
        import google_crc32c
        from gcsfs.core import initiate_upload, upload_chunk

        session = await self.request(
            key, "start the upload of", 0, initiate_upload(self.fs, self.bucket, key)
        )
        checksum = google_crc32c.Checksum()
        sent = 0
        ahead: asyncio.Future[tuple[bytes, int]] | None = asyncio.ensure_future(
            self.read(path, offset, min(CHUNK_BYTES, length))
        )
        stored: Any = None
        try:
            while ahead is not None:
                data, held = await ahead
                ahead = None
                try:
                    await asyncio.to_thread(checksum.update, data)
                    following = sent + len(data)
                    if following < length:
                        ahead = asyncio.ensure_future(
                            self.read(
                                path, offset + following, min(CHUNK_BYTES, length - following)
                            )
                        )
                    stored = await self.request(
                        key,
                        "upload",
                        len(data),
                        upload_chunk(
                            self.fs, session, data, sent, length, "application/octet-stream"
                        ),
                    )
                finally:
                    await self.budget.give(held)
                sent = following
        except BaseException:
            if ahead is not None:
                ahead.cancel()
                with contextlib.suppress(BaseException):
                    _, held = await ahead
                    await self.budget.give(held)
            with contextlib.suppress(Exception):
                await self.fs._call("DELETE", session)
            raise
        _check_stored(self.url(key), stored, length, _crc_text(checksum))

    async def compose(self, key: str, sources: list[str]) -> dict[str, Any]:
        """Joins ``sources`` (objects of the bucket) into ``key``; the new object."""
        body = {
            "kind": "storage#composeRequest",
            "sourceObjects": [{"name": name} for name in sources],
            "destination": {"name": key, "bucket": self.bucket},
        }
        call = self.fs._call(
            "POST",
            "b/{}/o/{}/compose",
            self.bucket,
            key,
            headers={"Content-Type": "application/json"},
            json=body,
            json_out=True,
        )
        found: dict[str, Any] = await self.request(key, "compose", 0, call)
        return found

    async def delete(self, key: str) -> None:
        await self.request(key, "delete", 0, self.fs._rm_file(f"{self.bucket}/{key}"), cleanup=True)


def _check_stored(url: str, stored: object, size: int, crc: str | None) -> None:
    """Refuses an upload the bucket did not store as it was read."""
    if not isinstance(stored, dict):
        raise OSError(errno.EIO, f"{url!r}: the bucket did not describe the object it stored")
    found_size = int(stored.get("size") or -1)
    if found_size != size:
        raise OSError(errno.EIO, f"{url!r} arrived as {found_size} bytes, {size} were sent")
    if crc is not None and stored.get("crc32c") != crc:
        raise OSError(
            errno.EIO,
            f"{url!r} arrived corrupt: the bucket stored CRC32C {stored.get('crc32c')!r}, "
            f"the bytes read have {crc!r}",
        )


async def _upload_file(upload: _Upload, source: Location, listed: SourceFile) -> None:
    key = (
        "/".join((upload.prefix, *listed.relative)) if upload.prefix else "/".join(listed.relative)
    )
    path = within(source, listed.relative).path
    if listed.size <= COMPOSITE_BYTES:
        await upload.send(key, path, 0, listed.size)
        return
    # A composite object has at most COMPOSE_SOURCES ** 2 parts: larger parts for a
    # larger file (whole chunks).
    count = min(math.ceil(listed.size / PART_BYTES), COMPOSE_SOURCES**2)
    part = math.ceil(listed.size / count / CHUNK_BYTES) * CHUNK_BYTES
    count = math.ceil(listed.size / part)
    parts = [f"{key}{names.UPLOAD_PART_SUFFIX}{i}" for i in range(count)]
    made = list(parts)
    try:
        await asyncio.gather(
            *(
                upload.send(name, path, i * part, min(part, listed.size - i * part))
                for i, name in enumerate(parts)
            )
        )
        level = parts
        depth = 0
        while len(level) > COMPOSE_SOURCES:
            groups = [level[i : i + COMPOSE_SOURCES] for i in range(0, len(level), COMPOSE_SOURCES)]
            joined = [f"{key}{names.UPLOAD_PART_SUFFIX}{depth}-{j}" for j in range(len(groups))]
            made.extend(joined)
            await asyncio.gather(
                *(upload.compose(n, g) for n, g in zip(joined, groups, strict=True))
            )
            level, depth = joined, depth + 1
        stored = await upload.compose(key, level)
        # Every part's CRC32C was checked as it landed; the bucket joins them itself.
        _check_stored(upload.url(key), stored, listed.size, None)
    finally:
        # The parts go whatever happened; a kill leaves them inside the promotion's
        # directory, which is removed as a whole.
        await asyncio.gather(*(upload.delete(name) for name in made), return_exceptions=True)


def copy_to_bucket(source: Location, files: Sequence[SourceFile], destination: Location) -> None:
    import fsspec.asyn

    from tinax._format.storage import gcs

    fs = gcs.GCS.filesystem()
    bucket, _, prefix = destination.path.partition("/")

    async def run() -> None:
        upload = _Upload(
            fs,
            bucket,
            prefix.rstrip("/"),
            _Budget(IN_FLIGHT_BYTES),
            asyncio.Semaphore(MAX_REQUESTS),
        )
        tasks = [asyncio.ensure_future(_upload_file(upload, source, f)) for f in files]
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        if all(task.exception() is None for task in done) and len(done) == len(tasks):
            return
        # After the first failure no request starts, and the failure is raised once
        # every request made has been answered. None is cancelled: a request cut short
        # here may still be stored by the bucket, after the caller has removed what was
        # copied, and stay there.
        upload.failed = True
        ended = await asyncio.gather(*tasks, return_exceptions=True)
        errors = [e for e in ended if isinstance(e, BaseException) and not isinstance(e, _Stopped)]
        raise errors[0]

    fsspec.asyn.sync(fs.loop, run)
