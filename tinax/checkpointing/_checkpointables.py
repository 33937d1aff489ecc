"""Saving and loading named checkpointables in one atomic Orbax V1 checkpoint."""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import grain
import jax
import numpy as np
from orbax.checkpoint import v1 as ocp

from tinax._format.integrity import checksums, iterstate
from tinax._format.metadata import arrays, jsonitems, layout
from tinax._format.naming import names
from tinax._format.naming.keys import format_key, key_parts
from tinax._format.records import metrics
from tinax._format.storage import files
from tinax._format.storage.location import Location
from tinax._paths import checkpoint_to_load
from tinax._targets import NumpyTarget
from tinax.checkpointing import (
    _context,
    _destination,
    _failures,
    _fast_load,
    _host_copies,
    _loading_from,
    _orbax,
    _pipeline,
    _processes,
    _restore_plan,
)
from tinax.checkpointing._checkpointable_names import validate_distinct_names
from tinax.checkpointing._checksummed_handler import CorruptDataError
from tinax.checkpointing._metrics import logged_metrics
from tinax.checkpointing._nonfinite import LoadCounts, loaded_health
from tinax.checkpointing._response import SaveResponse
from tinax.checkpointing._save_clock import SaveClock
from tinax.checkpointing._storable import check_storable, is_stateful, numpy_scalars_as_arrays
from tinax.checkpointing._verdict import TargetMismatchError, check_targets


def _check_mapping(value: object, *, what: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} must be a mapping of name to value, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    validate_distinct_names(value.keys(), what=what)
    return value


def save_checkpointables(
    path: str | os.PathLike[str],
    checkpointables: Mapping[str, Any],
) -> SaveResponse[None]:
    """Start one immutable atomic V1 save on every process's main thread.

    Everything is checked before anything is written: every leaf must be
    storable, and the destination must not exist. The destination is claimed for
    the whole save (see the guide "Preemption and several processes", "Claim, then
    write": docs/guides/preemption.md#claim-then-write): a save to a destination
    another live process is writing is refused, and a temporary directory left
    there by a save whose process died is removed first. With several processes,
    the primary alone checks and claims the destination, and every process raises
    the same error when any check fails. The returned response removes the Orbax
    temporary directory if the save fails.

    Args:
      path: Destination checkpoint directory. Must not use Orbax's reserved
        temporary suffix.
      checkpointables: Non-empty mapping of checkpointable name to value. Names
        must be portable and distinct.

    Returns:
      An Orbax ``AsyncResponse``; call ``.result()`` to await completion before
      loading from or deleting the destination.

    Raises:
      TypeError: If ``checkpointables`` is not a mapping or a name is not a
        string, or a leaf cannot be stored (naming the checkpointable and the
        leaf's key path).
      ValueError: If ``checkpointables`` is empty, a name is invalid or not
        distinct, or ``path`` uses the reserved temporary suffix.
      FileExistsError: If ``path`` already exists, or a live process is saving
        to it (naming that process).
      FileNotFoundError: If the parent directory of ``path`` does not exist.
      ProcessTimeoutError: A ``TimeoutError``: not every process reached the save
        in time (naming those that did not).
      OSError: With ``errno.ENOSPC`` if the disk fills up (raised here or by the
        response's ``result``), naming ``path``; nothing is left behind.
    """

    return start_save(path, checkpointables)


