"""What a derived or averaged checkpoint would hold, from the sources' metadata alone.

The same plan ``tinax.checkpointing.derive_checkpoint`` and ``average_checkpoints``
follow (``tinax._format.writing.treeplan``): which checkpointables and leaves are kept, their
new keys, the dtypes written, and the bytes read and written, before any array byte
is read. The explorer shows it before the work starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from tinax._format.metadata import arrays, layout, pytree
from tinax._format.naming import words
from tinax._format.storage.location import tree_bytes
from tinax._format.writing import treeplan
from tinax._paths import open_checkpoint

PREVIEW_COLUMNS = (
    "checkpointable",
    "key",
    "source_key",
    "kind",
    "shape",
    "dtype",
    "nbytes",
    "read",
)


def derive_preview(
    path: str | os.PathLike[str],
    *,
    checkpointables: str | Sequence[str] | None = None,
    keys: str | None = None,
    cast: str | None = None,
    rename: Sequence[tuple[str, str]] | Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """The leaves ``derive_checkpoint(path, …)`` with these arguments would write.

    One row per leaf (and one per iterator or JSON checkpointable, copied whole):
    ``checkpointable``, ``key`` (its key in the new checkpoint), ``source_key``,
    ``kind``, ``shape``, ``dtype`` (as written), ``nbytes`` (bytes written) and
    ``read`` (bytes read from the source). ``attrs["read_bytes"]`` and
    ``attrs["written_bytes"]`` sum them. Metadata only.

    Raises:
      TypeError, ValueError, FileNotFoundError: As ``derive_checkpoint`` raises them
        for the same source and arguments (nothing kept, keys that make no tree…).
    """
    checkpoint = open_checkpoint(path)
    plan = treeplan.plan_checkpoint(
        checkpoint,
        checkpointables,
        treeplan.compile_keys(keys),
        treeplan.compile_rename(rename),
    )
    cast_to = treeplan.compile_cast(cast)
    ctx = arrays.context()
    rows: list[dict[str, Any]] = []
    for name in plan.order:
        item = checkpoint.get(name)
        if name not in plan.leaves:
            rows.append(_whole(item))
            continue
        infos = _infos(plan.trees[name], ctx)
        for leaf in plan.leaves[name]:
            info = infos.get(leaf.source.param) if leaf.source.stored else None
            if info is None:
                rows.append(_row(name, leaf.key, leaf.source, None, None, 0, 0))
                continue
            stored = arrays.numpy_dtype(info.dtype)
            written = treeplan.written_dtype(leaf.source, stored, cast_to)
            size = 1
            for n in info.shape:
                size *= n
            rows.append(
                _row(
                    name,
                    leaf.key,
                    leaf.source,
                    tuple(info.shape),
                    written.name,
                    size * written.itemsize,
                    size * stored.itemsize,
                )
            )
    return _table(rows)


def average_preview(
    sources: Sequence[str | os.PathLike[str]],
    *,
    checkpointables: str | Sequence[str] | None = None,
    keys: str | None = None,
) -> pd.DataFrame:
    """The leaves ``average_checkpoints(sources, …)`` would write, the sources' metadata
    checked against each other as the average checks it.

    The columns of ``derive_preview``; ``read`` counts every source's bytes.

    Raises:
      TypeError: If ``sources`` is not a list of paths.
      ValueError: If fewer than two are given, or their structures differ (the
        first difference named: checkpointables, leaves, kinds, shapes, dtypes).
      FileNotFoundError: If a source does not exist.
    """
    if isinstance(sources, str | bytes | os.PathLike) or not isinstance(sources, Sequence):
        raise TypeError(f"sources must be a list of checkpoint paths, got {type(sources).__name__}")
    if len(sources) < 2:
        raise ValueError(f"an average needs at least two sources, got {len(sources)}")
    opened = [open_checkpoint(path) for path in sources]
    first = opened[0]
    held = [item.name for item in first.checkpointables]
    names = treeplan.select_checkpointables(
        checkpointables, held, f"checkpoint {str(first.path)!r}"
    )
    pattern = treeplan.compile_keys(keys)
    ctx = arrays.context()
    rows: list[dict[str, Any]] = []
    for name in names:
        items = [_item(checkpoint, name, first) for checkpoint in opened]
        if items[0].layout != layout.PYTREE:
            if pattern is not None and checkpointables is None:
                continue
            row = _whole(items[0])
            row["read"] *= len(items)
            rows.append(row)
            continue
        trees = [pytree.read_layout(item) for item in items]
        wheres = [f"checkpoint {str(c.path)!r}: checkpointable {name!r}" for c in opened]
        treeplan.check_same_leaves(list(zip(wheres, [t.leaves for t in trees], strict=True)))
        infos = [_infos(tree, ctx) for tree in trees]
        chosen = {id(p.source) for p in treeplan.plan_leaves(name, trees[0].leaves, keys=pattern)}
        for leaf in trees[0].leaves:
            if id(leaf) not in chosen:
                continue
            info = infos[0].get(leaf.param)
            if info is None:
                rows.append(_row(name, leaf.key, leaf, None, None, 0, 0))
                continue
            for other, where in zip(infos[1:], wheres[1:], strict=True):
                found = other.get(leaf.param)
                if found is None or (found.shape, found.dtype) != (info.shape, info.dtype):
                    got = "nothing" if found is None else f"{found.dtype} {found.shape}"
                    raise ValueError(
                        f"the sources differ: {wheres[0]}: leaf {leaf.key} is {info.dtype} "
                        f"{info.shape} but in {where} it is {got}"
                    )
            nbytes = (info.itemsize or 0) * _count(info.shape)
            rows.append(
                _row(
                    name,
                    leaf.key,
                    leaf,
                    tuple(info.shape),
                    info.dtype,
                    nbytes,
                    nbytes * len(opened),
                )
            )
    return _table(rows)


def _item(
    checkpoint: layout.Checkpoint, name: str, first: layout.Checkpoint
) -> layout.StoredCheckpointable:
    if name not in [item.name for item in checkpoint.checkpointables]:
        raise ValueError(
            f"the sources differ: checkpoint {str(checkpoint.path)!r} has no checkpointable "
            f"{name!r}, which {str(first.path)!r} has"
        )
    return checkpoint.get(name)


def _count(shape: Sequence[int]) -> int:
    size = 1
    for n in shape:
        size *= n
    return size


def _infos(tree: pytree.PyTreeLayout, ctx: Any) -> dict[str, arrays.ArrayInfo]:
    stored = [leaf for leaf in tree.leaves if leaf.stored and leaf.kind in words.STORED_ARRAY_KINDS]
    return pytree.array_infos(tree, stored, ctx) if stored else {}


def _whole(item: layout.StoredCheckpointable) -> dict[str, Any]:
    size = tree_bytes(item.directory)
    return {
        "checkpointable": item.name,
        "key": "",
        "source_key": "",
        "kind": item.layout,
        "shape": None,
        "dtype": None,
        "nbytes": size,
        "read": size,
    }


def _row(
    name: str,
    key: str,
    leaf: pytree.StoredLeaf,
    shape: tuple[int, ...] | None,
    dtype: str | None,
    nbytes: int,
    read: int,
) -> dict[str, Any]:
    return {
        "checkpointable": name,
        "key": key,
        "source_key": leaf.key,
        "kind": leaf.kind,
        "shape": shape,
        "dtype": dtype,
        "nbytes": nbytes,
        "read": read,
    }


def _table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    table = pd.DataFrame(rows, columns=list(PREVIEW_COLUMNS))
    for column in ("checkpointable", "key", "source_key", "kind", "dtype"):
        table[column] = table[column].astype("string")
    for column in ("nbytes", "read"):
        table[column] = table[column].astype("Int64")
    table.attrs["read_bytes"] = int(table["read"].sum()) if len(table) else 0
    table.attrs["written_bytes"] = int(table["nbytes"].sum()) if len(table) else 0
    return table
