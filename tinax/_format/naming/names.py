"""Every name that Orbax, Grain and tinax give to what they write on disk.

A file name, a suffix or a naming pattern of the checkpoint format is spelled here
once; everything else imports it.
"""

from __future__ import annotations

import re

# -- a checkpoint's root --------------------------------------------------------------

# Orbax's record of the checkpoint: which checkpointables, with which handlers, and
# when it committed.
CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"
# On object stores, where there is no rename, Orbax writes this file last.
COMMIT_SUCCESS = "commit_success.txt"


def commit_success_text(checkpoint: str) -> bytes:
    """What Orbax writes in ``COMMIT_SUCCESS`` when the checkpoint at ``checkpoint`` commits."""
    return f"Checkpoint commit was successful to {checkpoint}".encode()


# A training save's checkpointables, in the order it saves them
# (``TrainingCheckpointNames``' defaults).
TRAINING_CHECKPOINTABLES = ("model", "optimizer", "rng", "auxiliary", "iterator")

# An empty file Orbax V0 writes to mark a checkpoint directory.
ORBAX_MARKER = "orbax.checkpoint"
ROOT_METADATA = "_ROOT_METADATA"
# Written first when a checkpoint is removed, and removed last: a directory that holds
# it is being removed (or its removal was interrupted) and is never a checkpoint.
DELETION_MARKER = "_CHECKPOINT_DELETION"
# Written into a checkpoint a run's restore found corrupt (see CORRUPT_SUFFIX below).
CORRUPT_RECORD = "_TINAX_FOUND_CORRUPT"
# Written into a checkpoint of a branch a run left (see ABANDONED_SUFFIX below).
ABANDONED_RECORD = "_TINAX_ABANDONED"
# Written into a checkpoint tinax saved, just after it committed (JSON: how long the save
# blocked its caller and took in all). No load reads it; ``run_table`` does.
SAVE_TIMES = "_TINAX_SAVE_TIMES"
SAVE_TIMES_FORMAT = "tinax.save_times/1"
# Written into a checkpoint made from others (derived, averaged) before it commits (JSON:
# its sources, their steps and checksum records, the operation and its arguments).
LINEAGE = "_TINAX_LINEAGE"
LINEAGE_FORMAT = "tinax.lineage/1"
METRICS = "metrics"

# Names Orbax writes or reserves at a checkpoint's root; no checkpointable may take one.
RESERVED_ROOT_NAMES = frozenset(
    {
        CHECKPOINT_METADATA,
        ORBAX_MARKER,
        COMMIT_SUCCESS,
        METRICS,
        DELETION_MARKER,
        CORRUPT_RECORD,
        ABANDONED_RECORD,
        SAVE_TIMES,
        LINEAGE,
        "_METADATA",
        ROOT_METADATA,
    }
)

# Orbax reserves this checkpointable name for itself (it means "whatever is stored").
AUTO_CHECKPOINTABLE = "AUTO"
# Names no checkpointable may take: Orbax's root files and its own reserved names.
RESERVED_CHECKPOINTABLE_NAMES = RESERVED_ROOT_NAMES | {AUTO_CHECKPOINTABLE}

# -- a pytree checkpointable ------------------------------------------------------------

PYTREE_METADATA = "_METADATA"
STRINGS = "_strings.json"
SHARDINGS = "_sharding"
ARRAY_METADATAS = "array_metadatas"
# Each process's file in it.
ARRAY_METADATA_FILE = re.compile(r"^process_(\d+)$")
OCDBT_MANIFEST = "manifest.ocdbt"
# Each process writes its arrays into its own OCDBT store before they are merged.
OCDBT_PROCESS_PREFIX = "ocdbt.process_"
OCDBT_DATA = "d"
ZARR3_METADATA = "zarr.json"
ZARR2_METADATA = ".zarray"

# -- other checkpointables ----------------------------------------------------------------

