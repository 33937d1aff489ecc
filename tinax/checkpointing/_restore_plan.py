"""The restore plan: what a load will read and hold, per process and per device, worked
out from metadata alone before a byte of array data is read; and the refusal of a load
that does not fit.

For every leaf of the targets the plan finds who reads it (tinax's load engine or
Orbax's load, as the load itself decides: ``_load_plan``), where its parts land
(``_plan_places``), which chunks of which data files each part reads and how many of
those bytes lie outside it (``tinax._format.readplan``), and from that the host
memory each process adds at its peak (``_plan_memory``) and the memory each device
holds once it is restored. These are compared with what the host has available
(``tinax._format.hostmem``: cgroup-aware) and what each device reports free, and with
the load's budget: ``max_host_bytes``, or by default ``DEFAULT_BUDGET_SHARE`` of the
host memory available when the load starts.

Every load computes it first (``restore_checkpointables``) and raises
``RestoreTooLargeError`` before it opens a data file when it does not fit; within
its budget the load is given limits (``_plan_memory.limits_within``) that keep its
peak under the plan's figure. ``tinax.explore.restore_plan`` shows it as a table.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np

from tinax._format import hostmem
from tinax._format.arraydata import readplan
from tinax._format.metadata import layout
from tinax._targets import abstract_restore_target
from tinax.checkpointing import (
    _host_buffers,
    _load_plan,
    _orbax,
    _plan_memory,
    _plan_words,
    _processes,
)
from tinax.checkpointing._plan_figures import (
    DEFAULT_BUDGET_SHARE,
    DeviceFree,
    RestorePlan,
    RestoreTooLargeError,
)
from tinax.checkpointing._plan_leaves import leaf_plans, stored
from tinax.checkpointing._plan_memory import EngineLimits
from tinax.checkpointing._plan_places import (
    ORBAX,
    TINAX,
    LeafPlan,
    Place,
    relabelled,
    with_recorded_shardings,
)
from tinax.checkpointing._storable import is_stateful
from tinax.checkpointing._switches import switched

_log = logging.getLogger("tinax.checkpointing._fast_load")


def _reader(item: layout.StoredCheckpointable, name: str, abstract: Any) -> tuple[str, Any]:
    """Who loads a checkpointable, as ``_fast_load.load`` decides: ``tinax`` with the
    engine's plan, or ``Orbax (why)``."""
    try:
        found = _load_plan.plan(item, abstract)
    except (ValueError, OSError, TypeError, KeyError) as e:
        found = f"{type(e).__name__}: {e}"
    if isinstance(found, str):
        _log.debug("checkpointable %r left to Orbax: %s", name, found)
        return f"{ORBAX} ({found})", None
    return TINAX, found


# -- the plan --------------------------------------------------------------------------------


def _device_memory() -> dict[Place, DeviceFree]:
    from tinax.checkpointing._plan_places import device_place

    found = {}
    for device in jax.local_devices():
        try:
            stats = device.memory_stats()
        except Exception:  # not every backend reports, and some raise
            stats = None
        if stats and "bytes_limit" in stats:
            found[device_place(device)] = DeviceFree(
                int(stats["bytes_limit"]), int(stats.get("bytes_in_use", 0))
            )
    return found


@dataclasses.dataclass
class Planned:
    """A plan, with what the load it was made for reads by: the abstract targets (a
    leaf without a sharding given the recorded one) and the engine's own plans."""

    plan: RestorePlan
    abstract: dict[str, Any]
    engine: dict[str, Any]

    def close(self) -> None:
        """Closes the engine's plans (a plan made only to be shown)."""
        for found in self.engine.values():
            found.files.close()


def plan_restore(
    checkpoint: layout.Checkpoint,
    targets: Mapping[str, Any],
    *,
    max_host_bytes: int | None = None,
    orbax_in_flight: int | None = None,
    platform: str | None = None,
    device_memory: int | None = None,
) -> Planned:
    """The plan of restoring ``targets`` from ``checkpoint`` in this job.

    The targets are taken as the load takes them: live arrays as their shape, dtype
    and sharding, a leaf without a sharding with the one the checkpoint records.
    Nothing but metadata is read.

    Args:
      checkpoint: The opened checkpoint.
      targets: Checkpointable name → restore target, already judged against the
        checkpoint (``check_targets``).
      max_host_bytes: The most host memory the load may add; ``None`` for the
        default (``DEFAULT_BUDGET_SHARE`` of what is available).
      orbax_in_flight: The ``read_concurrent_bytes`` of the caller's Orbax context.
      platform: Plan as if the devices were of this platform (``tpu``, ``gpu``: an
        accelerator's host memory model), for a plan made without them.
      device_memory: Take each device to have this many bytes free (where JAX
        reports none, or for another machine).

    Raises:
      ValueError: If the checkpoint's metadata cannot be read.
    """
    src = checkpoint.path
    processes = jax.process_count()
    leaves: list[LeafPlan] = []
    readers: dict[str, str] = {}
    engine: dict[str, Any] = {}
    made: dict[str, Any] = {}
    metadata = 0
    for name, target in targets.items():
        if is_stateful(target):
            readers[name] = "iterator"
            continue
        # Live arrays are taken as their shape, dtype and sharding; a NumPy scalar as
        # a 0-d array (how it was saved).
        item = checkpoint.get(name)
        abstract = made[name] = with_recorded_shardings(item, abstract_restore_target(target))
        reader, found = _reader(item, name, abstract)
        readers[name] = reader
        if found is not None:
            engine[name] = found
        found_stored = stored(item)
        metadata += found_stored.metadata_bytes
        leaves += leaf_plans(name, target, abstract, found, found_stored, processes)
    if platform is not None:
        leaves = relabelled(leaves, platform)
    devices = _device_memory() if platform is None else {}
    if device_memory is not None:
        devices = {
            place: DeviceFree(device_memory, 0)
            for leaf in leaves
            for part in leaf.parts
            for place in part.part.places
            if place.process == jax.process_index() and not place.in_host_memory
        }
    plan = _finish(
        str(src),
        leaves,
        readers,
        processes=processes,
        local=readplan.read_in_place(src),
        max_host_bytes=max_host_bytes,
        orbax_in_flight=orbax_in_flight,
        metadata=metadata,
        devices=devices,
        host=hostmem.host_memory(),
    )
    return Planned(plan, made, engine)


