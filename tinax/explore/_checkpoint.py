"""A stored checkpoint as a leaf table, and one leaf's value."""

from __future__ import annotations

import concurrent.futures
import math
import os
from typing import Any

import pandas as pd
import tensorstore as ts

from tinax import _paths
from tinax._format.integrity import checksums
from tinax._format.metadata import arrays, jsonitems, layout, pytree
from tinax._format.metadata.layout import Checkpoint, StoredCheckpointable
from tinax._format.naming import words
from tinax._format.naming.keys import ROOT_KEY, format_key
from tinax._format.records import pipeline
from tinax._format.storage import files
from tinax.explore._array_read import array_record, read_array
from tinax.explore._key_match import LeafNotFoundError, match_key
from tinax.explore._leaf_rows import (
    LEAF_COLUMNS,
    Leaf,
    column,
    format_sharding_record,
    leaf_frame,
)

_MAX_THREADS = 8


def iterator_state(item: StoredCheckpointable) -> Any:
    """A Grain iterator's saved state: process 0's alone, else a dict by process file.

    Raises:
      ValueError: If a state file is not JSON (naming it).
    """
    states = jsonitems.read_iterator_states(item)
    return next(iter(states.values())) if len(states) == 1 else states


def _iterator_leaves(item: StoredCheckpointable, values: bool) -> list[Leaf]:
    """One row for an iterator saved by one process; one per process for several.

    Each process of a job saves its own iterator state (``process_<i>-of-<n>.json``);
    with several, each state is a row keyed by its file's name without ``.json``
    (``['process_1-of-2']``), in process order.
    """
    states = jsonitems.read_iterator_states(item)
    # An iterator's size is its stored state's: the bytes of its JSON file.
    entries = item.entries()
    sizes = {stem: entries[f"{stem}.json"].size for stem in states}
    if len(states) == 1:
        stem, state = next(iter(states.items()))
        return [
            Leaf(
                item.name,
                ROOT_KEY,
                words.ITERATOR,
                nbytes=sizes[stem],
                value=state if values else None,
            )
        ]
    return [
        Leaf(
            item.name,
            format_key((stem,)),
            words.ITERATOR,
            nbytes=sizes[stem],
            value=state if values else None,
        )
        for stem, state in states.items()
    ]


def _read_iterator(checkpoint: Checkpoint, item: StoredCheckpointable, key: str) -> Any:
    if key == ROOT_KEY:
        return iterator_state(item)
    states = jsonitems.read_iterator_states(item)
    if len(states) == 1:
        raise ValueError(_one_value(checkpoint, item, key))
    for stem, state in states.items():
        if format_key((stem,)) == key:
            return state
    raise ValueError(
        f"iterator {item.name!r} in {str(checkpoint.path)!r} has no key {key!r}; its keys "
        f"are {[format_key((stem,)) for stem in states]} (one per process), or {ROOT_KEY!r} "
        "for all of them"
    )


def _one_value(checkpoint: Checkpoint, item: StoredCheckpointable, key: str) -> str:
    return (
        f"checkpointable {item.name!r} in {str(checkpoint.path)!r} is one value; "
        f"its only key is {ROOT_KEY!r}, not {key!r}"
    )


def pytree_leaves(
    name: str, tree: pytree.PyTreeLayout, ctx: ts.Context, *, values: bool
) -> list[Leaf]:
    """The leaf rows of a pytree checkpointable, in ``tree.leaves`` order.

    Raises:
      ValueError: If an array's metadata, the strings or the scalars cannot be read.
    """
    infos = pytree.leaf_infos(tree, ctx)
    shardings = pytree.read_shardings(
        tree, [leaf.param for leaf in tree.leaves if leaf.kind == words.JAX_ARRAY]
    )
    strings: dict[str, str] = {}
    scalars: dict[str, Any] = {}
    if values:
        string_params = [leaf.param for leaf in tree.leaves if leaf.kind == words.STRING]
        if string_params:
            strings = pytree.read_strings(tree, string_params)
        scalar_leaves = [leaf for leaf, info in infos if info and leaf.kind == words.SCALAR]
        if scalar_leaves:
            scalars = pytree.read_scalars(tree, scalar_leaves, ctx)
    rows = []
    for leaf, info in infos:
        if info is None:
            rows.append(Leaf(name, leaf.key, leaf.kind, value=strings.get(leaf.param)))
            continue
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
                sharding=format_sharding_record(shardings.get(leaf.param)),
                chunk_shape=info.chunk_shape,
            )
        )
    return rows