# tinax stores a pytree without leaves (``()``, ``{}``, optax's empty states) as this record.
EMPTY_PYTREE = "empty_pytree.json"
EMPTY_PYTREE_FORMAT = "tinax.empty_pytree/1"
# Orbax V1 JsonHandler and MetricsHandler files.
JSON_FILES = ("data.json", "metrics", "metadata")
# Grain's handler writes one JSON state file per process.
ITERATOR_FILE = re.compile(r"^process_(\d+)-of-(\d+)\.json$")


def iterator_file_name(process_index: int, process_count: int) -> str:
    """The name of the file Grain writes for one process's iterator state."""
    return f"process_{process_index}-of-{process_count}.json"


# -- tinax's integrity record -------------------------------------------------------------

# In a pytree checkpointable saved by tinax: a checksum of every value each process wrote,
# one JSON file per process (written before the checkpoint commits).
CHECKSUMS_DIR = "tinax_checksums"
# The key tinax saves put in _CHECKPOINT_METADATA's custom_metadata, which Orbax commits
# with the checkpoint: {"checksums": true} promises a CHECKSUMS_DIR in every pytree and
# iterator checkpointable, so that deleting one is seen as damage.
CHECKSUMS_PROMISE = "tinax"
# Beside it in custom_metadata: the input pipeline each Grain iterator checkpointable was
# saved from, as Grain describes it (``pipeline``), so that a restore into another
# pipeline is refused. {checkpointable name: {"format", "grain", "nodes": [...]}}.
PIPELINES = "tinax_pipelines"
# A training save's auxiliary metrics, as logged (``tinax._format.records.metrics``), under
# ``custom_metadata``: a run's table reads them with the commit record.
METRICS_RECORD = "tinax_metrics"
# A checkpoint whose writer read every value it holds (a derived or averaged one) records
# its health under this key of ``custom_metadata`` (``integrity.health.record_entry``).
HEALTH_RECORD = "tinax_health"
PIPELINE_FORMAT = "tinax.pipeline/1"
CHECKSUMS_FORMAT = "tinax.checksums/1"
CHECKSUM_FILE = re.compile(r"^process_(\d+)\.json$")


def checksum_file_name(process_index: int) -> str:
    """The name of the file one process writes its checksums to."""
    return f"process_{process_index}.json"


# -- saves in progress ---------------------------------------------------------------------

# Orbax writes a checkpoint under `<name>.orbax-checkpoint-tmp[-<digits>]` and renames
# it when the save commits; such a path is never a finished checkpoint.
TEMPORARY_SUFFIX = ".orbax-checkpoint-tmp"
TEMPORARY_PATTERN = re.compile(re.escape(TEMPORARY_SUFFIX) + r"(-\d+)?$")


def is_temporary_name(name: str) -> bool:
    """Whether a path component carries Orbax's temporary suffix."""
    return bool(TEMPORARY_PATTERN.search(name))


def final_name(name: str) -> str:
    """The checkpoint name a temporary directory commits to (``name`` itself otherwise)."""
    return TEMPORARY_PATTERN.sub("", name)


# tinax claims a save's destination by locking this file beside it (``<name>.tinax-claim``)
# for as long as the save runs; it holds a small JSON record of the claiming process. A
# file, never a directory, so that nothing lists it as a checkpoint.
CLAIM_SUFFIX = ".tinax-claim"


def claim_name(name: str) -> str:
    """The name of the claim file of a save to the checkpoint ``name``."""
    return name + CLAIM_SUFFIX


# -- a run ----------------------------------------------------------------------------------

