"""A two-tier run over several processes: which local tier the job has, and the
decisions its processes make together (the step to restore, the promotions to finish).

``TrainingRun(directory, local=LOCAL_DIR, ...)`` in a job of several processes finds,
as it opens, how the processes' local directories lie (``local_tier_kind``): each
process writes a small probe file into its own and, once all have, looks for the
others' there.

- Every process sees every probe: one directory that every process shares (one host,
  or a file system every host mounts). Each process writes its shards of each local
  checkpoint into it, and process 0 promotes the whole checkpoint.
- Each sees its own alone: a directory of each process's own (a host's local SSD or
  ``/dev/shm`` on a pod slice). Each process saves its part there
  (``_host_parts``), and a promotion gathers the parts of every process.
- Anything between (some processes share a directory, others do not) is refused.

Decisions of a job whose processes each keep a part are made once, on process 0, from
what every process reports, and every process takes the same
(``_processes.decide``): the checkpoints to try, in order, when the run resumes (a
local step only where every process holds its part of it, intact; else the durable
tier's), and the local steps whose promotion a killed job left unfinished (those every
process still holds).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Collection, Sequence
from typing import Any

from tinax._format.naming import names
from tinax._format.storage.location import Location
from tinax.checkpointing import _processes

# The kinds of local tier a run can have.
ONE_PROCESS = "one process"
SHARED = "shared"
PER_PROCESS = "per process"
# The two tiers, as candidates for a restore name them.
LOCAL = "local"
DURABLE = "durable"


def local_tier_kind(local: Location, *, timeout: float) -> str:
    """How the job's processes keep the local tier ``local`` (see the module
    docstring); every process calls it.

    Raises:
      ValueError: On every process alike, if some processes share a directory and
        others do not, naming them.
      ProcessTimeoutError: If a process did not arrive within ``timeout``.
    """
    count = _processes.process_count()
    if count == 1:
        return ONE_PROCESS
    token = _processes.decide(
        None,
        lambda reports: secrets.token_hex(8),
        what="the start of a two-tier run",
        timeout=timeout,
    )
    me = _processes.process_index()
    probe = local / f"{names.HOST_PROBE_PREFIX}{token}-{me}"
    probe.write_new(b"")
    try:
        _processes.agree(None, what="the probe of the local directories", timeout=timeout)
        found = sorted(
            int(name.rsplit("-", 1)[1])
            for name in local.entries()
            if name.startswith(f"{names.HOST_PROBE_PREFIX}{token}-")
        )
        seen = _processes.gather(found, what="the probe of the local directories", timeout=timeout)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(probe.path)
    everyone = list(range(count))
    if all(others == everyone for others in seen):
        return SHARED
    if all(others == [index] for index, others in enumerate(seen)):
        return PER_PROCESS
    groups = sorted({tuple(others) for others in seen if len(others) > 1})
    shared = "; ".join(f"processes {', '.join(map(str, group))} share one" for group in groups)
    raise ValueError(
        f"TrainingRun(local=...): the job's {count} processes must either all share one "
        f"local directory or each have one of its own, but {shared} and the others "
        "do not: give each process a directory of its own (on a pod slice, the same "
        "path on each host's own disk; several processes on one host: one subdirectory "
        "each, e.g. f'/mnt/ssd/run/{jax.process_index()}')"
    )


def restore_candidates(
    local_steps: Collection[int], durable_steps: Collection[int], *, timeout: float
) -> list[tuple[int, str]]:
    """The checkpoints a resume tries, in order, agreed by every process: each
    ``(step, tier)``, newest first, a step's local copy before its durable one. A
    local step is a candidate only where every process holds its part of it.

    Args:
      local_steps: The complete, sound local steps this process holds.
      durable_steps: The durable tier's complete steps (the same on every process;
        process 0's list is the one used).
      timeout: Seconds to wait for the other processes.
    """

    def choose(reports: list[Any]) -> list[tuple[int, str]]:
        common = set(reports[0]["local"]).intersection(*(r["local"] for r in reports[1:]))
        found = [(step, 0, LOCAL) for step in common]
        found += [(step, 1, DURABLE) for step in reports[0]["durable"]]
        found.sort(key=lambda item: (-item[0], item[1]))
        return [(step, tier) for step, _, tier in found]

    chosen = _processes.decide(
        {"local": sorted(local_steps), "durable": sorted(durable_steps)},
        choose,
        what="the choice of the step to restore",
        timeout=timeout,
    )
    return [(int(step), str(tier)) for step, tier in chosen]


def pending_everywhere(pending: Sequence[int], *, timeout: float) -> list[int]:
    """The local steps whose promotion every process can finish (each holds its part
    and found it waiting), agreed by every process.

    Args:
      pending: The steps this process would promote again.
      timeout: Seconds to wait for the other processes.
    """
    chosen = _processes.decide(
        sorted(pending),
        lambda reports: sorted(set(reports[0]).intersection(*reports[1:])),
        what="the choice of the promotions to finish",
        timeout=timeout,
    )
    return [int(step) for step in chosen]
