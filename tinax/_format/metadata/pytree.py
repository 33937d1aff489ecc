"""An Orbax pytree checkpointable, from its metadata alone.

(Over 500 lines: ``_METADATA``'s typed decoding and the layout it gives belong
together, and the readers of strings, shardings and scalars share that layout.)

A pytree of an opened checkpoint (``layout.Checkpoint``) is read through it: its
layout parsed once, its ``_strings.json`` and ``_sharding`` read once, its array
store walked once, each kept on the checkpoint for every later reader.

The tree comes from ``_METADATA``; each array's shape, dtype and chunking from its
zarr metadata (read in bulk, see ``arrays``); strings from ``_strings.json``;
shardings from ``_sharding``. Array chunks are never read, except the few bytes of a
scalar or the one array asked for.
"""

from __future__ import annotations

import base64
import codecs
import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from tinax._format.metadata import arrays, budget
from tinax._format.metadata.arrays import ArrayInfo, parse_array_metadata
from tinax._format.metadata.layout import StoredCheckpointable
from tinax._format.naming import names, words
from tinax._format.naming.keys import KeyPart, KeyPath
from tinax._format.storage import files
from tinax._format.storage.location import FILE, Entry, Location

if TYPE_CHECKING:
    import tensorstore as ts

# Orbax's key types in ``key_metadata``.
_SEQUENCE_KEY = 1
_DICT_KEY = 2

# Orbax value types, as the kinds the tables show.
_KINDS = {
    "jax.Array": words.JAX_ARRAY,
    "np.ndarray": words.NUMPY_ARRAY,
    "scalar": words.SCALAR,
    "string": words.STRING,
    # None and empty containers, which Orbax records as leaves it skips.
    "None": words.EMPTY,
    "Dict": words.EMPTY,
    "List": words.EMPTY,
    "Tuple": words.EMPTY,
    "NamedTuple": words.EMPTY,
    "Unknown": words.EMPTY,
}


class StoredLeaf(NamedTuple):
    """One entry of ``_METADATA``.

    A named tuple rather than a dataclass: a checkpoint of tens of thousands of
    leaves makes one per leaf, and a tuple is made several times faster.

    Attributes:
      path: The leaf's key path.
      key: The leaf's key path in ``jax.tree_util.keystr`` format.
      param: Orbax's name for the stored array (key names joined by ``.``).
      kind: The table's kind for the leaf.
      stored: Whether Orbax stored data for it (not skipped on save).
    """

    path: KeyPath
    key: str
    param: str
    kind: str
    stored: bool