def start_save(
    path: str | os.PathLike[str],
    checkpointables: Mapping[str, Any],
    *,
    after_commit: Callable[[], None] | None = None,
    metrics_of: tuple[str, Any] | None = None,
) -> SaveResponse[None]:
    """``save_checkpointables``, with ``after_commit`` run once the save has committed
    and before its response gives the result out (see ``SaveResponse``); with
    ``metrics_of`` (a checkpointable's name and the auxiliary state in it), its
    metrics are recorded with the commit (``tinax._format.records.metrics``)."""

    if isinstance(checkpointables, Mapping):
        # Every process stores what it was given the same way (the checks run on one).
        checkpointables = {
            name: numpy_scalars_as_arrays(value) for name, value in checkpointables.items()
        }

    def check_values() -> None:
        _check_mapping(checkpointables, what="checkpointables")
        for name, value in checkpointables.items():
            check_storable(name, value)

    # Orbax's work per leaf allocates tens of objects, and with them the cycle
    # collector walks the whole heap again and again: it took a quarter of a save of
    # 10,000 arrays. Paused for the synchronous part of the save only: the caller's
    # training loop goes on while the rest is written, and its cyclic garbage must
    # still be collected (the guide "Storage settings", "Many small arrays":
    # docs/guides/storage.md#many-small-arrays; bench/rss.py).
    clock = SaveClock()
    files.pause_gc()
    try:
        values = list(checkpointables.values()) if isinstance(checkpointables, Mapping) else []
        # Under way while the values are checked and the destination claimed.
        _host_copies.start_host_copies(values)
        directories_first = _host_copies.write_batch_bytes(values) is not None
        ctx = _context.context(directories_first=directories_first, saving=True)
        dest = _destination.prepare(path, check_values, ctx)
    except BaseException:
        files.resume_gc()
        raise
    where = str(dest.location)
    _failures.begin(where)
    try:
        with ctx:
            inner = ocp.save_checkpointables_async(
                orbax_path(dest.location),
                dict(checkpointables),
                # Committed with the checkpoint: its checksums cannot be stripped unseen,
                # and the input pipeline each iterator reads is known at restore.
                custom_metadata=_custom_metadata(checkpointables, metrics_of),
            )
    except BaseException as e:
        try:
            if directories_first:
                # Handlers whose arrays were copied already write in the background.
                _orbax.wait_for_writers(_orbax.current_operation(), _orbax.coordination_timeout())
            dest.discard_temporaries()
        finally:
            dest.release()
            files.resume_gc()
        failure = _failures.save_failure(where, e)
        _failures.end(where)
        if failure is e:
            raise
        raise failure from e
    files.resume_gc()
    response: SaveResponse[None] = SaveResponse(
        inner, dest, on_end=_nothing, after_commit=clock.after_commit(dest.location, after_commit)
    )
    clock.returned()
    return response


def _custom_metadata(
    checkpointables: Mapping[str, Any], metrics_of: tuple[str, Any] | None = None
) -> dict[str, Any] | None:
    """What a save records in ``_CHECKPOINT_METADATA``: the promise of checksums, the
    input pipeline behind each Grain iterator (``_pipeline``), and a training save's
    metrics (read after the host copies began: no second transfer)."""
    custom: dict[str, Any] = {}
    if _context.checksumming():
        custom[names.CHECKSUMS_PROMISE] = {"checksums": True}
    pipelines = _pipeline.records(dict(checkpointables))
    if pipelines:
        custom[names.PIPELINES] = pipelines
    if metrics_of is not None:
        name, auxiliary = metrics_of
        custom[names.METRICS_RECORD] = metrics.record(name, logged_metrics(auxiliary))
    return custom or None


def _orbax_in_flight() -> int | None:
    """The ``read_concurrent_bytes`` the caller's Orbax context sets, if any."""
    found = _orbax.active_context().memory_options.read_concurrent_bytes
    return None if found is None else int(found)


def _nothing() -> None:
    """What a save's end has to undo: nothing since the collector pause ends earlier."""


def orbax_path(where: Location) -> os.PathLike[str]:
    """The path Orbax is given for ``where``: absolute, as Orbax requires."""
    return where.pathlike()


def _orbax_reason(error: BaseException) -> str:
    # Orbax appends its whole handler registry to a failed restore; the cause is
    # what precedes it, or the exception it was raised from.
    text = str(error).split(" found in registry", 1)[0]
    cause = error.__cause__ or error.__context__
    if cause is not None and cause is not error:
        text += f" ({type(cause).__name__}: {str(cause).split(' found in registry', 1)[0]})"
    return text


def _leaf_spec(leaf: Any) -> tuple[tuple[int, ...], Any] | None:
    # dtypes are compared as they are, not through np.dtype: typed PRNG keys have
    # extended dtypes (key<fry>) that NumPy cannot interpret.
    if isinstance(leaf, jax.ShapeDtypeStruct | NumpyTarget | jax.Array | np.ndarray):
        return tuple(leaf.shape), leaf.dtype
    return None


