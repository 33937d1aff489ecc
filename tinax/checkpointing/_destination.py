"""A save's destination: checked once, on the primary process, under a claim.

Claim, then write. Before Orbax creates anything, the primary process claims the
destination (``tinax._claims``) and, holding the claim, checks it: a committed
checkpoint there is never overwritten, and a temporary directory left by a save
whose process died is removed (and logged). A destination claimed by a live process
is refused, naming that process. Every process then agrees on the outcome, so a
refused save is refused everywhere and no process is left waiting for its peers.

The claim is held until the save has committed or failed; only its holder ever
removes a temporary directory, so a save that loses a race never touches the
winner's files.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable

from orbax.checkpoint import v1 as ocp

from tinax import _claims, _paths
from tinax._format.naming import words
from tinax._format.storage.location import Location
from tinax.checkpointing import _orbax, _processes

_log = logging.getLogger("tinax.checkpointing")


@dataclasses.dataclass
class Destination:
    """Where a save that has passed every check writes.

    Attributes:
      location: The checkpoint directory.
      primary: Whether this process checked it (and cleans up after a failure).
      claim: The claim this process holds on it, if any.
    """

    location: Location
    primary: bool
    claim: _claims.Claim | None

    def discard_temporaries(self) -> None:
        """After a failed save, removes what it left; only the primary does."""
        if self.primary:
            for temporary in _paths.temporary_siblings(self.location):
                temporary.remove_tree()

    def release(self) -> None:
        """Gives up the claim, if this process holds one."""
        if self.claim is not None:
            self.claim.release()


def claim_destination(dest: Location) -> _claims.Claim | None:
    """Claims ``dest`` and clears what interrupted saves left there.

    Returns:
      The claim; ``None`` where the storage has no locks.

    On object stores a save writes into ``dest`` itself; one that never committed
    there and has been quiet for ``_claims.QUIET_SECONDS`` is removed first, like a
    temporary directory whose writer is gone.

    Raises:
      FileExistsError: If a live process holds the claim, if ``dest`` exists, or,
        where there are no locks, if a temporary directory of a save to ``dest``
        exists (there is then no telling whether its save still runs).
    """
    held = _claims.claim(dest)
    try:
        unfinished = _claims.uncommitted_status(dest.snapshot()) if dest.exists() else None
        if unfinished is not None and unfinished.status == words.INTERRUPTED:
            _log.warning("removing %s, left by an interrupted save: %s", dest, unfinished.reason)
            dest.remove_tree()
        elif unfinished is not None:
            raise FileExistsError(
                f"a save to {str(dest)!r} is in progress ({unfinished.reason}); two saves "
                "never write one checkpoint"
            )
        elif dest.exists():
            raise FileExistsError(
                f"checkpoint destination {str(dest)!r} already exists; saves never overwrite"
            )
        leftovers = _paths.temporary_siblings(dest)
        if leftovers and held is None:
            raise FileExistsError(
                f"a save to {str(dest)!r} is in progress or was interrupted: "
                f"{str(leftovers[0])!r} exists, and this filesystem has no locks to tell "
                "which (delete it if no save is running)"
            )
        for temporary in leftovers:
            writer = (
                f"its writer ({held.previous}) is gone"
                if held is not None and held.previous is not None
                else "its writer did not claim it"
            )
            _log.warning("removing %s, left by an interrupted save: %s", temporary, writer)
            temporary.remove_tree()
    except BaseException:
        if held is not None:
            held.release()
        raise
    return held


def prepare(path: object, check_values: Callable[[], None], ctx: ocp.Context) -> Destination:
    """Every check a save makes before Orbax writes anything, agreed by every process.

    Args:
      path: The destination the caller gave.
      check_values: Checks what is to be saved; raises on a problem.
      ctx: The Orbax context the save runs in (its primary process and active
        processes are used).

    Returns:
      The checked destination, claimed if this is the primary process.

    Raises:
      TypeError, ValueError, FileExistsError, FileNotFoundError: The first problem
        any process found, on every process.
      ProcessTimeoutError: A ``TimeoutError``: not every process reached the save
        in time (naming those that did not).
    """
    options = ctx.multiprocessing_options
    primary = _processes.is_primary(options.primary_host)
    location: Location | None = None
    held: _claims.Claim | None = None
    error: Exception | None = None
    try:
        location = _paths.checkpoint_location(path)
        check_values()
        if primary:
            location = _paths.save_destination(path)
            held = claim_destination(location)
    except Exception as e:
        error = e
    try:
        _processes.agree(
            error,
            what=f"the save to {str(location or path)!r}",
            timeout=_processes.timeout_of(_orbax.coordination_timeout()),
            active_processes=sorted(options.active_processes or ()) or None,
        )
    except BaseException:
        if held is not None:
            held.release()
        raise
    assert location is not None  # agree() raised otherwise
    return Destination(location, primary, held)


def remove_interrupted_save(path: str | os.PathLike[str]) -> None:
    """Removes the temporary directory an interrupted save left behind.

    A save whose process was killed leaves Orbax's temporary directory
    (``<checkpoint>.orbax-checkpoint-tmp``); ``tinax.explore.list_checkpoints``
    lists it as ``interrupted``. It is never loadable, and the next save to the
    same checkpoint removes it anyway; this removes it now. The destination is
    claimed meanwhile, so no save to it can start during the removal. On object
    stores (``gs://``), where a save writes in place, ``path`` is the checkpoint
    directory itself that never committed.

    Args:
      path: The temporary directory, or the uncommitted ``gs://`` directory.

    Raises:
      TypeError: If ``path`` is not a path.
      ValueError: If ``path`` is neither an Orbax temporary directory nor a save
        that has not committed.
      FileNotFoundError: If nothing exists at ``path``.
      FileExistsError: If its save is still in progress; the message says who
        writes it.
    """
    found = _claims.remove_interrupted(_paths.location(path))
    _log.info("removed %s, left by an interrupted save (%s)", found.location, found.reason)
