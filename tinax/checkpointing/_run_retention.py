"""A run's directory: its complete checkpoints, its record, and what it keeps.

A run is a directory of checkpoints named ``step_<step>`` (``names.run_checkpoint_name``)
and one small JSON record beside them (``names.RUN_RECORD``): the run's policy, the
metric of every step saved, and why each checkpoint is kept. The record is a file,
so no listing takes it for a checkpoint, and it is replaced atomically. After each
commit the run keeps its ``keep`` newest checkpoints plus its ``keep_best`` best by
``best_by``, and the newest one whose metadata reads, and removes the others,
crash-safe (``_run_files``). With two tiers this is the durable tier.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tinax._format.integrity import preflight
from tinax._format.naming import names, words
from tinax._format.records import tiers
from tinax._format.records.runrecord import read_run_record
from tinax._format.storage import removal
from tinax._format.storage.location import Location
from tinax.checkpointing import _run_files
from tinax.checkpointing._local_tier import LocalTier

_log = logging.getLogger("tinax.checkpointing")


def _metric_label(best_by: str | Callable[[Any], Any] | None) -> str | None:
    if best_by is None:
        return None
    if isinstance(best_by, str):
        return best_by
    return getattr(best_by, "__name__", None) or type(best_by).__name__


def _metric_value(auxiliary: Mapping[Any, Any], best_by: str) -> Any:
    """The metric ``best_by`` names in the auxiliary state: a key, or a dotted path
    into nested mappings (``"eval.loss"``, as ``run_table`` names its column).

    Raises:
      ValueError: If there is no such key, naming the keys there are.
    """
    if best_by in auxiliary:
        return auxiliary[best_by]
    found: Any = auxiliary
    for part in best_by.split("."):
        if not isinstance(found, Mapping) or part not in found:
            raise ValueError(
                f"best_by={best_by!r} is not a key of the auxiliary state, nor a dotted "
                f"path into it (it has {sorted(map(str, auxiliary))})"
            )
        found = found[part]
    return found


class RunRecord:
    """The part of ``TrainingRun`` that keeps its directory: the complete checkpoints,
    the record, the metric of each save, and retention (see the module docstring).
    Process 0 alone writes the record and removes checkpoints."""

    _root: Location
    _local: LocalTier | None
    _parts: bool
    _save_every: int | None
    _keep: int | None
    _keep_best: int
    _best_by: str | Callable[[Any], Any] | None
    _best_mode: str
    _record: dict[str, Any]
    _durable_lock: threading.RLock
    _durable_steps: set[int]

    @property
    def directory(self) -> str:
        """The run's directory."""
        return str(self._root)

    def _complete(self) -> dict[int, Location]:
        """The committed checkpoints of ``directory`` by step."""
        return _run_files.complete_checkpoints(self._root)

    def _check_new_step(self, step: int) -> None:
        """Refuses a step the run has a checkpoint of, before anything is written, and
        says when a save goes back behind the run's newest checkpoint."""
        name = names.run_checkpoint_name(step)
        where = (self._root if self._local is None else self._local.root) / name
        # With two tiers, the durable tier as this run last listed it: no request to a
        # bucket on each save.
        if (
            (where / names.CHECKPOINT_METADATA).exists()
            or (where / names.COMMIT_SUCCESS).exists()
            or (self._local is not None and step in self._durable_steps)
        ):
            tier = "" if self._local is None else ", in either tier"
            raise FileExistsError(
                f"run {self.directory!r} has a checkpoint of step {step} already "
                f"({name}{tier}; saves never overwrite): resume with run.restore(...) and "
                "go on from the restored step + 1"
            )
        # The records' kept steps, as of the last retention: no listing on each save.
        kept = list(self._record["kept"])
        if self._local is not None:
            kept.extend(self._local.kept)
        newest = max((int(k) for k in kept if str(k).isdigit()), default=None)
        if newest is not None and step < newest:
            _log.warning(
                "saving step %d of run %r, whose newest checkpoint is step %d: did this job "
                "resume with run.restore(...) first?",
                step,
                self.directory,
                newest,
            )

    def _metric(self, auxiliary: Any) -> float | None:
        if self._best_by is None:
            return None
        if isinstance(self._best_by, str):
            if not isinstance(auxiliary, Mapping):
                raise TypeError(
                    f"best_by={self._best_by!r} needs a mapping as auxiliary state, "
                    f"got {type(auxiliary).__name__}"
                )
            value = _metric_value(auxiliary, self._best_by)
        else:
            value = self._best_by(auxiliary)
        shape = getattr(value, "shape", ())
        if isinstance(value, bool) or shape != ():
            raise TypeError(
                f"the metric {_metric_label(self._best_by)!r} must be a number or a 0-d "
                f"array, got {type(value).__name__}" + (f" of shape {shape}" if shape else "")
            )
        try:
            # Python and NumPy numbers, 0-d NumPy and JAX arrays (bfloat16 too).
            number = float(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"the metric {_metric_label(self._best_by)!r} must be a number, "
                f"got {type(value).__name__}"
            ) from None
        return number

    def _retain(self) -> None:
        """After a commit: keeps what the policy keeps, removes the rest, and records why."""
        with self._durable_lock:
            complete = self._complete()
            kept = self._kept(complete)
            for step in sorted(set(complete) - set(kept)):
                self._remove(complete[step])
            self._clean_up(newest=max(complete, default=None))
            for member in ("metrics", names.RUN_RECORD_HEALTH):
                self._record[member] = {
                    key: value
                    for key, value in self._record.get(member, {}).items()
                    if int(key) in kept
                }
            self._record["kept"] = {str(step): reasons for step, reasons in sorted(kept.items())}
            self._durable_steps = set(kept)
            self._write_record()

    def _kept(self, complete: dict[int, Location]) -> dict[int, list[str]]:
        """Why each checkpoint that stays is kept, by step."""
        steps = sorted(complete, reverse=True)
        if self._keep is None:
            return {step: [words.KEPT_ALL] for step in steps}
        kept: dict[int, list[str]] = {}
        for step in steps[: self._keep]:
            kept.setdefault(step, []).append(words.kept_newest(self._keep))
        if self._keep_best:
            label = _metric_label(self._best_by) or "metric"
            metrics = self._record["metrics"]
            scored = [
                (metrics[str(step)], step)
                for step in steps
                if isinstance(metrics.get(str(step)), int | float)
                and math.isfinite(metrics[str(step)])
            ]
            # Best first; among equals, the newer.
            sign = 1 if self._best_mode == "min" else -1
            scored.sort(key=lambda item: (sign * item[0], -item[1]))
            for _, step in scored[: self._keep_best]:
                kept.setdefault(step, []).append(words.kept_best(label, self._keep_best))
        for step in steps:
            try:
                preflight.check(complete[step])
            except (ValueError, OSError):
                continue
            if step not in kept:
                kept[step] = [words.KEPT_NEWEST_SOUND]
            break
        return kept

    def _remove(self, where: Location) -> None:
        _run_files.remove_checkpoint(where)

    def _clean_up(self, newest: int | None = None) -> None:
        """Finishes removals a killed run left, and removes interrupted saves older
        than the newest complete checkpoint."""
        if newest is None:
            newest = max(self._complete(), default=None)
        _run_files.clean_up(self._root, newest)

    def _policy(self) -> dict[str, Any]:
        policy: dict[str, Any] = {
            "save_every": self._save_every,
            "keep": self._keep,
            "keep_best": self._keep_best,
            "best_by": _metric_label(self._best_by),
            "best_mode": self._best_mode,
        }
        if self._local is not None:
            if not self._parts:
                # Where each process keeps a part, no one directory is the local tier
                # (a listing of the durable one must not take process 0's for it).
                policy[tiers.LOCAL] = self._local.root.path
                policy[tiers.LOCAL_HOST] = socket.gethostname()
            policy[tiers.LOCAL_EVERY] = self._local.every
            policy[tiers.LOCAL_KEEP] = self._local.keep
        return policy

    def _read_record(self) -> dict[str, Any]:
        found = read_run_record(self._root)
        metrics = {} if found is None else found.get("metrics", {})
        kept = {} if found is None else found.get("kept", {})
        healths = {} if found is None else found.get(names.RUN_RECORD_HEALTH, {})
        went_on = [] if found is None else found.get(names.RUN_RECORD_WENT_ON, [])
        record = {
            "format": names.RUN_RECORD_FORMAT,
            "policy": self._policy(),
            "metrics": dict(metrics) if isinstance(metrics, dict) else {},
            "kept": dict(kept) if isinstance(kept, dict) else {},
            names.RUN_RECORD_HEALTH: dict(healths) if isinstance(healths, dict) else {},
            names.RUN_RECORD_WENT_ON: list(went_on) if isinstance(went_on, list) else [],
        }
        if self._local is not None:
            record[tiers.TIER] = tiers.DURABLE_TIER
        return record

    def _write_record(self) -> None:
        self._record["policy"] = self._policy()
        self._record["updated_ns"] = time.time_ns()
        data = json.dumps(self._record, indent=1, sort_keys=True).encode("utf-8")
        removal.replace_file(self._root / names.RUN_RECORD, data)
