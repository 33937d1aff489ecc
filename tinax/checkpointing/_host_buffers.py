"""Host memory for the parts a load reads (``_fast_load``), bounded and reused.

On a CPU ``jax.device_put`` aliases host memory aligned to 64 bytes: the buffer a
part is read into becomes its array, with no copy. On an accelerator the part is
copied to its device and its buffer can be handed out again once that copy has
completed.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

# jax.device_put aliases host memory aligned so on a CPU (no copy).
ALIGN = 64


class HostBuffers:
    """Host memory for the parts being read.

    With ``reuse`` (an accelerator: parts are copied to their devices) every part is
    a slice of one arena of ``limit`` bytes, handed out first fit and taken back once
    the part's transfers have completed: the load touches at most ``limit`` bytes of
    new host memory, however large the checkpoint (new memory costs page faults,
    which on some virtual machines cost as much as reading the bytes). A part larger
    than the arena waits for it to be idle and gets memory of its own. Without
    ``reuse`` (a CPU: each buffer becomes its array) each part gets fresh memory, and
    parts being read hold at most ``limit`` bytes (or one part) at a time.
    """

    def __init__(self, limit: int, *, reuse: bool) -> None:
        self.limit = limit
        self.reuse = reuse
        self._busy = 0
        self._arena: np.ndarray | None = None
        # Free runs of the arena: (start, length), in order.
        self._free: list[tuple[int, int]] = [(0, limit)]
        self._cond = threading.Condition()

    def take(
        self, nbytes: int, *, own: bool = False, wait: bool = True
    ) -> tuple[np.ndarray, Any] | None:
        """A buffer of ``nbytes``, and what ``give`` takes back; waits while there is
        no room (``None`` instead, unless ``wait``). ``own``: memory of its own (it
        becomes a NumPy result)."""
        size = -(-max(nbytes, 1) // ALIGN) * ALIGN
        with self._cond:
            if not self.reuse or own or size > self.limit:
                while self._busy and self._busy + size > self.limit:
                    if not wait:
                        return None
                    self._cond.wait()
                self._busy += size
                return aligned(nbytes), (None, size)
            while (start := self._first_fit(size)) is None:
                if not self._busy:
                    # Slices kept back by a failed read: nothing will come back to fit.
                    self._busy += size
                    return aligned(nbytes), (None, size)
                if not wait:
                    return None
                self._cond.wait()
            if self._arena is None:
                # Pages are touched only as parts land in them: a small load touches
                # little, and a large one faults them in on all its threads at once.
                self._arena = aligned(self.limit)
            self._busy += size
            return self._arena[start : start + nbytes], (start, size)

    def _first_fit(self, size: int) -> int | None:
        for i, (start, length) in enumerate(self._free):
            if length >= size:
                if length == size:
                    del self._free[i]
                else:
                    self._free[i] = (start + size, length - size)
                return start
        return None

    def give(self, token: Any, *, keep: bool) -> None:
        """Ends the use of a buffer; ``keep``: its memory may be handed out again (not
        when it became a result, or transfers from it may not have ended)."""
        start, size = token
        with self._cond:
            self._busy -= size
            if start is not None and keep:
                self._free.append((start, size))
                self._free.sort()
                merged: list[tuple[int, int]] = []
                for run in self._free:
                    if merged and merged[-1][0] + merged[-1][1] == run[0]:
                        merged[-1] = (merged[-1][0], merged[-1][1] + run[1])
                    else:
                        merged.append(run)
                self._free = merged
            self._cond.notify_all()


def aligned(nbytes: int) -> np.ndarray:
    """Fresh host memory of ``nbytes``, starting at a multiple of ``ALIGN``."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + nbytes]