def checkpointable_leaves(item: StoredCheckpointable, ctx: Any, values: bool) -> list[Leaf]:
    """The leaf rows of one checkpointable, with stored values if ``values``.

    Raises:
      ValueError: If its metadata is missing or unreadable.
    """
    if item.layout == layout.PYTREE:
        tree = pytree.read_layout(item)
        return pytree_leaves(item.name, tree, ctx, values=values)
    if item.layout == layout.ITERATOR:
        return _iterator_leaves(item, values)
    if item.layout == layout.JSON:
        value = jsonitems.read_json_item(item)
        return [Leaf(item.name, ROOT_KEY, words.JSON, value=value if values else None)]
    if item.layout == layout.EMPTY:
        jsonitems.read_empty_record(item)
        return [Leaf(item.name, ROOT_KEY, words.EMPTY)]
    return [Leaf(item.name, ROOT_KEY, words.UNKNOWN)]


def checkpoint_leaves(checkpoint: Checkpoint, *, values: bool = True) -> list[Leaf]:
    """Every leaf row of ``checkpoint``, checkpointables read concurrently.

    Raises:
      ValueError: If any checkpointable's metadata is missing or unreadable.
    """
    ctx = arrays.context_of(checkpoint)
    items = checkpoint.checkpointables
    if len(items) == 1:
        return checkpointable_leaves(items[0], ctx, values)
    with concurrent.futures.ThreadPoolExecutor(min(len(items), _MAX_THREADS)) as pool:
        parts = list(pool.map(lambda item: checkpointable_leaves(item, ctx, values), items))
    return [leaf for part in parts for leaf in part]


def checkpoint_table(path: str | os.PathLike[str] | Checkpoint) -> pd.DataFrame:
    """One row per leaf of every checkpointable in a checkpoint, from metadata alone.

    Array data is never read: shapes, dtypes, chunking and shardings come from
    Orbax's metadata, read in bulk. Scalars, strings and Grain iterator states
    are small and show their stored value.

    Args:
      path: A checkpoint directory: Orbax V1 (``save_checkpointables``, a
        ``training.Checkpointer`` step), Orbax V0 (a ``CheckpointManager`` step,
        or a flat single-item checkpoint, whose checkpointable is named ``""``),
        or tinax's own.

    Returns:
      A DataFrame with columns ``checkpointable``, ``key`` (``jax.tree_util.keystr``
      format; ``""`` for a checkpointable that is one value, such as an iterator),
      ``kind`` (``jax.Array``, ``np.ndarray``, ``scalar``, ``string``, ``none``,
      ``empty``, ``iterator``, ``json``, ``unknown`` or Orbax's own type name),
      ``shape`` (tuple), ``dtype``, ``size``, ``nbytes``, ``value`` (scalars,
      strings, iterator and JSON state only), ``sharding`` (as saved: mesh shape,
      axis names and partition spec) and ``chunk_shape`` (tuple); missing where a
      column does not apply. A Grain iterator saved by several processes has one
      row per process, keyed by the name of its state file without ``.json``
      (``['process_1-of-2']``); saved by one process, it is one row with key ``""``.
      ``DataFrame.attrs["checksums"]`` says, for each checkpointable, whether it
      carries tinax checksums of its stored values (``True``) or none (``False``:
      written by Orbax itself or an older tinax; its data can be read but not
      checked). ``DataFrame.attrs["unchecked"]`` names, for each of them, the
      columns whose values no checksum vouches for: ``sharding`` always (Orbax's
      own record), ``value`` too without checksums. Values shown are checked
      against the checksums where there are some. ``DataFrame.attrs["pipelines"]``
      gives, for each Grain iterator saved by tinax, the input pipeline it was
      saved from as Grain describes it, source first (``("RangeMapDataset(start=0,
      stop=1000, step=1)", "ShuffleMapDataset(seed=0)", …)``): a restore into
      another pipeline is refused.

    Raises:
      TypeError: If ``path`` is not a path.
      FileNotFoundError: If ``path`` does not exist.
      ValueError: If ``path`` is not a readable checkpoint, or a value shown
        does not match its checksum (``CorruptDataError``); the message names
        the path and what is wrong.
    """
    return leaf_table(_paths.open_checkpoint(path))


