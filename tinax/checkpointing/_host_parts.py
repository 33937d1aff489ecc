"""A local tier on every host of a job: each process's save to its own host, and the
promotion that makes the parts of every host one ordinary checkpoint in the durable tier.

On a pod slice every host has storage of its own (a local SSD, ``/dev/shm``) and
nothing is shared but the bucket. Each process saves what it owns to its own local
directory, with no wait on any other process: Orbax's ``primary_host=None`` over the
process alone, so that it writes each shard its devices hold once (whatever its
replica: it must restore alone), its Grain iterator's state and its checksums, and
marks the arrays as holding its chunks only (``tinax._format.metadata.hostparts``).
Restored by the same processes onto the same devices, a part holds everything each
process needs, and each reads it alone.

A promotion (``promote_parts``, on a background thread of every process) sends each
host's files to the durable directory and commits the checkpoint once, after all have
arrived, as a save of the whole job would have (Orbax's layout, loadable by raw Orbax
and every tinax reader, on one process or many):

1. process 0 makes the destination ready (on a disk: claims it and makes the
   temporary directory, removing what a killed promotion left; on ``gs://``: removes
   an uncommitted copy there) and says so;
2. every process checks its part's values against their checksums (a corrupt part
   sends nothing) and sends its own files, process 0 also those every part shares;
3. process 0, once every process has said it sent its files, merges the processes'
   array stores into each pytree's root (as Orbax's finalize does), says that every
   chunk is stored, writes the commit record and commits (renames the temporary
   directory, or writes ``commit_success.txt`` last on ``gs://``), and says so;
   every other process waits for that word.

Every wait is on a ``_processes.Meeting``: it ends, naming the process, once a process
waited for has been silent for the run's timeout (each process says it is alive
every second while it works). Nothing half-done is committed: a promotion that fails
anywhere is removed by process 0 before it reports, and what a killed one left is
removed by the run that resumes.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from orbax.checkpoint import v1 as ocp

from tinax import _claims, _paths
from tinax._format.integrity import preflight
from tinax._format.metadata import hostparts
from tinax._format.naming import names
from tinax._format.storage import copied_files, transfer
from tinax._format.storage.location import Location
from tinax.checkpointing import _orbax, _processes, _promotion
from tinax.checkpointing._promotion import _checked_copy
from tinax.checkpointing._response import SaveResponse
from tinax.checkpointing._training import (
    TrainingCheckpoint,
    TrainingCheckpointNames,
    start_training_save,
)

_log = logging.getLogger("tinax.checkpointing")


def own_storage_context() -> ocp.Context:
    """The caller's Orbax context, with this process saving and loading alone, to and
    from storage of its own (see the module docstring)."""
    me = _processes.process_index()
    ctx = ocp.Context(_orbax.active_context())
    ctx.multiprocessing.primary_host = None
    ctx.multiprocessing.active_processes = {me}
    ctx.multiprocessing.barrier_sync_key_prefix = f"tinax-host-{me}"
    # Orbax refuses replica-parallel saves to storage of one's own.
    ctx.array.saving.use_replica_parallel = False
    # Made in the save call: made on Orbax's background thread, the checkpoint's
    # directory could be made first, parents and all, by a writer of another thread
    # (the array metadata's), then found there and removed with what was written.
    ctx.async_options.create_directories_asynchronously = False
    return ctx


@contextlib.contextmanager
def own_storage() -> Iterator[None]:
    """Saves and loads in this block are this process's alone, to and from storage of
    its own."""
    _orbax.allow_own_directories()
    with own_storage_context():
        yield


def start_save(
    path: Location,
    state: TrainingCheckpoint,
    *,
    names: TrainingCheckpointNames,
    after_commit: Any,
) -> SaveResponse[None]:
    """Starts this process's save of its part of ``state`` to ``path`` on its own host.

    Raises:
      As ``save_training_checkpoint``.
    """
    _orbax.write_host_values_under(str(path.parent))
    with own_storage():
        return start_training_save(str(path), state, names=names, after_commit=after_commit)


# -- the promotion ---------------------------------------------------------------------


def promote_parts(
    source: Location, destination: Location, *, meeting: _processes.Meeting, step: int
) -> None:
    """Promotes the parts of every process of step ``step`` (see the module docstring);
    every process of the job calls it, each with its own part as ``source``.

    Args:
      source: This process's committed part, on its host.
      destination: The durable checkpoint to commit (the same on every process).
      meeting: The promotion's meeting (the same name on every process).
      step: The step, for messages.

    Raises:
      CorruptDataError: If this process's part does not match its checksums.
      ProcessTimeoutError: If a process went silent before it had done its share.
      OSError, ValueError: If a part could not be read or sent, or the checkpoint
        could not be committed (on every process: process 0's report).
    """
    me = _processes.process_index()
    during = f"the promotion of step {step} to {str(destination)!r}"
    with meeting.working():
        if me == 0:
            _promote_as_primary(source, destination, meeting, during)
            return
        ready = meeting.wait("ready", [0], during=during)[0]
        if "error" in ready:
            raise _failed(during, ready, 0)
        target = _paths.location(ready["target"])
        try:
            _send_part(source, target, me)
        except BaseException as e:
            meeting.post("sent", _failure(e))
            raise
        meeting.post("sent", {})
        outcome = meeting.wait("committed", [0], during=during)[0]
        if "error" in outcome:
            raise _failed(during, outcome, 0)


class PartRefused(OSError):
    """A promotion of parts failed because another process's part was refused (its
    values did not match their checksums): that process sets its part aside; the
    step is not promoted, and the run goes on."""


def _failure(error: BaseException) -> dict[str, Any]:
    return {"error": f"{type(error).__name__}: {error}", "corrupt": isinstance(error, ValueError)}


def _failed(during: str, post: dict[str, Any], index: int) -> OSError:
    """The error of a process that learns from ``post`` that process ``index`` failed."""
    kind = PartRefused if post.get("corrupt") else OSError
    return kind(f"{during} failed: {post['error']} [process {index}]")


def _refused(error: BaseException) -> bool:
    """Whether ``error`` ended a promotion because some part was refused as corrupt."""
    return isinstance(error, PartRefused | ValueError)


def _promote_as_primary(
    source: Location, destination: Location, meeting: _processes.Meeting, during: str
) -> None:
    held: _claims.Claim | None = None
    target: Location | None = None
    try:
        try:
            held, target = _make_ready(destination)
        except BaseException as e:
            meeting.post("ready", _failure(e))
            raise
        meeting.post("ready", {"target": str(target)})
        try:
            _send_part(source, target, 0)
            sent = meeting.wait("sent", range(1, _processes.process_count()), during=during)
            failed = [(index, post) for index, post in sent.items() if "error" in post]
            if failed:
                raise _failed(during, failed[0][1], failed[0][0])
            _commit(source, target, destination)
        except BaseException as e:
            meeting.post("committed", _failure(e) | {"corrupt": _refused(e)})
            with contextlib.suppress(OSError):
                target.remove_tree()
            raise
        meeting.post("committed", {})
    finally:
        if held is not None:
            held.release()


def _make_ready(destination: Location) -> tuple[_claims.Claim | None, Location]:
    """Clears what a killed promotion left at ``destination`` and returns where the
    parts are sent (a claimed temporary directory on a disk, the destination itself on
    an object store).

    Raises:
      FileExistsError: If ``destination`` holds a committed checkpoint.
    """
    if not destination.storage.commits_by_rename:
        _promotion.clear_in_place(destination)
        return None, destination
    held = _claims.claim(destination)
    try:
        temporary = _promotion.clear_for_rename(destination)
        os.mkdir(temporary.path)
    except BaseException:
        if held is not None:
            held.release()
        raise
    return held, temporary


def _send_part(source: Location, target: Location, process: int) -> None:
    """Checks this process's part against its checksums, then sends its files (see
    ``hostparts.sent_by``) to ``target``.

    Raises:
      CorruptDataError: If a value does not match its checksum (nothing is sent).
    """
    checkpoint = preflight.check(source)
    sent = hostparts.sent_by(copied_files.source_files(source), process)
    _checked_copy(checkpoint, sent, target)


def _commit(source: Location, target: Location, destination: Location) -> None:
    """Makes the parts sent to ``target`` one checkpoint and commits it at
    ``destination`` (process 0, with every part in)."""
    listed = copied_files.source_files(source)
    for name in hostparts.stores(listed):
        _orbax.merge_process_stores((target / name).pathlike())
        hostparts.mark_chunks(target / name, True)
    record = [f for f in listed if f.relative == (names.CHECKPOINT_METADATA,)]
    if not record:
        raise ValueError(f"{str(source)!r} has no {names.CHECKPOINT_METADATA}: not committed")
    transfer.copy_files(source, record, target)
    if target == destination:
        # On an object store, as Orbax commits there: the marker last.
        (target / names.COMMIT_SUCCESS).write_new(names.commit_success_text(str(destination)))
    else:
        _promotion.commit_by_rename(target, destination)