# A training run (``tinax.checkpointing.TrainingRun``) records its policy, each step's
# metric and why each checkpoint is kept in this JSON file at the run's root. A file,
# never a directory, so that nothing lists it as a checkpoint.
RUN_RECORD = "tinax_run.json"
# A file each process of a job writes for a moment into its local directory, to find
# which processes share it (``tinax.checkpointing._hosts``).
HOST_PROBE_PREFIX = ".tinax-probe-"
RUN_RECORD_FORMAT = "tinax.run/1"
# The member of a run's record that keeps, by step, the health its loads found
# (``health.record_entry``).
RUN_RECORD_HEALTH = "health"
# The member that says from which step the run went on, each time it went on from an
# earlier step than its newest, and which steps it set aside then.
RUN_RECORD_WENT_ON = "went_on"
# A run's checkpoints are named ``step_<step>`` (six digits at least).
RUN_CHECKPOINT = re.compile(r"^step_(\d+)$")


def run_checkpoint_name(step: int) -> str:
    """The name a training run gives the checkpoint of ``step``."""
    return f"step_{step:06d}"


# -- promotions of a two-tier run --------------------------------------------------------

# A file larger than one upload is sent to gs:// as parts named ``<file><suffix><i>``
# beside it, composed into the file and deleted; a killed promotion leaves them inside
# its uncommitted directory, which is removed as a whole.
UPLOAD_PART_SUFFIX = ".tinax-part-"


# -- checkpoints a run found corrupt ---------------------------------------------------------

# A checkpoint that a run's restore could not load (and skipped for an older one) is moved
# aside to ``<name>.tinax-corrupt`` (``.tinax-corrupt-2``, … when taken), kept for
# inspection: the resumed job saves its step again under the old name. Before the move it
# gets this record at its root (JSON: why the load refused it, and when), which listings
# and ``verify`` read, and which makes loads refuse it wherever it is.
CORRUPT_SUFFIX = ".tinax-corrupt"
CORRUPT_PATTERN = re.compile(re.escape(CORRUPT_SUFFIX) + r"(-\d+)?$")
CORRUPT_RECORD_FORMAT = "tinax.found_corrupt/1"


def is_corrupt_name(name: str) -> bool:
    """Whether a path component names a checkpoint moved aside as corrupt."""
    return bool(CORRUPT_PATTERN.search(name))


def corrupt_name(name: str, attempt: int = 1) -> str:
    """The name a checkpoint ``name`` is moved aside to (``attempt`` > 1 when taken)."""
    return name + CORRUPT_SUFFIX + ("" if attempt == 1 else f"-{attempt}")


# -- checkpoints of a branch a run left ------------------------------------------------------

# When a run goes on from an earlier step than its newest (``TrainingRun.restore(...,
# step=N)``, or a restore that passed diverged checkpoints over), the checkpoints of the
# later steps belong to the branch it left: its first save moves each aside to
# ``<name>.tinax-abandoned`` (``-2``, … when taken), kept for inspection and never resumed
# from. Before the move each gets this record at its root (JSON: the step the run went on
# from, and when). On object stores, which cannot rename, it stays in place, marked.
ABANDONED_SUFFIX = ".tinax-abandoned"
ABANDONED_PATTERN = re.compile(re.escape(ABANDONED_SUFFIX) + r"(-\d+)?$")
ABANDONED_RECORD_FORMAT = "tinax.abandoned/1"


def abandoned_name(name: str, attempt: int = 1) -> str:
    """The name a checkpoint ``name`` of an abandoned branch is moved aside to."""
    return name + ABANDONED_SUFFIX + ("" if attempt == 1 else f"-{attempt}")


# -- steps ------------------------------------------------------------------------------

# Step directories: `<step>` or `<prefix>_<step>` as Orbax names them (zero padding
# allowed), or `<prefix>-<step>`.
_STEP = re.compile(r"^(?:.*[_-])?(\d+)$")


def step_from_name(name: str) -> int | None:
    """The step a checkpoint directory's name carries, if any (also for temporaries)."""
    match = _STEP.match(ABANDONED_PATTERN.sub("", CORRUPT_PATTERN.sub("", final_name(name))))
    # A step must fit a table's Int64 column; longer digit runs are not steps.
    if not match or len(match.group(1).lstrip("0")) > 18:
        return None
    return int(match.group(1))