def leaf_table(checkpoint: Checkpoint) -> pd.DataFrame:
    """``checkpoint_table`` of a checkpoint already checked by ``open_checkpoint``.

    Raises:
      ValueError: If any checkpointable's metadata is missing or unreadable.
    """
    with files.paused_gc():
        leaves = checkpoint_leaves(checkpoint)
        check_values(checkpoint, leaves)
        table = leaf_frame(leaves)
    presence = checksum_presence(checkpoint)
    table.attrs["checksums"] = presence
    # Shardings are Orbax's record, which no checksum covers; values are checked
    # only where the checkpointable carries checksums.
    table.attrs["unchecked"] = {
        name: ("sharding",) if present else ("value", "sharding")
        for name, present in presence.items()
    }
    # The input pipeline each iterator was saved from, node by node (a restore into
    # another is refused): {checkpointable: (node, …)}; empty where none was recorded.
    table.attrs["pipelines"] = {
        name: found.nodes for name, found in pipeline.saved_pipelines(checkpoint.pipelines).items()
    }
    return table


def check_values(checkpoint: Checkpoint, leaves: list[Leaf]) -> None:
    """Checks the values a table shows (scalars, strings, iterator states) against the
    checksums saved with them, as a load would.

    Raises:
      CorruptDataError: Naming the checkpoint, the checkpointable and the leaf or file.
    """
    for item in checksums.checksummed(checkpoint):
        records = checksums.read_checksums(item)
        if records is None:
            continue
        problems = checksums.check_files(item, records)
        for leaf in leaves:
            if leaf.checkpointable != item.name or leaf.kind not in (words.SCALAR, words.STRING):
                continue
            record = records.get(leaf.key)
            if record is not None and checksums.check_value(record, leaf.value) is False:
                problems.append(f"leaf {leaf.key}: the stored value does not match its checksum")
        if problems:
            raise checksums.CorruptDataError(
                f"checkpoint {str(checkpoint.path)!r}: checkpointable {item.name!r}: "
                + "; ".join(problems)
            )


def key_table(checkpoint: Checkpoint) -> pd.DataFrame:
    """The rows of ``leaf_table`` as far as the checkpoint's own metadata files tell.

    The same rows, in the same order and with the same columns, from the metadata
    ``open_checkpoint`` has already parsed: every leaf's ``checkpointable``, ``key``
    and ``kind``. Pytree leaves lack what the array store and value files hold
    (``shape``, ``dtype``, ``size``, ``nbytes``, ``value``, ``sharding``,
    ``chunk_shape``: missing); rows of iterators, JSON and empty checkpointables,
    read from their own small files, are complete. It is what a view of a large
    checkpoint shows while ``leaf_table`` reads the rest.

    Raises:
      ValueError: If a checkpointable's metadata is unreadable.
    """
    names: list[str] = []
    keys: list[str] = []
    kinds: list[str] = []
    others: list[Leaf] = []
    rows_of_others: list[int] = []
    for item in checkpoint.checkpointables:
        if item.layout == layout.PYTREE:
            leaves = pytree.read_layout(item).leaves
            names.extend([item.name] * len(leaves))
            keys.extend([leaf.key for leaf in leaves])
            kinds.extend([leaf.kind for leaf in leaves])
            continue
        for row in checkpointable_leaves(item, None, values=True):
            rows_of_others.append(len(keys))
            others.append(row)
            names.append(row.checkpointable)
            keys.append(row.key)
            kinds.append(row.kind)
    count = len(keys)
    columns: dict[str, list[Any]] = {"checkpointable": names, "key": keys, "kind": kinds}
    for field in LEAF_COLUMNS[3:]:
        cells: list[Any] = [None] * count
        for at, row in zip(rows_of_others, others, strict=True):
            cells[at] = getattr(row, field)
        columns[field] = cells
    table = pd.DataFrame({name: column(name, columns[name]) for name in LEAF_COLUMNS})
    table.attrs["checksums"] = checksum_presence(checkpoint)
    return table


def checksum_presence(checkpoint: Checkpoint) -> dict[str, bool]:
    """Whether each checkpointable carries tinax checksums of what it stores."""
    return {item.name: checksums.has_checksums(item) for item in checksums.checksummed(checkpoint)}


