"""The leaves a diff calls ``same`` that hold NaN or Inf on both sides: the same bytes
saved twice, counted where the library has read one side's data (a data check, a scan,
a load, or the diff's own "count" button), never left grey as if all were well."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from tinax import explore
from tinax import vocabulary as words


@dataclasses.dataclass(frozen=True)
class BothSides:
    """What is known of the NaN and Inf of a diff's ``same`` leaves.

    Attributes:
      known: Whether one side's data was read whole (so every ``same`` leaf's counts
        are known), or the other side's were.
      nan, inf: Per row of the diff, the NaN and Inf of a ``same`` leaf (0 elsewhere).
      diverged: Whether either side diverged (the library's health).
      read_side: The path whose data told them, or ``""``.
    """

    known: bool
    nan: np.ndarray = dataclasses.field(repr=False)
    inf: np.ndarray = dataclasses.field(repr=False)
    diverged: bool = False
    read_side: str = ""

    @property
    def leaves(self) -> int:
        """``same`` leaves holding NaN or Inf on both sides."""
        return int(((self.nan + self.inf) > 0).sum())

    @property
    def unknown_same(self) -> bool:
        """Whether some ``same`` leaves may hold NaN on both sides, not known yet."""
        return self.diverged and not self.known


def _counted(health: Any) -> bool:
    return health is not None and health.read and health.complete


def both_sides(diff: pd.DataFrame, a: str, b: str, healths: tuple[Any, Any]) -> BothSides:
    """The NaN and Inf of ``diff``'s ``same`` leaves, from the health of ``a`` or ``b``
    (``checkpoint_health``: per leaf where its data was read whole)."""
    nan = np.zeros(len(diff), np.int64)
    inf = np.zeros(len(diff), np.int64)
    diverged = any(h is not None and h.verdict == words.DIVERGED for h in healths)
    side = next(((p, h) for p, h in zip((a, b), healths, strict=True) if _counted(h)), None)
    if side is None:
        return BothSides(False, nan, inf, diverged)
    path, health = side
    counts = {(leaf.checkpointable, leaf.key): (leaf.nan, leaf.inf) for leaf in health.leaves}
    same = (diff["status"] == words.SAME).to_numpy(bool)
    for i, (name, key) in enumerate(zip(diff["checkpointable"], diff["key"], strict=True)):
        if same[i]:
            nan[i], inf[i] = counts.get((str(name), str(key)), (0, 0))
    return BothSides(True, nan, inf, diverged, path)


def known_both_sides(diff: pd.DataFrame, a: str, b: str) -> BothSides:
    """``both_sides`` with what the library knows of each side now (metadata, and what
    this process read of their data)."""
    return both_sides(diff, a, b, (explore.checkpoint_health(a), explore.checkpoint_health(b)))


def both_sides_text(found: BothSides) -> str:
    """``586 of the same leaves hold NaN or Inf on both sides (32,102,400 NaN, 0 Inf
    each)``, or ``""``."""
    if not found.leaves:
        return ""
    count = found.leaves
    return (
        f"{count:,} of the same lea{'f' if count == 1 else 'ves'} hold NaN or Inf on both "
        f"sides ({int(found.nan.sum()):,} NaN, {int(found.inf.sum()):,} Inf in each)"
    )
