"""Orbax's array store through tensorstore: bulk metadata reads, zarr metadata parsing and
single-array opens.

Orbax writes a pytree checkpointable's arrays as zarr arrays in an OCDBT key-value
store (or, in older checkpoints, as plain zarr directories). Each array's zarr
metadata sits under ``<param>/`` in that store; ``parse_array_metadata`` reads what
it claims (shape, dtype, chunking, codecs) without trusting it.

(Over 500 lines: the bulk reads of many stores, the single-store fallback that words
their damage, and the zarr parsing they feed share one record of an array and one set
of messages; split, each half would import the other.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import posixpath
import re
import struct
import urllib.parse
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any

from tinax._format.metadata import layout
from tinax._format.naming.dtypes import numpy_dtype as numpy_dtype
from tinax._format.storage.location import Location

if TYPE_CHECKING:
    pass

if TYPE_CHECKING:
    import tensorstore as ts

# B+tree nodes and array metadata are cached while one table is built; array
# chunks never are, so reading one leaf holds only that leaf's bytes.
_METADATA_CACHE_BYTES = 64 * 1024 * 1024
_METADATA_POOL = "cache_pool#tinax_metadata"


# Object stores (gs://): a failed request is retried a few times, then reported. With
# tensorstore's defaults an endpoint that refuses every request is retried for minutes.
_IO_CONCURRENCY = 16
_COPY_CONCURRENCY = max(4, os.cpu_count() or 1)
_GCS_RETRIES = {"max_retries": 4, "initial_delay": "0.5s", "max_delay": "4s"}


def context_of(checkpoint: layout.Checkpoint) -> ts.Context:
    """The tensorstore context every read of the opened ``checkpoint`` shares, made the
    first time it is asked for and kept on it: the B+tree nodes and array metadata one
    reader reads are in its cache for the next, so no file is read twice for them."""
    return checkpoint.kept(("tensorstore context",), context)


def context() -> ts.Context:
    """A fresh tensorstore context: metadata cached, array data not, retries bounded."""
    import tensorstore as ts

    return ts.Context(
        {
            # Reads of many chunks at once: tensorstore's defaults (the core count)
            # leave a 2-core machine reading one or two chunks at a time.
            "file_io_concurrency": {"limit": _IO_CONCURRENCY},
            "data_copy_concurrency": {"limit": _COPY_CONCURRENCY},
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


def _little_bytes_codec(codec: object) -> bool:
    if not isinstance(codec, dict) or codec.get("name") != "bytes":
        return False
    config = codec.get("configuration") or {}
    return isinstance(config, dict) and config.get("endian", "little") == "little"


# What ``inline_scalar`` says of an array that is not 0-d (not read at all).
NOT_0D = object()


def inline_scalar(metadata: bytes, chunk: bytes | None) -> Any:
    """The value of a zarr3 scalar whose one chunk is stored inline in an OCDBT B+tree
    (``walk_ocdbt`` gives both), as Orbax stores small ones: ``NOT_0D`` for an array
    that is not 0-d; ``None`` when the array is not such a scalar (the caller then
    reads it through tensorstore)."""
    import numpy as np

    try:
        meta = json.loads(metadata)
    except (ValueError, RecursionError):
        return None
    if isinstance(meta, dict) and isinstance(meta.get("shape"), list) and meta["shape"]:
        return NOT_0D
    if not isinstance(meta, dict) or meta.get("zarr_format") != 3 or meta.get("shape") != []:
        return None
    try:
        dtype = numpy_dtype(str(meta.get("data_type")))
    except TypeError:
        return None
    if dtype.kind not in "iufbV" or dtype.names is not None:
        return None
    codecs = meta.get("codecs")
    if not isinstance(codecs, list) or len(codecs) != 1:
        return None
    codec = codecs[0]
    if chunk is None:
        fill = meta.get("fill_value")
        return dtype.type(fill) if isinstance(fill, int | float) else None
    if _little_bytes_codec(codec):
        data = chunk
    elif isinstance(codec, dict) and codec.get("name") == "sharding_indexed":
        config = codec.get("configuration") or {}
        inner, index = config.get("codecs"), config.get("index_codecs")
        if not (
            isinstance(inner, list)
            and len(inner) == 1
            and _little_bytes_codec(inner[0])
            and isinstance(index, list)
            and len(index) == 2
            and _little_bytes_codec(index[0])
            and index[1] == {"name": "crc32c"}
            and config.get("index_location", "end") == "end"
            and len(chunk) >= 20
        ):
            return None
        offset, nbytes = struct.unpack("<QQ", chunk[-20:-4])
        if offset == nbytes == 2**64 - 1:
            fill = meta.get("fill_value")
            return dtype.type(fill) if isinstance(fill, int | float) else None
        if offset + nbytes > len(chunk) - 20:
            return None
        data = chunk[offset : offset + nbytes]
    else:
        return None
    if len(data) != dtype.itemsize:
        return None
    return np.frombuffer(data, dtype=dtype)[0]


def _root_location(base: Any, ctx: ts.Context) -> str | None:
    import tensorstore as ts

    manifest = ts.ocdbt.dump(base, context=ctx).result()
    versions = manifest.get("versions") or []
    if not versions or "location" not in versions[-1].get("root", {}):
        return None
    location: str = versions[-1]["root"]["location"]
    return location


# CRC-32C (Castagnoli: reflected, polynomial 0x82F63B78), as zarr3's crc32c codec and
# OCDBT's B+tree nodes append it.
_CRC32C_TABLE: list[int] = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC32C_TABLE.append(_c)
# Bytes up to which the table is used: beyond, tensorstore's codec is faster.
_CRC32C_TABLE_BYTES = 4096


def crc32c(data: bytes) -> int:
    """The CRC-32C of ``data``: by a table for a few bytes (a shard's index), else by
    tensorstore (a zarr3 chunk of the bytes stored in memory with its crc32c codec,
    which appends it), at C speed whatever the size (a B+tree node)."""
    import numpy as np
    import tensorstore as ts

    if len(data) <= _CRC32C_TABLE_BYTES:
        crc = 0xFFFFFFFF
        for byte in data:
            crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
        return crc ^ 0xFFFFFFFF
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "memory"},
        "metadata": {
            "shape": [len(data)],
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [len(data)]}},
            "chunk_key_encoding": {"name": "default"},
            "data_type": "uint8",
            "codecs": [{"name": "bytes"}, {"name": "crc32c"}],
            "fill_value": 0,
        },
        "store_data_equal_to_fill_value": True,
        "create": True,
    }
    array = ts.open(spec).result()
    array.write(np.frombuffer(data, np.uint8)).result()
    kvstore = array.kvstore
    assert kvstore is not None  # a zarr3 array opened on a kvstore
    stored = kvstore.read("c/0").result().value
    if len(stored) != len(data) + 4:
        raise AssertionError("tensorstore's crc32c codec stored an unexpected chunk")
    return int(struct.unpack("<I", stored[-4:])[0])


@dataclasses.dataclass(frozen=True)
class StoreWalk:
    """An OCDBT store as one walk of its B+tree found it.

    Attributes:
      values: Every key, with its inline value (``bytes``) or its location (text).
      nodes: The location of every B+tree node read.
    """

    values: dict[bytes, bytes | str]
    nodes: tuple[str, ...]


def walk_ocdbt(directory: Location, ctx: ts.Context) -> StoreWalk:
    """Every key of the OCDBT store in ``directory``, walked now (``_walk_ocdbt_store``).

    A reader of an opened checkpoint walks it through its layout, which keeps the walk
    on the checkpoint (``pytree.PyTreeLayout.walk_store``).

    Raises:
      ValueError: If the manifest or a node cannot be read or decoded.
    """
    nodes: list[str] = []
    values = dict(_walk_ocdbt_store(directory, ctx, nodes=nodes))
    return StoreWalk(values, tuple(nodes))


def _walk_ocdbt_store(
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
    import tensorstore as ts

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
    directory: Location,
    wanted: Collection[bytes],
    ctx: ts.Context,
    sizes: dict[str, int] | None = None,
    walk: StoreWalk | None = None,
) -> dict[bytes, bytes]:
    """Values of ``wanted`` keys, read by walking the OCDBT B+tree (see ``walk_ocdbt``),
    or from ``walk`` where the caller has walked it already.

    ``sizes``, if given, receives the stored bytes of every other key, summed by the
    directory of each wanted key (``w/zarr.json`` → ``w/``): an array's chunks.
    """
    import tensorstore as ts

    found: dict[bytes, bytes] = {}
    indirect: dict[bytes, str] = {}
    owners = {key[: key.rfind(b"/") + 1] for key in wanted}
    walked = walk_ocdbt(directory, ctx) if walk is None else walk
    for key, value in walked.values.items():
        if sizes is not None and key not in wanted:
            owner = _owner(key, owners)
            if owner is not None:
                length = len(value) if isinstance(value, bytes) else _length(value)
                name = owner.decode("utf-8", "replace")
                sizes[name] = sizes.get(name, 0) + length
        if key not in wanted:
            continue
        if isinstance(value, bytes):
            found[key] = value
        else:
            indirect[key] = value
    if indirect:
        base = ts.KvStore.open(directory.kvstore(), context=ctx).result()
        values = {key: ts.ocdbt.dump(base, loc, context=ctx) for key, loc in indirect.items()}
        for key, future in values.items():
            found[key] = future.result()
    return found


def _owner(key: bytes, owners: Collection[bytes]) -> bytes | None:
    """The longest of ``owners`` (directories, ``b""`` the root) that ``key`` lies in,
    when what follows is a chunk key (``c/0/1``, ``0.1``)."""
    cut = len(key)
    while cut > 0:
        cut = key.rfind(b"/", 0, cut)
        prefix = key[: cut + 1] if cut >= 0 else b""
        if prefix in owners and _CHUNK_KEY.fullmatch(key[len(prefix) :]):
            return prefix
        if cut < 0:
            return None
    return None


_CHUNK_KEY = re.compile(rb"c(?:[/.]\d+)*|\d+(?:[/.]\d+)*")


def _length(location: str) -> int:
    parts = location.split(":")
    return int(parts[4]) if len(parts) == 5 and parts[4].isdigit() else 0


def read_values(
    directory: Location,
    keys: Collection[str],
    *,
    ocdbt: bool,
    ctx: ts.Context,
    sizes: dict[str, int] | None = None,
    walk: StoreWalk | None = None,
) -> dict[str, bytes]:
    """The stored bytes of ``keys`` (relative to ``directory``), read concurrently.

    Keys that are not stored are absent from the result. ``sizes``, if given, is
    filled (OCDBT stores only, when their B+tree could be walked) with the stored
    bytes of the chunks under each key's directory. ``walk`` is the store's walk, if
    the caller has made it.

    Raises:
      ValueError: If the store cannot be opened or read.
    """
    import tensorstore as ts

    wanted = {key.encode("utf-8"): key for key in keys}
    found: dict[bytes, bytes] = {}
    if ocdbt and wanted:
        try:
            found = _walk_ocdbt(directory, wanted, ctx, sizes, walk)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            if sizes is not None:
                sizes.clear()
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
    import tensorstore as ts

    return [ts.open(spec, context=ctx, read=True) for spec in specs]


# -- zarr metadata ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ArrayInfo:
    """What an array's zarr metadata says.

    Attributes:
      shape: The array's shape.
      dtype: Its dtype, as NumPy names it.
      itemsize: Bytes per element (``None`` for a dtype NumPy does not know).
      chunk_shape: The unit the store decodes: zarr3's inner chunk, zarr2's chunk.
      grid_shape: The unit the store keeps under one key: zarr3's shard (the
        chunk grid's shape), zarr2's chunk.
      compressed: Whether a codec may store fewer bytes than it decodes to
        (``False`` only for codec chains known to be byte for byte).
    """

    shape: tuple[int, ...]
    dtype: str
    itemsize: int | None
    chunk_shape: tuple[int, ...] | None
    grid_shape: tuple[int, ...] | None = None
    compressed: bool = True


def dtype_name(name: str) -> tuple[str, int | None]:
    """A stored dtype as NumPy names it, and its item size (``None`` if unknown)."""
    import numpy as np
    import tensorstore as ts

    try:
        dtype = np.dtype(name)
    except TypeError:
        try:
            dtype = np.dtype(getattr(ts, name).numpy_dtype)
        except (AttributeError, TypeError):
            return name, None
    return dtype.name, dtype.itemsize


def int_tuple(value: object) -> tuple[int, ...] | None:
    """A list of non-negative integers as a tuple; ``None`` for anything else."""
    if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        return tuple(value)
    return None


def parse_array_metadata(data: bytes, *, zarr3: bool) -> ArrayInfo | None:
    """Shape, dtype and chunk shape from a ``zarr.json`` or ``.zarray``; ``None`` if garbled."""
    try:
        meta = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(meta, dict):
        return None
    shape = int_tuple(meta.get("shape"))
    raw_dtype = meta.get("data_type" if zarr3 else "dtype")
    if shape is None or not isinstance(raw_dtype, str):
        return None
    if zarr3:
        grid = meta.get("chunk_grid")
        chunks = None
        if isinstance(grid, dict) and isinstance(grid.get("configuration"), dict):
            chunks = int_tuple(grid["configuration"].get("chunk_shape"))
        grid_shape = chunks
        codecs = meta.get("codecs")
        # Orbax writes each shard with a sharding codec; its inner chunk is the unit read.
        if isinstance(codecs, list) and codecs and isinstance(codecs[0], dict):
            first = codecs[0]
            if first.get("name") == "sharding_indexed" and isinstance(
                first.get("configuration"), dict
            ):
                chunks = int_tuple(first["configuration"].get("chunk_shape")) or chunks
        compressed = _zarr3_compressed(codecs)
    else:
        chunks = grid_shape = int_tuple(meta.get("chunks"))
        compressed = meta.get("compressor") is not None or bool(meta.get("filters"))
    dtype, itemsize = dtype_name(raw_dtype)
    return ArrayInfo(shape, dtype, itemsize, chunks, grid_shape, compressed)


# zarr3 codecs that store exactly the bytes they decode to (plus a fixed-size suffix).
_PLAIN_CODECS = frozenset({"bytes", "transpose", "crc32c"})


def _zarr3_compressed(codecs: object) -> bool:
    """Whether a zarr3 codec chain (shards' inner chains included) may compress."""
    if not isinstance(codecs, list):
        return True
    for codec in codecs:
        if not isinstance(codec, dict):
            return True
        name, config = codec.get("name"), codec.get("configuration")
        if name == "sharding_indexed" and isinstance(config, dict):
            if _zarr3_compressed(config.get("codecs")):
                return True
        elif name not in _PLAIN_CODECS:
            return True
    return False


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
    import tensorstore as ts

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


# Stores of at most this many wanted keys are read by looking each key up: opening the
# store and one lookup cost less than a walk of its B+tree (a run of one-leaf checkpoints).
_LOOKUP_KEYS = 8


def _look_up(
    requests: list[tuple[Location, Collection[str]]], ocdbt: list[bool], ctx: ts.Context
) -> dict[int, dict[str, bytes] | ValueError]:
    """``read_values`` of the OCDBT stores of few keys among ``requests``, by index: every
    store opened at once, then every key of every store looked up at once."""
    import tensorstore as ts

    few = [
        i
        for i, ((_, keys), in_ocdbt) in enumerate(zip(requests, ocdbt, strict=True))
        if in_ocdbt and 0 < len(keys) <= _LOOKUP_KEYS
    ]
    opening = {
        i: ts.KvStore.open(kvstore_spec(requests[i][0], ocdbt=True), context=ctx) for i in few
    }
    reading: dict[int, list[tuple[str, Any]]] = {}
    for i, future in opening.items():
        with contextlib.suppress(*_WALK_ERRORS):
            store = future.result()
            reading[i] = [(key, store.read(key)) for key in dict.fromkeys(requests[i][1])]
    out: dict[int, dict[str, bytes] | ValueError] = {}
    for i in few:
        try:
            values = {}
            for key, read in reading[i]:
                result = read.result()
                if result.state == "value":
                    values[key] = result.value
            out[i] = values
        except _WALK_ERRORS:
            # Not opened or not read: read alone, in its own words.
            try:
                out[i] = read_values(requests[i][0], requests[i][1], ocdbt=True, ctx=ctx)
            except ValueError as e:
                out[i] = e
    return out


def read_values_of_stores(
    requests: list[tuple[Location, Collection[str]]], *, ocdbt: list[bool], ctx: ts.Context
) -> list[dict[str, bytes] | ValueError]:
    """``read_values`` of several stores, for each its values or its refusal.

    The OCDBT B+trees of every store are walked together, a level at a time, with
    every store's nodes of that level requested at once: a run of a thousand small
    checkpoints is read in a few rounds of concurrent reads instead of a thousand
    rounds of sequential ones. A store the walk cannot make sense of, or in which
    it misses a key, is read by ``read_values`` alone, which reports damage properly.
    Stores of a few keys are not walked: every one is opened at once and its keys
    looked up (``_look_up``), as ``read_values`` would look them up.
    """
    import tensorstore as ts

    wanted = [{key.encode("utf-8"): key for key in keys} for _, keys in requests]
    looked_up = _look_up(requests, ocdbt, ctx)
    opening = {
        i: ts.KvStore.open(directory.kvstore(), context=ctx)
        for i, ((directory, _), in_ocdbt) in enumerate(zip(requests, ocdbt, strict=True))
        if in_ocdbt and wanted[i] and i not in looked_up
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
        if i in looked_up:
            out.append(looked_up[i])
            continue
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
