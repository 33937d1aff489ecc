"""NaN and Inf counted while a load reads, once per leaf: what tells a restore whether
the checkpoint it read can be gone on from.

The load engine (``_fast_load``) counts each part it read, once its checksums have
matched, on the thread that then hands its buffer back (not the thread that reads
the next part); a part it casts to the target's dtype is counted as stored, before
the cast (a float64 overflowing float16 is no Inf of the checkpoint's); what Orbax
loads instead is counted on the host where its values
are there already (NumPy arrays, arrays on CPU devices), and its checkpointable is
named as not counted otherwise (an accelerator's arrays are not copied back to count
them). The counting is ``tinax._format.nonfinite.count``, the one every view makes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import numpy as np

from tinax._format.arraydata import nonfinite
from tinax._format.integrity import health
from tinax._format.metadata import layout, logged
from tinax._format.naming import words
from tinax._format.naming.keys import format_key, key_parts
from tinax.checkpointing import _processes

_log = logging.getLogger("tinax.checkpointing")


class LoadCounts:
    """NaN and Inf of every float leaf a load read, by checkpointable and key.

    Thread-safe: the engine's threads add the parts of one leaf side by side.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leaves: dict[tuple[str, str], list[int]] = {}
        self._read: set[str] = set()
        # Checkpointables whose leaves read were counted, some leaves left out.
        self._partly: set[str] = set()
        self._uncounted: set[str] = set()

    def add(self, checkpointable: str, key: str, nan: int, inf: int) -> None:
        """Adds one part's counts to its leaf."""
        with self._lock:
            found = self._leaves.setdefault((checkpointable, key), [0, 0])
            found[0] += nan
            found[1] += inf

    def counted(self, checkpointable: str, *, whole: bool = True) -> None:
        """Notes a checkpointable whose every leaf read was counted; ``whole``: no leaf
        was left out of the load."""
        with self._lock:
            (self._read if whole else self._partly).add(checkpointable)

    def forget(self, checkpointable: str) -> None:
        """Drops what was counted of a checkpointable that is loaded again elsewhere."""
        with self._lock:
            self._leaves = {k: v for k, v in self._leaves.items() if k[0] != checkpointable}
            self._read.discard(checkpointable)
            self._partly.discard(checkpointable)

    def not_counted(self, checkpointable: str) -> None:
        """Notes a checkpointable whose values were not counted."""
        with self._lock:
            self._uncounted.add(checkpointable)
            self._read.discard(checkpointable)

    def count_values(self, checkpointable: str, restored: Any) -> None:
        """Counts what Orbax restored of ``checkpointable``, where its values are on the
        host (one the engine loaded is counted already); notes it not counted where
        they are not."""
        with self._lock:
            if checkpointable in self._read or checkpointable in self._partly:
                return
        leaves = jax.tree_util.tree_flatten_with_path(restored)[0]
        found: list[tuple[str, int, int]] = []
        whole = True
        for path, value in leaves:
            if value is Ellipsis:
                whole = False  # a leaf left out of the load (Orbax's placeholder)
                continue
            host = _on_host(value)
            if host is _NOT_HERE:
                self.not_counted(checkpointable)
                return
            if host is not None:
                nan, inf = nonfinite.count(host)
                found.append((format_key(key_parts(path)), nan, inf))
        for key, nan, inf in found:
            self.add(checkpointable, key, nan, inf)
        if whole:
            self.counted(checkpointable)

    def leaves(self) -> list[health.LeafCount]:
        """Every leaf counted."""
        with self._lock:
            return [health.LeafCount(c, k, n, i) for (c, k), (n, i) in self._leaves.items()]

    def health(
        self, metrics: Mapping[str, float] | None, names: Iterable[str] | None = None
    ) -> health.Health:
        """The health of the checkpoint as far as this load read it (``names``: the
        checkpointables it holds; a load of fewer is not complete)."""
        leaves = self.leaves()
        with self._lock:
            read = set(self._read)
            complete = not self._uncounted and (names is None or set(names) <= read)
        return health.judge(
            metrics=metrics,
            counts=health.counts_of(leaves, read),
            leaves=leaves,
            complete=complete,
        )


_NOT_HERE = object()


def _on_host(value: Any) -> Any:
    """``value``'s values as a NumPy array where they are on this host (a NumPy array,
    an array on CPU devices); ``None`` for a value that holds no floats; ``_NOT_HERE``
    for one whose values are elsewhere (an accelerator)."""
    if isinstance(value, np.ndarray | np.generic):
        return np.asarray(value) if nonfinite.is_floating(np.asarray(value).dtype) else None
    if isinstance(value, jax.Array):
        if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            return None
        if not nonfinite.is_floating(np.dtype(value.dtype)):
            return None
        if not value.is_fully_addressable or any(
            getattr(d, "platform", None) != "cpu" for d in value.sharding.device_set
        ):
            return _NOT_HERE
        return np.asarray(value)
    if isinstance(value, float):
        return np.asarray(value)
    return None


@_processes.register_error
class DivergedCheckpointError(ValueError):
    """A checkpoint refused because it diverged: its model or optimizer state holds NaN
    or Inf, or a metric its save logged is NaN or infinite.

    ``TrainingRun.restore(..., allow_diverged=True)``, ``derive_checkpoint(...,
    allow_diverged=True)`` and ``average_checkpoints(..., allow_diverged=True)`` take
    such a checkpoint all the same. A ``ValueError``: code written for a load's
    refusals catches it.
    """


def loaded_health(checkpoint: layout.Checkpoint, counts: LoadCounts) -> health.Health:
    """What a load found of the checkpoint's health: remembered for the tables, and a
    warning when it diverged (the caller asked for those values, and gets them)."""
    arrays_held = [c.name for c in checkpoint.checkpointables if c.layout == layout.PYTREE]
    found = counts.health(logged.logged(checkpoint.record), arrays_held)
    # A load of some checkpointables adds to what earlier loads of the others found.
    earlier = health.recalled(checkpoint.path, checkpoint.committed_nsecs)
    found = health.merged(earlier, found, arrays_held)
    if found.verdict != words.HEALTH_UNKNOWN or found.read:
        health.remember(checkpoint.path, checkpoint.committed_nsecs, found)
    if found.verdict == words.DIVERGED:
        _log.warning("loaded %s, which diverged: %s", checkpoint.path, found.reason)
    return found
