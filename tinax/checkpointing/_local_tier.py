"""The local tier of a two-tier training run: its directory, its record, what it keeps.

``TrainingRun(directory, local=LOCAL_DIR, local_every=L, local_keep=J)`` saves a
checkpoint to ``LOCAL_DIR`` every ``L`` steps (fast local storage: a local SSD, a RAM
disk) and promotes some of them to ``directory``. The local directory keeps its own
run record (``names.RUN_RECORD``, see ``tinax._format.records.tiers``): the metric of each
local step, why each local checkpoint is kept, and which ones wait for their
promotion, so that a run resumed after a kill finishes them.

After each local commit the tier keeps its ``J`` newest complete checkpoints, every
one waiting for its promotion, and the newest one whose metadata reads; it removes
the others, crash-safe (``_run_files``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Collection
from typing import Any

from tinax._format.integrity import preflight
from tinax._format.naming import names, words
from tinax._format.records import tiers
from tinax._format.records.runrecord import read_run_record
from tinax._format.storage import locate, removal
from tinax._format.storage.location import Location
from tinax.checkpointing import _run_files


@dataclasses.dataclass(eq=False)
class LocalTier:
    """The local directory of a two-tier run.

    Attributes:
      root: The local directory.
      durable: The run's durable directory.
      every: Save here every this many steps.
      keep: How many of the newest local checkpoints to keep.
      made: Whether this run made the directory (a fresh machine).

    Raises:
      ValueError: If the directory holds the record of another run (of its own, or
        the local tier of another durable directory).
    """

    root: Location
    durable: Location
    every: int
    keep: int
    made: bool
    # What the tier's record says (empty for a new tier).
    metrics: dict[str, Any] = dataclasses.field(init=False)
    kept: dict[str, Any] = dataclasses.field(init=False)
    promote: set[int] = dataclasses.field(init=False)
    # What loads found of each local step's health (``health.record_entry``).
    health: dict[str, Any] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        root, durable = self.root, self.durable
        found = read_run_record(root) or {}
        named = found.get(tiers.DURABLE)
        if found and not (
            found.get(tiers.TIER) == tiers.LOCAL_TIER
            and isinstance(named, str)
            and tiers.same_directory(locate.location(named), durable)
        ):
            theirs = f"of the run in {named!r}" if isinstance(named, str) else "of a run of its own"
            raise ValueError(
                f"local directory {str(root)!r} holds the checkpoints {theirs}, not of "
                f"{str(durable)!r}: give each run a local directory of its own"
            )
        self.metrics = dict(found.get("metrics") or {})
        self.kept = dict(found.get("kept") or {})
        healths = found.get(names.RUN_RECORD_HEALTH)
        self.health = dict(healths) if isinstance(healths, dict) else {}
        promote = found.get(tiers.PROMOTE)
        self.promote = {
            s for s in (promote if isinstance(promote, list) else []) if type(s) is int and s >= 0
        }

    def path(self, step: int) -> Location:
        """Where the local checkpoint of ``step`` is (or would be)."""
        return self.root / names.run_checkpoint_name(step)

    def complete(self) -> dict[int, Location]:
        """The tier's committed checkpoints by step."""
        return _run_files.complete_checkpoints(self.root)

    def write_record(self, policy: dict[str, Any]) -> None:
        """Replaces the tier's record with what this run knows now."""
        record = {
            "format": names.RUN_RECORD_FORMAT,
            tiers.TIER: tiers.LOCAL_TIER,
            tiers.DURABLE: str(self.durable),
            "policy": policy,
            "metrics": self.metrics,
            "kept": self.kept,
            names.RUN_RECORD_HEALTH: self.health,
            tiers.PROMOTE: sorted(self.promote),
            "updated_ns": time.time_ns(),
        }
        data = json.dumps(record, indent=1, sort_keys=True).encode("utf-8")
        removal.replace_file(self.root / names.RUN_RECORD, data)

    def retain(self, waiting: Collection[int], policy: dict[str, Any]) -> None:
        """Keeps what the tier keeps (see the module docstring), removes the rest, and
        records why; ``waiting`` are the steps waiting for (or in) their promotion."""
        complete = self.complete()
        steps = sorted(complete, reverse=True)
        kept: dict[int, list[str]] = {}
        for step in steps[: self.keep]:
            kept.setdefault(step, []).append(words.kept_local_newest(self.keep))
        for step in steps:
            if step in waiting:
                kept.setdefault(step, []).append(words.KEPT_FOR_PROMOTION)
        for step in steps:
            try:
                preflight.check(complete[step])
            except (ValueError, OSError):
                continue
            kept.setdefault(step, [words.KEPT_NEWEST_SOUND])
            break
        for step in sorted(set(complete) - set(kept)):
            _run_files.remove_checkpoint(complete[step])
        _run_files.clean_up(self.root, max(complete, default=None))
        self.metrics = {key: value for key, value in self.metrics.items() if int(key) in kept}
        self.health = {key: value for key, value in self.health.items() if int(key) in kept}
        self.kept = {str(step): reasons for step, reasons in sorted(kept.items())}
        self.promote &= set(complete)
        self.write_record(policy)

    def pending(self, durable_steps: Collection[int], save_every: int | None) -> list[int]:
        """The local steps a resumed run promotes: those recorded as waiting, or on the
        promotion interval, newer than the durable tier's newest."""
        newest = max(durable_steps, default=-1)
        return sorted(
            step
            for step in self.complete()
            if step > newest
            and (step in self.promote or (save_every is not None and step % save_every == 0))
        )
