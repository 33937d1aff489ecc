"""The diff's bars: how far each subtree moved, the model's layers by default, and
the subtrees holding NaN or Inf first, in their own colour."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import ipywidgets as w
import pandas as pd

from tinax import vocabulary as words
from tinax.explore import display, toolkit
from tinax.vocabulary import format_key, parse_key

from ._nonfinite import NONFINITE_COLOR, is_nonfinite_change, nonfinite_counts, sides_text
from ._text import note_html

# Subtrees shown with a bar, largest relative change first.
MAX_BARS = 8

# The depth of the bars: the model's layers (as ``drift_table`` finds them), or the
# first N key parts. The dropdown's values: 0 stands for the layers.
LAYERS = 0
BAR_DEPTHS = (("by layer", LAYERS), ("1 key deep", 1), ("2 keys deep", 2), ("3 keys deep", 3))


def _percent(value: Any) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return ""
    if math.isnan(number):
        return ""
    return "∞" if math.isinf(number) else f"{number * 100:.3g} %"


def _subtree_of(paths: dict[str, list[Any]], depth: int) -> Callable[[str, Any], Any]:
    """Maps ``(checkpointable, key path)`` to its subtree: its first ``depth`` parts,
    or with ``LAYERS`` its layer, from the structure of that checkpointable's keys."""
    if depth != LAYERS:
        return lambda _name, path: path[:depth]
    found = {name: toolkit.layer_depth(found) for name, found in paths.items()}
    return lambda name, path: toolkit.layer_of(path, *found[name])


def subtree_changes(table: pd.DataFrame, depth: int) -> pd.DataFrame:
    """The relative change of each subtree, over its changed leaves; subtrees holding
    NaN or Inf first.

    A subtree is the first ``depth`` key parts of a leaf's key, or with ``LAYERS``
    (0) its layer: ``blocks.13`` of a model whose blocks are numbered, each other
    module whole (``layer_of``). Its relative change is ``‖b − a‖ / ‖a‖`` over the
    changed floating-point leaves under it that are finite on both sides (leaves that
    are the same add nothing to ``‖b − a‖``, and those recognised from their stored
    bytes were not decoded, so their norm is not known). A changed leaf holding NaN
    or Inf on either side is counted apart: its change is not a number.

    Returns:
      ``checkpointable``, ``subtree`` (a keystr), ``rel_change`` (NaN when no
      finite leaf changed), ``leaves`` (changed leaves counted), ``nonfinite``
      (those holding NaN or Inf), ``nan`` and ``inf`` (their counts in ``b``) and
      ``nan_a`` and ``inf_a`` (in ``a``):
      subtrees with non-finite leaves first (most such leaves, then most such values
      first), then by relative change.
    """
    bad = is_nonfinite_change(table)
    nan, inf = nonfinite_counts(table, ("b",))
    nan_a, inf_a = nonfinite_counts(table, ("a",))
    changed = (table["status"] == words.CHANGED).to_numpy(bool) & (
        table["norm_a"].notna().to_numpy(bool) | bad
    )
    # Layers are found from the structure of every leaf in the table, changed or not.
    paths: dict[str, list[Any]] = {}
    parsed: list[Any] = []
    for name, key in zip(table["checkpointable"], table["key"], strict=True):
        try:
            path: Any = parse_key(str(key))
        except ValueError:
            path = None
        parsed.append(path)
        if path is not None:
            paths.setdefault(str(name), []).append(path)
    rows = table[changed]
    bad, nan, inf = bad[changed], nan[changed], inf[changed]
    nan_a, inf_a = nan_a[changed], inf_a[changed]
    parsed = [p for p, keep in zip(parsed, changed, strict=True) if keep]
    subtree_of = _subtree_of(paths, depth)
    sums: dict[tuple[str, str], list[float]] = {}
    for i, (name, key, norm_a, norm_diff) in enumerate(
        zip(rows["checkpointable"], rows["key"], rows["norm_a"], rows["norm_diff"], strict=True)
    ):
        path = parsed[i]
        subtree = str(key) if path is None else format_key(subtree_of(str(name), path))
        entry = sums.setdefault((str(name), subtree), [0.0, 0.0, 0, 0, 0, 0, 0, 0])
        entry[2] += 1
        if bad[i]:
            entry[3] += 1
            entry[4] += int(nan[i])
            entry[5] += int(inf[i])
            entry[6] += int(nan_a[i])
            entry[7] += int(inf_a[i])
        elif not pd.isna(norm_a) and not pd.isna(norm_diff):
            entry[0] += float(norm_a) ** 2
            entry[1] += float(norm_diff) ** 2
    out = []
    for (name, subtree), (aa, dd, count, nonfinite, nans, infs, nans_a, infs_a) in sums.items():
        if aa:
            rel = math.sqrt(dd) / math.sqrt(aa)
        elif count > nonfinite:
            rel = 0.0 if dd == 0 else math.inf
        else:
            rel = math.nan
        counts = (int(nans), int(infs), int(nans_a), int(infs_a))
        out.append((name, subtree, rel, int(count), int(nonfinite), *counts))
    frame = pd.DataFrame(
        out,
        columns=[
            "checkpointable",
            "subtree",
            "rel_change",
            "leaves",
            "nonfinite",
            "nan",
            "inf",
            "nan_a",
            "inf_a",
        ],
    )
    values = frame["nan"] + frame["inf"] + frame["nan_a"] + frame["inf_a"]
    order = frame.assign(_rel=frame["rel_change"].fillna(-1.0), _values=values)
    order = order.sort_values(["nonfinite", "_values", "_rel"], ascending=False, kind="stable")
    return order.drop(columns=["_rel", "_values"]).reset_index(drop=True)


