"""Orbax's array store through tensorstore: bulk metadata reads and single-array opens.

Orbax writes a pytree checkpointable's arrays as zarr arrays in an OCDBT key-value
store (or, in older checkpoints, as plain zarr directories). Each array's zarr
metadata sits under ``<param>/`` in that store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import posixpath
import re
import urllib.parse
from collections.abc import Collection, Iterator
from typing import Any

import tensorstore as ts

from tinax._format.storage import Location

# B+tree nodes and array metadata are cached while one table is built; array
# chunks never are, so reading one leaf holds only that leaf's bytes.
_METADATA_CACHE_BYTES = 64 * 1024 * 1024
_METADATA_POOL = "cache_pool#tinax_metadata"


# Object stores (gs://): a failed request is retried a few times, then reported. With
# tensorstore's defaults an endpoint that refuses every request is retried for minutes.
_GCS_RETRIES = {"max_retries": 4, "initial_delay": "0.5s", "max_delay": "4s"}


def context() -> ts.Context:
    """A fresh tensorstore context: metadata cached, array data not, retries bounded."""
    return ts.Context(
        {
            "cache_pool": {"total_bytes_limit": 0},
            _METADATA_POOL: {"total_bytes_limit": _METADATA_CACHE_BYTES},
            "gcs_request_retries": _GCS_RETRIES,
        }
    )


def kvstore_spec(directory: Location, *, ocdbt: bool, path: str = "") -> dict[str, Any]:
    """The kvstore Orbax wrote a checkpointable's arrays to, at ``path`` within it."""
    base = directory.kvstore()
    if ocdbt:
        return {"driver": "ocdbt", "base": base, "cache_pool": _METADATA_POOL, "path": path}
    return {**base, "path": base["path"] + path}


_SPEC_SUFFIX = re.compile(r"\s*\[tensorstore_spec=.*\]\s*$", re.DOTALL)


def message(error: BaseException) -> str:
    """A tensorstore error's message without the spec it appends."""
    return _SPEC_SUFFIX.sub("", str(error))


@dataclasses.dataclass(frozen=True)
class ValueRef:
    """Where an OCDBT store keeps a value out of line: a byte range of one of its files.

    Attributes:
      file: The file's path relative to the store's directory (``ocdbt.process_0/d/…``).
      offset: Where the value starts in the file.
      length: Its length in bytes.
      location: OCDBT's own reference to it, as ``ts.ocdbt.dump`` takes it.
    """

    file: str
    offset: int
    length: int
    location: str


def parse_location(location: str) -> ValueRef:
    """The file and byte range of an OCDBT location ``<kind>:<base>:<file>:<offset>:<length>``.

    Raises:
      ValueError: If ``location`` is not of that form, or names a file outside the store.
    """
    parts = location.split(":")
    if len(parts) != 5 or not (parts[3].isdigit() and parts[4].isdigit()):
        raise ValueError(
            f"OCDBT location {location!r} is not <kind>:<base>:<file>:<offset>:<length>"
        )
    file = urllib.parse.unquote(parts[1]) + urllib.parse.unquote(parts[2])
    if not file or file.startswith("/") or ".." in posixpath.normpath(file).split("/"):
        raise ValueError(f"OCDBT location {location!r} names a file outside its store")
    return ValueRef(file=file, offset=int(parts[3]), length=int(parts[4]), location=location)


def _root_location(base: Any, ctx: ts.Context) -> str | None:
    manifest = ts.ocdbt.dump(base, context=ctx).result()
    versions = manifest.get("versions") or []
    if not versions or "location" not in versions[-1].get("root", {}):
        return None
    location: str = versions[-1]["root"]["location"]
    return location


