"""Building blocks for tools made over ``tinax.explore``: the Jupyter widgets, a
dashboard, a script that watches a run.

``tinax.explore`` itself exports the tables (``list_checkpoints``,
``checkpoint_table``, ``diff_table``, ``verify``, …). What such a tool needs beside
them lives here: a checkpoint's leaves staged for a large checkpoint, one leaf's
statistics, the verification's parts (to write a check of one's own), a run
directory's names and sizes, the listing's cache, where a model's layers are
(``layer_depth``, ``layer_of``: the grouping ``drift_table`` uses by default), a
checkpoint's lineage in a line, and what a derived or averaged checkpoint would hold
before it is written. Sizes and keys are shown as ``tinax.explore.display`` shows
them, durations as ``human_duration`` does. Like the rest of ``tinax.explore``, nothing here imports JAX, Orbax or ipywidgets.
"""

from tinax.explore._lineage import lineage_summary
from tinax.explore._listing import ListingCache
from tinax.explore._live import leaf_key
from tinax.explore._readable import human_duration
from tinax.explore._run_view.directory import (
    bytes_written,
    check_new_checkpoint_name,
    existing_directory,
    next_checkpoint_name,
    path_exists,
    resolve_path,
    save_directory,
)
from tinax.explore._run_view.drift import layer_depth, layer_of
from tinax.explore._run_view.retention import run_listing
from tinax.explore._staged import StagedLeaves, collector_paused, open_leaves
from tinax.explore._summary import (
    LeafStatistics,
    is_numeric,
    leaf_statistics,
    leaf_summary,
)
from tinax.explore._surgery_preview import average_preview, derive_preview
from tinax.explore._verify.verification import (
    DEFAULT_CHECKS,
    Check,
    Finding,
    LeafScan,
    StoredArray,
    VerifyTarget,
)

__all__ = [
    "DEFAULT_CHECKS",
    "Check",
    "Finding",
    "LeafScan",
    "LeafStatistics",
    "ListingCache",
    "StagedLeaves",
    "StoredArray",
    "VerifyTarget",
    "average_preview",
    "bytes_written",
    "check_new_checkpoint_name",
    "collector_paused",
    "derive_preview",
    "existing_directory",
    "human_duration",
    "is_numeric",
    "layer_depth",
    "layer_of",
    "leaf_key",
    "leaf_statistics",
    "leaf_summary",
    "lineage_summary",
    "next_checkpoint_name",
    "open_leaves",
    "path_exists",
    "resolve_path",
    "run_listing",
    "save_directory",
]
