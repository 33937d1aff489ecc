"""Promotions: a committed local checkpoint copied to the durable tier, checked, and committed.

A two-tier run (``TrainingRun(..., local=...)``) saves to fast local storage and
promotes some of those checkpoints to its durable directory. A promotion copies
nothing from the devices again: it copies the files of the committed local checkpoint
(``tinax._format.storage.transfer``: each file read once and streamed) once it has checked that
the checkpoint's values are the ones saved (``tinax._format.arraydata.valuecheck``, against the
checksums saved with them), and commits the copy the way Orbax commits a save there,
so raw Orbax and every tinax reader take it for a checkpoint like any other:

- on a disk: into ``<name>.orbax-checkpoint-tmp`` under the destination's claim
  (``tinax._claims``), renamed once every file is written and synced; a kill leaves
  an interrupted temporary directory;
- on ``gs://``: into the final directory, ``_CHECKPOINT_METADATA`` after every other
  file and ``commit_success.txt`` last; a kill leaves a directory with neither, which
  every reader takes for a save that has not committed.

A promotion that fails removes what it copied before it reports the failure; what a
killed one left is removed by the run that resumes (``TrainingRun``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Callable

from orbax.checkpoint import v1 as ocp

from tinax import _claims, _paths
from tinax._format.arraydata import valuecheck
from tinax._format.integrity import preflight
from tinax._format.integrity.checksums import CorruptDataError
from tinax._format.metadata import layout
from tinax._format.naming import names
from tinax._format.storage import copied_files, transfer
from tinax._format.storage.location import Location
from tinax.checkpointing import _response, _run_files

_log = logging.getLogger("tinax.checkpointing")

# The files a promotion writes after every other one, in this order: the commit record,
# then (on object stores) the marker that the checkpoint is whole.
_LAST = ((names.CHECKPOINT_METADATA,), (names.COMMIT_SUCCESS,))


def promote(source: Location, destination: Location) -> None:
    """Copies the committed local checkpoint ``source`` to the new ``destination``.

    Args:
      source: A committed checkpoint on a local disk.
      destination: Where it is to be committed: a local path or a ``gs://`` prefix,
        with nothing committed there. What a killed promotion left there is removed
        first (the caller is the only writer of its durable tier).

    Raises:
      CorruptDataError: If ``source``'s values do not match the checksums saved with
        them (nothing is committed).
      ValueError: If ``source`` is not a checkpoint a load would accept.
      FileExistsError: If ``destination`` holds a committed checkpoint, or a live
        process holds its claim.
      OSError: If a file cannot be read or written, or arrived corrupt.
    """
    checkpoint = preflight.check(source)
    files = copied_files.source_files(source)
    body = [f for f in files if f.relative not in _LAST]
    record = [f for f in files if f.relative == _LAST[0]]
    if not record:
        raise ValueError(f"{str(source)!r} has no {names.CHECKPOINT_METADATA}: not committed")
    if destination.storage.commits_by_rename:
        _promote_by_rename(checkpoint, body + record, destination)
    else:
        _promote_in_place(checkpoint, body, record, destination)


def _checked_copy(
    checkpoint: layout.Checkpoint, files: list[copied_files.SourceFile], target: Location
) -> None:
    """Checks the values, then copies ``files`` to ``target``: a corrupt checkpoint
    sends nothing. (Side by side, the check and the copy contend for the processor
    and for the interpreter, and the promotion took longer: the check reads what the
    save has just written, from the page cache, in a small part of the copy's time.)

    Raises:
      CorruptDataError: If a value does not match its saved checksum.
    """
    problems = valuecheck.check_values(checkpoint)
    if problems:
        more = f" and {len(problems) - 1} more problem(s)" if len(problems) > 1 else ""
        raise CorruptDataError(
            f"checkpoint {str(checkpoint.path)!r} was not promoted: {problems[0]}{more}"
        )
    transfer.copy_files(checkpoint.path, files, target)


def _promote_by_rename(
    checkpoint: layout.Checkpoint, files: list[copied_files.SourceFile], destination: Location
) -> None:
    held = _claims.claim(destination)
    try:
        temporary = clear_for_rename(destination)
        try:
            _checked_copy(checkpoint, files, temporary)
            commit_by_rename(temporary, destination)
        except BaseException:
            temporary.remove_tree()
            raise
    finally:
        if held is not None:
            held.release()


def clear_for_rename(destination: Location) -> Location:
    """Before a promotion to a disk (its claim held): refuses a committed
    ``destination``, removes what a killed promotion left, and returns the temporary
    directory to copy into (not made yet).

    Raises:
      FileExistsError: If ``destination`` exists.
    """
    if destination.exists():
        raise FileExistsError(f"{str(destination)!r} exists already: a promotion never overwrites")
    for leftover in _paths.temporary_siblings(destination):
        _log.warning("removing %s, left by an interrupted promotion", leftover)
        leftover.remove_tree()
    return destination.parent / (destination.name + names.TEMPORARY_SUFFIX)


def commit_by_rename(temporary: Location, destination: Location) -> None:
    """Commits a copy made in ``temporary`` as Orbax commits on a disk: the marker
    written, the directory renamed to ``destination``, the rename made durable."""
    (temporary / names.COMMIT_SUCCESS).write_new(names.commit_success_text(str(destination)))
    os.rename(temporary.path, destination.path)
    fd = os.open(destination.parent.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _promote_in_place(
    checkpoint: layout.Checkpoint,
    body: list[copied_files.SourceFile],
    record: list[copied_files.SourceFile],
    destination: Location,
) -> None:
    clear_in_place(destination)
    try:
        _checked_copy(checkpoint, body, destination)
        # Committed as Orbax commits on an object store: the record after every other
        # file, the marker last.
        transfer.copy_files(checkpoint.path, record, destination)
        (destination / names.COMMIT_SUCCESS).write_new(names.commit_success_text(str(destination)))
    except BaseException:
        with contextlib.suppress(OSError):
            destination.remove_tree()
        raise


def clear_in_place(destination: Location) -> None:
    """Before a promotion to an object store: removes what a killed promotion (or a
    restore that found the step corrupt) left at ``destination``.

    Raises:
      FileExistsError: If ``destination`` holds a committed checkpoint.
    """
    found = destination.snapshot()
    entries = found.entries()
    if names.CORRUPT_RECORD in entries or names.ABANDONED_RECORD in entries:
        # A restore found it corrupt, or the run left its branch, and marked it in place
        # (an object store cannot move it aside): the step's new checkpoint takes its place.
        _log.warning("removing %s, marked set aside, to promote its step again", found)
        _run_files.remove_checkpoint(destination)
    elif entries:
        if not layout.is_uncommitted(found):
            raise FileExistsError(
                f"{str(destination)!r} holds a committed checkpoint: a promotion never overwrites"
            )
        _log.warning("removing %s, left by an interrupted promotion", destination)
        destination.remove_tree()


class Promotion(ocp.AsyncResponse[None]):
    """One promotion, run in the background after the one before it; an Orbax
    ``AsyncResponse`` (``result``, ``on_complete``).

    ``after(error)`` runs on the promotion's thread once it has ended (``error`` is
    ``None`` when it committed) and before the result is given out; what it raises
    is logged. A script that ends with promotions in flight waits for them (as for
    saves; ``TrainingRun.close`` waits explicitly). ``copy(source, destination)``
    does the promotion's work (``promote``, unless another is given: the promotion
    of a part of every host's, ``_host_parts.promote_parts``).

    Attributes:
      step: The step promoted.
      source: The local checkpoint.
      destination: Where it is committed.
    """

    def __init__(
        self,
        step: int,
        source: Location,
        destination: Location,
        after: Callable[[BaseException | None], None],
        previous: Promotion | None,
        copy: Callable[[Location, Location], None] | None = None,
    ) -> None:
        self.step = step
        self.source = source
        self.destination = destination
        self._after = after
        self._copy = copy
        self._previous = previous
        self._started = threading.Event()
        self._future: concurrent.futures.Future[None] = concurrent.futures.Future()
        _response.track(self)
        self._thread = threading.Thread(
            target=self._run, name=f"tinax-promote:{destination.name}", daemon=True
        )
        self._thread.start()

    @property
    def path(self) -> str:
        """Where the promotion commits."""
        return str(self.destination)

    @property
    def started(self) -> bool:
        """Whether it has begun copying (the one before it has ended)."""
        return self._started.is_set()

    def _run(self) -> None:
        try:
            if self._previous is not None:
                self._previous._future.exception()  # waits; its failure is its own
                self._previous = None
            self._started.set()
            error: BaseException | None = None
            try:
                (self._copy or promote)(self.source, self.destination)
            except BaseException as e:
                error = e
            try:
                self._after(error)
            except Exception:
                _log.exception("after the promotion of %s", self.source)
            if error is None:
                self._future.set_result(None)
            else:
                self._future.set_exception(error)
        finally:
            _response.untrack(self)

    def result(self, timeout: float | None = None) -> None:
        """Waits for the promotion to commit.

        Raises:
          TimeoutError: If it has not ended within ``timeout`` seconds.
          Exception: Why it failed.
        """
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"the promotion of {str(self.source)!r} has not ended after {timeout} s"
            ) from None

    def done(self) -> bool:
        """Whether the promotion has ended, committed or not."""
        return self._future.done()

    def exception(self) -> BaseException | None:
        """Why it failed, once it has ended; else ``None``."""
        return self._future.exception() if self._future.done() else None

    def on_complete(self, callback: Callable[[None], None]) -> None:
        """Calls ``callback(None)`` once the promotion has committed."""

        def _call(future: concurrent.futures.Future[None]) -> None:
            if not future.cancelled() and future.exception() is None:
                callback(None)

        self._future.add_done_callback(_call)

    def wait_quietly(self) -> None:
        """Waits for the end; never raises."""
        self._future.exception()

    def __repr__(self) -> str:
        state = "done" if self.done() else "running" if self.started else "waiting"
        return f"Promotion(step={self.step}, {str(self.destination)!r}, {state})"