@dataclasses.dataclass(frozen=True)
class PyTreeLayout:
    """How a pytree checkpointable is stored.

    Attributes:
      directory: The checkpointable's directory.
      leaves: Its leaves, in stored order.
      ocdbt: Whether its arrays are in an OCDBT store.
      zarr3: Whether they are zarr3 arrays.
      all_chunks_stored: Whether every chunk is stored, even one of fill values.
      item: The checkpointable of an opened checkpoint this is, through which its
        other files are read (once, kept on it); ``None`` for a pytree read without
        one (a checkpoint being written, or one Orbax's handler reads).
    """

    directory: Location
    leaves: tuple[StoredLeaf, ...]
    ocdbt: bool
    zarr3: bool
    all_chunks_stored: bool
    item: StoredCheckpointable | None = dataclasses.field(default=None, compare=False, repr=False)

    def read_json(self, name: str, *, what: str) -> Any:
        """The JSON document of its file ``name`` (metadata: size-capped, no depth walk),
        through its opened checkpoint where it has one.

        Raises:
          ValueError: If the file is missing, too large or not JSON, naming it.
        """
        where = self.directory / name
        if self.item is not None:
            return self.item.checkpoint.read_json(
                where, what=what, max_bytes=files.MAX_METADATA_BYTES, max_depth=None
            )
        return files.read_json(where, what=what, max_bytes=files.MAX_METADATA_BYTES, max_depth=None)

    def context(self) -> ts.Context:
        """The tensorstore context its reads share: its opened checkpoint's
        (``arrays.context_of``), else a fresh one."""
        if self.item is None:
            return arrays.context()
        return arrays.context_of(self.item.checkpoint)

    def has_file(self, name: str) -> bool:
        """Whether its directory holds ``name`` (as its checkpoint's walk found it)."""
        return name in self.entries(self.directory)

    def entries(self, where: Location) -> dict[str, Entry]:
        """The entries of ``where`` (its directory or one below it): as its opened
        checkpoint's walk found them, else listed now."""
        if self.item is not None:
            return self.item.checkpoint.entries(where)
        return where.entries()

    def walk_store(self, ctx: ts.Context) -> arrays.StoreWalk:
        """Its OCDBT store's keys, values and B+tree nodes (``arrays.walk_ocdbt``):
        walked once and kept on its opened checkpoint.

        Raises:
          ValueError, KeyError, TypeError: As the walk raises them.
        """
        if self.item is None:
            return arrays.walk_ocdbt(self.directory, ctx)
        return self.item.checkpoint.kept(
            ("ocdbt walk", self.directory.path), lambda: arrays.walk_ocdbt(self.directory, ctx)
        )

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
        """The tensorstore spec that opens ``leaf``'s array."""
        return arrays.array_spec(
            self.directory,
            storage_path(leaf.param),
            ocdbt=self.ocdbt,
            zarr3=self.zarr3,
            all_chunks_stored=self.all_chunks_stored,
        )


class _KeyItem(msgspec.Struct, frozen=True, gc=False):
    """One entry of a leaf's ``key_metadata``: a key's name and Orbax's key type."""

    key: str
    key_type: int


class _ValueMetadata(msgspec.Struct, gc=False):
    """A leaf's ``value_metadata``, as far as the tables read it."""

    value_type: str
    skip_deserialize: bool = False


class _Entry(msgspec.Struct, gc=False):
    """One leaf of ``tree_metadata``."""

    key_metadata: list[_KeyItem]
    value_metadata: _ValueMetadata


class _Metadata(msgspec.Struct, gc=False):
    """Orbax's pytree ``_METADATA``; fields the tables do not read are skipped."""

    tree_metadata: dict[str, _Entry]
    use_ocdbt: Any = None
    use_zarr3: Any = None
    store_array_data_equal_to_fill_value: Any = None


_METADATA_DECODER = msgspec.json.Decoder(_Metadata)


_METADATA_WHAT = "Orbax pytree metadata"


def _decode_metadata(meta_file: Location, data: bytes) -> _Metadata:
    """``_METADATA`` decoded into typed records.

    A document Orbax wrote decodes straight into them, without the dict per key
    and per leaf a generic parse makes. Any other document (a wrong type, JSON
    only the standard library accepts, a parse error) is read the generic way,
    which accepts and refuses exactly what it did before, with its messages.

    Raises:
      ValueError: If the file is missing, too large, not JSON or not Orbax's
        pytree metadata; the message names the file and what is wrong.
    """
    what = _METADATA_WHAT
    try:
        # msgspec skips fields the records do not name without looking at them;
        # a load (Orbax's parser) refuses bytes that are not UTF-8 anywhere.
        codecs.decode(data, "utf-8")
        return _METADATA_DECODER.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        # A nesting bomb exhausts msgspec's recursion too; the generic parse below
        # names the file and says so.
        pass
    meta = files.parse_json_object(data, path=meta_file, what=what, max_depth=None)
    tree = meta.get("tree_metadata")
    if not isinstance(tree, dict):
        raise ValueError(f"{str(meta_file)!r} has no tree_metadata object")
    entries = {}
    for entry_name, entry in tree.items():
        where = f"{str(meta_file)!r} entry {entry_name!r}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} is not an object")
        key_metadata = entry.get("key_metadata")
        if not isinstance(key_metadata, list):
            raise ValueError(f"{where}: key_metadata is not a list")
        items = []
        for item in key_metadata:
            if not isinstance(item, dict):
                raise ValueError(f"{where}: a key_metadata entry is not an object")
            name, key_type = item.get("key"), item.get("key_type")
            if not isinstance(name, str) or isinstance(key_type, bool):
                raise ValueError(f"{where}: a key is not a string")
            if type(key_type) is not int:
                raise ValueError(f"{where}: unknown key_type {key_type!r}")
            items.append(_KeyItem(name, key_type))
        value = entry.get("value_metadata")
        if not isinstance(value, dict) or not isinstance(value.get("value_type"), str):
            raise ValueError(f"{where} has no value_type")
        entries[entry_name] = _Entry(
            items, _ValueMetadata(value["value_type"], bool(value.get("skip_deserialize", False)))
        )
    return _Metadata(
        entries,
        meta.get("use_ocdbt"),
        meta.get("use_zarr3"),
        meta.get("store_array_data_equal_to_fill_value"),
    )