def _check_restored(path: Location, name: str, target: Any, restored: Any) -> None:
    """Raises unless ``restored`` has the structure, shapes and dtypes of ``target``."""
    target_leaves, target_def = jax.tree_util.tree_flatten_with_path(target)
    restored_leaves, restored_def = jax.tree_util.tree_flatten_with_path(restored)
    if str(target_def) != str(restored_def):
        raise TargetMismatchError(
            f"checkpoint {str(path)!r}: checkpointable {name!r}: stored structure does not match the restore target "
            f"(target {target_def}, stored {restored_def})"
        )
    for (key_path, want), (_, got) in zip(target_leaves, restored_leaves, strict=True):
        want_spec, got_spec = _leaf_spec(want), _leaf_spec(got)
        if want_spec is not None and got_spec != want_spec:
            raise TargetMismatchError(
                f"checkpoint {str(path)!r}: checkpointable {name!r} leaf "
                f"{format_key(key_parts(key_path))}: target "
                f"{want_spec[0]} {want_spec[1]} but checkpoint restored "
                f"{got_spec and got_spec[0]} {got_spec and got_spec[1]}"
            )


def load_checkpointables(
    path: str | os.PathLike[str] | layout.Checkpoint, targets: Mapping[str, Any]
) -> dict[str, Any]:
    """Load all named V1 targets together on every process's main thread.

    Before anything is read the load works out its restore plan from metadata
    (``tinax.explore.restore_plan`` shows it): a load whose peak host memory would
    exceed its budget or the memory available, or that would not fit a device, is
    refused with ``RestoreTooLargeError`` before any data file is opened. The budget
    is the ``max_host_bytes`` of an enclosing ``with memory_budget(...)``, by default
    90% of the host memory available when the load starts (cgroup-aware: a
    container's limit counts); within it the load's read buffers are sized to stay
    under the plan's figure.

    Args:
      path: Source checkpoint directory, or the checkpoint as ``open_checkpoint``
        opened it (nothing is listed or read again).
      targets: Non-empty mapping of checkpointable name to an explicit
        non-``None`` restore target. Names must be portable and distinct.

    Returns:
      A dict mapping each requested name to its restored value.

    Raises:
      TypeError: If ``targets`` is not a mapping or a name is not a string.
      ValueError: If ``targets`` is empty, a name is invalid or not distinct, a
        target is ``None``, ``path`` uses the reserved temporary suffix, ``path``
        is not a checkpoint or fails the preflight (a link, FIFO, oversized or
        non-JSON metadata file: the message names it), it lacks a requested
        checkpointable, or stored data cannot be read.
      CorruptDataError: A ``ValueError``: stored data does not match the
        checksums saved with it, naming the checkpoint, checkpointable and leaf.
      FileNotFoundError: If ``path`` does not exist.
      RestoreTooLargeError: A ``MemoryError``: the restore does not fit its budget
        (``memory_budget``), the host or a device (one paragraph: the bytes needed
        and available, the largest leaves, what to change); nothing was read.
    """
    _check_mapping(targets, what="targets")
    check_targets_given(targets)
    # A load of many leaves allocates tens of objects per leaf; the cycle collector
    # would walk the whole heap again and again (40% of a 10,000-leaf load).
    with files.paused_gc():
        checkpoint = checkpoint_to_load(path)
        check_targets(checkpoint, targets)
        _pipeline.check_pipelines(checkpoint, dict(targets))
        counts = LoadCounts()
        restored = restore_checkpointables(checkpoint, targets, counts)
    loaded_health(checkpoint, counts)
    return restored


def check_targets_given(targets: Mapping[str, Any]) -> None:
    """Raises ``ValueError`` for a restore target that is ``None``."""
    for name, target in targets.items():
        if target is None:
            raise ValueError(
                f"restore target for {name!r} is None; it must be an explicit non-None target"
            )


