"""A tree of objects under a prefix of a bucket, listed in a few round trips at once.

A page of Google Cloud Storage's object listing holds at most 1,000 objects, and each
page is a round trip (10-150 ms). Read one after another, the pages of a run of 1,000
checkpoints of some 40 objects each (40 pages) take seconds. So the first page is read
alone: a tree of up to 1,000 objects is then listed, in one request, as before. A larger
tree is cut at its top-level folders (a run's checkpoints) into groups of about a page
each, by the objects a folder holds on the first page; the folders are listed once
(one request for up to 1,000 of them) and the groups read side by side, each under the
longest prefix its folders share and within the range they span
(``prefix``/``startOffset``/``endOffset``). A tree of any size is listed in about three
round trips, for a few requests more than its pages one after another.

The objects are given as gcsfs's ``find(path, detail=True)`` gives them: the full name
(``bucket/key``) of each object under ``path`` (folder markers included) → its
information (``name``, ``size``, ``type``, ``generation``, ``updated``).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

# The most objects a listing page holds.
PAGE = 1_000
# Ranges read at once: no more than the connections gcsfs's HTTP session keeps open.
_AT_ONCE = 32
# Only what a listing is read for: the rest of each object's resource is not sent.
_FIELDS = "items(name,size,generation,updated),prefixes,nextPageToken"


def list_tree(fs: Any, path: str, timeout: float) -> dict[str, dict[str, Any]]:
    """Every object under ``path`` (``bucket/key``; a file at ``path`` is itself).

    Args:
      fs: A ``gcsfs.GCSFileSystem``.
      path: ``bucket/key`` without the scheme.
      timeout: Seconds the whole listing may take.
    """
    from fsspec.asyn import sync

    bucket, _, key = path.partition("/")
    prefix = key.strip("/") + "/" if key.strip("/") else ""
    found = sync(fs.loop, _tree, fs, bucket, prefix, timeout=timeout)
    if not found:
        # Nothing under it as a folder: a file, or nothing (gcsfs says which).
        return dict(fs.find(path, detail=True, timeout=timeout))
    listed: dict[str, dict[str, Any]] = {}
    for item in found:
        # Each item is made an object's info as gcsfs gives it, in place: a large
        # tree's tens of thousands of dictionaries are not built twice.
        name = item["name"] = f"{bucket}/{item['name']}"
        item["size"] = int(item.get("size") or 0)
        item["type"] = "file"
        listed[name] = item
    return listed


async def _page(fs: Any, bucket: str, **query: Any) -> dict[str, Any]:
    page: dict[str, Any] = await fs._call(
        "GET",
        "b/{}/o",
        bucket,
        json_out=True,
        fields=_FIELDS,
        maxResults=PAGE,
        **{k: v for k, v in query.items() if v is not None},
    )
    return page


async def _pages(
    fs: Any,
    bucket: str,
    prefix: str,
    *,
    start: str | None = None,
    end: str | None = None,
    token: str | None = None,
    delimiter: str = "",
) -> tuple[list[dict[str, Any]], list[str]]:
    """The objects (and, with a delimiter, the folders) of ``[start, end)``, page by page."""
    items: list[dict[str, Any]] = []
    folders: list[str] = []
    while True:
        page = await _page(
            fs,
            bucket,
            prefix=prefix or None,
            startOffset=start,
            endOffset=end,
            pageToken=token,
            delimiter=delimiter,
        )
        items.extend(page.get("items", []))
        folders.extend(page.get("prefixes", []))
        token = page.get("nextPageToken")
        if not token:
            return items, folders


def _folder(name: str, prefix: str) -> str | None:
    """The top-level folder (``prefix + part + "/"``) that object ``name`` is in."""
    part, slash, _ = name[len(prefix) :].partition("/")
    return prefix + part + "/" if slash else None


def _common_start(first: str, last: str) -> str:
    """The characters ``first`` and ``last`` begin with alike: every name sorted between
    them begins with them too. (Characters, not path parts: ``commonprefix``.)"""
    return os.path.commonprefix([first, last])  # noqa: RUF071


def _groups(folders: list[str], size: int) -> list[list[str]]:
    """``folders`` (sorted) cut into runs of at most ``size`` that each share as long a
    prefix as they can: cut where the names branch (``step_0004…`` | ``step_0005…``),
    the branches too small to fill a run put together."""
    if len(folders) <= size:
        return [folders] if folders else []
    shared = len(_common_start(folders[0], folders[-1]))
    groups: list[list[str]] = []
    pending: list[str] = []
    for _, branch in itertools.groupby(folders, key=lambda name: name[: shared + 1]):
        names = list(branch)
        if len(names) > size:
            if pending:
                groups.append(pending)
                pending = []
            groups.extend(_groups(names, size))
        elif len(pending) + len(names) <= size:
            pending += names
        else:
            if pending:
                groups.append(pending)
            pending = names
    if pending:
        groups.append(pending)
    return groups


async def _tree(fs: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    first = await _page(fs, bucket, prefix=prefix or None, delimiter="")
    items: list[dict[str, Any]] = first.get("items", [])
    token = first.get("nextPageToken")
    if not token:
        return items
    # Everything before the folder of the first page's last object is listed already.
    cut = _folder(items[-1]["name"], prefix)
    before = [item for item in items if cut is None or item["name"] < cut]
    folders = {_folder(item["name"], prefix) for item in before} - {None}
    if cut is None or not folders:
        # One folder fills the first page (or the tree has few): the pages in turn.
        rest, _ = await _pages(fs, bucket, prefix, token=token)
        return items + rest
    # The folders from the cut on (and the files beside them), and the folders read in
    # groups of about a page each.
    files, names = await _pages(fs, bucket, prefix, start=cut, delimiter="/")
    per_folder = len(before) / len(folders)
    # Folders differ in size: a group is sized to fill nine tenths of a page.
    size = max(1, int(0.9 * PAGE / max(per_folder, 1.0)))
    limit = asyncio.Semaphore(_AT_ONCE)

    async def read(group: list[str]) -> list[dict[str, Any]]:
        # Each group is asked for under the prefix its folders share: a bucket then
        # looks at those names alone (an emulator scans every name under the prefix
        # for each page it serves), and the range ends where its last folder does.
        start, last = group[0], group[-1]
        shared = _common_start(start, last)
        end = last[:-1] + chr(ord("/") + 1)
        async with limit:
            found, _ = await _pages(fs, bucket, shared, start=start, end=end)
        # Files beside the folders come from the folders' listing, once.
        return [item for item in found if _folder(item["name"], prefix) is not None]

    parts = await asyncio.gather(*(read(group) for group in _groups(sorted(names), size)))
    return before + files + [item for part in parts for item in part]