def _stored_leaves(meta_file: Location, tree: dict[str, _Entry]) -> list[StoredLeaf]:
    """Every leaf of ``tree_metadata``, in order, with its key path, key text and
    Orbax's name for its array.

    Leaves come in tree order, so consecutive leaves mostly share all their keys
    but the last (``opt_state``, ``0``, ``mu``, ``block_0001``, ``mlp``, …): those
    are compared at once (in C) with the previous leaf's and, when equal, their
    path, text and name are taken from it. Each distinct key is worked out once.
    Tens of thousands of leaves are read this way in less time than their JSON
    takes to decode.

    Raises:
      ValueError: If the keys are not Orbax's, naming the file and the entry.
    """
    known: dict[_KeyItem, tuple[KeyPart, str, str]] = {}

    def read_key(item: _KeyItem, entry_name: str) -> tuple[KeyPart, str, str]:
        name = item.key
        if item.key_type == _DICT_KEY:
            read: tuple[KeyPart, str, str] = (name, f"[{name!r}]", name)
        elif item.key_type == _SEQUENCE_KEY:
            if not (name.isdigit() and name.isascii()):
                raise ValueError(
                    f"{str(meta_file)!r} entry {entry_name!r}: sequence key {name!r} "
                    "is not an index"
                )
            read = (int(name), f"[{int(name)}]", name)
        else:
            raise ValueError(
                f"{str(meta_file)!r} entry {entry_name!r}: unknown key_type {item.key_type!r}"
            )
        known[item] = read
        return read

    leaves: list[StoredLeaf] = []
    kinds = _KINDS
    # The previous leaf's keys but its last, and their path, text and array name
    # (with its trailing "." if there are any).
    head: list[_KeyItem] | None = None
    head_path: KeyPath = ()
    head_text = head_param = ""
    for entry_name, entry in tree.items():
        items = entry.key_metadata
        path: KeyPath
        if not items:  # The tree is a single leaf.
            path, key, param = (), "", ""
        else:
            if head is None or len(items) != len(head) + 1 or items[:-1] != head:
                head = items[:-1]
                parts = [known.get(item) or read_key(item, entry_name) for item in head]
                head_path = tuple([part for part, _, _ in parts])
                head_text = "".join([text for _, text, _ in parts])
                head_param = "".join([name + "." for _, _, name in parts])
            last = items[-1]
            part, text, name = known.get(last) or read_key(last, entry_name)
            path, key, param = (*head_path, part), head_text + text, head_param + name
            # Orbax stores the array under this name, "/" making directories (Haiku's
            # module names have them); refuse one that would climb out of the
            # checkpointable.
            if ("/" in param or param in (".", "..")) and any(
                part in ("", ".", "..") for part in param.split("/")
            ):
                raise ValueError(
                    f"{str(meta_file)!r} entry {entry_name!r}: stored name {param!r} is not "
                    "a path within the checkpoint"
                )
        value = entry.value_metadata
        kind = kinds.get(value.value_type) or value.value_type
        leaves.append(StoredLeaf(path, key, param, kind, not value.skip_deserialize))
    return leaves


