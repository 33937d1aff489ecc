"""Host memory for the parts a load reads (``_fast_load``), bounded and reused.

On a CPU ``jax.device_put`` aliases host memory aligned to 64 bytes: the buffer a
part is read into becomes its array, with no copy. On an accelerator the part is
copied to its device and its buffer can be handed out again once that copy has
completed; the arena those buffers are cut from is kept for ``KEEP_SECONDS`` after a
load, for the next load to reuse.
"""

from __future__ import annotations

import mmap
import threading
from typing import Any

import numpy as np

# jax.device_put aliases host memory aligned so on a CPU (no copy).
ALIGN = 64
# How long an accelerator load's arena outlives the load, for the next one to reuse
# its pages: new pages cost page faults, which on a TPU host's sandbox took 0.1 s for
# 256 MiB on 13 threads, with or without huge pages asked for (``bench/load_stages.py``):
# a 2.8 GB load took 0.62 s with a new arena and 0.50 s with the one kept.
KEEP_SECONDS = 60.0

_kept_lock = threading.Lock()
# The arena kept from the last load, and the timer that drops it.
_kept: np.ndarray | None = None
_kept_timer: threading.Timer | None = None


def _take_kept() -> np.ndarray | None:
    """The arena kept from the last load, no longer kept (its timer stopped)."""
    global _kept, _kept_timer
    with _kept_lock:
        found, _kept = _kept, None
        if _kept_timer is not None:
            _kept_timer.cancel()
            _kept_timer = None
    return found


def _arena(size: int) -> np.ndarray:
    """An arena of ``size`` bytes: the one kept from an earlier load if it is large
    enough (and no other load uses it), else fresh memory."""
    found = _take_kept()
    if found is not None and found.nbytes >= size:
        return found[:size]
    return aligned(size)


def _keep(arena: np.ndarray) -> None:
    """Keeps ``arena`` for the next load, for ``KEEP_SECONDS``."""
    global _kept, _kept_timer
    with _kept_lock:
        if _kept_timer is not None:
            _kept_timer.cancel()
        _kept = arena
        _kept_timer = threading.Timer(KEEP_SECONDS, _drop, args=(arena,))
        _kept_timer.daemon = True
        _kept_timer.start()


def _drop(arena: np.ndarray) -> None:
    global _kept, _kept_timer
    with _kept_lock:
        if _kept is arena:
            _kept, _kept_timer = None, None


def kept_bytes() -> int:
    """The bytes of the arena kept from the last load (resident, and reused by the next
    load that fits in it), 0 if none."""
    with _kept_lock:
        return 0 if _kept is None else int(_kept.nbytes)


def drop_kept() -> None:
    """Frees the arena kept from the last load now."""
    _take_kept()


class HostBuffers:
    """Host memory for the parts being read.

    With ``reuse`` (an accelerator: parts are copied to their devices) every part is
    a slice of one arena of ``limit`` bytes, handed out first fit and taken back once
    the part's transfers have completed: the load touches at most ``limit`` bytes of
    new host memory, however large the checkpoint (new memory costs page faults,
    which on some virtual machines cost as much as reading the bytes), and ``close``
    keeps the arena for the next load. A part larger than the arena waits for it to be
    idle and gets memory of its own. Without
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
        self, nbytes: int, *, own: bool = False, wait: bool = True, apart: bool = False
    ) -> tuple[np.ndarray, Any] | None:
        """A buffer of ``nbytes``, and what ``give`` takes back; waits while there is
        no room (``None`` instead, unless ``wait``). ``own``: memory of its own (it
        becomes a NumPy result). ``apart``: memory of its own that becomes no array
        (``mapped``); so is a part larger than the arena."""
        size = -(-max(nbytes, 1) // ALIGN) * ALIGN
        with self._cond:
            if not self.reuse or own or size > self.limit:
                while self._busy and self._busy + size > self.limit:
                    if not wait:
                        return None
                    self._cond.wait()
                self._busy += size
                gone = apart or (self.reuse and not own)
                return (mapped(nbytes) if gone else aligned(nbytes)), (None, size)
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
                self._arena = _arena(self.limit)
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

    def close(self) -> None:
        """Ends the load: its arena is kept for the next one, unless a slice of it was
        not given back whole (its transfers may go on)."""
        with self._cond:
            arena, self._arena = self._arena, None
            whole = self._free == [(0, self.limit)]
        if arena is not None and whole:
            _keep(arena)


def mapped(nbytes: int) -> np.ndarray:
    """Fresh memory of ``nbytes`` mapped apart from the allocator's heap (page aligned):
    given back to the system the moment it is dropped. A read buffer that becomes no
    array would otherwise stay resident on the allocator's free lists once freed (a
    freed block smaller than its adaptive mapping threshold is kept), as much as the
    load ever held at once."""
    return np.frombuffer(mmap.mmap(-1, max(nbytes, 1)), np.uint8, count=nbytes)


def aligned(nbytes: int) -> np.ndarray:
    """Fresh host memory of ``nbytes``, starting at a multiple of ``ALIGN``."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + nbytes]