def read_leaf(path: str | os.PathLike[str] | Checkpoint, checkpointable: str, key: str) -> Any:
    """The value of one stored leaf, reading only that leaf's bytes.

    Given a path, the checkpoint is opened for this leaf alone: of its checksum
    records only this leaf's is decoded and checked (a record must still exist for
    every stored value; ``open_checkpoint``, ``verify`` and the loads check every
    record), and a small array's keys are looked up in its store rather than the
    store walked.

    Args:
      path: A checkpoint directory (see ``checkpoint_table``), or a checkpoint
        ``open_checkpoint`` opened (leaf after leaf of one checkpoint: its store is
        walked once).
      checkpointable: The checkpointable's name, as in ``checkpoint_table``.
      key: The leaf's key: its ``keystr`` as in ``checkpoint_table``
        (``"['blocks']['3']['down']['kernel']['value']"``), or dotted as the tables
        and the widgets show it (``"blocks.3.down.kernel"``, NNX's ``value`` left
        out or not, the parts every row shares left out where that leaves one leaf).

    Returns:
      A ``np.ndarray`` for a stored array (``jax.Array`` leaves too, whole: every
      process's shards; no device is involved), a Python scalar, a string,
      ``None``, or an iterator's or JSON checkpointable's state. For an iterator
      saved by several processes, key ``""`` gives every process's state by file
      name, and a row's key that process's state alone.

    Raises:
      TypeError: If an argument has the wrong type.
      FileNotFoundError: If ``path`` does not exist.
      ValueError: If the checkpoint, checkpointable or leaf does not exist or
        cannot be read; the message names the path and what is wrong (a key that
        names no leaf, or several, the nearest or the candidates).
    """
    # Opened for this one leaf: its checksum record alone is decoded and checked.
    checkpoint = _paths.open_checkpoint(path, every_record=False)
    item = checkpoint.get(checkpointable)
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, got {type(key).__name__}")
    if item.layout == layout.PYTREE:
        tree = pytree.read_layout(item)
        by_key = {leaf.key: leaf for leaf in tree.leaves}
        try:
            # Named as a table shows it (dotted) or as its keystr.
            key = match_key(list(by_key), key, checkpointable=item.name)
        except LeafNotFoundError as e:
            raise LeafNotFoundError(f"checkpoint {str(checkpoint.path)!r}: {e}") from None
        leaf = by_key[key]
        try:
            checked = False
            if leaf.kind in words.ARRAY_KINDS and leaf.stored:
                value, checked = read_array(
                    tree,
                    leaf,
                    tree.context(),
                    array_record(item, key),
                    # Opened here for this leaf alone: no other of its arrays is read.
                    alone=not isinstance(path, Checkpoint),
                )
            else:
                value = pytree.read_value(tree, leaf, tree.context())
        except ValueError as e:
            complaint = checksums.undecodable(str(e))
            if complaint is not None:
                # A chunk that does not decode is damage, as a checksum that does
                # not match is, and is said alike.
                raise ValueError(
                    f"checkpoint {str(checkpoint.path)!r}: checkpointable {checkpointable!r}: "
                    + checksums.undecodable_message(key, complaint)
                ) from None
            raise ValueError(
                f"checkpoint {str(checkpoint.path)!r}: cannot read leaf {key} of "
                f"{checkpointable!r}: {arrays.message(e)}"
            ) from None
        problem = None if checked else checksums.check_read_value(item, key, value)
        if problem is not None:
            raise ValueError(
                f"checkpoint {str(checkpoint.path)!r}: checkpointable {checkpointable!r}: {problem}"
            )
        return value
    if item.layout == layout.ITERATOR:
        records = checksums.read_checksums(item)
        problems = [] if records is None else checksums.check_files(item, records)
        if problems:
            raise ValueError(
                f"checkpoint {str(checkpoint.path)!r}: checkpointable {checkpointable!r}: "
                + "; ".join(problems)
            )
        return _read_iterator(checkpoint, item, key)
    if key != ROOT_KEY:
        raise ValueError(_one_value(checkpoint, item, key))
    if item.layout == layout.JSON:
        return jsonitems.read_json_item(item)
    if item.layout == layout.EMPTY:
        jsonitems.read_empty_record(item)
        return None
    raise ValueError(
        f"checkpointable {checkpointable!r} in {str(checkpoint.path)!r} is stored in a "
        "layout tinax.explore does not read"
    )
