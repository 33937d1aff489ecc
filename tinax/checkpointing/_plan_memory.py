"""The host memory a load adds at its peak, as each reader really holds it; and the
limits that keep a load within a budget.

tinax's load engine (``_fast_load``) on a CPU reads each part into the buffer that
becomes its array (a replica on a second CPU device gets a copy): the restored
values are the load's memory, and nothing is read into memory twice. On an
accelerator it reads parts into one reused arena (``DEVICE_HOST_BUFFER_BYTES``,
pages touched only as parts land in it) and copies them to their devices; a part
larger than the arena waits for it to be idle and gets memory of its own; the arena
is kept ``_host_buffers.KEEP_SECONDS`` after the load. Its reading threads each hold a
scratch chunk (for chunks a part cuts) and a compressed chunk's bytes. A leaf cast to
another dtype (``_casts``) is read as stored into a buffer of its own, which goes
once its values are cast into the restored array: such a load holds the restored
values in the target's dtype and, beside them, the parts being read in the stored
one; on an accelerator the parts sit in the arena and their cast values wait for
their transfers (a figure not yet measured on an accelerator).

Orbax's load reads each part into a fresh zeroed NumPy array (its whole chunks'
extent reserved against ``read_concurrent_bytes``, which tinax sets), and copies the
part to its devices (a CPU device too: Orbax's arrays are not aligned for JAX to
alias). Where the target asks for a cast the engine leaves to Orbax (one not
between float dtypes), tinax's check reads the stored values a second time
(``_orbax.check_host_reads``). Its parts are read all at once up to that limit: the
plan takes its buffers in flight as the bytes reserved at once, and the stored bytes
of a cast beside them, an estimate that ``bench/restore_plan.py`` found from 17%
above to 7% below what such loads held when it measured float casts through Orbax
(0.975x and 0.931x at 0.5 and 2 GB). Under a limit cut by a budget such loads held
more than the limit accounts for: some 200 MB beside the restored values of the
0.5 GB state whether the limit was 63 or 31 MB (docs/guides/restore_plan.md); the
engine's casts hold their budgets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tinax.checkpointing import _fast_load, _host_buffers
from tinax.checkpointing._plan_places import ORBAX, TINAX, LeafPlan, PartPlan

# What a load holds besides its buffers: for each array it puts on a device (a
# device's shard of a leaf: its JAX and Python objects, the allocator's rounding of
# its buffer) and once, measured by bench/restore_plan.py (2 MiB for 184 shards, 5.5
# MiB for 616, 27.5 MiB for 3,200), each with a margin, so that the plan's figure is
# one a budget can hold the load to.
SHARD_OVERHEAD_BYTES = 10 << 10
BASE_OVERHEAD_BYTES = 2 << 20
# Orbax's reads reserve at most this much at once unless the caller's context sets
# ``read_concurrent_bytes`` (Orbax's own default is no limit: every array at once).
ORBAX_IN_FLIGHT_BYTES = 1 << 30


@dataclasses.dataclass(frozen=True)
class EngineLimits:
    """What a load is given to stay within its budget.

    Attributes:
      arena_bytes: The tinax engine's reused host buffer on an accelerator.
      reading_bytes: On a CPU, what the engine's parts being read hold at once.
      orbax_in_flight: Orbax's ``read_concurrent_bytes``.
      piece_readers: On a CPU, how many saved pieces the engine reads at once into
        buffers of their own (``_piece_reads``): one per reading thread, fewer under
        a budget.
    """

    arena_bytes: int = dataclasses.field(
        default_factory=lambda: _fast_load.DEVICE_HOST_BUFFER_BYTES
    )
    reading_bytes: int = dataclasses.field(default_factory=lambda: _fast_load.HOST_BUFFER_BYTES)
    orbax_in_flight: int = ORBAX_IN_FLIGHT_BYTES
    piece_readers: int = dataclasses.field(default_factory=lambda: _fast_load.THREADS)


@dataclasses.dataclass(frozen=True)
class HostPeak:
    """One process's host memory during a load, beyond what it held before.

    Attributes:
      kept: The restored values that live in host memory (NumPy leaves, scalars,
        a CPU device's arrays).
      in_flight: Read buffers at the peak (the engine's arena and larger parts on an
        accelerator, fetched shards from an object store, Orbax's part buffers).
      scratch: The reading threads' chunk buffers.
      overhead: Objects made per leaf, and the load's fixed costs.
      after: Host memory the load leaves held besides the restored values (the
        engine's arena, kept for the next load), 0 where none.
    """

    kept: int
    in_flight: int
    scratch: int
    overhead: int
    after: int = 0

    @property
    def peak(self) -> int:
        """What the load adds at its peak."""
        return self.kept + self.in_flight + self.scratch + self.overhead


def _aligned(nbytes: int) -> int:
    return -(-max(nbytes, 1) // _host_buffers.ALIGN) * _host_buffers.ALIGN


def _parts(leaves: Sequence[LeafPlan], process: int, reader: str) -> list[PartPlan]:
    return [
        part
        for leaf in leaves
        if leaf.reader == reader
        for part in leaf.parts
        if part.part.places[0].process == process
    ]


def _reuses_arena(parts: Sequence[PartPlan]) -> bool:
    """Whether the engine copies parts to their devices (``_fast_load._copied_to_devices``)."""
    return any(not place.in_host_memory for part in parts for place in part.part.places)


def _read_bytes(part: PartPlan) -> int:
    """The buffer the engine reads a part into: its bytes as stored (a cast's too)."""
    return part.cast or part.nbytes


def _arena_in_flight(parts: Sequence[PartPlan], arena: int) -> tuple[int, int]:
    """The arena's touched bytes and the largest part too big for it."""
    sizes = [_aligned(_read_bytes(p)) for p in parts if p.part.places[0].platform != "host"]
    small = sum(s for s in sizes if s <= arena)
    big = max((s for s in sizes if s > arena), default=0)
    return min(arena, small), big


def _scratch(parts: Sequence[PartPlan], *, by_piece: bool, piece_readers: int) -> int:
    """The reading threads' buffers: each grows to the largest chunk it decodes apart,
    the longest compressed chunk it reads whole, and (``by_piece``: on a CPU, from a
    local disk) the largest saved piece it reads of a box grown to cover whole
    pieces, of which ``piece_readers`` are held at once; the threads take the
    largest first."""
    threads = _fast_load.THREADS
    staged = sum(p.reads.staged for p in parts)
    staged_bytes = max((p.reads.staged_bytes for p in parts), default=0)
    compressed = sum(p.reads.compressed for p in parts)
    compressed_bytes = max((p.reads.compressed_bytes for p in parts), default=0)
    pieces = sorted((n for p in parts for n in p.pieces), reverse=True) if by_piece else []
    return (
        min(threads, staged) * staged_bytes
        + min(threads, compressed) * compressed_bytes
        + sum(pieces[: min(threads, piece_readers)])
    )


def _cast_in_flight(parts: Sequence[PartPlan], arena: int) -> int:
    """On an accelerator, the cast values of the parts in the arena, each held until
    its transfers end: at most the arena's worth, in the target's dtype."""
    cast = [p for p in parts if p.cast and p.part.places[0].platform != "host"]
    if not cast:
        return 0
    stored = sum(_aligned(p.cast) for p in cast)
    restored = sum(_aligned(p.nbytes) for p in cast)
    return min(restored, arena * restored // max(1, stored))


def _transient(parts: Sequence[PartPlan], limit: int) -> int:
    """On a CPU, the read buffers no array keeps (boxes grown to cover whole saved
    pieces, each device taking a copy of its window; parts read to be cast) resident
    at once, in the stored dtype. Each is mapped
    apart and goes once its devices have their copies; its pages are touched only as
    chunks land in it. The reading threads take the parts' tasks (``TASK_BYTES`` of
    chunks each) largest part first: what is resident is taken as the parts of the
    first ``THREADS`` tasks (bench/restore_plan.py measured from a fifth to a little
    more than that, as the threads happen to run), never more than the parts being
    read (``limit``, or one part)."""

    def apart(part: PartPlan) -> bool:
        return not part.pieces and (part.part.transient or bool(part.cast))

    sizes = [_aligned(_read_bytes(p)) for p in parts if apart(p)]
    if not sizes:
        return 0
    tasks = 0
    first = 0
    for part in sorted(parts, key=lambda p: -_read_bytes(p)):
        if tasks >= _fast_load.THREADS:
            break
        tasks += max(1, -(-_read_bytes(part) // _fast_load.TASK_BYTES))
        if apart(part):
            first += _aligned(_read_bytes(part))
    return min(max(first, max(sizes)), max(limit, max(sizes)))


def host_peak(
    leaves: Sequence[LeafPlan],
    process: int,
    limits: EngineLimits,
    *,
    kept_arena: int,
    local: bool,
) -> HostPeak:
    """What a load of ``leaves`` adds to ``process``'s host memory (module docstring).

    Args:
      leaves: The restore's leaves.
      process: The process.
      limits: What the load is given.
      kept_arena: The bytes of the engine's arena kept from an earlier load in this
        process (resident already, and reused), 0 if none.
      local: Whether the checkpoint is on a local disk (else an object store).
    """
    kept = 0
    shards = 0
    for leaf in leaves:
        if leaf.reader not in (TINAX, ORBAX):
            continue
        for place, nbytes in leaf.held().items():
            if place.process == process:
                shards += 1
                kept += nbytes if place.in_host_memory else 0
    engine = _parts(leaves, process, TINAX)
    in_flight = after = 0
    reuse = bool(engine) and _reuses_arena(engine)
    if engine:
        if reuse:
            touched, big = _arena_in_flight(engine, limits.arena_bytes)
            new = 0 if kept_arena >= limits.arena_bytes else touched
            in_flight, after = new + big, new
            in_flight += _cast_in_flight(engine, limits.arena_bytes)
        else:
            in_flight = _transient(engine, limits.reading_bytes)
        if not local:
            # Parts being read hold the shards fetched for them.
            decoded = sum(_read_bytes(p) for p in engine)
            fetched = sum(p.reads.nbytes for p in engine)
            limit = limits.arena_bytes if reuse else limits.reading_bytes
            busy = min(decoded, max(limit, max(_read_bytes(p) for p in engine)))
            in_flight += busy * fetched // max(1, decoded)
    orbax = _parts(leaves, process, ORBAX)
    if orbax:
        # Orbax loads after the engine (restore_checkpointables): the larger phase counts.
        reserved = min(sum(p.reserved for p in orbax), limits.orbax_in_flight)
        checked = min(sum(p.cast for p in orbax), limits.orbax_in_flight)
        in_flight = max(in_flight, reserved + checked)
    return HostPeak(
        kept=kept,
        in_flight=in_flight,
        scratch=_scratch(engine, by_piece=local and not reuse, piece_readers=limits.piece_readers),
        overhead=BASE_OVERHEAD_BYTES + SHARD_OVERHEAD_BYTES * shards if shards else 0,
        after=after,
    )


def largest_reservation(leaves: Sequence[LeafPlan], process: int) -> int:
    """The most Orbax's reader reserves for one part (its limit must exceed it)."""
    return max((p.reserved for p in _parts(leaves, process, ORBAX)), default=0)


def limits_within(
    budget: int,
    leaves: Sequence[LeafPlan],
    process: int,
    *,
    kept_arena: int,
    local: bool,
    orbax_in_flight: int | None = None,
) -> EngineLimits:
    """The most generous limits under which the load's peak stays within ``budget``;
    the smallest the readers work with where none does (the plan then does not fit).

    Args:
      orbax_in_flight: ``read_concurrent_bytes`` the caller's Orbax context sets, which
        is kept.
    """
    first = EngineLimits(orbax_in_flight=orbax_in_flight or ORBAX_IN_FLIGHT_BYTES)
    found = host_peak(leaves, process, first, kept_arena=kept_arena, local=local)
    if found.peak <= budget:
        return first
    left = budget - (found.kept + found.scratch + found.overhead)
    every = _parts(leaves, process, TINAX)
    engine = [p for p in every if p.part.places[0].platform != "host"]
    arena, reading = first.arena_bytes, first.reading_bytes
    if engine and _reuses_arena(engine):
        touched, big = _arena_in_flight(engine, arena)
        if touched + big > left:
            largest = max(_aligned(_read_bytes(p)) for p in engine)
            # Parts larger than the arena are read one at a time, in memory of their own.
            arena = max(_host_buffers.ALIGN, min(arena, left - largest))
    elif every and local and _transient(every, reading) > left:
        # Fewer parts read at once: the buffers no array keeps shrink with them (to one
        # part, at the least).
        reading = max(_host_buffers.ALIGN, left)
    orbax = first.orbax_in_flight
    if orbax_in_flight is None and _parts(leaves, process, ORBAX):
        least = largest_reservation(leaves, process) + 1
        copies = 2 if any(p.cast for p in _parts(leaves, process, ORBAX)) else 1
        orbax = max(least, min(orbax, left // copies))
    limits = EngineLimits(arena_bytes=arena, reading_bytes=reading, orbax_in_flight=orbax)
    if every and local and not (engine and _reuses_arena(engine)):
        # Still above: fewer saved pieces read at once, into buffers of their own.
        peak = host_peak(leaves, process, limits, kept_arena=kept_arena, local=local).peak
        held = _scratch(every, by_piece=True, piece_readers=limits.piece_readers)
        readers = limits.piece_readers
        while (
            readers > 1
            and peak - held + _scratch(every, by_piece=True, piece_readers=readers) > budget
        ):
            readers -= 1
        limits = dataclasses.replace(limits, piece_readers=readers)
    return limits
