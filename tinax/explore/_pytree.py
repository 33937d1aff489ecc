"""An Orbax pytree checkpointable as leaf records, from its metadata alone.

The tree comes from ``_METADATA``; each array's shape, dtype and chunking from its
zarr metadata (read in bulk, see ``_store``); strings from ``_strings.json``; shardings
from ``_sharding``. Array chunks are never read, except the few bytes of a scalar.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts

from tinax.explore import _files, _layout, _store
from tinax.explore._leaves import Leaf, format_sharding_record

_STRINGS_FILE = "_strings.json"
_SHARDING_FILE = "_sharding"
_OCDBT_MANIFEST = "manifest.ocdbt"
_SEQUENCE_KEY = 1
_DICT_KEY = 2

# Orbax value types, as the kinds the tables show.
_KINDS = {
    "jax.Array": "jax.Array",
    "np.ndarray": "np.ndarray",
    "scalar": "scalar",
    "string": "string",
    "None": "none",
    # Empty containers, which Orbax records as leaves.
    "Dict": "empty",
    "List": "empty",
    "Tuple": "empty",
    "NamedTuple": "empty",
}
ARRAY_KINDS = frozenset({"jax.Array", "np.ndarray", "scalar"})


@dataclasses.dataclass(frozen=True)
class StoredLeaf:
    """One entry of ``_METADATA``.

    Attributes:
      key: The leaf's key path in ``jax.tree_util.keystr`` format.
      param: Orbax's name for the stored array (key names joined by ``.``).
      kind: The table's kind for the leaf.
      stored: Whether Orbax stored data for it (not skipped on save).
    """

    key: str
    param: str
    kind: str
    stored: bool


@dataclasses.dataclass(frozen=True)
class PyTreeLayout:
    """How a pytree checkpointable is stored."""

    directory: Path
    leaves: tuple[StoredLeaf, ...]
    ocdbt: bool
    zarr3: bool
    all_chunks_stored: bool

    def find(self, key: object, *, name: str) -> StoredLeaf:
        """The leaf at ``key``.

        Raises:
          TypeError: If ``key`` is not a string.
          ValueError: If there is no such leaf.
        """
        if not isinstance(key, str):
            raise TypeError(f"key must be a str, got {type(key).__name__}")
        for leaf in self.leaves:
            if leaf.key == key:
                return leaf
        sample = [leaf.key for leaf in self.leaves[:5]]
        raise ValueError(
            f"checkpointable {name!r} at {str(self.directory)!r} has no leaf {key!r}; "
            f"keys look like {sample}"
        )

    def array_spec(self, leaf: StoredLeaf) -> dict[str, Any]:
        return _store.array_spec(
            self.directory,
            storage_path(leaf.param),
            ocdbt=self.ocdbt,
            zarr3=self.zarr3,
            all_chunks_stored=self.all_chunks_stored,
        )


def _key_and_param(key_metadata: object, where: str) -> tuple[str, str]:
    if not isinstance(key_metadata, list):
        raise ValueError(f"{where}: key_metadata is not a list")
    parts, names = [], []
    for item in key_metadata:
        if not isinstance(item, dict):
            raise ValueError(f"{where}: a key_metadata entry is not an object")
        name, key_type = item.get("key"), item.get("key_type")
        if not isinstance(name, str) or isinstance(key_type, bool):
            raise ValueError(f"{where}: a key is not a string")
        if key_type == _SEQUENCE_KEY:
            if not name.isdigit():
                raise ValueError(f"{where}: sequence key {name!r} is not an index")
            parts.append(f"[{int(name)}]")
        elif key_type == _DICT_KEY:
            parts.append(f"[{name!r}]")
        else:
            raise ValueError(f"{where}: unknown key_type {key_type!r}")
        names.append(name)
    param = ".".join(names)
    # Orbax stores the array under this name, "/" making directories (Haiku's module
    # names have them); refuse one that would climb out of the checkpointable.
    if param and any(part in ("", ".", "..") for part in param.split("/")):
        raise ValueError(f"{where}: stored name {param!r} is not a path within the checkpoint")
    return "".join(parts), param


def storage_path(param: str) -> str:
    """Where Orbax stores an array within the checkpointable (a root leaf at its top)."""
    return param + "/" if param else ""


def read_layout(directory: Path) -> PyTreeLayout:
    """Parses a pytree checkpointable's ``_METADATA``.

    Raises:
      ValueError: If ``_METADATA`` is missing, not JSON, or not Orbax's pytree
        metadata; the message names the file and what is wrong.
    """
    meta_file = directory / _layout.PYTREE_METADATA
    meta = _files.read_json_object(
        meta_file,
        what="Orbax pytree metadata",
        max_bytes=_files.MAX_METADATA_BYTES,
        max_depth=None,
    )
    tree = meta.get("tree_metadata")
    if not isinstance(tree, dict):
        raise ValueError(f"{str(meta_file)!r} has no tree_metadata object")
    leaves = []
    for entry_name, entry in tree.items():
        where = f"{str(meta_file)!r} entry {entry_name!r}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} is not an object")
        key, param = _key_and_param(entry.get("key_metadata"), where)
        value = entry.get("value_metadata")
        if not isinstance(value, dict) or not isinstance(value.get("value_type"), str):
            raise ValueError(f"{where} has no value_type")
        value_type: str = value["value_type"]
        leaves.append(
            StoredLeaf(
                key=key,
                param=param,
                kind=_KINDS.get(value_type) or value_type,
                stored=not value.get("skip_deserialize", False),
            )
        )
    has_manifest = (directory / _OCDBT_MANIFEST).is_file()
    ocdbt = meta.get("use_ocdbt")
    if not isinstance(ocdbt, bool):
        ocdbt = has_manifest
    if ocdbt and not has_manifest and any(leaf.kind in ARRAY_KINDS for leaf in leaves):
        # Tensorstore would read a store without its manifest as an empty one.
        raise ValueError(
            f"{str(directory)!r} has no {_OCDBT_MANIFEST}, so its arrays cannot be found"
        )
    zarr3 = meta.get("use_zarr3")
    return PyTreeLayout(
        directory=directory,
        leaves=tuple(leaves),
        ocdbt=ocdbt,
        zarr3=zarr3 is True,
        all_chunks_stored=meta.get("store_array_data_equal_to_fill_value") is True,
    )


@dataclasses.dataclass(frozen=True)
class ArrayInfo:
    """What an array's zarr metadata says."""

    shape: tuple[int, ...]
    dtype: str
    itemsize: int | None
    chunk_shape: tuple[int, ...] | None


