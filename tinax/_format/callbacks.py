"""The callbacks a long read or write takes: how far it has come, and whether to stop.

Diffs, drift and scans of a run, verification of data, exports and derived
checkpoints all report progress and (some) stop on request in the same way; the
types live here, below every layer that uses them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

# Called as ``progress(done, total)``: units done so far out of ``total`` (leaves,
# bytes or checkpoints, as the operation says).
Progress = Callable[[int, int], None]
# A request to stop: a function asked between units of work, or an event set.
Cancel = Callable[[], bool] | threading.Event


def cancelled(cancel: Cancel | None) -> bool:
    """Whether ``cancel`` (None: never) asks to stop now."""
    if cancel is None:
        return False
    return cancel.is_set() if isinstance(cancel, threading.Event) else bool(cancel())
