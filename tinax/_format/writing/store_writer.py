"""A pytree checkpointable written in Orbax's layout, one array (and one box) at a time.

Orbax writes a whole pytree at once from host arrays it holds in memory. A
checkpoint made from other checkpoints (``tinax.checkpointing.derive_checkpoint``,
``average_checkpoints``) is written here instead, without JAX or Orbax, in exactly
the files Orbax writes, so that Orbax loads it as its own:

- the array store: zarr3 arrays in an OCDBT key-value store with Orbax's settings
  (inline values up to 1 KiB, one large B+tree node, a single-file manifest), each
  chunk a shard of one inner chunk, uncompressed, as tinax's saves store them;
- ``_METADATA`` (the tree: each leaf's keys and value type), ``_sharding`` (each
  array's sharding, as Orbax records it), ``array_metadatas/process_0`` (each
  array's write and chunk shapes, and a PRNG key's implementation), ``_strings.json``
  (string leaves);
- ``tinax_checksums/process_0.json``: the checksum of every value written, as a
  tinax save records it.

Boxes are written into a tensorstore transaction that is committed every
``BATCH_BYTES`` (one commit in flight while the next batch fills), so memory holds
at most two batches of written data whatever the size of the arrays. Each array's
zarr metadata is written into the same transactions as a plain value (the arrays
are opened assuming it), so a tree of ten thousand leaves costs no commit per leaf.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorstore as ts

from tinax._format.arraydata.chunks import Box
from tinax._format.integrity import checksums
from tinax._format.integrity.checksums import Bounds, LeafRecord, Piece
from tinax._format.metadata import arrays
from tinax._format.metadata.pytree import storage_path
from tinax._format.naming import names
from tinax._format.naming.keys import KeyPath, format_key
from tinax._format.storage import durable
from tinax._format.storage.location import Location
from tinax._format.writing import ocdbt_root, shards
from tinax._format.writing.treeplan import param_name

# Written data held by one transaction before it is committed.
BATCH_BYTES = 32 << 20
# Orbax's OCDBT settings (``tensorstore_utils._add_ocdbt_write_options``): array
# metadata inline in the tree, one large B+tree node, a single-file manifest.
_OCDBT_CONFIG = {
    "max_inline_value_bytes": 1024,
    "max_decoded_node_bytes": 100_000_000,
    "manifest_kind": "single",
    "compression": {"id": "zstd"},
}
# Orbax's data files: up to 2 GiB each (400 MiB on an object store).
_DATA_FILE_BYTES = 2**31
_OBJECT_STORE_DATA_FILE_BYTES = 400 * 2**20
# The value type Orbax gives a JAX array in ``_METADATA``.
_JAX_ARRAY = "jax.Array"
# Orbax's key types in ``key_metadata``.
_SEQUENCE_KEY = 1
_DICT_KEY = 2


def context() -> ts.Context:
    """The tensorstore context of a writer (and of the reads that feed it): the
    readers' settings, without a sync per file written (``durable`` syncs them)."""
    spec = arrays.context().spec.to_json()
    spec["file_io_sync"] = durable.TENSORSTORE_SYNC
    return ts.Context(spec)


def _orbax_entry_name(path: KeyPath) -> str:
    """The name Orbax gives a leaf's entry in ``tree_metadata``: its keys as a tuple."""
    return str(tuple(str(part) for part in path))


def _key_metadata(path: KeyPath) -> list[dict[str, Any]]:
    return [
        {"key": str(part), "key_type": _SEQUENCE_KEY if isinstance(part, int) else _DICT_KEY}
        for part in path
    ]


def zarr3_metadata(shape: Sequence[int], chunk: Sequence[int], dtype: np.dtype) -> dict[str, Any]:
    """The zarr3 metadata Orbax writes for an uncompressed array: each chunk a shard of
    one inner chunk, little-endian bytes, the shard index checked by CRC32C."""
    name = dtype.name
    fill: Any = 0.0 if (dtype.kind == "f" or name == "bfloat16" or name.startswith("float8")) else 0
    if dtype.kind == "b":
        fill = False
    elif dtype.kind == "c":
        fill = [0.0, 0.0]
    return {
        "chunk_grid": {"configuration": {"chunk_shape": list(chunk)}, "name": "regular"},
        "chunk_key_encoding": {"name": "default"},
        "codecs": [
            {
                "configuration": {
                    "chunk_shape": list(chunk),
                    "codecs": [{"configuration": {"endian": "little"}, "name": "bytes"}],
                    "index_codecs": [
                        {"configuration": {"endian": "little"}, "name": "bytes"},
                        {"name": "crc32c"},
                    ],
                },
                "name": "sharding_indexed",
            }
        ],
        "data_type": name,
        "fill_value": fill,
        "node_type": "array",
        "shape": list(shape),
        "zarr_format": 3,
    }


