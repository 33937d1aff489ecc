"""Read-only inspection of checkpoints and live state as pandas tables.

Metadata first: tables are built from Orbax's metadata without reading array data,
and ``read_leaf`` reads one leaf's bytes only. Keys are ``jax.tree_util.keystr``
key paths, so tables of a checkpoint and of live state join on
``(checkpointable, key)``. This layer imports no ipywidgets; it serves terminals
(``python -m tinax.explore PATH``), scripts and the widgets alike.
"""

from tinax.explore._checkpoint import checkpoint_table, read_leaf
from tinax.explore._compare import compare_table
from tinax.explore._diff import diff_table
from tinax.explore._drift import drift_table
from tinax.explore._export import export_safetensors
from tinax.explore._listing import ListingCache, list_checkpoints
from tinax.explore._live import leaf_key, state_table
from tinax.explore._ranking import sort_by_change
from tinax.explore._readable import human_bytes, human_duration, readable
from tinax.explore._retention import retention_table, run_policy
from tinax.explore._run_dir import (
    bytes_written,
    check_new_checkpoint_name,
    existing_directory,
    next_checkpoint_name,
    path_exists,
    resolve_path,
    save_directory,
)
from tinax.explore._run_table import run_table
from tinax.explore._scan_run import scan_run
from tinax.explore._staged import StagedLeaves, collector_paused, open_leaves
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
    Verification,
    VerifyTarget,
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
    "StagedLeaves",
    "StoredArray",
    "Verification",
    "VerifyTarget",
    "bytes_written",
    "check_new_checkpoint_name",
    "checkpoint_table",
    "collector_paused",
    "compare_table",
    "diff_table",
    "drift_table",
    "existing_directory",
    "export_safetensors",
    "human_bytes",
    "human_duration",
    "is_numeric",
    "leaf_key",
    "leaf_statistics",
    "leaf_summary",
    "list_checkpoints",
    "next_checkpoint_name",
    "open_leaves",
    "path_exists",
    "read_leaf",
    "readable",
    "resolve_path",
    "retention_table",
    "run_policy",
    "run_table",
    "save_directory",
    "scan_run",
    "sort_by_change",
    "state_table",
    "verify",
]