def walk_ocdbt(
    directory: Location, ctx: ts.Context, *, nodes: list[str] | None = None
) -> Iterator[tuple[bytes, bytes | str]]:
    """Every key of the OCDBT store in ``directory``, with its inline value or location.

    The B+tree is read a level at a time, each level's nodes requested at once.
    Orbax keeps small values (array metadata among them) inline in the leaf
    nodes, so a whole checkpointable's keys arrive in a few reads.

    Args:
      directory: The store's directory (holding ``manifest.ocdbt``).
      ctx: The tensorstore context.
      nodes: If given, the location of every B+tree node read is appended to it.

    Yields:
      ``(key, value)``: ``bytes`` for a value kept inline, else its location text.

    Raises:
      ValueError: If the manifest or a node cannot be read or decoded.
    """
    base = ts.KvStore.open(directory.kvstore(), context=ctx).result()
    root = _root_location(base, ctx)
    if root is None:
        return
    level: list[tuple[bytes, str]] = [(b"", root)]
    while level:
        pending = [(prefix, loc, ts.ocdbt.dump(base, loc, context=ctx)) for prefix, loc in level]
        level = []
        for prefix, loc, future in pending:
            if nodes is not None:
                nodes.append(loc)
            for entry in future.result()["entries"]:
                if "location" in entry:
                    # Keys below an interior entry are stored relative to its prefix.
                    level.append(
                        (prefix + entry.get("subtree_common_prefix", b""), entry["location"])
                    )
                elif "inline_value" in entry:
                    yield prefix + entry["key"], entry["inline_value"]
                elif "indirect_value" in entry:
                    yield prefix + entry["key"], entry["indirect_value"]


def _walk_ocdbt(
    directory: Location, wanted: Collection[bytes], ctx: ts.Context
) -> dict[bytes, bytes]:
    """Values of ``wanted`` keys, read by walking the OCDBT B+tree (see ``walk_ocdbt``)."""
    base = ts.KvStore.open(directory.kvstore(), context=ctx).result()
    found: dict[bytes, bytes] = {}
    indirect: dict[bytes, str] = {}
    for key, value in walk_ocdbt(directory, ctx):
        if key not in wanted:
            continue
        if isinstance(value, bytes):
            found[key] = value
        else:
            indirect[key] = value
    values = {key: ts.ocdbt.dump(base, loc, context=ctx) for key, loc in indirect.items()}
    for key, future in values.items():
        found[key] = future.result()
    return found


def read_values(
    directory: Location, keys: Collection[str], *, ocdbt: bool, ctx: ts.Context
) -> dict[str, bytes]:
    """The stored bytes of ``keys`` (relative to ``directory``), read concurrently.

    Keys that are not stored are absent from the result.

    Raises:
      ValueError: If the store cannot be opened or read.
    """
    wanted = {key.encode("utf-8"): key for key in keys}
    found: dict[bytes, bytes] = {}
    if ocdbt and wanted:
        try:
            found = _walk_ocdbt(directory, wanted, ctx)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            # The walk reads OCDBT's dumped node format; whatever it could not
            # make sense of is read below through the ordinary key lookup, which
            # also reports a damaged store properly.
            found = {}
    missing = [key for key in wanted if key not in found]
    if missing:
        store = ts.KvStore.open(kvstore_spec(directory, ocdbt=ocdbt), context=ctx).result()
        futures = [(key, store.read(key)) for key in missing]
        for key, future in futures:
            result = future.result()
            if result.state == "value":
                found[key] = result.value
    return {wanted[key]: value for key, value in found.items()}


def array_spec(
    directory: Location,
    path: str,
    *,
    ocdbt: bool,
    zarr3: bool,
    all_chunks_stored: bool,
) -> dict[str, Any]:
    """The tensorstore spec that opens the array stored at ``path`` within ``directory``."""
    spec: dict[str, Any] = {
        "driver": "zarr3" if zarr3 else "zarr",
        "kvstore": kvstore_spec(directory, ocdbt=ocdbt, path=path),
        "recheck_cached_metadata": False,
        "recheck_cached_data": False,
    }
    if all_chunks_stored:
        # Orbax stored every chunk, so a missing one is damage, not fill value.
        spec["fill_missing_data_reads"] = False
    return spec


