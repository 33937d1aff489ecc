"""Atomic Orbax V1 checkpoints of complete training state.

Save model, optimizer, RNG, auxiliary and Grain iterator state together, restore
them into explicit abstract targets, and resume bit-exactly. Legacy Orbax V0
support lives in ``tinax.checkpointing.legacy.v0`` and is not imported here.
"""

from tinax._format.metadata.layout import Checkpoint
from tinax._paths import open_checkpoint
from tinax._targets import NumpyTarget, abstract_restore_target
from tinax.checkpointing._average import average_checkpoints
from tinax.checkpointing._checkpointable_names import validate_checkpointable_name
from tinax.checkpointing._checkpointables import load_checkpointables, save_checkpointables
from tinax.checkpointing._checksummed_handler import CorruptDataError
from tinax.checkpointing._context import compression
from tinax.checkpointing._derive import derive_checkpoint
from tinax.checkpointing._destination import remove_interrupted_save
from tinax.checkpointing._diverged import set_aside_diverged
from tinax.checkpointing._nonfinite import DivergedCheckpointError
from tinax.checkpointing._pipeline import PipelineMismatchError, allow_pipeline_change
from tinax.checkpointing._plan_figures import RestoreTooLargeError
from tinax.checkpointing._processes import ProcessTimeoutError
from tinax.checkpointing._response import SaveResponse
from tinax.checkpointing._restore_plan import memory_budget
from tinax.checkpointing._run import TrainingRun
from tinax.checkpointing._safetensors import load_safetensors
from tinax.checkpointing._training import (
    TrainingCheckpoint,
    TrainingCheckpointNames,
    load_training_checkpoint,
    save_training_checkpoint,
)
from tinax.checkpointing._verdict import TargetMismatchError, allow_lossy_casts

__all__ = [
    "Checkpoint",
    "CorruptDataError",
    "DivergedCheckpointError",
    "NumpyTarget",
    "PipelineMismatchError",
    "ProcessTimeoutError",
    "RestoreTooLargeError",
    "SaveResponse",
    "TargetMismatchError",
    "TrainingCheckpoint",
    "TrainingCheckpointNames",
    "TrainingRun",
    "abstract_restore_target",
    "allow_lossy_casts",
    "allow_pipeline_change",
    "average_checkpoints",
    "compression",
    "derive_checkpoint",
    "load_checkpointables",
    "load_safetensors",
    "load_training_checkpoint",
    "memory_budget",
    "open_checkpoint",
    "remove_interrupted_save",
    "save_checkpointables",
    "save_training_checkpoint",
    "set_aside_diverged",
    "validate_checkpointable_name",
]
