"""Training checkpoints: model, optimizer, RNG, auxiliary and iterator state together."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

import grain
import numpy as np

from tinax._format.integrity.health import Health
from tinax._format.metadata import logged, pytree
from tinax._format.metadata.layout import Checkpoint
from tinax._format.naming.names import TRAINING_CHECKPOINTABLES
from tinax._format.storage import files
from tinax._paths import checkpoint_to_load
from tinax._targets import refuse_flax_objects
from tinax.checkpointing._checkpointable_names import validate_distinct_names
from tinax.checkpointing._checkpointables import (
    check_iterator_states,
    check_targets_given,
    restore_checkpointables,
    start_save,
)
from tinax.checkpointing._nonfinite import LoadCounts, loaded_health
from tinax.checkpointing._pipeline import check_pipelines
from tinax.checkpointing._response import SaveResponse
from tinax.checkpointing._verdict import TargetMismatchError, check_targets

STEP_KEY = "step"
STATE_KEY = "state"
# Orbax stores the step as an int64.
_MAX_STEP = 2**63 - 1


def _array_step(step: object) -> object:
    """A 0-d integer array (``jnp.asarray(4)``, ``np.asarray(4)``) as the integer it holds."""
    if isinstance(step, np.ndarray) or type(step).__module__.startswith("jax"):
        shape, dtype = getattr(step, "shape", None), getattr(step, "dtype", None)
        if shape == () and dtype is not None:
            try:
                kind = np.dtype(dtype).kind
            except TypeError:
                return step  # a typed PRNG key, say: refused below
            if kind in "iu":
                try:
                    return int(step)  # type: ignore[call-overload]
                except Exception:  # a traced value has no integer yet
                    raise TypeError(
                        "step must be a concrete integer; got a traced array (inside jit?)"
                    ) from None
    return step


def check_step(step: object) -> int:
    """Checks a training step: a non-negative ``int``, NumPy integer or 0-d integer
    array (``jnp.asarray(4)``), not a ``bool`` (nor a boolean array)."""
    step = _array_step(step)
    if isinstance(step, bool) or not isinstance(step, int | np.integer):
        raise TypeError(
            f"step must be an integer or a 0-d integer array (booleans are not), "
            f"got {type(step).__name__}: {step!r}"
        )
    if step < 0:
        raise ValueError(f"step must be non-negative, got {step}")
    if step > _MAX_STEP:
        raise ValueError(
            f"step must fit in a signed 64-bit integer (at most {_MAX_STEP}), got {step}"
        )
    return int(step)


def check_iterator(iterator: object) -> grain.DatasetIterator:
    """Checks that ``iterator`` is a ``grain.DatasetIterator``."""
    if not isinstance(iterator, grain.DatasetIterator):
        raise TypeError(f"iterator must be a grain.DatasetIterator, got {type(iterator).__name__}")
    return iterator


@dataclasses.dataclass(frozen=True)
class TrainingCheckpointNames:
    """Names for the five independently handled parts of a training checkpoint.

    Attributes:
      model: Checkpointable name for model state.
      optimizer: Checkpointable name for optimizer state.
      rng: Checkpointable name for RNG state.
      auxiliary: Checkpointable name for auxiliary state and step metadata.
      iterator: Checkpointable name for the input iterator state.

    Raises:
      TypeError: If any name is not a string.
      ValueError: If any name is invalid (see ``validate_checkpointable_name``)
        or the names are not portable and distinct.
    """

    model: str = TRAINING_CHECKPOINTABLES[0]
    optimizer: str = TRAINING_CHECKPOINTABLES[1]
    rng: str = TRAINING_CHECKPOINTABLES[2]
    auxiliary: str = TRAINING_CHECKPOINTABLES[3]
    iterator: str = TRAINING_CHECKPOINTABLES[4]

    def __post_init__(self) -> None:
        validate_distinct_names(
            (self.model, self.optimizer, self.rng, self.auxiliary, self.iterator),
            what="TrainingCheckpointNames",
        )


@dataclasses.dataclass(frozen=True)
class TrainingCheckpoint:
    """A complete restored training state from one atomic checkpoint.

    Attributes:
      step: Non-negative training step the checkpoint was written at.
      model: Restored model state.
      optimizer: Restored optimizer state.
      rng: Restored RNG state.
      auxiliary: Restored user auxiliary state.
      iterator: Restored Grain input iterator.

    Raises:
      TypeError: If ``step`` is not an integer (booleans rejected) or
        ``iterator`` is not a ``grain.DatasetIterator``.
      ValueError: If ``step`` is negative.
    """

    step: int
    model: Any
    optimizer: Any
    rng: Any
    auxiliary: Any
    iterator: grain.DatasetIterator

    def __post_init__(self) -> None:
        object.__setattr__(self, "step", check_step(self.step))
        check_iterator(self.iterator)


def _check_names(names: object) -> TrainingCheckpointNames:
    if names is None:
        return TrainingCheckpointNames()
    if not isinstance(names, TrainingCheckpointNames):
        raise TypeError(
            f"names must be a TrainingCheckpointNames or None, got {type(names).__name__}"
        )
    return names


def save_training_checkpoint(
    path: str | os.PathLike[str],
    step: int,
    model: Any,
    optimizer: Any,
    rng: Any,
    auxiliary: Any,
    iterator: grain.DatasetIterator,
    *,
    names: TrainingCheckpointNames | None = None,
) -> SaveResponse[None]:
    """Start one atomic training save on every process's main thread.

    The iterator's state is captured when this call returns, so the caller may
    keep iterating while the save completes in the background.

    Args:
      path: Destination checkpoint directory.
      step: Non-negative training step.
      model: Model state to save.
      optimizer: Optimizer state to save.
      rng: RNG state to save.
      auxiliary: User auxiliary state saved alongside ``step``.
      iterator: Grain input iterator whose state is saved.
      names: Optional override for the five checkpointable names. Defaults to
        ``TrainingCheckpointNames()``.

    Returns:
      An Orbax ``AsyncResponse``; call ``.result()`` to await completion.

    A step may be an ``int``, a NumPy integer or a 0-d integer array
    (``jnp.asarray(4)``). NumPy scalars in the state are saved as 0-d NumPy arrays
    and come back as such.

    Raises:
      TypeError: If ``step`` is not an integer (booleans rejected), ``iterator``
        is not a ``grain.DatasetIterator``, ``names`` is not a
        ``TrainingCheckpointNames``, or ``model`` or ``optimizer`` is a flax NNX
        object rather than its state (``nnx.state(model)``).
      ValueError: If ``step`` is negative.
    """
    state = TrainingCheckpoint(step, model, optimizer, rng, auxiliary, iterator)
    return start_training_save(path, state, names=names)


def start_training_save(
    path: str | os.PathLike[str],
    state: TrainingCheckpoint,
    *,
    names: TrainingCheckpointNames | None = None,
    after_commit: Callable[[], None] | None = None,
) -> SaveResponse[None]:
    """``save_training_checkpoint`` of ``state`` (its step and iterator checked as it
    was made), with ``after_commit`` as in ``start_save``."""
    names = _check_names(names)
    return start_save(
        path,
        {
            names.model: state.model,
            names.optimizer: state.optimizer,
            names.rng: state.rng,
            names.auxiliary: {STEP_KEY: state.step, STATE_KEY: state.auxiliary},
            names.iterator: state.iterator,
        },
        after_commit=after_commit,
        metrics_of=(names.auxiliary, state.auxiliary),
    )


def _check_auxiliary_layout(checkpoint: Checkpoint, name: str) -> None:
    path = checkpoint.path
    keys = pytree.top_level_keys(checkpoint.get(name))
    if keys is None:
        raise TypeError(
            f"auxiliary checkpointable {name!r} in {str(path)!r} is not a stored pytree, "
            "so it does not restore as a mapping"
        )
    if not all(is_dict_key for _, is_dict_key in keys):
        raise TypeError(
            f"auxiliary checkpointable {name!r} in {str(path)!r} does not restore as a mapping"
        )
    present = {key for key, _ in keys}
    # Orbax records an empty `state` ({}, (), None) as a leaf of its own, so both keys
    # are visible in the metadata.
    for key in (STEP_KEY, STATE_KEY):
        if key not in present:
            raise ValueError(
                f"auxiliary checkpointable {name!r} in {str(path)!r} is missing {key!r}"
            )


# The cycle collector is paused for the whole load, as in load_checkpointables.
@files.paused_gc()
def load_training_checkpoint(
    path: str | os.PathLike[str] | Checkpoint,
    model_target: Any,
    optimizer_target: Any,
    rng_target: Any,
    auxiliary_target: Any,
    iterator: grain.DatasetIterator,
    *,
    names: TrainingCheckpointNames | None = None,
) -> TrainingCheckpoint:
    """Preflight value targets before restoring the stateful iterator.

    The model, optimizer, RNG and auxiliary state are restored and checked against
    their targets first; only when all of them match is the iterator's state read
    from the same checkpoint and set, in place, with prefetch started as Grain's
    own handler does. An incompatible target therefore raises and leaves the
    caller's iterator exactly where it was.

    Args:
      path: Source checkpoint directory.
      model_target: Restore target for model state.
      optimizer_target: Restore target for optimizer state.
      rng_target: Restore target for RNG state.
      auxiliary_target: Restore target for user auxiliary state.
      iterator: Grain iterator to restore in place.
      names: Optional override for the five checkpointable names. Defaults to
        ``TrainingCheckpointNames()``.

    Returns:
      A ``TrainingCheckpoint`` with the restored step, model, optimizer, rng,
      auxiliary state, and iterator.

    Targets may be abstract (``abstract_restore_target``, ``nnx.eval_shape``) or
    the live state itself: its arrays are taken as their shape, dtype and sharding.

    Raises:
      TypeError: If ``iterator`` is not a ``grain.DatasetIterator``, ``names`` is
        not a ``TrainingCheckpointNames``, the auxiliary checkpointable does
        not restore as a mapping, or a target is a flax NNX object
        (``nnx.Module``, ``nnx.Optimizer``) or ``GraphDef`` rather than its
        state (``nnx.state(model)``).
      ValueError: If the auxiliary checkpointable is missing ``step`` or
        ``state``, the restored step is negative, a target does not match the
        checkpoint, the iterator was saved by a different number of processes,
        the checkpoint fails the preflight, or its stored data is unreadable or
        corrupt (``CorruptDataError``, naming the leaf; a damaged iterator state
        is found before the iterator is touched), or the iterator reads another
        input pipeline than the one saved (``PipelineMismatchError``, naming what
        differs; ``allow_pipeline_change()`` lets a deliberate change through).
      FileNotFoundError: If ``path`` does not exist.
      RestoreTooLargeError: A ``MemoryError``: the restore does not fit its budget
        (``memory_budget``), the host or a device (one paragraph saying what it
        needs and what is available); nothing was read and the iterator was not
        touched.

    NaN and Inf are counted in every float leaf as it is read; a checkpoint that
    turns out diverged is loaded all the same, with a warning naming what was found
    (``TrainingRun.restore`` passes such checkpoints over).
    """
    return restore_training(
        path, model_target, optimizer_target, rng_target, auxiliary_target, iterator, names=names
    )


def restore_training(
    path: str | os.PathLike[str] | Checkpoint,
    model_target: Any,
    optimizer_target: Any,
    rng_target: Any,
    auxiliary_target: Any,
    iterator: grain.DatasetIterator,
    *,
    names: TrainingCheckpointNames | None = None,
    accept: Callable[[Checkpoint, Health], None] | None = None,
) -> TrainingCheckpoint:
    """``load_training_checkpoint``; with ``accept``, the checkpoint's health (its data
    read and counted) is given to it before the iterator is touched: it raises to
    refuse the checkpoint, leaving the iterator as it was, or returns to take it."""
    check_iterator(iterator)
    names = _check_names(names)
    checkpoint = checkpoint_to_load(path)
    src = checkpoint.path
    held = [item.name for item in checkpoint.checkpointables]
    parts = (names.model, names.optimizer, names.rng, names.auxiliary, names.iterator)
    missing = [n for n in parts if n not in held]
    if missing:
        raise TargetMismatchError(
            f"checkpoint {str(src)!r} is not a training checkpoint: it has no {missing}; "
            f"it holds {held}"
        )
    _check_auxiliary_layout(checkpoint, names.auxiliary)
    # Before anything is restored: a job of another process count cannot resume it.
    check_iterator_states(checkpoint.get(names.iterator))

    for name, target in ((names.model, model_target), (names.optimizer, optimizer_target)):
        refuse_flax_objects(target, what=f"{name} target")
    value_targets = {
        names.model: model_target,
        names.optimizer: optimizer_target,
        names.rng: rng_target,
        names.auxiliary: {STEP_KEY: 0, STATE_KEY: auxiliary_target},
    }
    check_targets_given(value_targets)
    # All five parts are judged against the metadata before anything is read, the
    # iterator's pipeline against the one it was saved from too.
    check_targets(checkpoint, {**value_targets, names.iterator: iterator})
    check_pipelines(checkpoint, {names.iterator: iterator})
    counts = LoadCounts()
    values = restore_checkpointables(checkpoint, value_targets, counts)
    auxiliary = values[names.auxiliary]
    if not isinstance(auxiliary, Mapping):
        raise TypeError(
            f"auxiliary checkpointable {names.auxiliary!r} did not restore as a mapping"
        )
    for key in (STEP_KEY, STATE_KEY):
        if key not in auxiliary:
            raise ValueError(f"auxiliary checkpointable {names.auxiliary!r} is missing {key!r}")
    step = auxiliary[STEP_KEY]
    if isinstance(step, bool) or not isinstance(step, int | np.integer):
        raise ValueError(f"stored step {step!r} in {str(src)!r} is not an integer")
    if step < 0:
        raise ValueError(f"stored step {step} in {str(src)!r} is negative")
    if accept is None:
        loaded_health(checkpoint, counts)
    else:
        accept(checkpoint, counts.health(logged.logged(checkpoint.record), value_targets))
    # Only now is the caller's iterator touched.
    restore_checkpointables(checkpoint, {names.iterator: iterator})
    iterator.start_prefetch()
    return TrainingCheckpoint(
        step=int(step),
        model=values[names.model],
        optimizer=values[names.optimizer],
        rng=values[names.rng],
        auxiliary=auxiliary[STATE_KEY],
        iterator=iterator,
    )
