"""A stored checkpoint as a leaf table, and one leaf's value."""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any

import pandas as pd

from tinax.explore import _files, _layout, _pytree, _store
from tinax.explore._layout import Checkpoint, StoredCheckpointable
from tinax.explore._leaves import ROOT_KEY, Leaf, leaf_frame

_MAX_THREADS = 8


def _iterator_files(directory: os.PathLike[str]) -> list[tuple[int, str]]:
    found = []
    for name in os.listdir(directory):
        match = _layout.ITERATOR_FILE.match(name)
        if match:
            found.append((int(match.group(1)), name))
    return sorted(found)


def read_iterator_state(item: StoredCheckpointable) -> Any:
    """A Grain iterator's saved state: process 0's alone, else a dict by process file.

    Raises:
      ValueError: If a state file is not JSON (naming it).
    """
    states = {
        name.removesuffix(".json"): _files.read_json(
            item.directory / name, what="Grain iterator state"
        )
        for _, name in _iterator_files(item.directory)
    }
    if not states:
        raise ValueError(f"{str(item.directory)!r} holds no Grain iterator state file")
    return next(iter(states.values())) if len(states) == 1 else states


def _read_json_checkpointable(item: StoredCheckpointable) -> Any:
    for name in _layout.JSON_FILES:
        path = item.directory / name
        if path.is_file():
            return _files.read_json(path, what="a JSON checkpointable")
    raise ValueError(f"{str(item.directory)!r} holds no JSON checkpointable file")


def _check_empty_record(item: StoredCheckpointable) -> None:
    path = item.directory / _layout.EMPTY_PYTREE_FILE
    record = _files.read_json_object(path, what="tinax's record of a pytree without leaves")
    if "structure" not in record:
        raise ValueError(f"{str(path)!r} has no structure; it is not a tinax empty-pytree record")


def _checkpointable_leaves(item: StoredCheckpointable, ctx: Any, values: bool) -> list[Leaf]:
    if item.layout == _layout.PYTREE:
        layout = _pytree.read_layout(item.directory)
        return _pytree.leaves(item.name, layout, ctx, values=values)
    if item.layout == _layout.ITERATOR:
        state = read_iterator_state(item)
        return [Leaf(item.name, ROOT_KEY, "iterator", value=state if values else None)]
    if item.layout == _layout.JSON:
        value = _read_json_checkpointable(item)
        return [Leaf(item.name, ROOT_KEY, "json", value=value if values else None)]
    if item.layout == _layout.EMPTY:
        _check_empty_record(item)
        return [Leaf(item.name, ROOT_KEY, "empty")]
    return [Leaf(item.name, ROOT_KEY, "unknown")]


def checkpoint_leaves(checkpoint: Checkpoint, *, values: bool = True) -> list[Leaf]:
    """Every leaf row of ``checkpoint``, checkpointables read concurrently.

    Raises:
      ValueError: If any checkpointable's metadata is missing or unreadable.
    """
    ctx = _store.context()
    items = checkpoint.checkpointables
    if len(items) == 1:
        return _checkpointable_leaves(items[0], ctx, values)
    with concurrent.futures.ThreadPoolExecutor(min(len(items), _MAX_THREADS)) as pool:
        parts = list(pool.map(lambda item: _checkpointable_leaves(item, ctx, values), items))
    return [leaf for part in parts for leaf in part]


def checkpoint_table(path: str | os.PathLike[str]) -> pd.DataFrame:
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
      strings, iterator and JSON state only), ``sharding`` and ``chunk_shape``
      (tuple); missing where a column does not apply.

    Raises:
      TypeError: If ``path`` is not a path.
      FileNotFoundError: If ``path`` does not exist.
      ValueError: If ``path`` is not a readable checkpoint; the message names
        the path and what is wrong.
    """
    checkpoint = _layout.open_checkpoint(path)
    return leaf_frame(checkpoint_leaves(checkpoint))


def read_leaf(path: str | os.PathLike[str], checkpointable: str, key: str) -> Any:
    """The value of one stored leaf, reading only that leaf's bytes.

    Args:
      path: A checkpoint directory (see ``checkpoint_table``).
      checkpointable: The checkpointable's name, as in ``checkpoint_table``.
      key: The leaf's key, as in ``checkpoint_table``.

    Returns:
      A ``np.ndarray`` for a stored array (``jax.Array`` leaves too; no device is
      involved), a Python scalar, a string, ``None``, or an iterator's or JSON
      checkpointable's state.

    Raises:
      TypeError: If an argument has the wrong type.
      FileNotFoundError: If ``path`` does not exist.
      ValueError: If the checkpoint, checkpointable or leaf does not exist or
        cannot be read; the message names the path and what is wrong.
    """
    checkpoint = _layout.open_checkpoint(path)
    item = checkpoint.get(checkpointable)
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, got {type(key).__name__}")
    if item.layout == _layout.PYTREE:
        layout = _pytree.read_layout(item.directory)
        leaf = layout.find(key, name=item.name)
        try:
            return _pytree.read_value(layout, leaf, _store.context())
        except ValueError as e:
            raise ValueError(
                f"checkpoint {str(checkpoint.path)!r}: cannot read leaf {key} of "
                f"{checkpointable!r}: {_store.message(e)}"
            ) from None
    if key != ROOT_KEY:
        raise ValueError(
            f"checkpointable {checkpointable!r} in {str(checkpoint.path)!r} is one value; "
            f"its only key is {ROOT_KEY!r}, not {key!r}"
        )
    if item.layout == _layout.ITERATOR:
        return read_iterator_state(item)
    if item.layout == _layout.JSON:
        return _read_json_checkpointable(item)
    if item.layout == _layout.EMPTY:
        _check_empty_record(item)
        return None
    raise ValueError(
        f"checkpointable {checkpointable!r} in {str(checkpoint.path)!r} is stored in a "
        "layout tinax.explore does not read"
    )
