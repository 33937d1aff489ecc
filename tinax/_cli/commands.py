"""``tinax ls``, ``show``, ``diff`` and ``export``: the explore tables in a terminal, or
as JSON or CSV for scripts (``main`` reads the command line and calls these).

Text output fits the terminal's width (``COLUMNS``, else the terminal's, else 80
characters): sizes in KiB/MiB, times as ages, floats to four significant digits, keys
as ``tinax.explore.display`` shows them everywhere, in natural order. ``--json`` and
``--csv`` print every column at full precision under the tables' own column names,
keys as exact ``keystr``.
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pandas as pd

from tinax._cli import terminal as term
from tinax._cli.args import EXIT_NO, EXIT_OK
from tinax._cli.output import (
    _csv,
    _dump,
    _machine,
    _natural,
    _progress,
    _records,
    _say,
)
from tinax._cli.terminal import Column, jsonable
from tinax._cli.verify import is_run
from tinax._format.metadata.layout import Checkpoint
from tinax._format.naming import keys as _keys
from tinax._format.naming import words
from tinax._paths import open_checkpoint
from tinax.explore import display
from tinax.explore._checkpoint import checkpoint_table, read_leaf
from tinax.explore._diff import diff_table
from tinax.explore._export import export_safetensors
from tinax.explore._key_match import LeafNotFoundError, exact_key, match_key
from tinax.explore._ranking import PRNG_KEY, value_kind
from tinax.explore._summary import leaf_summary

__all__ = ["diff", "export", "jsonable", "show"]

# A PRNG key leaf shows this many keys' data in text.
_KEYS_SHOWN = 4
# --json gives at most this many elements of a key array's data.
_KEY_DATA_JSON = 4096


_LEAVES = (
    Column("key", "key", key=True, priority=0),
    Column("kind", "kind", priority=5),
    Column("shape", "shape", term.shape, priority=1),
    Column("dtype", "dtype", priority=1),
    Column("nbytes", "size", term.human_bytes, priority=2, right=True),
    Column("value", "value", priority=3),
    Column("chunk_shape", "chunks", term.shape, priority=7),
    Column("sharding", "sharding", priority=8),
)
_DIFF = (
    Column("key", "key", key=True, priority=0),
    Column("status", "status", priority=0),
    Column("change", "change", priority=1, right=True),
    Column("shape_a", "shape", term.shape, priority=3),
    Column("dtype_a", "dtype", priority=4),
    Column("max_abs_diff", "max_abs_diff", term.number, priority=5, right=True),
    Column("cosine", "cosine", term.number, priority=7, right=True),
    # The later side's NaN and Inf matter most (where a run went); zeros are blank,
    # so that a column of them gives way.
    Column("nan_a", "nan_a", term.count_if_any, priority=8, right=True),
    Column("nan_b", "nan_b", term.count_if_any, priority=6, right=True),
    Column("inf_a", "inf_a", term.count_if_any, priority=8, right=True),
    Column("inf_b", "inf_b", term.count_if_any, priority=7, right=True),
)
_FILES = (
    Column("file", "file", priority=0),
    Column("nbytes", "size", term.human_bytes, priority=1, right=True),
)


# -- ls ------------------------------------------------------------------------------------


# -- show ----------------------------------------------------------------------------------


def _show_checkpoint(path: str, args: argparse.Namespace, out: TextIO) -> None:
    from tinax._cli import surgery

    checkpoint = open_checkpoint(path)  # once, for the table, the keys and the lineage
    table = checkpoint_table(checkpoint)
    if args.json or args.csv:
        _machine(table, args.json, out)
        return
    total = term.width()
    made = surgery.lineage_line(checkpoint)
    if made:
        _say(made, out, total)
        print(file=out)
    # One block per checkpointable: its name once, what its keys share, its table.
    typed = typed_keys(checkpoint)
    for name, rows in table.groupby("checkpointable", sort=False):
        rows = _with_key_kind(_natural(rows.reset_index(drop=True)), typed)
        nbytes = term.human_bytes(rows["nbytes"].sum()) if rows["nbytes"].notna().any() else ""
        count = f"{len(rows)} lea{'f' if len(rows) == 1 else 'ves'}"
        title = f"{name or '(unnamed)'}: {count}" + (f", {nbytes}" if nbytes else "")
        shared = display.shared_prefix([str(k) for k in rows["key"]])
        if shared:
            title += f"; keys under {shared}"
        _say(title, out, total)
        term.render(rows, _LEAVES, out, total)
        print(file=out)
    for name, nodes in table.attrs.get("pipelines", {}).items():
        _say(f"{name}: saved from the pipeline {' → '.join(nodes)}", out, total)
    without = sorted(n for n, has in table.attrs["checksums"].items() if not has)
    if without:
        _say(
            f"checksums: none recorded for {', '.join(map(repr, without))} (written "
            "without tinax checksums; data cannot be checked)",
            out,
            total,
        )


def typed_keys(path: str | Checkpoint) -> dict[tuple[str, str], str]:
    """The arrays of a checkpoint that were typed PRNG keys when saved (Orbax stores
    their key data and records the key's implementation): ``(checkpointable, key)``
    → implementation (``fry``, ``threefry2x32``…)."""
    from tinax._format.metadata import fit, layout, pytree

    found: dict[tuple[str, str], str] = {}
    checkpoint = open_checkpoint(path)
    for item in checkpoint.checkpointables:
        if item.layout != layout.PYTREE:
            continue
        try:
            impls = fit.key_impls(item)
        except (ValueError, OSError):
            continue
        if not impls or not any(impls.values()):
            continue
        for leaf in pytree.read_layout(item).leaves:
            impl = impls.get(leaf.param)
            if impl:
                found[(item.name, leaf.key)] = impl
    return found


def _with_key_kind(rows: pd.DataFrame, typed: dict[tuple[str, str], str]) -> pd.DataFrame:
    """Rows whose values are PRNG keys (stored as their key data) say so in ``kind``; a
    typed key (``jax.random.key``) is shown as the key it is, ``key<impl>`` of the
    key's own shape, not as its key data's ``(2,) uint32``."""
    kinds, shapes, dtypes = [], [], []
    for cp, key, kind, dtype, shape in zip(
        rows["checkpointable"], rows["key"], rows["kind"], rows["dtype"], rows["shape"], strict=True
    ):
        impl = typed.get((str(cp), str(key)))
        if impl is not None and isinstance(shape, tuple) and shape:
            kinds.append(PRNG_KEY)
            shapes.append(shape[:-1])
            dtypes.append(f"key<{impl}>")
            continue
        dims = tuple(shape) if isinstance(shape, tuple) else shape
        kinds.append(PRNG_KEY if value_kind(str(cp), str(key), dtype, dims) == PRNG_KEY else kind)
        shapes.append(shape)
        dtypes.append(dtype)
    shown = rows.assign(
        kind=pd.array(kinds, dtype=rows["kind"].dtype),
        shape=pd.Series(shapes, index=rows.index, dtype=object),
        dtype=pd.array(dtypes, dtype=rows["dtype"].dtype),
    )
    if "chunk_shape" in shown.columns:
        # A typed key's chunks are its key data's: they say nothing of the key.
        keyed = [str(d).startswith("key<") for d in dtypes]
        shown["chunk_shape"] = shown["chunk_shape"].astype(object).mask(keyed, None)
    return shown


def _labels_shown(table: pd.DataFrame, checkpointable: str) -> dict[str, str]:
    """``show``'s key labels for a checkpointable at this terminal's width: label → key."""
    rows = _natural(table[table["checkpointable"] == checkpointable].reset_index(drop=True))
    labels = term.layout(rows, _LEAVES, term.width()).cells["key"]
    return dict(zip(labels, (str(k) for k in rows["key"]), strict=True))


def _resolve_leaf(path: str, given: Sequence[str]) -> tuple[str, str]:
    """The checkpointable and exact key that ``--leaf``'s words name."""
    if len(given) > 2:
        raise ValueError(
            f"--leaf takes [CHECKPOINTABLE] KEY, got {len(given)} words; quote a key "
            "with spaces in it"
        )
    table = checkpoint_table(path)
    names = [str(n) for n in dict.fromkeys(table["checkpointable"])]
    by_name = {n: [str(k) for k in table.loc[table["checkpointable"] == n, "key"]] for n in names}
    if len(given) == 2:
        checkpointable, name = given
        if checkpointable not in by_name:
            import difflib

            near = difflib.get_close_matches(checkpointable, names, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise LeafNotFoundError(
                f"{path}: no checkpointable {checkpointable!r}; it has {', '.join(names)}{hint}"
            )
        shown = _labels_shown(table, checkpointable)
        key = match_key(by_name[checkpointable], name, checkpointable=checkpointable, shown=shown)
        return checkpointable, key
    # One word: the key with its checkpointable as its first part (model.blocks.2…),
    # or a key that names one leaf of the whole checkpoint.
    written = [
        (checkpointable, found)
        for checkpointable, keys in by_name.items()
        if (found := exact_key(keys, given[0])) is not None
    ]
    if len(written) == 1:
        return written[0]
    labelled = [
        (checkpointable, shown[given[0]])
        for checkpointable in names
        if given[0] in (shown := _labels_shown(table, checkpointable))
    ]
    if len(labelled) == 1:
        return labelled[0]
    whole: dict[str, tuple[str, str]] = {}
    for checkpointable, keys in by_name.items():
        for key in keys:
            whole[_keys.format_key((checkpointable, *_keys.parse_key(key)))] = (checkpointable, key)
    return whole[match_key(list(whole), given[0])]


def _key_lines(value: np.ndarray) -> list[str]:
    """A PRNG key array's keys as hex words, the first few."""
    data = np.asarray(value).reshape(-1, value.shape[-1]) if value.ndim else value.reshape(1, 1)
    shown = [" ".join(f"{int(w):08x}" for w in row) for row in data[:_KEYS_SHOWN]]
    if len(data) > _KEYS_SHOWN:
        shown.append(f"… and {len(data) - _KEYS_SHOWN} more")
    return shown


def _show_leaf(path: str, given: Sequence[str], args: argparse.Namespace, out: TextIO) -> None:
    checkpointable, key = _resolve_leaf(path, given)
    value = read_leaf(path, checkpointable, key)
    is_array = isinstance(value, np.ndarray)
    is_key = is_array and (
        value_kind(checkpointable, key, value.dtype.name, tuple(value.shape)) == PRNG_KEY
    )
    if is_key:
        # A key's bits are not quantities: no statistics of them, the key data itself.
        summary: dict[str, Any] = {
            "kind": PRNG_KEY,
            "shape": tuple(int(d) for d in value.shape),
            "dtype": value.dtype.name,
            "keys": int(np.prod(value.shape[:-1], dtype=np.int64)) if value.ndim else 1,
        }
    else:
        summary = leaf_summary(value)
    label = display.readable_key(key)
    if args.json or args.csv:
        record: dict[str, Any] = {
            "checkpointable": checkpointable,
            "key": key,
            "name": label,
            **summary,
        }
        if is_key:
            flat = value.reshape(-1)
            record["key_data"] = flat[:_KEY_DATA_JSON].reshape(-1, value.shape[-1]).tolist()
            record["key_data_complete"] = flat.size <= _KEY_DATA_JSON
        elif not is_array:
            record["value"] = value
        if args.json:
            json.dump(jsonable(record), out, indent=1)
            print(file=out)
        else:
            _csv(pd.DataFrame([record]), out)
        return
    total = term.width()
    fields: list[tuple[str, str]] = [
        ("checkpointable", checkpointable),
        ("key", label),
        ("keystr", key or '""'),
    ]
    for field, item in summary.items():
        if term.is_missing(item):
            continue
        shown = term.shape(item) if field == "shape" else term.text(item)
        # "size" means bytes in every view; a summary's size counts elements.
        fields.append(("elements" if field == "size" else field, shown))
    if is_key:
        fields.extend(("key data", line) for line in _key_lines(value))
    elif not is_array:
        # Numbers to four significant digits, like the tables (--json has them whole).
        plain = isinstance(value, int | float | np.number) and not isinstance(value, bool)
        fields.append(("value", term.number(value) if plain else repr(value)))
    for field, shown in fields:
        print(term.shorten_middle(f"{field}: {shown}", total), file=out)


def show(path: str, args: argparse.Namespace, out: TextIO, err: TextIO, *, listing: bool) -> None:
    """``tinax ls ROOT``, ``tinax show PATH`` and ``tinax PATH``."""
    if getattr(args, "leaf", None):
        _show_leaf(path, args.leaf, args, out)
    elif listing or is_run(path):
        from tinax._cli.ls import show_listing

        show_listing(path, args, out, err)
    else:
        _show_checkpoint(path, args, out)


# -- diff ----------------------------------------------------------------------------------


def diff(args: argparse.Namespace, out: TextIO) -> int:
    """``tinax diff A B``: 0 when every leaf is the same, 1 when they differ (diff(1)'s)."""
    table = diff_table(args.a, args.b, sort=not args.key_order)
    differ = bool((table["status"] != words.SAME).any())
    if args.key_order:
        table = _natural(table)
    if args.changed:
        table = table[table["status"] != words.SAME].reset_index(drop=True)
    if args.json or args.csv:
        # Statistics that do not apply (or are undefined, as a zero vector's cosine) are null.
        _machine(table.astype(object).where(table.notna(), None), args.json, out)
        return EXIT_NO if differ else EXIT_OK
    total = term.width()
    _say(f"from {args.a}", out, total)
    _say(f"  to {args.b}", out, total)
    names = [str(n) for n in table["checkpointable"]]
    # "change" tells a change for what the leaf is; for the rest it repeats the status.
    told = table["change"].astype(object).where(table["change"] != table["status"], None)
    term.render(table.assign(change=told), _DIFF, out, total, checkpointables=names)
    counts = table["status"].value_counts()
    said = ", ".join(f"{n} {status}" for status, n in counts.items()) or "no leaves"
    changed = table[table["status"] == words.CHANGED]
    for marker in words.NONFINITE_CHANGES:
        found = int((changed["nonfinite"] == marker).sum())
        if found:
            said += f"; {found} {marker}"
    _say(said, out, total)
    return EXIT_NO if differ else EXIT_OK


# -- export --------------------------------------------------------------------------------


def export(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``tinax export CKPT OUT``."""
    with _progress(err, "exporting") as progress, warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", RuntimeWarning)
        files = export_safetensors(
            args.checkpoint,
            args.out,
            checkpointable=args.checkpointable,
            keys=args.keys,
            dtype=args.dtype,
            max_file_bytes=args.max_file_size,
            verify=args.verify,
            progress=progress,
        )
    for warning in said:
        # NaN or Inf written: one line on stderr, whatever the output format.
        print(f"tinax export: warning: {warning.message}", file=err)
    rows = pd.DataFrame(
        {
            "file": [f.name for f in files],
            "path": [str(f) for f in files],
            "nbytes": [Path(f).stat().st_size for f in files],
        }
    )
    if args.json:
        _dump(
            {
                "directory": str(files[0].parent),
                "checkpointable": args.checkpointable,
                "files": _records(rows),
            },
            out,
        )
        return EXIT_OK
    if args.csv:
        _csv(rows, out)
        return EXIT_OK
    total = term.width()
    count = f"{len(files)} file{'s' if len(files) > 1 else ''}"
    title = f"{count}, {term.human_bytes(int(rows['nbytes'].sum()))}"
    print(term.shorten_middle(f"{files[0].parent}: {title}", total), file=out)
    term.render(rows, _FILES, out, total)
    return 0