def check_iterator_states(item: layout.StoredCheckpointable) -> None:
    """Refuses to restore an iterator that was saved by a different number of processes.

    Grain restores the state this process saved (``process_<i>-of-<n>.json``); a job
    with another process count has none to restore.

    Raises:
      ValueError: Naming what was saved and how to get at it, if this process's
        state file is missing but other processes' are there; naming the file, if
        a state is not one Grain could resume from (``tinax._format.integrity.iterstate``).
    """
    src, name = item.checkpoint.path, item.name
    saved = jsonitems.iterator_files(item)
    mine = _own_iterator_file()
    if not saved or any(file == mine for _, _, file in saved):
        if saved:
            # Before Grain reads it: a state it could not resume from is refused here.
            # Only this process's: the others are theirs to check.
            iterstate.check_states(item, only=mine)
        return
    counts = sorted({count for _, count, _ in saved})
    raise ValueError(
        f"checkpoint {str(src)!r}: iterator {name!r} was saved by "
        f"{' or '.join(map(str, counts))} process(es) ({', '.join(f for _, _, f in saved)}) "
        f"and this job has {_processes.process_count()}, so there is no {mine} to restore. "
        "Restore the other checkpointables with load_checkpointables; "
        "tinax.explore.read_leaf gives each saved process's iterator state"
    )


def _own_iterator_file() -> str:
    """The iterator state file this process saves and restores."""
    return names.iterator_file_name(_processes.process_index(), _processes.process_count())


def set_iterator_state(item: layout.StoredCheckpointable, iterator: Any) -> bool:
    """Restores a Grain ``DatasetIterator`` in place as Grain's own load does (the JSON
    of this process's state file given to ``set_state``), from the file as the opened
    checkpoint read it, checked against the checkpointable's checksums first: no
    Orbax load, whose existence checks cost dozens of requests on a bucket.

    Returns:
      ``False``, touching nothing, for any other iterator (one whose class loads in
      a way of its own), which Orbax's handler restores.

    Raises:
      CorruptDataError: If the state file does not match its checksum, naming it;
        the iterator is left as it was.
    """
    if not isinstance(iterator, grain.DatasetIterator) or (
        type(iterator).load is not grain.DatasetIterator.load
    ):
        return False
    name, directory = _own_iterator_file(), item.directory
    # The bytes the check of its state read (kept on the opened checkpoint).
    data = item.checkpoint.read_bytes(
        directory / name, what="Grain iterator state", max_bytes=files.MAX_SMALL_JSON_BYTES
    )
    records = checksums.read_checksums(item)
    record = None if records is None else records.get(name)
    problem = None if record is None else checksums.file_problem(name, data, record)
    if problem is not None:
        raise CorruptDataError(
            f"checkpoint {str(directory.parent)!r}: checkpointable {directory.name!r}: {problem}"
        )
    iterator.set_state(json.loads(data))
    return True


# Tensorstore reports a read that failed with the status code first.
_READ_FAILURE = re.compile(
    r"^(DATA_LOSS|NOT_FOUND|FAILED_PRECONDITION|OUT_OF_RANGE|INVALID_ARGUMENT|UNKNOWN|"
    r"INTERNAL|RESOURCE_EXHAUSTED|UNAVAILABLE|PERMISSION_DENIED|ABORTED|CANCELLED): "
)
# Orbax names the array it was reading in the tensorstore spec it quotes.
_ORBAX_READING = "Encountered error while reading array index"
_SPEC_PATH = re.compile(r"['\"]path['\"]: ['\"]([^'\"]*)['\"]")


def load_error(src: Location, targets: Mapping[str, Any], error: BaseException) -> Exception:
    """The error to report for an Orbax load that failed, saying what really happened.

    Orbax reports every failure inside a checkpointable's load as an incompatible
    handler; the cause is further down the chain: corrupt data (a checksum that
    does not match), a read that failed (a damaged or unreadable file), or a
    target that does not fit what is stored.
    """
    chain = _failures.causes(error)
    for cause in chain:
        if isinstance(cause, CorruptDataError):
            return CorruptDataError(str(cause))
    # tinax's own readers name the file that is wrong; that is the message to give.
    named = next((c for c in chain[1:] if isinstance(c, ValueError) and str(src) in str(c)), None)
    if named is not None:
        return ValueError(f"checkpoint {str(src)!r}: cannot load {sorted(targets)}: {named}")
    failed = [c for c in chain if _READ_FAILURE.match(str(c)) or str(c).startswith(_ORBAX_READING)]
    if failed:
        reading = next((c for c in chain if str(c).startswith(_ORBAX_READING)), None)
        array = _SPEC_PATH.findall(str(reading)) if reading is not None else []
        what = f" (reading array {array[-1].rstrip('/')!r})" if array else ""
        root = next((c for c in reversed(chain) if _READ_FAILURE.match(str(c))), failed[-1])
        return ValueError(
            f"checkpoint {str(src)!r}: the stored data of {sorted(targets)} cannot be read; "
            f"it is damaged or unreadable{what}: {arrays.message(root)}"
        )
    if any(is_stateful(target) for target in targets.values()):
        # An iterator refusing its saved state: a state damaged past the checks, or
        # one from another pipeline; nothing tells which, so it is no target verdict.
        return ValueError(
            f"checkpoint {str(src)!r}: the saved state of {sorted(targets)} does not "
            f"restore into the iterator given: {_orbax_reason(error)}"
        )
    # Nothing was damaged or unreadable: what Orbax refused is the targets.
    return TargetMismatchError(
        f"checkpoint {str(src)!r}: Orbax could not restore {sorted(targets)} into these "
        f"targets although their metadata fits: {_orbax_reason(error)}"
    )


