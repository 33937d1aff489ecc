"""A restore's plan as a table: what it will read and hold, per process and per device,
from metadata alone, before a byte of array data is read.

JAX and ``tinax.checkpointing`` are imported on first use: whoever passes restore
targets has them loaded already.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pandas as pd

from tinax import _paths
from tinax._format.metadata.layout import Checkpoint
from tinax.explore import _live, display

if TYPE_CHECKING:
    from tinax.checkpointing._plan_figures import RestorePlan
    from tinax.checkpointing._plan_places import Place

PLAN_COLUMNS = (
    "process",
    "device",
    "platform",
    "memory_bytes",
    "limit_bytes",
    "fits",
    "read_bytes",
    "files",
    "data_files",
    "chunks",
    "beyond_bytes",
    "largest",
)
# The leaves named as those that dominate a row.
_LARGEST = 3
# What the host row of each process is called in ``device``.
HOST = "host"


def _largest(plan: RestorePlan, places: list[Place]) -> str:
    found: dict[tuple[str, str], int] = {}
    for leaf in plan.leaves:
        held = leaf.held()
        n = sum(held.get(place, 0) for place in places)
        if n and leaf.reader != "not read":
            found[(leaf.checkpointable, leaf.key)] = n
    ranked = sorted(found.items(), key=lambda item: -item[1])[:_LARGEST]
    return ", ".join(
        f"{name} {display.readable_key(key) or '(whole)'} ({display.human_bytes(n)})"
        for (name, key), n in ranked
    )


def _rows(plan: RestorePlan) -> list[dict[str, Any]]:
    from tinax.checkpointing import _plan_words

    over = {place for place, _, _ in _plan_words.devices_over(plan)}
    places = plan.places()
    rows = []
    for process in sorted({p.process for p in places} | set(plan.hosts)):
        mine = [p for p in places if p.process == process]
        peak = plan.hosts[process]
        reads = plan.reads(process=process)
        files = plan.data_files(process=process)
        limit = None
        if process == plan.process:
            known = [n for n in (plan.budget, plan.host.available if plan.host else None) if n]
            limit = min(known) if known else None
        rows.append(
            {
                "process": process,
                "device": HOST,
                "platform": HOST,
                "memory_bytes": peak.peak,
                "limit_bytes": limit,
                "fits": None if limit is None else peak.peak <= limit,
                "read_bytes": reads.nbytes + plan.metadata_bytes,
                "files": len(files),
                "data_files": ", ".join(files),
                "chunks": reads.chunks,
                "beyond_bytes": reads.beyond,
                "largest": _largest(plan, [p for p in mine if p.in_host_memory]),
            }
        )
        for place in mine:
            if place.platform == HOST:
                continue  # NumPy leaves: the host row holds them
            reads = plan.reads(place)
            files = plan.data_files(place)
            free = plan.devices.get(place)
            rows.append(
                {
                    "process": process,
                    "device": place.name,
                    "platform": place.platform,
                    "memory_bytes": plan.held(place),
                    "limit_bytes": None if free is None else free.free,
                    "fits": None if free is None else place not in over,
                    "read_bytes": reads.nbytes,
                    "files": len(files),
                    "data_files": ", ".join(files),
                    "chunks": reads.chunks,
                    "beyond_bytes": reads.beyond,
                    "largest": _largest(plan, [place]),
                }
            )
    return rows


def plan_frame(plan: RestorePlan) -> pd.DataFrame:
    """The table of a plan (see ``restore_plan``)."""
    from tinax.checkpointing import _plan_words

    table = pd.DataFrame(_rows(plan), columns=list(PLAN_COLUMNS))
    for name in ("process", "memory_bytes", "limit_bytes", "read_bytes", "files", "chunks"):
        table[name] = table[name].astype("Int64")
    table["beyond_bytes"] = table["beyond_bytes"].astype("Int64")
    table["fits"] = table["fits"].astype("boolean")
    for name in ("device", "platform", "data_files", "largest"):
        table[name] = table[name].astype("string")
    peak = plan.hosts[plan.process]
    table.attrs.update(
        {
            "path": plan.path,
            "fits": plan.fits,
            "refusal": None if plan.fits else _plan_words.refusal(plan, refused=False),
            "problems": list(plan.problems),
            "warnings": list(plan.warnings),
            "readers": dict(plan.readers),
            "leaves": sum(1 for leaf in plan.leaves if leaf.reader != "not read"),
            "peak_host_bytes": peak.peak,
            "kept_host_bytes": peak.kept,
            "buffer_bytes": peak.in_flight + peak.scratch,
            "after_host_bytes": peak.after,
            "budget_bytes": plan.budget,
            "budget_given": plan.budget_given,
            "available_bytes": None if plan.host is None else plan.host.available,
            "available_from": None if plan.host is None else plan.host.source,
            "read_bytes": plan.reads(process=plan.process).nbytes + plan.metadata_bytes,
            "metadata_bytes": plan.metadata_bytes,
        }
    )
    return table


def restore_plan(
    path: str | os.PathLike[str] | Checkpoint,
    targets: Mapping[str, Any] | None = None,
    *,
    mesh: Mapping[str, int] | None = None,
    max_host_bytes: int | None = None,
    platform: str | None = None,
    device_memory: int | None = None,
) -> pd.DataFrame:
    """What restoring ``targets`` from a checkpoint will read and hold, per process and
    per device, from metadata alone: no array data is read.

    The plan is the one every load makes before it reads (and is refused by, with
    ``RestoreTooLargeError``, when it does not fit): who reads each checkpointable
    (tinax's engine, or Orbax's load and why), which chunks of which data files each
    device's part needs, the bytes read beyond the parts that need them (chunks a
    resharded target's parts cut), the host memory the load adds at its peak (the
    restored values that live in host memory, its read and decode buffers) and the
    memory each device holds after it.

    Args:
      path: A checkpoint directory, or the checkpoint as ``open_checkpoint`` opened
        it.
      targets: Checkpointable name → restore target, as a load takes it: live state,
        abstract targets (``abstract_restore_target``, ``nnx.eval_shape``'s, without
        a sharding: the saved one is used), Orbax's placeholder ``...`` for leaves
        left out. ``None``: every pytree checkpointable as it was saved.
      mesh: With ``targets=None``: axis name → size, the saved shardings' partitions
        laid on a mesh of these sizes (this process needs that many devices).
      max_host_bytes: The budget the peak is held to, as
        ``tinax.checkpointing.memory_budget`` sets it; ``None``: 90% of the host
        memory available now.
      platform: Plan as if the devices were of this platform (``tpu``, ``gpu``: an
        accelerator's host memory), for a plan made on another machine.
      device_memory: Compare each device with this many bytes, where JAX reports
        none.

    Returns:
      One row per process (``device`` is ``host``), followed by one per device of
      it: ``process``, ``device`` (``cpu:0``, ``tpu:3``), ``platform``,
      ``memory_bytes`` (for the host row the peak the load adds; for a device what
      it holds after the restore), ``limit_bytes`` (what that is compared with: the
      budget or the memory available, whichever is less; a device's free memory
      where JAX reports it; missing for other processes' hosts and for CPU devices,
      whose memory is the host's), ``fits``, ``read_bytes`` (from data files; the
      host row's total includes the metadata read), ``files`` and ``data_files``
      (how many data files it reads from, and which: their paths relative to the
      checkpoint, comma-separated), ``chunks``,
      ``beyond_bytes`` (of ``read_bytes``, those of values outside the parts that
      need them) and ``largest`` (the leaves that dominate the row's memory).
      ``attrs`` holds ``fits``, ``refusal`` (the paragraph a load would raise, or
      ``None``), ``warnings`` (what a person can act on: leaves landing replicated
      on every device, a peak above the limit, a restore that reads far more than
      it keeps, live state held beside the restore), ``readers``,
      ``peak_host_bytes``, ``kept_host_bytes``, ``buffer_bytes``,
      ``after_host_bytes`` (host memory the load keeps after it: an accelerator's
      read buffer, for the next load), ``budget_bytes``, ``available_bytes`` and
      ``available_from``, ``read_bytes`` and ``metadata_bytes``.

    Raises:
      TypeError: If ``targets`` is not a mapping with string keys, or a target is
        a flax NNX object rather than its state.
      TargetMismatchError: If a target does not fit the checkpoint (the verdict
        every load reaches first; ``compare_table`` shows it leaf by leaf).
      FileNotFoundError: If ``path`` does not exist.
      ValueError: If ``path`` is not a readable checkpoint, ``mesh`` names axes the
        saved shardings do not use or more devices than this process has, or
        ``max_host_bytes`` is not positive.
    """
    from tinax.checkpointing import _pipeline, _restore_plan, _saved_targets, _verdict

    budget = _restore_plan.check_budget(max_host_bytes)
    checkpoint = _paths.open_checkpoint(path)
    if targets is None:
        chosen = _saved_targets.saved_targets(checkpoint, mesh)
    else:
        if mesh is not None:
            raise ValueError("mesh is for a plan of the saved targets (targets=None)")
        chosen = dict(_live.check_mapping(targets))
        _verdict.check_targets(checkpoint, chosen)
        _pipeline.check_pipelines(checkpoint, chosen)
    planned = _restore_plan.plan_restore(
        checkpoint,
        chosen,
        max_host_bytes=budget if budget is not None else _restore_plan.budget_in_force(),
        platform=platform,
        device_memory=device_memory,
    )
    planned.close()
    return plan_frame(planned.plan)
