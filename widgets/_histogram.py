"""A histogram image of one leaf's statistics (computed by ``tinax.explore``)."""

from __future__ import annotations

import io

import numpy as np

from tinax.explore.toolkit import LeafStatistics

# What fits across the image at the title's size.
_TITLE_CHARS = 48


def fit_title(title: str) -> str:
    """``title`` as it fits across the image: a long key keeps its end, the leaf's own name.

    The image has a fixed width; the whole key is in the widget's heading.
    """
    return title if len(title) <= _TITLE_CHARS else "…" + title[-(_TITLE_CHARS - 1) :]


def histogram_png(stats: LeafStatistics, *, title: str = "", log: bool = False) -> bytes:
    """A small PNG bar chart of ``stats.histogram`` (empty bytes if there is none).

    With ``log``, the counts are on a log scale, where the tails show.
    """
    if stats.histogram is None:
        return b""
    # The object-oriented API needs no pyplot state and no GUI backend.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    counts, edges = stats.histogram
    # Shown at its natural size (about 400 px wide): 10 pt labels are 13 px.
    figure = Figure(figsize=(4.2, 2.6), dpi=96)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    if log:
        # An empty bin has no logarithm: it is drawn at the axis' floor.
        axes.stairs(np.maximum(counts, 0.5), edges, fill=True, color="#1f77b4", baseline=0.5)
        axes.set_yscale("log")
        axes.set_ylim(bottom=0.5)
        axes.set_ylabel("count (log)", fontsize=10)
    else:
        axes.stairs(counts, edges, fill=True, color="#1f77b4")
        axes.set_ylabel("count", fontsize=10)
    if title:
        axes.set_title(fit_title(title), fontsize=10)
    axes.tick_params(labelsize=10)
    # Few, short tick labels: they never run into each other, even when the image is
    # shown smaller than its natural size.
    axes.xaxis.set_major_locator(MaxNLocator(nbins=5))
    if not log:
        axes.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return out.getvalue()