def dtype_name(name: str) -> tuple[str, int | None]:
    """A stored dtype as NumPy names it, and its item size (``None`` if unknown)."""
    try:
        dtype = np.dtype(name)
    except TypeError:
        try:
            dtype = np.dtype(getattr(ts, name).numpy_dtype)
        except (AttributeError, TypeError):
            return name, None
    return dtype.name, dtype.itemsize


def _int_tuple(value: object) -> tuple[int, ...] | None:
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
    shape = _int_tuple(meta.get("shape"))
    raw_dtype = meta.get("data_type" if zarr3 else "dtype")
    if shape is None or not isinstance(raw_dtype, str):
        return None
    if zarr3:
        grid = meta.get("chunk_grid")
        chunks = None
        if isinstance(grid, dict) and isinstance(grid.get("configuration"), dict):
            chunks = _int_tuple(grid["configuration"].get("chunk_shape"))
        codecs = meta.get("codecs")
        # Orbax writes each shard with a sharding codec; its inner chunk is the unit read.
        if isinstance(codecs, list) and codecs and isinstance(codecs[0], dict):
            first = codecs[0]
            if first.get("name") == "sharding_indexed" and isinstance(
                first.get("configuration"), dict
            ):
                chunks = _int_tuple(first["configuration"].get("chunk_shape")) or chunks
    else:
        chunks = _int_tuple(meta.get("chunks"))
    dtype, itemsize = dtype_name(raw_dtype)
    return ArrayInfo(shape=shape, dtype=dtype, itemsize=itemsize, chunk_shape=chunks)


def _array_infos(
    layout: PyTreeLayout, params: Iterable[str], ctx: ts.Context
) -> dict[str, ArrayInfo]:
    suffix = "zarr.json" if layout.zarr3 else ".zarray"
    keys = {storage_path(param) + suffix: param for param in params}
    try:
        stored = _store.read_values(layout.directory, keys, ocdbt=layout.ocdbt, ctx=ctx)
    except ValueError as e:
        raise ValueError(
            f"cannot read the array metadata under {str(layout.directory)!r}: {_store.message(e)}"
        ) from None
    infos: dict[str, ArrayInfo] = {}
    parsed: dict[bytes, ArrayInfo | None] = {}
    for key, param in keys.items():
        if key not in stored:
            raise ValueError(
                f"array {param!r} under {str(layout.directory)!r} is missing: no {key} is stored"
            )
        data = stored[key]
        # Layers repeat: many arrays share byte-identical metadata.
        if data not in parsed:
            parsed[data] = parse_array_metadata(data, zarr3=layout.zarr3)
        info = parsed[data]
        if info is None:
            raise ValueError(
                f"array metadata {key} under {str(layout.directory)!r} is not valid zarr metadata"
            )
        infos[param] = info
    return infos