def _readable(key: str) -> str:
    try:
        return display.readable_key(key)
    except ValueError:
        return key


def ordered_subtrees(rows: pd.DataFrame, depth: int) -> pd.DataFrame:
    """``subtree_changes`` in the order the bars show them: subtrees holding NaN or
    Inf first, then the model's before the optimizer's, each by its change."""
    subtrees = subtree_changes(rows, depth)
    part = [
        display.state_part(c, k)
        for c, k in zip(subtrees["checkpointable"], subtrees["subtree"], strict=True)
    ]
    return (
        subtrees.assign(_part=part, _finite=subtrees["nonfinite"] == 0)
        .sort_values(["_finite", "_part"], kind="stable")
        .drop(columns=["_part", "_finite"])
        .reset_index(drop=True)
    )


def left_out_text(subtrees: pd.DataFrame, shown: int) -> str:
    """What the bars leave out, in a line: ``and 5 more subtrees: model embed (NaN/Inf),
    model head (NaN/Inf), model pos (NaN/Inf), …``; ``""`` when none is."""
    rest = subtrees.iloc[shown:]
    if rest.empty:
        return ""
    named = [
        f"{name} {_readable(subtree)}".strip() + (" (NaN/Inf)" if bad else "")
        for name, subtree, bad in zip(
            rest["checkpointable"], rest["subtree"], rest["nonfinite"], strict=True
        )
    ]
    more = len(rest)
    listed = ", ".join(named[:3]) + (", …" if more > 3 else "")
    return f"and {more:,} more subtree{'s' if more != 1 else ''}: {listed}"


def bar_rows(subtrees: pd.DataFrame, *, limit: int | None = MAX_BARS) -> tuple[w.Widget, ...]:
    """The bars of ``ordered_subtrees``, under a line that says what they measure: the
    first ``limit`` (``None``: all)."""
    if limit is not None:
        subtrees = subtrees.head(limit)
    finite = [
        r
        for r, n in zip(subtrees["rel_change"], subtrees["nonfinite"], strict=True)
        if not n and math.isfinite(r)
    ]
    top = max(finite, default=0.0) or 1.0
    shown = []
    for row in subtrees.itertuples(index=False):
        shown.append(_bar(row, top))
    if shown:
        shown.insert(
            0,
            w.HTML(
                note_html(
                    "relative change ‖b − a‖ / ‖a‖ of the floating-point leaves"
                    + ("; NaN/Inf in purple" if int(subtrees["nonfinite"].sum()) else "")
                )
            ),
        )
    else:
        shown = [w.HTML(note_html("no floating-point leaf changed"))]
    return tuple(shown)


def _bar(row: Any, top: float) -> w.HBox:
    """One subtree's bar: its relative change against the largest, or, holding NaN or
    Inf, a full bar in their colour and their counts: never a percentage."""
    name, subtree, rel, leaves = row.checkpointable, row.subtree, row.rel_change, row.leaves
    exact = f"{name} {subtree}".strip()
    label = f"{name} {_readable(subtree)}" if subtree else name
    if row.nonfinite:
        value, color = 1.0, NONFINITE_COLOR
        counts = sides_text(row.nan, row.inf, row.nan_a, row.inf_a)
        text = f"NaN/Inf in {row.nonfinite:,} of {leaves:,} changed ({counts})"
    else:
        value = min(1.0, rel / top) if math.isfinite(rel) else 1.0
        color = None
        text = f"{_percent(rel)} ({leaves:,} changed)"
    bar = w.FloatProgress(value=value, min=0.0, max=1.0, layout=w.Layout(width="16em"))
    if color is not None:
        bar.style.bar_color = color
        bar.add_class("tinax-bar-nonfinite")
    words_label = w.Label(text, layout=w.Layout(flex="0 0 auto"))
    if color is not None:
        words_label.style.text_color = color
    return w.HBox(
        [w.Label(label, layout=w.Layout(width="20em"), tooltip=exact), bar, words_label],
        # On a narrow screen the numbers go under the bar, never cut.
        layout=w.Layout(flex_flow="row wrap"),
    )
