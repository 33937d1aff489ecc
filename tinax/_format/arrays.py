"""Orbax's array store through tensorstore: bulk metadata reads and single-array opens.

Orbax writes a pytree checkpointable's arrays as zarr arrays in an OCDBT key-value
store (or, in older checkpoints, as plain zarr directories). Each array's zarr
metadata sits under ``<param>/`` in that store.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

import tensorstore as ts

from tinax._format.storage import Location

# B+tree nodes and array metadata are cached while one table is built; array
# chunks never are, so reading one leaf holds only that leaf's bytes.
_METADATA_CACHE_BYTES = 64 * 1024 * 1024
_METADATA_POOL = "cache_pool#tinax_metadata"


def context() -> ts.Context:
    """A fresh tensorstore context: metadata cached, array data not."""
    return ts.Context(
        {
            "cache_pool": {"total_bytes_limit": 0},
            _METADATA_POOL: {"total_bytes_limit": _METADATA_CACHE_BYTES},
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


def _walk_ocdbt(
    directory: Location, wanted: Collection[bytes], ctx: ts.Context
) -> dict[bytes, bytes]:
    """Values of ``wanted`` keys, read by walking the OCDBT B+tree a level at a time.

    Each level's nodes are requested at once, and Orbax keeps small values (array
    metadata among them) inline in the leaf nodes, so a whole checkpointable's
    metadata arrives in a few reads instead of one lookup per array.
    """
    base = ts.KvStore.open(directory.kvstore(), context=ctx).result()
    manifest = ts.ocdbt.dump(base, context=ctx).result()
    versions = manifest.get("versions") or []
    if not versions or "location" not in versions[-1].get("root", {}):
        return {}
    found: dict[bytes, bytes] = {}
    indirect: dict[bytes, str] = {}
    level: list[tuple[bytes, str]] = [(b"", versions[-1]["root"]["location"])]
    while level:
        pending = [(prefix, ts.ocdbt.dump(base, loc, context=ctx)) for prefix, loc in level]
        level = []
        for prefix, future in pending:
            for entry in future.result()["entries"]:
                if "location" in entry:
                    # Keys below an interior entry are stored relative to its prefix.
                    level.append(
                        (prefix + entry.get("subtree_common_prefix", b""), entry["location"])
                    )
                    continue
                key = prefix + entry["key"]
                if key not in wanted:
                    continue
                if "inline_value" in entry:
                    found[key] = entry["inline_value"]
                elif "indirect_value" in entry:
                    indirect[key] = entry["indirect_value"]
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
