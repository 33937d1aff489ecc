"""What a table's page says: its cells as text, its keys as people read them, offered
at every width, and which of its columns say nothing about the rows in view.

Both are worked out per page, in Python, so that the browser (``grid.js``) only picks:
the longest set of key labels that fits its column (each set keeps the rows apart,
``display.display_keys``), and which columns to leave out first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from tinax.explore import display

# The widths (characters) at which a key column's labels are offered, longest first
# (0: no limit): the browser shows the longest set whose every label fits, so that the
# rows in view never read alike however narrow the column.
KEY_WIDTHS = (0, 96, 80, 68, 58, 50, 44, 38, 33, 29, 25, 22, 19, 16)
# How little a column says about the rows in view: nothing at all (not shown), or one
# value in every row (the first to give way).
SILENT = 2
UNIFORM = 1


def format_cell(value: Any) -> str:
    """A table cell's text: ``''`` for missing values, tuples without trailing commas."""
    if value is None or value is pd.NaT:
        return ""
    if isinstance(value, float) and math.isnan(value):
        return ""
    try:
        if pd.isna(value) is True:
            return ""
    except (TypeError, ValueError):
        pass
    if isinstance(value, tuple):
        # Shapes read as Python writes them: (4,) and ().
        return "(" + ", ".join(str(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)


def key_labels(
    texts: Sequence[str], keys: Sequence[str], groups: Sequence[str] | None
) -> tuple[list[list[str]], list[str], str]:
    """Labels of a page's leaf keys at every ``KEY_WIDTHS`` width, the exact text that
    hover and copy give, and what every label leaves out (for the header).

    Args:
      texts: Each row's key as its column formats it (``"(whole)"`` for the root).
      keys: Each row's key in keystr format (``""`` for the root).
      groups: Each row's checkpointable, or ``None``: they lead the labels when they
        differ; a whole checkpointable (the empty key) is named by it.

    Returns:
      ``(labels, exact, prefix)``; ``labels`` empty for every row when a key is not
      in keystr format (the cells are shown as they are).
    """
    several = groups if groups is not None and len(set(groups)) > 1 else None
    try:
        sets = [
            display.display_keys(keys, width=w or None, checkpointables=several) for w in KEY_WIDTHS
        ]
        prefix = display.shared_prefix(keys, checkpointables=several)
    except ValueError:
        return [[] for _ in texts], list(texts), ""
    labels = []
    for slot, text in enumerate(texts):
        if keys[slot] == "" and several is None:
            labels.append([text] * len(KEY_WIDTHS))  # the root, as the column formats it
        else:
            labels.append([labels_at[slot] for labels_at in sets])
    exact = [k or (groups[slot] if groups else "") or texts[slot] for slot, k in enumerate(keys)]
    return labels, exact, prefix


def quiet_columns(
    cells: Sequence[Sequence[str]], keys: Sequence[bool], told: Sequence[bool]
) -> list[int]:
    """Per column of a page: ``SILENT`` if it says nothing about the rows in view (every
    cell blank, the same cells as a column before it, or ``told`` by the key labels),
    ``UNIFORM`` if one value fills it, else 0; key columns (``keys``) always 0."""
    columns = [[row[i] for row in cells] for i in range(len(keys))]
    quiet = []
    for i, values in enumerate(columns):
        if keys[i]:
            quiet.append(0)
            continue
        blank = all(v == "" for v in values)
        twin = bool(values) and any(columns[j] == values for j in range(i) if not keys[j])
        if blank or twin or told[i]:
            quiet.append(SILENT)
        elif len(values) > 1 and len(set(values)) == 1:
            quiet.append(UNIFORM)
        else:
            quiet.append(0)
    return quiet
