"""The words tables use for kinds of leaves and for statuses, spelled once.

Tables are plain DataFrames read by people and by code; a status or a kind is a
string, and everything that writes or tests one imports it from here.
"""

from __future__ import annotations

# -- what a leaf is (the ``kind`` column) ---------------------------------------------

JAX_ARRAY = "jax.Array"
NUMPY_ARRAY = "np.ndarray"
SCALAR = "scalar"
STRING = "string"
# Nothing to store: None, and containers without leaves (optax's EmptyState() and
# MaskedNode(), (), {}, []). Orbax records all of them as values it skips.
EMPTY = "empty"
ITERATOR = "iterator"
JSON = "json"
UNKNOWN = "unknown"

LEAF_KINDS = (JAX_ARRAY, NUMPY_ARRAY, SCALAR, STRING, EMPTY, ITERATOR, JSON, UNKNOWN)
ARRAY_KINDS = frozenset({JAX_ARRAY, NUMPY_ARRAY})
# Kinds whose value lives in the array store (a scalar is a 0-d array there).
STORED_ARRAY_KINDS = frozenset({JAX_ARRAY, NUMPY_ARRAY, SCALAR})

# -- a checkpoint in a listing (``list_checkpoints``' ``status``) ------------------------

COMPLETE = "complete"
# A save that is still being written: a live process holds its claim.
IN_PROGRESS = "in progress"
# A save whose writer is gone (killed, preempted): never loadable, safe to remove.
INTERRUPTED = "interrupted"
INVALID = "invalid"
# A checkpoint whose removal has begun (it holds ``names.DELETION_MARKER``): never
# loadable; the run that removes it, or the next one, finishes the removal.
BEING_REMOVED = "being removed"
# A checkpoint a run's restore could not load and moved aside (``names.CORRUPT_SUFFIX``),
# kept for inspection; never loadable, never counted as its step's checkpoint.
FOUND_CORRUPT = "corrupt (found by restore)"
# A checkpoint of a branch the run left when it went on from an earlier step (its
# later checkpoints, moved aside to ``names.ABANDONED_SUFFIX``): intact, kept for
# inspection, never resumed from.
ABANDONED = "abandoned"
LISTING_STATUSES = (
    COMPLETE,
    IN_PROGRESS,
    INTERRUPTED,
    INVALID,
    BEING_REMOVED,
    FOUND_CORRUPT,
    ABANDONED,
)

# -- where a checkpoint of a two-tier run is (``list_checkpoints``' ``tier``) ---------------

# A training run with a local tier (``TrainingRun(..., local=...)``) keeps checkpoints on
# fast local storage and promotes some to its durable directory; a listing of such a run
# says where each checkpoint is.
TIER_LOCAL = "local"
TIER_DURABLE = "durable"
# The same step committed in both tiers (a promoted checkpoint still kept locally).
TIER_BOTH = "both"
TIERS = (TIER_LOCAL, TIER_DURABLE, TIER_BOTH)
# A local checkpoint the run will copy to its durable tier (``list_checkpoints``'
# ``promotion``), and one being copied now.
PROMOTION_WAITING = "waiting"
PROMOTION_RUNNING = "promoting"
PROMOTIONS = (PROMOTION_WAITING, PROMOTION_RUNNING)

# -- why a run keeps a checkpoint (``retention_table``'s ``kept``) -------------------------


def kept_newest(count: int) -> str:
    """A checkpoint kept as one of the ``count`` newest (``"newest 2"``)."""
    return f"newest {count}"


def kept_best(metric: str, count: int = 1) -> str:
    """A checkpoint kept as one of the ``count`` best by ``metric`` (``"best loss"``)."""
    return f"best {metric}" if count == 1 else f"best {count} by {metric}"


def kept_local_newest(count: int) -> str:
    """A local checkpoint of a two-tier run kept as one of the ``count`` newest there."""
    return f"newest {count} local"


# A local checkpoint kept until the run has copied it to its durable tier.
KEPT_FOR_PROMOTION = "waiting for promotion"
# Kept whatever the policy says: the newest checkpoint whose metadata reads.
KEPT_NEWEST_SOUND = "newest sound"
# Kept because no policy removes anything (``keep=None``).
KEPT_ALL = "all kept"
# The reasons that are words of their own (the others are made by the functions above).
KEPT_WORDS = (KEPT_FOR_PROMOTION, KEPT_NEWEST_SOUND, KEPT_ALL)

# -- a leaf against a restore target (``compare_table``'s ``status``) -----------------------

OK = "ok"
SHAPE_DIFFERS = "shape differs"
# The stored dtype converts to the target's: the load casts on restore, as Orbax's does
# (``lossy`` says whether every stored value survives the cast).
DTYPE_CAST = "dtype cast"
# The dtypes do not convert into each other (a PRNG key and a float, say).
DTYPE_DIFFERS = "dtype differs"
KIND_DIFFERS = "kind differs"
MISSING_FROM_CHECKPOINT = "missing from checkpoint"
NOT_IN_TARGET = "not in target"
# The target asks for the leaf not to be restored (Orbax's placeholder ``...``).
LEFT_OUT = "left out"

