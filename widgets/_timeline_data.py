"""What the run timeline's drawing (``timeline.js``) is sent: the run's figures as JSON,
non-finite values told apart from missing ones."""

from __future__ import annotations

import html
import math
from typing import Any

import pandas as pd

from tinax.explore.display import display_keys, human_bytes, readable_key
from tinax.vocabulary import COMPLETE, DIVERGED
from tinax.vocabulary import NONFINITE as SCAN_NONFINITE

from ._nonfinite import NONFINITE_COLOR, counted

# Labels of the heatmap's rows: as wide as this in characters at most.
LABEL_CHARS = 28
# A heatmap cell that is not a value: its layer held NaN or Inf on either side, or
# a part of it could not be compared or was not read (its figures are not known).
NAN_CELL = "nonfinite"
UNREAD_CELL = "unread"
# ``run_table``'s column naming, per checkpoint, the metrics recorded as NaN or ±Inf.
NONFINITE_METRICS = "nonfinite_metrics"


def floats(values: Any) -> list[float | None]:
    """JSON numbers: NaN, infinities and what is not a number as ``None`` (a gap)."""
    out: list[float | None] = []
    for v in values:
        try:
            number = float(v)
        except (TypeError, ValueError):
            out.append(None)
            continue
        out.append(number if math.isfinite(number) else None)
    return out


def nonfinite_word(value: Any) -> str | None:
    """``"NaN"``, ``"Inf"`` or ``"-Inf"`` for a non-finite number; ``None`` for a
    finite one and for what is no number at all (a missing value)."""
    if value is None or value is pd.NA:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if math.isnan(number):
        # A missing value of a float column is NaN too: pandas' own NA marks it apart.
        return "NaN"
    if math.isinf(number):
        return "Inf" if number > 0 else "-Inf"
    return None


def nonfinite_metrics(rows: pd.DataFrame, metrics: list[str]) -> dict[str, list[list[Any]]]:
    """Per metric, ``[step, word]`` of each checkpoint whose value is NaN or ±Inf.

    A checkpoint that does not record the metric at all is not listed: a NaN in a
    metric column counts only where ``run_table``'s ``nonfinite_metrics`` names the
    metric (without that column: where a nullable column holds NaN, not ``<NA>``).
    """
    named: list[set[str]] | None = None
    if NONFINITE_METRICS in rows:
        named = [
            set() if pd.isna(v) else {n.strip() for n in str(v).split(", ")}
            for v in rows[NONFINITE_METRICS]
        ]
    out: dict[str, list[list[Any]]] = {}
    for metric in metrics:
        if metric not in rows:
            continue
        column = rows[metric]
        missing = column.isna() if _nullable(column) else pd.Series(False, index=column.index)
        found = []
        for i, (step, value, absent) in enumerate(zip(rows["step"], column, missing, strict=True)):
            word = None if absent is True else nonfinite_word(value)
            if named is not None and metric not in named[i]:
                word = None
            if word is not None:
                found.append([int(step), word])
        if found:
            out[metric] = found
    return out


def _nullable(column: pd.Series) -> bool:
    # Nullable extension dtypes (Float64, Int64) keep NaN apart from <NA>.
    return isinstance(column.dtype, pd.api.extensions.ExtensionDtype) and not isinstance(
        column.dtype, pd.CategoricalDtype
    )


def first_nonfinite_metrics(found: dict[str, list[list[Any]]]) -> list[tuple[str, int, str]]:
    """``(metric, first step, word)`` of each metric that went non-finite, earliest first."""
    firsts = [(metric, int(hits[0][0]), str(hits[0][1])) for metric, hits in found.items()]
    return sorted(firsts, key=lambda f: (f[1], f[0]))


def _counts(drift: pd.DataFrame, column: str) -> list[int]:
    if column not in drift:
        return [0] * len(drift)
    return [counted(v) for v in drift[column]]


def cell_states(drift: pd.DataFrame) -> list[str | None]:
    """What each ``drift_table`` row's heatmap cell shows instead of a colour, if
    anything: ``NAN_CELL`` when its layer held NaN or Inf, ``UNREAD_CELL`` when a
    part of it could not be compared or its figures are not known, ``None`` for a
    value."""
    states: list[str | None] = []
    for nan, inf, unreadable, value in zip(
        _counts(drift, "nan"),
        _counts(drift, "inf"),
        _counts(drift, "unreadable"),
        drift["rel_update"],
        strict=True,
    ):
        if nan or inf:
            states.append(NAN_CELL)
        elif unreadable or value is None or value is pd.NA or pd.isna(value):
            states.append(UNREAD_CELL)
        else:
            states.append(None)
    return states


