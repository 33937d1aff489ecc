"""A pytree checkpointable opened as the source of a new checkpoint.

Everything a writer needs to store a leaf again as Orbax stored it, read from the
metadata alone: the leaf's value metadata as Orbax wrote it in ``_METADATA``, its
array's extra metadata (a PRNG key's implementation) from ``array_metadatas``, its
sharding's record from ``_sharding``, a string's value, and the checksums recorded
for it. Arrays are opened for reading box by box (``streaming.source_arrays``).
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import tensorstore as ts

from tinax._format.arraydata import rawread
from tinax._format.integrity import checksums
from tinax._format.integrity.checksums import LeafRecord
from tinax._format.metadata import layout, pytree
from tinax._format.metadata.pytree import PyTreeLayout, StoredLeaf
from tinax._format.naming import names
from tinax._format.storage import files
from tinax._format.writing import streaming


@dataclasses.dataclass
class PyTreeSource:
    """One pytree checkpointable of a source checkpoint.

    Attributes:
      checkpoint: The checkpoint's path, for messages.
      name: The checkpointable's name.
      tree: Its layout.
      value_metadata: Orbax's value metadata of each leaf, in the leaves' order.
      records: Its recorded checksums by leaf key (``None``: it has none).
      ext_metadata: Orbax's extra array metadata by stored name.
      shardings: Orbax's sharding records (JSON texts) by stored name.
      data_files: The data files its arrays are read raw from, each opened once for the
        operation that reads it (``close`` closes them).
    """

    checkpoint: str
    name: str
    tree: PyTreeLayout
    value_metadata: list[dict[str, Any]]
    records: dict[str, LeafRecord] | None
    ext_metadata: dict[str, Any]
    shardings: dict[str, str]
    data_files: rawread.DataFiles = dataclasses.field(default_factory=rawread.DataFiles)
    _arrays: dict[str, streaming.SourceArray] | None = None
    _strings: dict[str, str] | None = None

    @property
    def leaves(self) -> tuple[StoredLeaf, ...]:
        return self.tree.leaves

    def where(self, leaf: StoredLeaf | None = None) -> str:
        """``checkpoint '…': checkpointable '…'`` (``: leaf …``), for messages."""
        text = f"checkpoint {self.checkpoint!r}: checkpointable {self.name!r}"
        return text if leaf is None else f"{text}: leaf {leaf.key or '(root)'}"

    def arrays(self, ctx: ts.Context) -> dict[str, streaming.SourceArray]:
        """Its stored arrays (scalars among them), opened, by leaf key.

        Raises:
          ValueError: If an array's metadata is missing or claims the impossible.
        """
        if self._arrays is None:
            try:
                # Read in the context its checkpoint's other reads share (its store
                # walked once, its manifest read once), whatever ``ctx`` writes in.
                self._arrays = streaming.source_arrays(
                    self.tree, self.leaves, self.records, self.tree.context(), self.data_files
                )
            except ValueError as e:
                raise ValueError(f"{self.where()}: {e}") from None
        return self._arrays

    def close(self) -> None:
        """Closes the data files its reads opened."""
        self.data_files.close()

    def string(self, leaf: StoredLeaf) -> str:
        """The value of a string leaf, checked against its checksum.

        Raises:
          ValueError: If it cannot be read; ``CorruptDataError`` if it does not
            match its checksum.
        """
        if self._strings is None:
            params = [leaf.param for leaf in self.leaves if leaf.kind == "string" and leaf.stored]
            self._strings = pytree.read_strings(self.tree, params)
        value = self._strings[leaf.param]
        record = None if self.records is None else self.records.get(leaf.key)
        if record is not None and checksums.check_value(record, value) is False:
            raise checksums.CorruptDataError(
                f"{self.where(leaf)}: the stored value is corrupt: it does not match its checksum"
            )
        return value


def open_pytree_source(
    checkpoint: layout.Checkpoint, item: layout.StoredCheckpointable
) -> PyTreeSource:
    """Reads the metadata of a pytree checkpointable that a new checkpoint copies from.

    Raises:
      ValueError: If its metadata is unreadable or not Orbax's, naming the file.
    """
    listed = checkpoint.scan.listing()
    entries = item.entries()
    tree = pytree.read_layout(item)
    meta_file = item.directory / names.PYTREE_METADATA
    # Parsed from the bytes the layout was read from (kept on the checkpoint).
    meta = checkpoint.read_json_object(
        meta_file, what="Orbax pytree metadata", max_bytes=files.MAX_METADATA_BYTES, max_depth=None
    )
    tree_metadata = meta.get("tree_metadata")
    values = [
        entry.get("value_metadata") if isinstance(entry, dict) else None
        for entry in (tree_metadata.values() if isinstance(tree_metadata, dict) else ())
    ]
    if len(values) != len(tree.leaves) or not all(isinstance(v, dict) for v in values):
        raise ValueError(f"{str(meta_file)!r} has a leaf without value metadata")
    records = checksums.read_checksums(item)
    shardings: dict[str, str] = {}
    if names.SHARDINGS in entries:
        stored = tree.read_json(names.SHARDINGS, what="Orbax array shardings")
        if isinstance(stored, dict):
            shardings = {k: v for k, v in stored.items() if isinstance(v, str)}
    return PyTreeSource(
        checkpoint=str(checkpoint.path),
        name=item.name,
        tree=tree,
        value_metadata=values,  # type: ignore[arg-type]
        records=records,
        ext_metadata=_ext_metadata(item, listed),
        shardings=shardings,
    )


def _ext_metadata(item: layout.StoredCheckpointable, listed: dict[str, Any]) -> dict[str, Any]:
    """Orbax's extra array metadata by stored name, from every process's file."""
    directory = item.directory / names.ARRAY_METADATAS
    found: dict[str, Any] = {}
    for name in sorted(listed.get(directory.path, {})):
        document = item.checkpoint.read_json_object(
            directory / name,
            what="Orbax array metadata",
            max_bytes=files.MAX_METADATA_BYTES,
            max_depth=None,
        )
        for record in document.get("array_metadatas") or ():
            entry = record.get("array_metadata") if isinstance(record, dict) else None
            if isinstance(entry, dict) and isinstance(entry.get("param_name"), str):
                found.setdefault(entry["param_name"], entry.get("ext_metadata"))
    return found


def sharding_key(param: str) -> str:
    """The key of an array's record in ``_sharding``: its stored name in base64."""
    return base64.b64encode(param.encode("utf-8")).decode("ascii")
