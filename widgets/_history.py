"""One leaf across a run: its norm, mean and max at every complete checkpoint."""

from __future__ import annotations

import io
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from tinax import explore
from tinax.explore.toolkit import is_numeric, leaf_statistics
from tinax.vocabulary import COMPLETE

HISTORY_COLUMNS = (
    "step",
    "name",
    "path",
    "norm",
    "mean",
    "max",
    "nan",
    "inf",
    "quantiles",
    "error",
)
# The percentiles of a leaf's values drawn over steps, as TensorBoard's distributions
# draw them: bands from the outside in, the median as a line.
PERCENTILES = (0.0, 7.0, 16.0, 31.0, 50.0, 69.0, 84.0, 93.0, 100.0)
# Elements per pass when the norm is summed, so that a large leaf needs little more
# memory than itself.
_CHUNK = 1 << 20


def _norm(value: Any) -> float:
    """The L2 norm of the values (complex ones by magnitude): NaN when one is NaN,
    infinite when one is infinite, as the norm itself is; never the norm of what is
    left once they are dropped (an array gone NaN would read as a norm of 0)."""
    flat = np.asarray(value).reshape(-1)
    total = 0.0
    for start in range(0, flat.size, _CHUNK):
        chunk = flat[start : start + _CHUNK]
        chunk = np.abs(chunk) if chunk.dtype.kind == "c" else chunk
        as_float = chunk.astype(np.float64)
        if np.isnan(as_float).any():
            return math.nan
        if np.isinf(as_float).any():
            total = math.inf
            continue
        total += float(np.dot(as_float, as_float))
    return math.sqrt(total)


def leaf_history(
    checkpoints: pd.DataFrame,
    checkpointable: str,
    key: str,
    *,
    progress: Callable[[int, int], None] | None = None,
    stop: threading.Event | None = None,
) -> pd.DataFrame:
    """The norm, mean and max of one leaf in every complete checkpoint of a listing.

    Each checkpoint is read with ``read_leaf``: that leaf's bytes only. A checkpoint
    without the leaf, or whose leaf is not numeric or cannot be read, has NaN
    figures and says why in ``error``.

    Args:
      checkpoints: A ``list_checkpoints`` table.
      checkpointable: The leaf's checkpointable.
      key: The leaf's key.
      progress: Called with ``(done, total)`` after each checkpoint.
      stop: When set, reading stops and the rows read so far are returned.

    Returns:
      One row per complete checkpoint, in step order: ``step``, ``name``, ``path``,
      ``norm`` (L2; NaN or infinite when a value is), ``mean`` and ``max`` (of the
      finite values), ``nan`` and ``inf`` (how many values are NaN, ±Inf; ``<NA>``
      where not read), ``quantiles`` (the ``PERCENTILES`` of the finite real
      values, or ``None``), ``error`` (``""`` when read).
    """
    done = checkpoints[checkpoints["status"] == COMPLETE] if len(checkpoints) else checkpoints
    if len(done):
        done = done.sort_values(["step", "name"], na_position="last", kind="stable")
    rows: list[tuple[Any, ...]] = []
    total = len(done)
    for step, name, path in zip(done["step"], done["name"], done["path"], strict=True):
        if stop is not None and stop.is_set():
            break
        norm = mean = maximum = math.nan
        nan: int | None = None
        inf: int | None = None
        quantiles: tuple[float, ...] | None = None
        error = ""
        try:
            value = explore.read_leaf(str(path), checkpointable, key)
            if is_numeric(value):
                stats = leaf_statistics(value, bins=None)
                norm = _norm(value)
                mean = math.nan if stats.mean is None else float(stats.mean)
                maximum = math.nan if stats.maximum is None else float(stats.maximum)
                nan, inf = int(stats.nan_count), int(stats.inf_count)
                quantiles = _quantiles(value)
            else:
                error = f"not numeric ({type(value).__name__})"
        except Exception as e:  # One unreadable checkpoint does not end the history.
            error = f"{type(e).__name__}: {e}"
        rows.append((step, str(name), str(path), norm, mean, maximum, nan, inf, quantiles, error))
        if progress is not None:
            progress(len(rows), total)
    frame = pd.DataFrame(rows, columns=list(HISTORY_COLUMNS))
    for column in ("step", "nan", "inf"):
        frame[column] = pd.array(frame[column], dtype="Int64")
    return frame