def open_arrays(specs: list[dict[str, Any]], ctx: ts.Context) -> list[Any]:
    """Opens the arrays for reading, all at once; returns their futures."""
    return [ts.open(spec, context=ctx, read=True) for spec in specs]


# What a walk of a store's B+tree may raise where it cannot make sense of a node.
_WALK_ERRORS = (ValueError, KeyError, TypeError, IndexError, AttributeError)


def _walk_level(
    base: Any,
    nodes: list[tuple[bytes, Any]],
    wanted: Collection[bytes],
    found: dict[bytes, Any],
    ctx: ts.Context,
) -> list[tuple[bytes, str]]:
    """Takes the ``wanted`` keys of one B+tree level's nodes (their pending dumps) into
    ``found``; returns the nodes of the level below."""
    below: list[tuple[bytes, str]] = []
    for prefix, future in nodes:
        for entry in future.result()["entries"]:
            if "location" in entry:
                # Keys below an interior entry are stored relative to its prefix.
                below.append((prefix + entry.get("subtree_common_prefix", b""), entry["location"]))
                continue
            key = prefix + entry["key"]
            if key in wanted:
                if "inline_value" in entry:
                    found[key] = entry["inline_value"]
                elif "indirect_value" in entry:
                    found[key] = ts.ocdbt.dump(base, entry["indirect_value"], context=ctx)
    return below


def read_values_of_stores(
    requests: list[tuple[Location, Collection[str]]], *, ocdbt: list[bool], ctx: ts.Context
) -> list[dict[str, bytes] | ValueError]:
    """``read_values`` of several stores, for each its values or its refusal.

    The OCDBT B+trees of every store are walked together, a level at a time, with
    every store's nodes of that level requested at once: a run of a thousand small
    checkpoints is read in a few rounds of concurrent reads instead of a thousand
    rounds of sequential ones. A store the walk cannot make sense of, or in which
    it misses a key, is read by ``read_values`` alone, which reports damage properly.
    """
    wanted = [{key.encode("utf-8"): key for key in keys} for _, keys in requests]
    opening = {
        i: ts.KvStore.open(directory.kvstore(), context=ctx)
        for i, ((directory, _), in_ocdbt) in enumerate(zip(requests, ocdbt, strict=True))
        if in_ocdbt and wanted[i]
    }
    bases: dict[int, Any] = {}
    for i, future in opening.items():
        with contextlib.suppress(*_WALK_ERRORS):
            bases[i] = future.result()
    manifests: dict[int, Any] = {i: ts.ocdbt.dump(base, context=ctx) for i, base in bases.items()}
    found: dict[int, dict[bytes, Any]] = {}
    level: dict[int, list[tuple[bytes, Any]]] = {}
    for i, future in manifests.items():
        with contextlib.suppress(*_WALK_ERRORS):
            versions = future.result().get("versions") or []
            found[i] = {}
            if versions and "location" in versions[-1].get("root", {}):
                level[i] = [(b"", versions[-1]["root"]["location"])]
    while level:
        pending = {
            i: [(prefix, ts.ocdbt.dump(bases[i], loc, context=ctx)) for prefix, loc in nodes]
            for i, nodes in level.items()
        }
        level = {}
        for i, nodes in pending.items():
            try:
                below = _walk_level(bases[i], nodes, wanted[i], found[i], ctx)
            except _WALK_ERRORS:
                del found[i]
                continue
            if below:
                level[i] = below
    out: list[dict[str, bytes] | ValueError] = []
    for i, ((directory, keys), in_ocdbt) in enumerate(zip(requests, ocdbt, strict=True)):
        values = found.get(i)
        try:
            if values is not None and len(values) == len(wanted[i]):
                out.append(
                    {
                        wanted[i][key]: value if isinstance(value, bytes) else value.result()
                        for key, value in values.items()
                    }
                )
                continue
        except _WALK_ERRORS:
            pass
        # Not walked, or keys missed by the walk: the ordinary lookup says what is there.
        try:
            out.append(read_values(directory, keys, ocdbt=in_ocdbt, ctx=ctx))
        except ValueError as e:
            out.append(e)
    return out