COMPARE_STATUSES = (
    OK,
    SHAPE_DIFFERS,
    DTYPE_CAST,
    DTYPE_DIFFERS,
    KIND_DIFFERS,
    MISSING_FROM_CHECKPOINT,
    NOT_IN_TARGET,
    LEFT_OUT,
)
# Statuses that make a restore impossible whatever the caller allows.
REFUSED_STATUSES = frozenset(
    {SHAPE_DIFFERS, DTYPE_DIFFERS, KIND_DIFFERS, MISSING_FROM_CHECKPOINT, NOT_IN_TARGET}
)

# -- two checkpoints, leaf by leaf (``diff_table``'s ``status``) ----------------------------

SAME = "same"
CHANGED = "changed"
ONLY_IN_A = "only in a"
ONLY_IN_B = "only in b"
# Stored bytes that do not match the checksums saved with them.
CORRUPT = "corrupt"

DIFF_STATUSES = (
    SAME,
    CHANGED,
    ONLY_IN_A,
    ONLY_IN_B,
    SHAPE_DIFFERS,
    DTYPE_DIFFERS,
    KIND_DIFFERS,
    CORRUPT,
)

# -- what ``verify`` found (a finding's ``severity``) ------------------------------------------

# ERROR: the checkpoint cannot be trusted to load as saved. WARNING: unusual but not in
# the way of a load. INFO: said for the record (what was checked, what could not be).
SEVERITIES = ERROR, WARNING, INFO = ("error", "warning", "info")

# -- non-finite values (``diff_table``'s ``nonfinite``; ``verify`` and ``scan_run``) ----------

# A leaf finite everywhere in ``a`` that holds NaN or Inf in ``b``; one holding NaN or
# Inf on both sides; one that held NaN or Inf in ``a`` and is finite everywhere in ``b``.
NONFINITE_CHANGES = BECAME_NONFINITE, NONFINITE_BOTH, BECAME_FINITE = (
    "became non-finite",
    "non-finite in both",
    "became finite",
)

# -- whether a checkpoint is fit to resume from (``tinax._format.integrity.health``) ------------------

# Integrity: are these the bytes that were saved? SOUND: committed, and every check made
# so far passed (with data read: every byte matched its checksums). DAMAGED: something in
# the way of a load (unreadable metadata, a missing file, a byte that does not match).
# INCOMPLETE: not a checkpoint yet, or any more (a save in progress or interrupted, one
# being removed).
DAMAGED = "damaged"
INCOMPLETE = "incomplete"
# Health: can a run go on from here? HEALTHY: its data was read and neither its state
# nor its logged metrics hold NaN or Inf. DIVERGED (below): its model or optimizer state
# holds NaN or Inf, or a metric it logged is NaN or infinite. HEALTH_UNKNOWN: its data
# has not been read and its logged metrics are finite (or it logged none).
HEALTHY = "healthy"
HEALTH_UNKNOWN = "not yet known"

# -- a checkpoint's verdict (``Verification.status``, ``scan_run``'s ``verdict``) -------------

# SOUND: whole, loadable, and not diverged as far as is known. DIVERGED: whole and
# loadable, but its model or optimizer state holds NaN or Inf, or a metric it logged is
# NaN or infinite: the run diverged before this save (never called sound). NOT_SOUND:
# something in the way of a load (an error finding).
VERIFY_STATUSES = SOUND, DIVERGED, NOT_SOUND = ("sound", "diverged", "not sound")
INTEGRITIES = (SOUND, DAMAGED, INCOMPLETE)
HEALTHS = (HEALTHY, DIVERGED, HEALTH_UNKNOWN)

# ``scan_run``'s verdicts besides ``DIVERGED`` and ``NOT_SOUND``: read and finite
# everywhere; NaN or Inf only outside the model and optimizer state (a metric in the
# auxiliary state, say); not a complete checkpoint; not read (the scan was cancelled).
FINITE = "finite"
NONFINITE = "non-finite"
NOT_COMPLETE = "not complete"
NOT_SCANNED = "not scanned"

SCAN_VERDICTS = (FINITE, NONFINITE, DIVERGED, NOT_SOUND, NOT_COMPLETE, NOT_SCANNED)

# The checkpointables that hold metrics rather than training state: the auxiliary
# state (``TrainingCheckpointNames().auxiliary``) and Orbax's recorded ``metrics``.
# NaN or Inf there is a logged metric's (a NaN loss); anywhere else it is in the model or
# the optimizer state, whatever their names. Either makes a checkpoint ``diverged``.
METRIC_CHECKPOINTABLES = frozenset({"auxiliary", "metrics"})