def storage_path(param: str) -> str:
    """Where Orbax stores an array within the checkpointable (a root leaf at its top)."""
    return param + "/" if param else ""


def read_layout(item: StoredCheckpointable) -> PyTreeLayout:
    """The layout of a pytree checkpointable of an opened checkpoint: its ``_METADATA``
    parsed the first time it is asked for, and kept on the checkpoint.

    Raises:
      ValueError: If ``_METADATA`` is missing, not JSON, or not Orbax's pytree
        metadata; the message names the file and what is wrong.
    """
    return item.checkpoint.kept(
        ("pytree layout", item.directory.path),
        lambda: parse_layout(item.directory, item.entries(), item),
    )


def parse_layout(
    directory: Location,
    entries: Mapping[str, Entry] | None = None,
    item: StoredCheckpointable | None = None,
) -> PyTreeLayout:
    """Parses a pytree checkpointable's ``_METADATA``, each time it is called: for a
    pytree no opened checkpoint holds (``read_layout`` is for those).

    Args:
      directory: The checkpointable's directory.
      entries: Its entries, if the caller has listed them already.
      item: The opened checkpoint's checkpointable it is, if any.

    Raises:
      ValueError: If ``_METADATA`` is missing, not JSON, or not Orbax's pytree
        metadata; the message names the file and what is wrong.
    """
    meta_file = directory / names.PYTREE_METADATA
    if entries is None:
        meta_entry = meta_file.entry()
        manifest_entry = (directory / names.OCDBT_MANIFEST).entry()
    else:
        meta_entry = entries.get(names.PYTREE_METADATA)
        manifest_entry = entries.get(names.OCDBT_MANIFEST)
    has_manifest = manifest_entry is not None and manifest_entry.kind == FILE
    with files.paused_gc():
        if item is None:
            data = files.read_listed_bytes(
                meta_file, meta_entry, what=_METADATA_WHAT, max_bytes=files.MAX_METADATA_BYTES
            )
        else:
            # Kept on the checkpoint: a writer that copies the pytree parses it whole too.
            data = item.checkpoint.read_bytes(
                meta_file, what=_METADATA_WHAT, max_bytes=files.MAX_METADATA_BYTES
            )
        meta = _decode_metadata(meta_file, data)
        leaves = _stored_leaves(meta_file, meta.tree_metadata)
    ocdbt = meta.use_ocdbt
    if not isinstance(ocdbt, bool):
        ocdbt = has_manifest
    if ocdbt and not has_manifest and any(leaf.kind in words.STORED_ARRAY_KINDS for leaf in leaves):
        # Tensorstore would read a store without its manifest as an empty one.
        raise ValueError(
            f"{str(directory)!r} has no {names.OCDBT_MANIFEST}, so its arrays cannot be found"
        )
    return PyTreeLayout(
        directory=directory,
        leaves=tuple(leaves),
        ocdbt=ocdbt,
        zarr3=meta.use_zarr3 is True,
        all_chunks_stored=meta.store_array_data_equal_to_fill_value is True,
        item=item,
    )


def array_metadata_keys(layout: PyTreeLayout, leaves: Iterable[StoredLeaf]) -> dict[str, str]:
    """Where each leaf's array metadata is stored, by key: its ``param``."""
    suffix = names.ZARR3_METADATA if layout.zarr3 else names.ZARR2_METADATA
    return {storage_path(leaf.param) + suffix: leaf.param for leaf in leaves}