def heat_data(drift: pd.DataFrame) -> tuple[dict[str, Any], list[str]]:
    """The heatmap's part of the data (rows: layers, columns: consecutive pairs), and
    the ``drift_table`` key of each row."""
    keys = list(dict.fromkeys(str(k) for k in drift["key"]))
    subtrees = {str(k): str(s) for k, s in zip(drift["key"], drift["subtree"], strict=True)}
    pairs = sorted(
        {(int(s), int(p)) for s, p in zip(drift["step"], drift["previous_step"], strict=True)}
    )
    column = {step: i for i, (step, _) in enumerate(pairs)}
    row_of = {key: i for i, key in enumerate(keys)}
    heat: list[list[float | None]] = [[None] * len(pairs) for _ in keys]
    states: list[list[str | None]] = [[None] * len(pairs) for _ in keys]
    counts: list[list[list[int] | None]] = [[None] * len(pairs) for _ in keys]
    for key, step, value, state, nan, inf, nan_b, inf_b, unreadable in zip(
        drift["key"],
        drift["step"],
        floats(drift["rel_update"]),
        cell_states(drift),
        _counts(drift, "nan"),
        _counts(drift, "inf"),
        _counts(drift, "nan_b"),
        _counts(drift, "inf_b"),
        _counts(drift, "unreadable"),
        strict=True,
    ):
        r, c = row_of[str(key)], column[int(step)]
        heat[r][c] = value
        states[r][c] = state
        # What a cell's tooltip tells: NaN and Inf in each of its two checkpoints
        # (the counts a scan of each finds), and leaves not compared.
        counts[r][c] = [nan - nan_b, inf - inf_b, nan_b, inf_b, unreadable]
    labels = display_keys(keys, width=LABEL_CHARS) if len(keys) > 1 else [subtrees[k] for k in keys]
    data = {
        "layers": labels,
        "layer_keys": [subtrees[k] for k in keys],
        "heat": heat,
        "heat_state": states,
        "heat_counts": counts,
        "heat_steps": [s for s, _ in pairs],
        "heat_previous": [p for _, p in pairs],
    }
    return data, keys


def _words(rows: pd.DataFrame, column: str) -> list[str]:
    if column not in rows:
        return []
    return ["" if pd.isna(v) else str(v) for v in rows[column]]


