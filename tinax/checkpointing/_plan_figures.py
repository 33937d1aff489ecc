"""A restore plan as a value: what a restore will read and hold, per process and per
device, the limits it was compared with, and why it does not fit (``_restore_plan``
makes it, ``_plan_words`` says it in words)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from tinax._format import hostmem
from tinax._format.arraydata.readplan import Reads
from tinax.checkpointing import _processes
from tinax.checkpointing._plan_memory import EngineLimits, HostPeak
from tinax.checkpointing._plan_places import NOT_READ, LeafPlan, Place

# The default budget: this share of the host memory available when the load starts
# (the rest is left to everything else the process and the machine do meanwhile).
DEFAULT_BUDGET_SHARE = 0.9
# Warnings about memory name what matters: a replicated leaf or a live target's
# arrays below this many bytes in all are not worth a word.
NOTABLE_BYTES = 1 << 20
# Copies of replicated leaves are called out from this many bytes (and a tenth of what
# the restore holds): a model's biases and norms held whole everywhere are normal.
REPLICAS_NOTABLE_BYTES = 16 << 20
# A restore reading this many times what it keeps is called out.
READS_TOO_MUCH = 1.5
# The leaves named as the largest, in a refusal and per place.
LARGEST = 3


@_processes.register_error
class RestoreTooLargeError(MemoryError):
    """A load refused before it read anything: its restore plan does not fit the host
    memory (or its budget, ``max_host_bytes``) or a device's memory.

    The message is one paragraph: what the load needs and what is available, the
    largest leaves, and what to change (``tinax.explore.restore_plan`` shows the whole
    plan).
    """


RestoreTooLargeError.__module__ = "tinax.checkpointing"


@dataclasses.dataclass(frozen=True)
class DeviceFree:
    """A device's memory as JAX reports it (``Device.memory_stats``)."""

    limit: int
    in_use: int

    @property
    def free(self) -> int:
        return max(0, self.limit - self.in_use)


@dataclasses.dataclass
class RestorePlan:
    """What a restore will read and hold (see the module's docstring).

    Attributes:
      path: The checkpoint.
      process: The process that made the plan (whose limits were read).
      processes: Every process of the job.
      leaves: Every leaf of the targets.
      readers: Who reads each checkpointable: ``tinax``, ``Orbax (why)``, or
        ``iterator`` (a Grain iterator's state).
      hosts: Each process's host memory at the load's peak, under ``limits``.
      limits: What the load is given to stay within ``budget``.
      host: The host memory available to this process, ``None`` if unknown.
      budget: The most host memory the load may add (``max_host_bytes``, or the
        default), ``None`` where neither is known.
      budget_given: Whether ``budget`` is the caller's ``max_host_bytes``.
      devices: The memory of this process's devices, where JAX reports it.
      kept_arena: The engine's host arena kept from an earlier load (resident).
      metadata_bytes: Bytes of metadata files each process reads first.
      warnings: What a person can act on.
      problems: Why the load does not fit; empty when it does.
    """

    path: str
    process: int
    processes: int
    leaves: list[LeafPlan]
    readers: dict[str, str]
    hosts: dict[int, HostPeak]
    limits: EngineLimits
    host: hostmem.HostMemory | None
    budget: int | None
    budget_given: bool
    devices: dict[Place, DeviceFree]
    kept_arena: int
    metadata_bytes: int
    warnings: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def fits(self) -> bool:
        """Whether the load fits: its peak within the budget and the host, every device
        within its memory."""
        return not self.problems

    def places(self) -> list[Place]:
        """Every place that holds or reads something, in process and device order."""
        found = {p for leaf in self.leaves for part in leaf.parts for p in part.part.places}
        return sorted(found)

    def held(self, place: Place) -> int:
        """The bytes ``place`` holds once the restore is done."""
        return sum(leaf.held().get(place, 0) for leaf in self.leaves if leaf.reader != NOT_READ)

    def _parts_read(
        self, place: Place | None, process: int | None
    ) -> Iterator[tuple[LeafPlan, Reads]]:
        """Each part ``place`` reads (those it is the first holder of), or each part one
        ``process`` reads, with its leaf."""
        for leaf in self.leaves:
            for part in leaf.parts:
                first = part.part.places[0]
                if (place is not None and first == place) or (
                    process is not None and first.process == process
                ):
                    yield leaf, part.reads

    def reads(self, place: Place | None = None, *, process: int | None = None) -> Reads:
        """What ``place`` reads (the parts it is the first holder of), or everything one
        ``process`` reads."""
        total = Reads()
        for _, reads in self._parts_read(place, process):
            total.add(reads)
        return total

    def data_files(self, place: Place | None = None, *, process: int | None = None) -> list[str]:
        """The data files what ``place`` (or one ``process``) reads come from, each
        relative to the checkpoint: its checkpointable's directory first, since the
        names within one store's directory may repeat in another's."""
        found = {
            f"{leaf.checkpointable}/{name}"
            for leaf, reads in self._parts_read(place, process)
            for name in reads.files
        }
        return sorted(found)

    def largest(self, place: Place, count: int = LARGEST) -> list[tuple[LeafPlan, int]]:
        """The leaves that dominate what ``place`` holds, with their bytes there."""
        found = [(leaf, leaf.held().get(place, 0)) for leaf in self.leaves]
        found = [item for item in found if item[1] > 0 and item[0].reader != NOT_READ]
        found.sort(key=lambda item: -item[1])
        return found[:count]