def array_infos(
    layout: PyTreeLayout,
    leaves: Iterable[StoredLeaf],
    ctx: ts.Context | None,
    stored: dict[str, bytes] | ValueError | None = None,
    stored_sizes: Mapping[str, int] | None = None,
) -> dict[str, ArrayInfo]:
    """Each leaf's array metadata by ``param``, read in bulk (in ``ctx``, else a
    fresh context).

    ``stored`` is what ``arrays.read_values`` gave for ``array_metadata_keys``, if
    the caller has read them already (with other stores: a listing), and
    ``stored_sizes`` what it gave as ``sizes``, if the caller walked the store.

    Raises:
      ValueError: If a leaf's metadata is missing or garbled, naming it.
    """
    keys = array_metadata_keys(layout, leaves)
    sizes: dict[str, int] = {}
    if stored is not None and stored_sizes is not None:
        sizes.update(stored_sizes)
    try:
        if stored is None:
            if ctx is None:
                ctx = arrays.context() if layout.item is None else layout.context()
            stored = arrays.read_values(
                layout.directory,
                keys,
                ocdbt=layout.ocdbt,
                ctx=ctx,
                sizes=sizes,
                walk=_walked(layout, ctx),
            )
        elif isinstance(stored, ValueError):
            raise stored
    except ValueError as e:
        raise ValueError(
            f"cannot read the array metadata under {str(layout.directory)!r}: {arrays.message(e)}"
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
        problem = budget.claim_problem(info.shape, info.itemsize, info.chunk_shape)
        if (
            problem is None
            and sizes
            and layout.all_chunks_stored
            and not info.compressed
            and info.itemsize is not None
        ):
            # Every chunk is stored, byte for byte: they must hold what the shape claims.
            claimed = math.prod(info.shape) * info.itemsize
            problem = budget.stored_problem(claimed, sizes.get(storage_path(param), 0))
        if problem is not None:
            raise ValueError(f"array {param!r} under {str(layout.directory)!r}: {problem}")
        infos[param] = info
    return infos


def _walked(layout: PyTreeLayout, ctx: ts.Context) -> arrays.StoreWalk | None:
    """The store's walk kept on the opened checkpoint (made now if it is the first to
    ask); ``None`` where there is none to keep or it fails (the reader then looks its
    keys up, and says what is wrong in its own words)."""
    if layout.item is None or not layout.ocdbt:
        return None
    try:
        return layout.walk_store(ctx)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def leaf_infos(layout: PyTreeLayout, ctx: ts.Context) -> list[tuple[StoredLeaf, ArrayInfo | None]]:
    """Every leaf with its array metadata (``None`` for leaves not in the array store).

    Raises:
      ValueError: If an array's metadata is missing or garbled, naming it.
    """
    in_store = [
        leaf for leaf in layout.leaves if leaf.stored and leaf.kind in words.STORED_ARRAY_KINDS
    ]
    with files.paused_gc():
        infos = array_infos(layout, in_store, ctx)
        return [(leaf, infos.get(leaf.param)) for leaf in layout.leaves]


def read_strings(layout: PyTreeLayout, params: list[str]) -> dict[str, str]:
    """The stored values of string leaves, by ``param``.

    Raises:
      ValueError: If ``_strings.json`` is unreadable or lacks one of them.
    """
    path = layout.directory / names.STRINGS
    strings = layout.read_json(names.STRINGS, what="Orbax string leaves")
    if not isinstance(strings, dict):
        raise ValueError(
            f"{str(path)!r} (Orbax string leaves) holds a JSON {type(strings).__name__}, "
            "not an object"
        )
    out = {}
    for param in params:
        value = strings.get(param)
        if not isinstance(value, str):
            raise ValueError(f"{str(path)!r} holds no string for leaf {param!r}")
        out[param] = value
    return out


def sharding_records(layout: PyTreeLayout) -> dict[str, str]:
    """Orbax's ``_sharding`` records as stored, each array's JSON text by ``param``
    (empty where there is no such file).

    Raises:
      ValueError: If ``_sharding`` exists but is unreadable.
    """
    path = layout.directory / names.SHARDINGS
    if not layout.has_file(names.SHARDINGS):
        return {}
    stored = layout.read_json(names.SHARDINGS, what="Orbax array shardings")
    if not isinstance(stored, dict):
        raise ValueError(
            f"{str(path)!r} (Orbax array shardings) holds a JSON {type(stored).__name__}, "
            "not an object"
        )
    # Orbax keys each record by the base64 of the array's name.
    by_key = {
        base64.b64encode(leaf.param.encode("utf-8")).decode("ascii"): leaf.param
        for leaf in layout.leaves
    }
    return {
        by_key[key]: record
        for key, record in stored.items()
        if key in by_key and isinstance(record, str)
    }


def read_shardings(layout: PyTreeLayout, params: list[str]) -> dict[str, dict[str, Any]]:
    """Orbax's record of each array's sharding, by ``param`` (absent where unknown).

    Raises:
      ValueError: If ``_sharding`` exists but is unreadable.
    """
    stored = sharding_records(layout)
    parsed: dict[str, Any] = {}
    out = {}
    for param in params:
        record = stored.get(param)
        if record is None:
            continue
        # Most arrays share one of a few shardings.
        if record not in parsed:
            try:
                parsed[record] = json.loads(record)
            except (ValueError, RecursionError):
                parsed[record] = None
        if isinstance(parsed[record], dict):
            out[param] = parsed[record]
    return out


def read_scalars(layout: PyTreeLayout, leaves: list[StoredLeaf], ctx: ts.Context) -> dict[str, Any]:
    """The values of scalar leaves, by ``param``: a few bytes each.

    Raises:
      ValueError: If one cannot be read.
    """
    values: dict[str, Any] = {}
    if layout.ocdbt and layout.zarr3 and leaves:
        # Orbax keeps a scalar inline in the B+tree, which the store's (kept) walk
        # holds: no array is opened, and on a bucket no request is made for it.
        try:
            stored = layout.walk_store(ctx).values
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            stored = {}  # read below, which says what is wrong in its own words
        for leaf in leaves:
            path = storage_path(leaf.param)
            metadata = stored.get((path + names.ZARR3_METADATA).encode("utf-8"))
            chunk = stored.get((path + "c").encode("utf-8"))
            if isinstance(metadata, bytes) and isinstance(chunk, bytes | None):
                value = arrays.inline_scalar(metadata, chunk)
                if value is not None and value is not arrays.NOT_0D:
                    values[leaf.param] = value.item()
        leaves = [leaf for leaf in leaves if leaf.param not in values]
        if not leaves:
            return values
    opened = arrays.open_arrays([layout.array_spec(leaf) for leaf in leaves], ctx)
    try:
        reads = [
            (leaf, future.result().read()) for leaf, future in zip(leaves, opened, strict=True)
        ]
        for leaf, read in reads:
            values[leaf.param] = read.result().item()
    except ValueError as e:
        raise ValueError(
            f"cannot read the scalar leaves under {str(layout.directory)!r}: {arrays.message(e)}"
        ) from None
    return values


def read_value(layout: PyTreeLayout, leaf: StoredLeaf, ctx: ts.Context) -> Any:
    """One leaf's value, reading only that leaf's stored bytes.

    Raises:
      ValueError: If it cannot be read (tensorstore's message).
    """
    if leaf.kind == words.STRING:
        return read_strings(layout, [leaf.param])[leaf.param]
    if leaf.kind == words.EMPTY or not leaf.stored:
        return None
    # The claimed shape and chunking are checked before tensorstore allocates them.
    array_infos(layout, [leaf], ctx)
    array = arrays.open_arrays([layout.array_spec(leaf)], ctx)[0].result()
    value = array.read().result()
    return value.item() if leaf.kind == words.SCALAR else value


def top_level_keys(item: StoredCheckpointable) -> list[tuple[KeyPart, bool]] | None:
    """The first key of every stored leaf, and whether it is a dict key, in stored order.

    Returns ``None`` when the checkpointable holds no Orbax pytree metadata.

    Raises:
      ValueError: If the metadata is unreadable.
    """
    if names.PYTREE_METADATA not in item.entries():
        return None
    layout = read_layout(item)
    keys: dict[KeyPart, bool] = {}
    for leaf in layout.leaves:
        if leaf.path:
            keys.setdefault(leaf.path[0], isinstance(leaf.path[0], str))
        else:
            keys.setdefault("", False)
    return list(keys.items())