def restore_checkpointables(
    checkpoint: layout.Checkpoint, targets: Mapping[str, Any], counts: LoadCounts | None = None
) -> dict[str, Any]:
    """Restores ``targets`` from the opened ``checkpoint`` and checks them against their
    targets, reading what it has read already from it.

    The caller has already checked the names, and the targets against the
    checkpoint's metadata (``check_targets``). The restore plan comes first: a
    restore that does not fit is refused before any data file is opened. ``counts``
    counts NaN and Inf of every float leaf restored (``_nonfinite``).

    Raises:
      CorruptDataError: If stored data does not match its checksums (a
        ``ValueError`` naming the checkpoint, checkpointable and leaf).
      ValueError: If stored data cannot be read, or Orbax cannot restore what
        the metadata promised.
      RestoreTooLargeError: If the restore does not fit (``_restore_plan``).
    """
    src = checkpoint.path
    for name, target in targets.items():
        if is_stateful(target):
            check_iterator_states(checkpoint.get(name))
    values = {name: t for name, t in targets.items() if not is_stateful(t)}
    planned = _restore_plan.plan_restore(
        checkpoint,
        values,
        max_host_bytes=_restore_plan.budget_in_force(),
        orbax_in_flight=_orbax_in_flight(),
    )
    try:
        _restore_plan.refuse_unless_fits(planned.plan)
        # What the load engine reads byte for byte it loads; Orbax loads the rest.
        restored = _fast_load.load(
            checkpoint,
            {name: planned.engine.get(name) for name in values},
            arena_bytes=planned.plan.limits.arena_bytes,
            reading_bytes=planned.plan.limits.reading_bytes,
            piece_readers=planned.plan.limits.piece_readers,
            counts=counts,
        )
    finally:
        planned.close()
    abstract = {
        name: target if is_stateful(target) else planned.abstract[name]
        for name, target in targets.items()
    }
    for name, target in targets.items():
        if is_stateful(target) and set_iterator_state(checkpoint.get(name), target):
            restored[name] = target
    rest = {name: t for name, t in abstract.items() if name not in restored}
    ctx = _context.context()
    if ctx.memory_options.read_concurrent_bytes is None:
        # Orbax's own default reads every array at once: the plan's figure holds it.
        ctx.memory_options.read_concurrent_bytes = planned.plan.limits.orbax_in_flight
    try:
        with (
            ctx,
            _loading_from.reading_from(checkpoint),
            warnings.catch_warnings(),
        ):
            # A target without a sharding (nnx.eval_shape's) is loaded with the one the
            # checkpoint records, as Orbax does; its warning says only that.
            warnings.filterwarnings("ignore", message="Sharding info not provided when restoring")
            if rest:
                restored.update(ocp.load_checkpointables(orbax_path(src), rest))
    except (TypeError, ValueError, KeyError, LookupError, OSError) as e:
        failure = load_error(src, targets, e)
        # A target problem is the caller's: Orbax's traceback would only hide it.
        raise failure from (None if isinstance(failure, TargetMismatchError) else e)
    # Orbax restores a NumPy leaf with its stored shape whatever the target says;
    # a restore that does not match its target is an error, not a surprise later.
    for name, target in targets.items():
        _check_restored(src, name, target, restored[name])
        if counts is not None and not is_stateful(target):
            counts.count_values(name, restored[name])  # what Orbax loaded: counted here
    return {name: restored[name] for name in targets}
