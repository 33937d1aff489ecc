"""How far each layer moved between consecutive checkpoints of a run.

Each pair of consecutive complete checkpoints is compared leaf by leaf by
``diff_table`` (raw, checksummed reads in bounded memory) and the leaves' sums are
added up per subtree. The sums of a pair are kept in memory, keyed by both
checkpoints' paths, commit times and sizes, so a second call reads no array again
(at any depth).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from tinax._format import callbacks
from tinax._format.arraydata import rawread
from tinax._format.callbacks import Cancel, Progress
from tinax._format.lru import LruCache
from tinax._format.metadata.layout import Checkpoint
from tinax._format.naming import keys, words
from tinax.explore import _diff, _listing
from tinax.explore.display import natural_key

DRIFT_COLUMNS = (
    "step",
    "previous_step",
    "subtree",
    "key",
    "rel_update",
    "cosine",
    "max_abs_diff",
    "norm",
    "norm_update",
    "nan",
    "inf",
    "leaves",
    "unreadable",
    "nan_b",
    "inf_b",
)
# Linen's variable collections: a level of these names (``params``, ``batch_stats``)
# wraps the model's modules, as NNX's ``value`` wraps its arrays; layers are looked
# for below it.
LINEN_COLLECTIONS = frozenset({"params", "batch_stats", "cache", "intermediates", "losses"})
# Which checkpointable holds the model, by the names training code gives it.
MODEL_NAMES = ("model", "params", "pytree", "state", "default")
# What the sums of the pairs kept may hold at most: about 150 bytes a leaf.
_KEEP_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class LeafDrift:
    """The sums of one floating-point leaf between two checkpoints.

    ``aa``, ``bb`` and ``dd`` are ``‖a‖²``, ``‖b‖²`` and ``‖b − a‖²`` over the elements
    finite on both sides (``aa`` NaN for a leaf found ``same`` from its checksums
    without being read: it adds nothing to ``dd``).
    """

    checkpointable: str
    key: str
    aa: float
    bb: float
    dd: float
    max_abs: float
    nan: int
    inf: int
    nan_b: int = 0
    inf_b: int = 0
    # Why the leaf was not compared (``corrupt``, ``shape differs``, ``only in b``…);
    # ``None`` for a leaf whose sums are above.
    unreadable: str | None = None
    # False for a leaf found ``same`` by its checksums, whose values were not read.
    read: bool = True


# The sums of the pairs read, kept by the process: the result of reading the data of two
# checkpoints (seconds to minutes), not metadata. Why: the run timeline groups the same
# sums by another depth when asked, and a refresh of a run reads only its new pairs;
# nothing else keeps them. Keyed by both checkpoints' path, commit time and size (a
# committed checkpoint does not change; one written again at the same path commits
# anew); bounded by ``_KEEP_BYTES``, the least recently used pairs going first.
_pairs: LruCache[tuple[Any, ...], list[LeafDrift]] = LruCache(
    max_bytes=_KEEP_BYTES, size=lambda leaves: 150 * len(leaves) + 100
)


def _identity(row: Any) -> tuple[Any, ...]:
    return (str(row["path"]), str(row["committed"]), int(row["nbytes"]))


def _count(value: Any) -> int:
    return 0 if value is None or pd.isna(value) else int(value)


def _number(value: Any) -> float:
    return math.nan if value is None or pd.isna(value) else float(value)


def pair_drift(a: _Opened, b: _Opened, checkpointable: str | None = None) -> list[LeafDrift]:
    """The sums of every floating-point leaf of two opened checkpoints (``diff_table``'s),
    or of one checkpointable of each (the others' data is not read), each read with the
    data files held open for it."""
    diff = _diff.diff_sides(
        _diff.stored_side(a.checkpoint, checkpointable, a.files),
        _diff.stored_side(b.checkpoint, checkpointable, b.files),
        sort=False,
    )
    floats = diff[diff["value_kind"] == "float"]
    out = []
    for row in floats.itertuples(index=False):
        if row.status not in (words.SAME, words.CHANGED):
            # Not compared (damaged, or not the same leaf on both sides): said, not dropped.
            out.append(
                LeafDrift(
                    checkpointable=checkpointable or str(row.checkpointable),
                    key=str(row.key),
                    aa=math.nan,
                    bb=math.nan,
                    dd=math.nan,
                    max_abs=math.nan,
                    nan=0,
                    inf=0,
                    unreadable=str(row.status),
                )
            )
            continue
        same = row.status == words.SAME
        decoded = row.decoded
        read = not same or (decoded is not pd.NA and decoded is not None and bool(decoded))
        norm_a, norm_b = _number(row.norm_a), _number(row.norm_b)
        nan = _count(row.nan_a) + _count(row.nan_b)
        inf = _count(row.inf_a) + _count(row.inf_b)
        out.append(
            LeafDrift(
                checkpointable=checkpointable or str(row.checkpointable),
                key=str(row.key),
                aa=norm_a**2 if not same or not math.isnan(norm_a) else math.nan,
                bb=norm_b**2 if not same or not math.isnan(norm_b) else math.nan,
                dd=0.0 if same else _number(row.norm_diff) ** 2,
                max_abs=0.0 if same else _number(row.max_abs_diff),
                nan=nan,
                inf=inf,
                nan_b=_count(row.nan_b),
                inf_b=_count(row.inf_b),
                read=read,
            )
        )
    return out


@dataclasses.dataclass(frozen=True)
class _Opened:
    """A checkpoint of a run as the drift reads it: opened once, its data files opened
    once, for both pairs it is in."""

    checkpoint: Checkpoint
    files: rawread.DataFiles = dataclasses.field(default_factory=rawread.DataFiles)


def _cached_pair(
    first: Any, second: Any, checkpointable: str | None, source: Callable[[Any], _Opened]
) -> list[LeafDrift]:
    identity = (_identity(first), _identity(second), checkpointable)
    return _pairs.get_or_compute(
        identity, lambda: pair_drift(source(first), source(second), checkpointable)
    )


def cached_pairs() -> int:
    """How many pairs' sums this process keeps."""
    return len(_pairs)


def _parts(key: str) -> keys.KeyPath:
    try:
        return keys.parse_key(key)
    except ValueError:
        return (key,)


def _integer_like(part: Any) -> bool:
    return isinstance(part, int) or (isinstance(part, str) and part.isdigit())


def shared_levels(paths: Sequence[keys.KeyPath]) -> int:
    """How many leading key parts are wrappers, not a leaf's last: parts every leaf
    shares (a model saved under one name), and levels of Linen's variable
    collections (``params``, ``batch_stats``: ``LINEN_COLLECTIONS``), however many
    of them the model has. Layers are looked for below them."""
    if not paths:
        return 0
    shortest = min(len(p) for p in paths)
    level = 0
    while level < shortest - 1 and (
        len(names := {p[level] for p in paths}) == 1 or names <= LINEN_COLLECTIONS
    ):
        level += 1
    return level


def layer_depth(paths: Sequence[keys.KeyPath]) -> tuple[int, int]:
    """Where a model's structure says its layers are: ``(depth, base)``, ``depth`` one
    past the first level whose keys include indices (``blocks.0``, ``blocks.1``…:
    depth 2), else one past ``base``, the wrapper levels (``shared_levels``: its
    modules, ``params.Dense_0``)."""
    base = shared_levels(paths)
    deepest = max((len(p) for p in paths), default=0)
    for level in range(base, deepest):
        if any(len(p) > level + 1 and _integer_like(p[level]) for p in paths):
            return level + 1, base
    return base + 1, base


def layer_of(path: keys.KeyPath, depth: int, base: int = 0) -> keys.KeyPath:
    """The layer a leaf belongs to when layers are ``depth`` deep: its first ``depth``
    parts where they end in an index (``blocks.7``); else its module below the
    ``base`` shared levels (``embed``, ``head``; Linen's ``params.Dense_0``), which is
    not a sequence of layers."""
    if len(path) > depth and _integer_like(path[depth - 1]):
        return path[:depth]
    return path[: base + 1]


def _label(path: keys.KeyPath) -> str:
    return ".".join(str(part) for part in path) if path else "(root)"


def drift_table(
    root: str | os.PathLike[str],
    *,
    depth: int | None = None,
    checkpointable: str | None = None,
    progress: Progress | None = None,
    cancel: Cancel | None = None,
) -> pd.DataFrame:
    """How far each subtree (layer) moved between consecutive checkpoints of a run.

    For each pair of consecutive complete checkpoints (by step) and each subtree at
    ``depth``: the relative update ``‖b − a‖ / ‖a‖``, the cosine of ``a`` and ``b``
    and the largest absolute difference, over the subtree's floating-point leaves
    (counters, integer leaves and PRNG keys are left out, as ``diff_table`` tells
    them). Arrays are read raw and checked against their checksums, in bounded
    memory, by ``diff_table``; each pair's sums are kept in memory, so a second call
    (at any depth) reads no array again.

    Args:
      root: A run directory (local or ``gs://``).
      depth: How many key parts make a subtree, counted below the wrapper levels
        (``shared_levels``: a name every leaf shares, Linen's collections
        ``params`` and ``batch_stats``), which stay in its name: ``2`` makes
        ``blocks.7`` of ``['blocks']['7']['attn']['q']['kernel']``, ``1`` makes
        ``params.Conv_0`` and ``batch_stats.BatchNorm_0`` of a Linen model.
        ``None``: the model's layers, where its structure says they are: the
        items of its first level with indices (``blocks.N``), and each other
        module below the wrappers whole (``embed``, ``head``; Linen's
        ``params.Dense_0``).
      checkpointable: Which checkpointable to compare; ``None``: the model (the
        first of ``model``, ``params``, ``pytree``, ``state``, ``default`` present,
        else every one).
      progress: Called as ``progress(pairs_done, pairs_total)`` after each pair.
      cancel: A ``threading.Event`` or a callable; once set (or returning true),
        no further pair is compared and the table holds the pairs done, with
        ``attrs["cancelled"]`` true.

    Returns:
      A DataFrame with one row per pair and subtree, ordered by step then subtree
      (indices as numbers): ``step`` (the later checkpoint's), ``previous_step``,
      ``subtree`` (dotted: ``blocks.7``; with every checkpointable compared,
      prefixed by its name), ``key`` (the subtree's key path, as ``keystr``),
      ``rel_update``, ``cosine``, ``max_abs_diff``, ``norm`` (‖a‖; NaN where a leaf
      was found unchanged by its checksums without being read), ``norm_update``
      (‖b − a‖), ``nan`` and ``inf`` (non-finite values of the subtree, both sides),
      ``leaves`` (its floating-point leaves), ``unreadable`` (those of them not
      compared: damaged on a side, or not the same leaf on both), and ``nan_b``
      and ``inf_b`` (those of the later checkpoint alone: what a scan of it counts
      in the subtree). The statistics
      are over the leaves compared and the elements finite on both sides; a
      subtree holding NaN or Inf on either side, or none of whose leaves could be
      compared, has NaN statistics. ``attrs``: ``depth``, ``checkpointable``,
      ``cancelled``, ``pairs`` and ``unreadable``, a list of one dict per leaf not
      compared: ``step``, ``previous_step``, ``checkpointable``, ``key`` and
      ``status`` (as ``diff_table`` found it: ``corrupt``, ``shape differs``, ``only
      in b``…); ``pd.DataFrame(attrs["unreadable"])`` makes it a table.

    Raises:
      TypeError: If ``depth`` is not an integer or ``checkpointable`` not a string.
      ValueError: If ``depth`` < 1, or a checkpoint cannot be read.
      FileNotFoundError: If ``root`` does not exist.
    """
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)):
        raise TypeError(f"depth must be an integer or None, got {type(depth).__name__}")
    if depth is not None and depth < 1:
        raise ValueError(f"depth must be at least 1, got {depth}")
    if checkpointable is not None and not isinstance(checkpointable, str):
        raise TypeError(
            f"checkpointable must be a name or None, got {type(checkpointable).__name__}"
        )
    run = _listing.run_listing(root)
    listing = run.table
    opened: dict[str, _Opened] = {}

    def source(row: Any) -> _Opened:
        """A checkpoint of the run as a pair reads it: opened once, from what the run's
        listing read of it, for both pairs it is in (and let go after the second)."""
        path = str(row["path"])
        if path not in opened:
            opened[path] = _Opened(run.open(row))
        return opened[path]

    complete = listing[(listing["status"] == words.COMPLETE) & listing["step"].notna()]
    complete = complete.sort_values("step", kind="stable")
    rows = [row for _, row in complete.iterrows()]
    pairs = list(itertools.pairwise(rows))
    stored = set(rows[-1]["checkpointables"] or ()) if rows else set()
    if checkpointable is None:
        chosen = next((name for name in MODEL_NAMES if name in stored), None)
    else:
        chosen = checkpointable
        if rows and chosen not in stored:
            raise ValueError(
                f"{str(root)!r}: its checkpoints have no checkpointable {chosen!r} "
                f"(they have {sorted(stored)})"
            )
    done: list[tuple[int, int, list[LeafDrift]]] = []
    cancelled = False
    try:
        for index, (first, second) in enumerate(pairs):
            if callbacks.cancelled(cancel):
                cancelled = True
                break
            found = _cached_pair(first, second, chosen, source)
            done_with = opened.pop(str(first["path"]), None)  # in no later pair
            if done_with is not None:
                done_with.files.close()
            done.append((int(first["step"]), int(second["step"]), found))
            if progress is not None:
                progress(index + 1, len(pairs))
    finally:
        for left in opened.values():
            left.files.close()
    paths = {
        (leaf.checkpointable, leaf.key): _parts(leaf.key)
        for _, _, leaves in done
        for leaf in leaves
        if chosen is None or leaf.checkpointable == chosen
    }
    by_name: dict[str, list[keys.KeyPath]] = collections.defaultdict(list)
    for (name, _), path in paths.items():
        by_name[name].append(path)
    depths = {name: layer_depth(found) for name, found in by_name.items()}
    out = []
    unreadable_rows: list[tuple[int, int, str, str, str]] = []
    # NaN/Inf counts of each leaf's later side, carried to the next pair: a leaf found
    # the same by its checksums there (not read) holds the very same values.
    carried: dict[tuple[str, str], tuple[int, int]] = {}
    for previous, step, leaves in done:
        sums: dict[tuple[str, keys.KeyPath], list[Any]] = {}
        for leaf in leaves:
            if chosen is not None and leaf.checkpointable != chosen:
                continue
            path = paths[(leaf.checkpointable, leaf.key)]
            layers, base = depths[leaf.checkpointable]
            # An explicit depth counts below the wrappers (Linen's ``params``), which
            # stay in the name.
            subtree = layer_of(path, layers, base) if depth is None else path[: base + depth]
            group = sums.setdefault((leaf.checkpointable, subtree), [0.0] * 4 + [0] * 7)
            group[6] += 1
            if leaf.unreadable is not None:
                group[8] += 1
                unreadable_rows.append(
                    (step, previous, leaf.checkpointable, leaf.key, leaf.unreadable)
                )
                continue
            group[0] += leaf.aa if not math.isnan(leaf.aa) else 0.0
            group[1] += leaf.bb if not math.isnan(leaf.bb) else 0.0
            group[2] += leaf.dd if not math.isnan(leaf.dd) else 0.0
            group[3] = max(group[3], leaf.max_abs) if not math.isnan(leaf.max_abs) else group[3]
            nan, inf, nan_b, inf_b = leaf.nan, leaf.inf, leaf.nan_b, leaf.inf_b
            if not leaf.read:
                nan_b, inf_b = carried.get((leaf.checkpointable, leaf.key), (0, 0))
                nan, inf = 2 * nan_b, 2 * inf_b
            carried[(leaf.checkpointable, leaf.key)] = (nan_b, inf_b)
            group[4] += nan
            group[5] += inf
            group[7] += int(not leaf.read)
            group[9] += nan_b
            group[10] += inf_b
        for (name, path), group in sums.items():
            aa, bb, dd, max_abs, nan, inf, count, unread, unreadable, nan_b, inf_b = group
            # A leaf ``same`` by its checksums was not read: the subtree's norm is unknown.
            norm, update = (math.nan if unread else math.sqrt(aa)), math.sqrt(dd)
            if nan or inf or unreadable == count:
                rel = cosine = max_diff = math.nan
                if unreadable == count:
                    norm = update = math.nan
            elif dd == 0.0:
                rel, cosine, max_diff = 0.0, 1.0, 0.0
            elif unread:
                # Part of the subtree was not read (unchanged): its norm is not known.
                rel, cosine, max_diff = math.nan, math.nan, max_abs
            else:
                rel = update / norm if norm > 0 else math.inf
                ab = (aa + bb - dd) / 2
                cosine = ab / math.sqrt(aa * bb) if aa > 0 and bb > 0 else math.nan
                cosine = min(1.0, max(-1.0, cosine)) if not math.isnan(cosine) else cosine
                max_diff = max_abs
            label = _label(path) if chosen is not None else _label((name, *path))
            out.append(
                (
                    step,
                    previous,
                    label,
                    keys.format_key(path),
                    rel,
                    cosine,
                    max_diff,
                    norm,
                    update,
                    nan,
                    inf,
                    count,
                    unreadable,
                    nan_b,
                    inf_b,
                    natural_key(keys.format_key(path)),
                )
            )
    out.sort(key=lambda r: (r[0], r[-1]))
    columns: dict[str, Any] = {}
    for i, column in enumerate(DRIFT_COLUMNS):
        values = [r[i] for r in out]
        if column in (
            "step",
            "previous_step",
            "nan",
            "inf",
            "leaves",
            "unreadable",
            "nan_b",
            "inf_b",
        ):
            columns[column] = pd.array(values, dtype="Int64")
        elif column in ("subtree", "key"):
            columns[column] = pd.array(values, dtype="string")
        else:
            columns[column] = np.array(values, dtype=float)
    table = pd.DataFrame(columns)
    # Plain records, not a DataFrame: pandas compares attrs when it combines frames.
    unreadable = [
        {"step": a, "previous_step": b, "checkpointable": c, "key": k, "status": why}
        for a, b, c, k, why in unreadable_rows
    ]
    table.attrs = {
        "depth": depth,
        "checkpointable": chosen,
        "cancelled": cancelled,
        "pairs": len(done),
        "unreadable": unreadable,
    }
    return table