def _quantiles(value: Any) -> tuple[float, ...] | None:
    array = np.asarray(value)
    if array.dtype.kind not in "biuf" or array.size == 0:
        return None
    finite = array[np.isfinite(array)] if array.dtype.kind == "f" else array
    if finite.size == 0:
        return None
    return tuple(float(q) for q in np.percentile(finite, PERCENTILES))


def history_png(history: pd.DataFrame, *, title: str = "") -> bytes:
    """Norm, mean and max against step, one small panel each, and the distribution of
    the values over steps (percentile bands); empty bytes if there is nothing to draw."""
    read = history[history["error"] == ""] if len(history) else history
    read = read[read["step"].notna()] if len(read) else read
    if read.empty:
        return b""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    # Sized to be shown at its natural size (about 460 px wide) with 10 pt labels.
    figure = Figure(figsize=(4.8, 6.0), dpi=96)
    FigureCanvasAgg(figure)
    axes = figure.subplots(4, 1, sharex=True, height_ratios=(1, 1, 1, 1.6))
    steps = read["step"].astype("int64").to_numpy()
    bad = _nonfinite_steps(read)
    for ax, field, color in zip(
        axes[:3], ("norm", "mean", "max"), ("#4e79a7", "#f28e2b", "#e15759"), strict=True
    ):
        # NaN and infinite figures are gaps in the line, never a fall to 0.
        values = read[field].to_numpy(dtype=float)
        ax.plot(
            steps, np.where(np.isfinite(values), values, np.nan), "o-", color=color, markersize=3
        )
        ax.set_ylabel(field, fontsize=10)
        ax.tick_params(labelsize=10)
        _mark_nonfinite(ax, bad)
    spread = axes[-1]
    rows = [(s, q) for s, q in zip(steps, read["quantiles"], strict=True) if q is not None]
    if rows:
        at = np.asarray([s for s, _ in rows])
        q = np.asarray([q for _, q in rows])
        bands = len(PERCENTILES) // 2
        for i in range(bands):
            shade = 0.25 + 0.6 * (i + 1) / bands
            spread.fill_between(
                at, q[:, i], q[:, -1 - i], color="#4e79a7", alpha=shade * 0.5, linewidth=0
            )
        spread.plot(at, q[:, bands], color="#1f3b5c", linewidth=1.2)
    _mark_nonfinite(spread, bad)
    spread.set_ylabel("values", fontsize=10)
    spread.tick_params(labelsize=10)
    # The checkpoints' own steps where they fit; else whole numbers, no tick at 1.25.
    if len(steps) <= 12:
        axes[-1].set_xticks(steps)
    else:
        axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    label = "step (bands: 0–100, 7–93, 16–84, 31–69 %; line: median)"
    if len(bad):
        label += f"\n✕ NaN/Inf from step {int(bad[0])}; mean, max, bands: finite values"
    axes[-1].set_xlabel(label, fontsize=10)
    if title:
        axes[0].set_title(title, fontsize=11)
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return out.getvalue()


def _nonfinite_steps(history: pd.DataFrame) -> np.ndarray:
    """The steps at which the leaf held NaN or Inf."""
    counts = history["nan"].fillna(0).astype("int64") + history["inf"].fillna(0).astype("int64")
    return history["step"][counts.to_numpy() > 0].astype("int64").to_numpy()


def _mark_nonfinite(ax: Any, steps: np.ndarray) -> None:
    """A red ✕ at the top of a panel at each step whose leaf held NaN or Inf."""
    if len(steps):
        ax.plot(
            steps,
            np.full(len(steps), 0.96),
            "x",
            color="#d62728",
            markersize=6,
            transform=ax.get_xaxis_transform(),
            clip_on=False,
        )