def drawn_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows the timeline draws: one complete checkpoint a step. Where two share a
    step (a copy derived from a step, saved beside the run's own), the one the run
    recorded is drawn; ``attrs["beside"]`` names the others."""
    done = table[(table["status"] == COMPLETE) & table["step"].notna()]
    kept = done["kept"] if "kept" in done else pd.Series(None, index=done.index, dtype=object)
    recorded = kept.notna() & (kept.astype("string") != "")
    ordered = done.assign(_own=recorded).sort_values(
        ["step", "_own"], ascending=[True, False], kind="stable"
    )
    shown = ordered.drop_duplicates("step").drop(columns="_own")
    beside = [str(n) for n in ordered.loc[~ordered.index.isin(shown.index), "name"]]
    shown.attrs = {"beside": beside}
    return shown


def timeline_data(
    table: pd.DataFrame, drift: pd.DataFrame, scan: pd.DataFrame
) -> tuple[dict[str, Any], list[str]]:
    """Everything the drawing shows, and the ``drift_table`` key of each heatmap row.

    Args:
      table: The ``run_table``.
      drift: The ``drift_table`` (empty: no heatmap).
      scan: The ``scan_run`` table (empty: no NaN lines, no roll-back line).
    """
    if table.empty:
        return {"steps": [], "empty": "No checkpoint in this run yet."}, []
    rows = drawn_rows(table)
    steps = [int(s) for s in rows["step"]]
    metrics = [str(m) for m in table.attrs.get("metrics", [])]
    data: dict[str, Any] = {
        "steps": steps,
        "metrics": {m: floats(rows[m]) for m in metrics if m in rows},
        # Read from the run's own metrics: shown at once, before any scan.
        "metric_nonfinite": nonfinite_metrics(rows, metrics),
        "save_blocked_s": floats(rows["save_blocked_s"]),
        "save_total_s": floats(rows["save_total_s"]),
        "nbytes": floats(rows["nbytes"]),
        # The library's verdict of each, as every view says it.
        "health": _words(rows, "health"),
        "health_reason": _words(rows, "health_reason"),
    }
    keys: list[str] = []
    if len(drift):
        heat, keys = heat_data(drift)
        data.update(heat)
    if len(scan):
        # Diverged (NaN or Inf in the model or its optimizer state) or non-finite (in
        # a metric of the auxiliary state only): both are red lines.
        bad = scan[scan["verdict"].isin([DIVERGED, SCAN_NONFINITE])]
        data["nonfinite_steps"] = [int(s) for s in bad["step"] if not pd.isna(s)]
        data["rollback_step"] = scan.attrs.get("rollback_step")
    return data, keys


def picks_text(steps: list[int], *, layer: str | None, off: str | None, diffs: bool) -> str:
    """The line under the drawing that says what is picked: the step open, the two
    diffed (and the heatmap's layer), or what is open off the timeline (``off``)."""
    if not steps:
        return f"{off} open: it has no step on this timeline" if off else ""
    if len(steps) == 1:
        text = f"step {steps[0]} open"
        if diffs:
            text += "; click another step to diff the two (shift-click: open it alone)"
        return text
    text = f"diff of steps {steps[0]} → {steps[1]}"
    if layer is not None:
        text += f", layer {layer}"
    return text + "; the next click opens one step"


def summary_html(table: pd.DataFrame, drift: pd.DataFrame, scan: pd.DataFrame) -> str:
    """The line under the drawing: the run counted, where it went non-finite (its
    metrics at once, its layers and checkpoints once read) and what moved most."""
    if table.empty:
        return ""
    complete = int((table["status"] == COMPLETE).sum())
    parts = [f"{len(table)} checkpoints, {complete} complete"]
    total = table["nbytes"].dropna()
    if len(total):
        parts.append(human_bytes(int(total.sum())) + " on disk")
    saves = table["save_total_s"].dropna()
    if len(saves):
        parts.append(f"saves {saves.median():.2g} s (median)")
    rows = drawn_rows(table)
    beside = rows.attrs["beside"]
    if beside:
        named = ", ".join(beside[:3]) + (f" and {len(beside) - 3} more" if len(beside) > 3 else "")
        parts.append(f"not drawn, at a step drawn already: {html.escape(named)}")
    diverged = rows[rows["health"] == DIVERGED] if "health" in rows else rows.iloc[:0]
    if len(diverged):
        # The library's verdict, which a NaN logged metric is part of: said once.
        first = diverged.iloc[0]
        parts.append(
            f"<span style='color:{NONFINITE_COLOR}' class='tinax-timeline-diverged'>"
            f"diverged from step {int(first['step'])}: "
            f"{html.escape(str(first['health_reason']))}</span>"
        )
    metrics = [str(m) for m in table.attrs.get("metrics", [])]
    found = [] if len(diverged) else first_nonfinite_metrics(nonfinite_metrics(rows, metrics))
    for metric, step, word in found[:3]:
        parts.append(
            f"<span style='color:#d62728'>{html.escape(metric)} {word} from step {step}</span>"
        )
    parts.extend(_drift_summary(drift))
    if len(scan):
        first = scan.attrs.get("first_nonfinite_step")
        if first is not None:
            parts.append(
                f"<span style='color:#d62728'>NaN/Inf in checkpoints from step {first}"
                f"</span>; roll back to <b>{scan.attrs.get('rollback_step')}</b>"
            )
    return "<div style='line-height:1.4'>" + " · ".join(parts) + "</div>"


def _drift_summary(drift: pd.DataFrame) -> list[str]:
    if not len(drift):
        return []
    parts = []
    finite = drift[drift["rel_update"] > 0]
    if len(finite):
        top = finite.loc[finite["rel_update"].idxmax()]
        parts.append(
            f"moved most: <b>{html.escape(str(top['subtree']))}</b> at step "
            f"{int(top['step'])} (rel_update {top['rel_update']:.3g})"
        )
    bad = drift[[state == NAN_CELL for state in cell_states(drift)]]
    if len(bad):
        first = int(bad["step"].min())
        layers = sorted(set(bad[bad["step"] == first]["subtree"].astype(str)))
        named = ", ".join(layers[:3]) + (f" and {len(layers) - 3} more" if len(layers) > 3 else "")
        parts.append(
            f"<span style='color:{NONFINITE_COLOR}'>NaN/Inf in {html.escape(named)} "
            f"from step {first}</span>"
        )
    unreadable = drift.attrs.get("unreadable")
    if isinstance(unreadable, pd.DataFrame) and len(unreadable):
        row = unreadable.iloc[0]
        where = f"{_readable(str(row['key']))} at step {row['step']} ({row['status']})"
        more = f" and {len(unreadable) - 1:,} more" if len(unreadable) > 1 else ""
        count = len(unreadable)
        parts.append(
            f"<span style='color:#7a4f01'>{count:,} lea{'f' if count == 1 else 'ves'} "
            f"not compared: {html.escape(where)}{more}</span>"
        )
    return parts


def _readable(key: str) -> str:
    try:
        return readable_key(key)
    except ValueError:
        return key
