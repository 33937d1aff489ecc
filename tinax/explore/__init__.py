"""Read-only inspection of checkpoints and live state as pandas tables.

Metadata first: tables are built from Orbax's metadata without reading array data,
and ``read_leaf`` reads one leaf's bytes only. Keys are ``jax.tree_util.keystr``
key paths, so tables of a checkpoint and of live state join on
``(checkpointable, key)``. This layer imports no ipywidgets; it serves terminals
(``python -m tinax.explore PATH``), scripts and the widgets alike.
"""

from tinax.explore._checkpoint import checkpoint_table, read_leaf
from tinax.explore._compare import compare_table
from tinax.explore._diff import diff_table, sort_by_change
from tinax.explore._export import export_safetensors
from tinax.explore._listing import ListingCache, list_checkpoints, listing_cache
from tinax.explore._live import leaf_key, state_table
from tinax.explore._summary import (
    HISTOGRAM_BINS,
    LeafStatistics,
    is_numeric,
    leaf_statistics,
    leaf_summary,
)
from tinax.explore._verify import (
    DEFAULT_CHECKS,
    Check,
    Finding,
    LeafScan,
    StoredArray,
    Target,
    Verification,
    verify,
)

__all__ = [
    "DEFAULT_CHECKS",
    "HISTOGRAM_BINS",
    "Check",
    "Finding",
    "LeafScan",
    "LeafStatistics",
    "ListingCache",
    "StoredArray",
    "Target",
    "Verification",
    "checkpoint_table",
    "compare_table",
    "diff_table",
    "export_safetensors",
    "is_numeric",
    "leaf_key",
    "leaf_statistics",
    "leaf_summary",
    "list_checkpoints",
    "listing_cache",
    "read_leaf",
    "sort_by_change",
    "state_table",
    "verify",
]