@dataclasses.dataclass
class _Array:
    key: str
    prefix: str
    metadata: dict[str, Any]
    shape: tuple[int, ...]
    dtype: np.dtype
    chunk: tuple[int, ...]
    store: Any = None  # tensorstore's zarr3 driver, opened for a box off the chunk grid


def _chunk_name(array: _Array, index: tuple[int, ...]) -> str:
    """The store key of ``array``'s chunk at grid ``index`` (zarr3's default encoding)."""
    return array.prefix + "/".join(["c", *map(str, index)])


class PyTreeWriter:
    """Writes one pytree checkpointable into a new directory.

    Leaves are added in the order they take in the tree (``add_empty``,
    ``add_string``, ``add_array``); an array's boxes are then written in any order
    (``write``) and its checksums given (``set_digests``). ``finish`` commits the
    last data and writes the metadata files; ``abort`` drops what is pending. The
    caller removes the directory if anything fails.

    Attributes:
      directory: The checkpointable's directory.
    """

    def __init__(self, directory: Location, ctx: ts.Context, *, batch_bytes: int = BATCH_BYTES):
        self.directory = directory
        self._ctx = ctx
        self._batch_bytes = batch_bytes
        data_file = (
            _DATA_FILE_BYTES
            if directory.storage.commits_by_rename
            else _OBJECT_STORE_DATA_FILE_BYTES
        )
        self._kvstore_spec: dict[str, Any] = {
            "driver": "ocdbt",
            "base": directory.kvstore(),
            "config": _OCDBT_CONFIG,
            "target_data_file_size": data_file,
            "assume_config": True,
        }
        self._kvstore = ts.KvStore.open(self._kvstore_spec, context=ctx).result()
        self._entries: dict[str, dict[str, Any]] = {}
        self._array_metadatas: list[dict[str, Any]] = []
        self._shardings: dict[str, str] = {}
        self._strings: dict[str, str] = {}
        self._records: dict[str, LeafRecord] = {}
        self._arrays: dict[str, _Array] = {}
        self._txn = ts.Transaction()
        self._pending = 0
        self._writes: list[Any] = []
        self._committing: Any = None
        self._sync = durable.BackgroundSync(directory)
        # Chunks stored on a local disk (``_put``): written into data files here, and
        # added to the store's B+tree once tensorstore has committed the rest.
        self._values = ocdbt_root.NewValues(directory, _DATA_FILE_BYTES)
        self._ring = ocdbt_root.BufferRing()

    # -- leaves ---------------------------------------------------------------------

    def _entry(self, path: KeyPath, value_metadata: dict[str, Any]) -> None:
        name = _orbax_entry_name(path)
        if name in self._entries:
            raise ValueError(f"{str(self.directory)!r}: leaf {format_key(path)} added twice")
        self._entries[name] = {
            "key_metadata": _key_metadata(path),
            "value_metadata": dict(value_metadata),
        }

    def add_empty(self, path: KeyPath, value_metadata: dict[str, Any]) -> None:
        """A leaf without stored data (``None``, an empty container or optax state)."""
        self._entry(path, value_metadata)

    def add_string(self, path: KeyPath, value_metadata: dict[str, Any], value: str) -> None:
        """A string leaf, with its checksum."""
        self._entry(path, value_metadata)
        self._strings[param_name(path)] = value
        self._records[format_key(path)] = LeafRecord(
            checksums.STRING, "", (), (Piece((), checksums.string_digest(value)),)
        )

    def add_array(
        self,
        path: KeyPath,
        value_metadata: dict[str, Any],
        *,
        shape: tuple[int, ...],
        dtype: np.dtype,
        chunk: tuple[int, ...],
        ext_metadata: Any = None,
        sharding: str | None = None,
        zarr_json: bytes | None = None,
    ) -> str:
        """An array (or a scalar, of ``shape`` ``()``) whose boxes ``write`` then writes.

        Args:
          path: Its key path in the tree.
          value_metadata: Orbax's value metadata for it (``value_type``…); its
            ``write_shape`` is set here for arrays.
          shape: Its shape.
          dtype: Its dtype as stored.
          chunk: The chunk shape it is stored with.
          ext_metadata: Orbax's extra array metadata (a PRNG key's implementation).
          sharding: Orbax's record of its sharding (a JSON text), if any.
          zarr_json: Its zarr metadata as stored by the checkpoint it is copied
            from, whose chunks ``write_stored`` then copies; by default the metadata
            of ``zarr3_metadata``, whose chunks ``write`` encodes.

        Returns:
          Its key (keystr), by which ``write`` and ``set_digests`` name it.
        """
        key = format_key(path)
        metadata = dict(value_metadata)
        if "write_shape" in metadata:
            metadata["write_shape"] = list(shape)
        self._entry(path, metadata)
        param = param_name(path)
        prefix = storage_path(param)
        if zarr_json is None:
            zarr = zarr3_metadata(shape, chunk, dtype)
            encoded = json.dumps(zarr, sort_keys=True, separators=(",", ":")).encode("utf-8")
        else:
            zarr, encoded = json.loads(zarr_json), zarr_json
        self._writes.append(
            self._kvstore.with_transaction(self._txn).write(prefix + names.ZARR3_METADATA, encoded)
        )
        self._arrays[key] = _Array(key, prefix, zarr, shape, dtype, chunk)
        # Orbax keeps these for JAX arrays only (NumPy arrays and scalars have none).
        if value_metadata.get("value_type") == _JAX_ARRAY:
            self._array_metadatas.append(
                {
                    "array_metadata": {
                        "param_name": param,
                        "write_shape": list(shape),
                        "chunk_shape": list(chunk),
                        "ext_metadata": ext_metadata,
                    }
                }
            )
        if sharding is not None:
            self._shardings[base64.b64encode(param.encode("utf-8")).decode("ascii")] = sharding
        return key

    def write(self, key: str, box: Box, values: np.ndarray) -> None:
        """Writes ``values`` at ``box`` of array ``key`` (copied: the caller may reuse them).

        A box of whole chunks (as ``streaming.plan_boxes`` plans them) is stored chunk
        by chunk as encoded values; any other goes through tensorstore's zarr3 driver.

        Raises:
          ValueError: If tensorstore refuses the write (its message).
        """
        array = self._arrays[key]
        values = np.asarray(values, dtype=array.dtype)
        if shards.aligned(box, array.chunk, array.shape):
            fill = None
            for index, part in shards.chunk_boxes(box, array.chunk):
                inner = tuple(
                    slice(p.start - b.start, p.stop - b.start)
                    for p, b in zip(part, box, strict=True)
                )
                chunk_values = values[inner] if inner else values
                if chunk_values.shape != array.chunk:
                    # zarr stores the chunks at an array's end whole, filled past it.
                    if fill is None:
                        fill = np.zeros(array.chunk, array.dtype)
                    padded = fill.copy()
                    padded[tuple(slice(0, n) for n in chunk_values.shape)] = chunk_values
                    chunk_values = padded
                self._put(_chunk_name(array, index), shards.encode_shard(chunk_values, self._ring))
            return
        target = self._zarr(array).with_transaction(self._txn)
        write = (target[box] if box else target).write(values)
        # Copied before returning: the caller may reuse ``values`` at once.
        write.copy.result()
        self._writes.append(write)
        self._pending += values.size * values.itemsize
        if self._pending >= self._batch_bytes:
            self._commit()

    def chunk_out(self, key: str, box: Box) -> shards.ChunkOut | None:
        """Room for ``box`` of array ``key``'s values in the bytes it is stored as, when
        ``box`` is one whole chunk: filled by the caller and given to ``write_out``, they
        are stored without another copy. None for any other box (``write`` it)."""
        array = self._arrays[key]
        shape = tuple(s.stop - s.start for s in box)
        if (
            shape != array.chunk
            or not shards.aligned(box, array.chunk, array.shape)
            or not shards.little_endian(array.dtype)
        ):
            return None
        count = math.prod(shape)
        lent = self._ring.lend(count * array.dtype.itemsize + shards.TRAILER_BYTES)
        values = np.frombuffer(lent.view, array.dtype, count).reshape(shape)
        index = tuple(s.start // c for s, c in zip(box, array.chunk, strict=True))
        return shards.ChunkOut(values, _chunk_name(array, index), lent)

    def write_out(self, out: shards.ChunkOut) -> None:
        """Stores a chunk ``chunk_out`` gave, its values filled in (and not touched after)."""
        shards.seal(out.lent, out.values.nbytes)
        self._put(out.name, out.lent)

    def link_files(self, paths: set[str]) -> None:
        """Has the stored chunks ``write_stored`` is given from these local data files
        referenced where they are, each file hard-linked into this store
        (``ocdbt_root.NewValues.link_files``), not copied."""
        self._values.link_files(paths)

    def write_stored(
        self,
        key: str,
        chunk_key: str,
        value: bytes | memoryview,
        origin: tuple[int, int] | None = None,
        source: tuple[str, int] | None = None,
    ) -> None:
        """Writes one stored chunk of array ``key`` as it is: ``value`` under its chunk
        key (``c/3/0``), the array added with the metadata the bytes were stored with.
        ``origin``: where the same bytes are in a local file (descriptor, offset), for
        the kernel to copy them from there onto a local disk. ``source``: that file's
        path and the offset, for a file ``link_files`` named, to reference them there.
        """
        self._put(self._arrays[key].prefix + chunk_key, value, origin, source)

    def _put(
        self,
        name: str,
        value: bytes | memoryview | ocdbt_root.Lent,
        origin: tuple[int, int] | None = None,
        source: tuple[str, int] | None = None,
    ) -> None:
        """Stores one chunk's bytes under ``name``: into this store's own data files on
        a local disk (added to its B+tree by ``finish``, with ``origin`` and ``source``
        as ``write_stored`` says); through tensorstore's transaction on an object
        store, or with too many keys for one B+tree node."""
        if (
            self.directory.is_local
            and len(self._arrays) <= ocdbt_root.MAX_ARRAYS
            and len(self._values.added) < ocdbt_root.MAX_ADDED
        ):
            self._values.append(name.encode("utf-8"), value, origin, source)
            return
        store = self._kvstore.with_transaction(self._txn)
        if isinstance(value, ocdbt_root.Lent):
            data = bytes(value.view)
            value.give_back()
        else:
            data = bytes(value)
        self._writes.append(store.write(name, data))
        self._pending += len(data)
        if self._pending >= self._batch_bytes:
            self._commit()

    def _zarr(self, array: _Array) -> Any:
        if array.store is None:
            array.store = ts.open(
                {
                    "driver": "zarr3",
                    "kvstore": {**self._kvstore_spec, "path": array.prefix},
                    "metadata": array.metadata,
                    # As Orbax writes: every chunk stored, zeros too, so that a missing
                    # chunk is damage (``store_array_data_equal_to_fill_value``).
                    "store_data_equal_to_fill_value": True,
                    "recheck_cached_data": False,
                    "recheck_cached_metadata": False,
                },
                assume_metadata=True,
                context=self._ctx,
            ).result()
        return array.store

    def set_digests(self, key: str, digests: dict[Bounds, str]) -> None:
        """The checksums of array ``key``'s pieces, as written."""
        array = self._arrays[key]
        self._records[key] = LeafRecord(
            checksums.ARRAY,
            str(array.dtype),
            array.shape,
            tuple(Piece(bounds, digest) for bounds, digest in digests.items()),
        )

    # -- commits --------------------------------------------------------------------

    def _commit(self) -> None:
        """Commits the writes so far; the next ones go into a new transaction."""
        # Copied into the transaction before it commits (and failures seen here).
        for write in self._writes:
            write.result() if not hasattr(write, "copy") else write.copy.result()
        self._writes = []
        if self._committing is not None:
            # One commit in flight at a time: memory holds at most two batches.
            self._committing.result()
            self._sync.written()
        self._committing = self._txn.commit_async()
        self._txn = ts.Transaction()
        self._pending = 0

    def finish(self, process_index: int = 0) -> None:
        """Commits the last writes and writes the metadata files, durably.

        Raises:
          ValueError: If a write failed (tensorstore's message), or an array has no
            checksums given.
          OSError: If a file cannot be written.
        """
        missing = sorted(set(self._arrays) - set(self._records))
        if missing:
            raise ValueError(f"arrays {missing[:5]} were written without their checksums")
        self._commit()
        self._committing.result()
        self._committing = None
        self._sync.written()
        self._sync.close()
        self._values.close()
        if self._values.added:
            ocdbt_root.add_version(self.directory, self._values.added)
        meta = {
            "tree_metadata": self._entries,
            "use_ocdbt": True,
            "use_zarr3": True,
            "store_array_data_equal_to_fill_value": True,
            "custom_metadata": None,
        }
        write = self._write_json
        write(self.directory / names.PYTREE_METADATA, meta)
        if self._strings:
            write(self.directory / names.STRINGS, self._strings)
        if self._shardings:
            write(self.directory / names.SHARDINGS, self._shardings)
        if self._array_metadatas:
            write(
                self.directory / names.ARRAY_METADATAS / f"process_{process_index}",
                {"array_metadatas": self._array_metadatas},
            )
        where = self.directory / names.CHECKSUMS_DIR / names.checksum_file_name(process_index)
        where.write_new(checksums.encode(self._records, process_index))

    @staticmethod
    def _write_json(where: Location, document: Any) -> None:
        where.write_new(json.dumps(document).encode("utf-8"))

    def abort(self) -> None:
        """Drops what has not been committed and waits for a commit in flight."""
        with contextlib.suppress(ValueError):  # already committed or aborted
            self._txn.abort()
        if self._committing is not None:
            # The caller reports the failure that made it abort.
            with contextlib.suppress(Exception):
                self._committing.result()
            self._committing = None
        with contextlib.suppress(OSError):
            self._sync.close()
        with contextlib.suppress(OSError):
            self._values.close()