def refuse_unless_fits(plan: RestorePlan) -> None:
    """Raises ``RestoreTooLargeError`` with the plan's paragraph unless it fits; with
    several processes, on every process if any one's does not fit (each judges its
    own host and devices).

    Raises:
      RestoreTooLargeError: If the plan does not fit here or on another process.
    """
    error = None if plan.fits else RestoreTooLargeError(_plan_words.refusal(plan))
    options = _orbax.active_context().multiprocessing_options
    _processes.agree(
        error,
        what=f"the restore plan of {plan.path!r}",
        timeout=_processes.timeout_of(_orbax.coordination_timeout()),
        active_processes=sorted(options.active_processes or ()) or None,
    )


def _finish(
    path: str,
    leaves: list[LeafPlan],
    readers: dict[str, str],
    *,
    processes: int,
    local: bool,
    max_host_bytes: int | None,
    orbax_in_flight: int | None,
    metadata: int,
    devices: dict[Place, DeviceFree],
    host: hostmem.HostMemory | None,
) -> RestorePlan:
    """The plan's figures, limits, warnings and problems, from its leaves."""
    process = jax.process_index()
    kept_arena = _host_buffers.kept_bytes()
    if max_host_bytes is not None:
        budget: int | None = max_host_bytes
    elif host is not None:
        budget = int(host.available * DEFAULT_BUDGET_SHARE)
    else:
        budget = None
    limits = (
        _plan_memory.limits_within(
            budget,
            leaves,
            process,
            kept_arena=kept_arena,
            local=local,
            orbax_in_flight=orbax_in_flight,
        )
        if budget is not None
        else EngineLimits(orbax_in_flight=orbax_in_flight or _plan_memory.ORBAX_IN_FLIGHT_BYTES)
    )
    hosts = {
        p: _plan_memory.host_peak(
            leaves, p, limits, kept_arena=kept_arena if p == process else 0, local=local
        )
        for p in range(processes)
    }
    plan = RestorePlan(
        path=path,
        process=process,
        processes=processes,
        leaves=leaves,
        readers=readers,
        hosts=hosts,
        limits=limits,
        host=host,
        budget=budget,
        budget_given=max_host_bytes is not None,
        devices=devices,
        kept_arena=kept_arena,
        metadata_bytes=metadata,
    )
    plan.problems = _plan_words.problems(plan)
    plan.warnings = _plan_words.warnings(plan)
    return plan


_BUDGET: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "tinax_max_host_bytes", default=None
)


@contextlib.contextmanager
def memory_budget(max_host_bytes: int | None) -> Iterator[None]:
    """Holds loads in this block to ``max_host_bytes`` of host memory at their peak.

    Every load works out its restore plan before it reads anything
    (``tinax.explore.restore_plan`` shows it); the plan's peak is what the load adds
    to the host: the restored values that live in host memory (NumPy leaves, and on
    a CPU the arrays themselves), its read buffers, its decode buffers::

        with tinax.checkpointing.memory_budget(8 << 30):
            restored = load_checkpointables(path, targets)

    A load whose peak would exceed the budget raises ``RestoreTooLargeError``
    before it opens a data file; within it, its read buffers (the reused host buffer
    on an accelerator, Orbax's reads in flight) are sized so that it stays under
    the plan's figure. Outside such a block the budget is 90% of the host memory
    available when the load starts (cgroup-aware: a container's limit counts). A
    budget above what is available does not lift that limit. The budget belongs to
    the calling thread (and its ``asyncio`` tasks), like ``with ocp.Context(...)``.

    Args:
      max_host_bytes: Bytes; ``None`` for the default inside an outer budget.

    Raises:
      TypeError: If ``max_host_bytes`` is not an ``int`` or ``None`` (booleans are
        not integers).
      ValueError: If it is not positive.
    """
    with switched(_BUDGET, check_budget(max_host_bytes)):
        yield


def budget_in_force() -> int | None:
    """The ``max_host_bytes`` of the enclosing ``memory_budget``, or ``None``."""
    return _BUDGET.get()


def check_budget(max_host_bytes: object) -> int | None:
    """``max_host_bytes`` checked: ``None`` or a positive ``int``.

    Raises:
      TypeError: If it is not an integer (booleans are not).
      ValueError: If it is not positive.
    """
    if max_host_bytes is None:
        return None
    if isinstance(max_host_bytes, bool) or not isinstance(max_host_bytes, int | np.integer):
        raise TypeError(
            f"max_host_bytes must be an int (bytes) or None, got {type(max_host_bytes).__name__}"
        )
    if max_host_bytes <= 0:
        raise ValueError(f"max_host_bytes must be positive, got {max_host_bytes}")
    return int(max_host_bytes)
