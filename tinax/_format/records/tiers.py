"""A two-tier training run: which directory is its local tier and which its durable one.

``TrainingRun(directory, local=LOCAL_DIR, ...)`` saves to fast local storage and
promotes some checkpoints to ``directory``, the durable tier. Each of the two
directories holds a run record (``names.RUN_RECORD``):

- the durable directory's is the run's record as for any run; its policy names the
  local tier (``LOCAL``: the local directory's absolute path, ``LOCAL_HOST``: the
  host it is on, with ``LOCAL_EVERY`` and ``LOCAL_KEEP``);
- the local directory's says that it is a local tier (``TIER`` is ``LOCAL_TIER``), of
  which durable directory (``DURABLE``, its URL), and which of its checkpoints wait
  for their promotion (``PROMOTE``) or are being copied now (``PROMOTING``).

A reader of either directory finds the other through these records. A local tier is
taken only where it exists on this machine and its record names the same durable
directory back: a path that means something else on another host is never mixed in.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from tinax._format.records.runrecord import read_run_record
from tinax._format.storage import locate
from tinax._format.storage.location import Location, local

# -- keys of the run records -----------------------------------------------------------

# Which tier a record belongs to (``LOCAL_TIER`` or ``DURABLE_TIER``); a record without
# it is a run of one tier.
TIER = "tier"
LOCAL_TIER = "local"
DURABLE_TIER = "durable"
# In the local tier's record: the durable directory's URL.
DURABLE = "durable"
# In the local tier's record: the steps whose local checkpoints wait for their
# promotion, and the one being copied now (or null).
PROMOTE = "promote"
PROMOTING = "promoting"
# In the policy of both records: the local tier, as ``TrainingRun`` was given it.
LOCAL = "local"
LOCAL_HOST = "local_host"
LOCAL_EVERY = "local_every"
LOCAL_KEEP = "local_keep"


@dataclasses.dataclass(frozen=True)
class TwoTierRun:
    """The two directories of a two-tier run, as their records say.

    Attributes:
      durable: The durable directory.
      local: The local directory; ``None`` where it is not on this machine (or no
        longer the local tier of ``durable``).
      promote: Local steps recorded as waiting for their promotion.
      promoting: The local step recorded as being copied now, if any.
      durable_record: The durable directory's run record, if it has one yet.
      local_record: The local directory's run record, if ``local`` is known.
    """

    durable: Location
    local: Location | None
    promote: frozenset[int]
    promoting: int | None
    durable_record: dict[str, Any] | None
    local_record: dict[str, Any] | None

    def other(self, root: Location) -> Location | None:
        """The tier ``root`` is not (``None`` where that tier is not on this machine)."""
        if self.local is not None and same_directory(root, self.local):
            return self.durable
        return self.local


def same_directory(a: Location, b: Location) -> bool:
    """Whether two locations name one directory (local paths compared resolved)."""
    if a.is_local and b.is_local:
        return os.path.realpath(a.path) == os.path.realpath(b.path)
    return str(a) == str(b)


def overlapping(a: Location, b: Location) -> bool:
    """Whether two directories are one, or one holds the other (local paths resolved;
    directories on different storages never overlap)."""
    if a.is_local != b.is_local:
        return False
    if a.is_local:
        first, second = os.path.realpath(a.path), os.path.realpath(b.path)
        sep = os.sep
    else:
        first, second = str(a).rstrip("/"), str(b).rstrip("/")
        sep = "/"
    return first == second or first.startswith(second + sep) or second.startswith(first + sep)


def check_local_tier(local: Location, durable: Location) -> None:
    """Refuses a local tier that is not on this machine's own storage, or not apart
    from the durable tier.

    Raises:
      ValueError: Naming both directories and what is wrong.
    """
    if not local.is_local:
        raise ValueError(
            f"local {str(local)!r} must be a directory on this machine's own storage (a "
            "local SSD, /dev/shm), not a bucket: the durable tier is the run's directory"
        )
    if overlapping(local, durable):
        raise ValueError(
            f"local {os.path.realpath(local.path)!r} and the run's directory {str(durable)!r} "
            "must be apart: the local tier is neither the durable one nor inside it (nor "
            "around it)"
        )


def _steps(value: object) -> frozenset[int]:
    if not isinstance(value, list):
        return frozenset()
    return frozenset(s for s in value if isinstance(s, int) and not isinstance(s, bool) and s >= 0)


def _step(value: object) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok else None  # type: ignore[return-value]


def _read(root: Location) -> dict[str, Any] | None:
    try:
        return read_run_record(root)
    except OSError:
        return None  # an unreachable tier is shown as absent, never as an error


def _local_of(durable: Location, local_record: dict[str, Any]) -> bool:
    """Whether a local tier's record names ``durable`` as its durable directory."""
    named = local_record.get(DURABLE)
    if local_record.get(TIER) != LOCAL_TIER or not isinstance(named, str):
        return False
    try:
        return same_directory(locate.location(named), durable)
    except ValueError:
        return False


def two_tier_run(root: Location, record: dict[str, Any] | None = None) -> TwoTierRun | None:
    """The two-tier run ``root`` is a tier of; ``None`` for any other directory.

    Args:
      root: A run directory: the durable or the local tier of a two-tier run (or
        anything else).
      record: ``root``'s run record, if the caller has read it already.
    """
    if record is None:
        record = _read(root)
    if record is None:
        return None
    if record.get(TIER) == LOCAL_TIER:
        named = record.get(DURABLE)
        if not isinstance(named, str):
            return None
        try:
            durable = locate.location(named)
        except ValueError:
            return None
        return TwoTierRun(
            durable=durable,
            local=root,
            promote=_steps(record.get(PROMOTE)),
            promoting=_step(record.get(PROMOTING)),
            durable_record=_read(durable),
            local_record=record,
        )
    policy = record.get("policy")
    path = policy.get(LOCAL) if isinstance(policy, dict) else None
    if not isinstance(path, str) or not os.path.isabs(path):
        return None
    tier: Location | None = local(path)
    local_record = _read(tier) if tier is not None and tier.is_dir() else None
    if local_record is None or not _local_of(root, local_record):
        tier, local_record = None, None
    return TwoTierRun(
        durable=root,
        local=tier,
        promote=_steps(None if local_record is None else local_record.get(PROMOTE)),
        promoting=_step(None if local_record is None else local_record.get(PROMOTING)),
        durable_record=record,
        local_record=local_record,
    )