def _read_strings(layout: PyTreeLayout, params: list[str]) -> dict[str, str]:
    path = layout.directory / _STRINGS_FILE
    strings = _files.read_json_object(
        path, what="Orbax string leaves", max_bytes=_files.MAX_METADATA_BYTES, max_depth=None
    )
    out = {}
    for param in params:
        value = strings.get(param)
        if not isinstance(value, str):
            raise ValueError(f"{str(path)!r} holds no string for leaf {param!r}")
        out[param] = value
    return out


def _read_shardings(layout: PyTreeLayout, params: list[str]) -> dict[str, str]:
    path = layout.directory / _SHARDING_FILE
    if not path.exists():
        return {}
    stored = _files.read_json_object(
        path, what="Orbax array shardings", max_bytes=_files.MAX_METADATA_BYTES, max_depth=None
    )
    formatted: dict[str, str | None] = {}
    out = {}
    for param in params:
        record = stored.get(base64.b64encode(param.encode("utf-8")).decode("ascii"))
        if not isinstance(record, str):
            continue
        # Most arrays share one of a few shardings.
        if record not in formatted:
            try:
                formatted[record] = format_sharding_record(json.loads(record))
            except (ValueError, RecursionError):
                formatted[record] = None
        text = formatted[record]
        if text is not None:
            out[param] = text
    return out


def _scalar_values(
    layout: PyTreeLayout, leaves: list[StoredLeaf], ctx: ts.Context
) -> dict[str, Any]:
    opened = _store.open_arrays([layout.array_spec(leaf) for leaf in leaves], ctx)
    values: dict[str, Any] = {}
    try:
        reads = [
            (leaf, future.result().read()) for leaf, future in zip(leaves, opened, strict=True)
        ]
        for leaf, read in reads:
            values[leaf.param] = read.result().item()
    except ValueError as e:
        raise ValueError(
            f"cannot read the scalar leaves under {str(layout.directory)!r}: {_store.message(e)}"
        ) from None
    return values


def leaves(name: str, layout: PyTreeLayout, ctx: ts.Context, *, values: bool) -> list[Leaf]:
    """The table rows of one pytree checkpointable.

    Args:
      name: The checkpointable's name.
      layout: Its parsed ``_METADATA``.
      ctx: Tensorstore context for the reads.
      values: Whether to read scalar and string values.

    Raises:
      ValueError: If any metadata is missing or unreadable.
    """
    arrays = [leaf for leaf in layout.leaves if leaf.stored and leaf.kind in ARRAY_KINDS]
    infos = _array_infos(layout, [leaf.param for leaf in arrays], ctx)
    shardings = _read_shardings(
        layout, [leaf.param for leaf in layout.leaves if leaf.kind == "jax.Array"]
    )
    strings: dict[str, str] = {}
    scalars: dict[str, Any] = {}
    if values:
        string_params = [leaf.param for leaf in layout.leaves if leaf.kind == "string"]
        if string_params:
            strings = _read_strings(layout, string_params)
        scalar_leaves = [leaf for leaf in arrays if leaf.kind == "scalar"]
        if scalar_leaves:
            scalars = _scalar_values(layout, scalar_leaves, ctx)
    rows = []
    for leaf in layout.leaves:
        info = infos.get(leaf.param)
        if info is not None:
            size = math.prod(info.shape)
            rows.append(
                Leaf(
                    checkpointable=name,
                    key=leaf.key,
                    kind=leaf.kind,
                    shape=info.shape,
                    dtype=info.dtype,
                    size=size,
                    nbytes=None if info.itemsize is None else size * info.itemsize,
                    value=scalars.get(leaf.param),
                    sharding=shardings.get(leaf.param),
                    chunk_shape=info.chunk_shape,
                )
            )
        else:
            rows.append(Leaf(name, leaf.key, leaf.kind, value=strings.get(leaf.param)))
    return rows


def read_value(layout: PyTreeLayout, leaf: StoredLeaf, ctx: ts.Context) -> Any:
    """One leaf's value, reading only that leaf's stored bytes."""
    if leaf.kind == "string":
        return _read_strings(layout, [leaf.param])[leaf.param]
    if leaf.kind in ("none", "empty") or not leaf.stored:
        return None
    array = _store.open_arrays([layout.array_spec(leaf)], ctx)[0].result()
    value = array.read().result()
    return value.item() if leaf.kind == "scalar" else value
