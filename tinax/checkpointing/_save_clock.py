"""The save-time record: how long a save blocked its caller and took in all, and the
size of what it committed.

Written by the primary process into the checkpoint just after it commits
(``tinax._format.records.savetimes``), before the response gives its result out; a
failure to write it is logged, never the save's failure.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tinax._format.naming import names
from tinax._format.records import savetimes
from tinax._format.storage import removal
from tinax._format.storage.location import Location, tree_bytes
from tinax.checkpointing import _processes

_log = logging.getLogger("tinax.checkpointing")

# How long the record waits for ``returned`` when a save commits before its start
# has returned to the caller (never, in practice: the start returns first).
_RETURN_WAIT_S = 60.0


class SaveClock:
    """Started when a save is asked for; ``returned`` when ``save`` gives control back;
    ``after_commit`` records both durations in the committed checkpoint."""

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self._blocked: float | None = None
        self._returned = threading.Event()

    def returned(self) -> None:
        """The caller gets control back now: the save blocked it until here."""
        self._blocked = time.perf_counter() - self._started
        self._returned.set()

    def after_commit(self, where: Location, then: Callable[[], None] | None) -> Callable[[], None]:
        """What to run after the save to ``where`` commits: the record, then ``then``."""

        def run() -> None:
            total = time.perf_counter() - self._started
            try:
                self._record(where, total)
            finally:
                if then is not None:
                    then()

        return run

    def _record(self, where: Location, total: float) -> None:
        if _processes.process_index() != 0:
            return
        self._returned.wait(_RETURN_WAIT_S)
        blocked = total if self._blocked is None else min(self._blocked, total)
        # The size of what was committed, where a walk of it is a few system calls (not
        # requests): a listing of the run then reads it here instead of walking it.
        nbytes = None if where.storage.parallel_reads else tree_bytes(where)
        try:
            removal.replace_file(
                where / names.SAVE_TIMES,
                savetimes.encode(savetimes.SaveTimes(blocked, total, nbytes)),
            )
        except OSError as e:
            _log.warning("could not record the save times of %s: %s", where, e)
