"""A restore plan in words: why it does not fit, the warnings a person can act on, and
the paragraph a refused load raises with."""

from __future__ import annotations

from collections.abc import Sequence

from tinax._format.metadata.budget import describe_bytes as _b
from tinax.checkpointing._plan_figures import (
    DEFAULT_BUDGET_SHARE,
    LARGEST,
    NOTABLE_BYTES,
    READS_TOO_MUCH,
    REPLICAS_NOTABLE_BYTES,
    RestorePlan,
)
from tinax.checkpointing._plan_places import NOT_READ, ORBAX, LeafPlan, Place


def _leaf_name(leaf: LeafPlan) -> str:
    return f"{leaf.checkpointable}{leaf.key}"


def _named(leaves: Sequence[tuple[LeafPlan, int]]) -> str:
    return ", ".join(f"{_leaf_name(leaf)} ({_b(n)})" for leaf, n in leaves)


def _leaves(count: int) -> str:
    return f"{count} lea{'f' if count == 1 else 'ves'}"


def _limit_text(plan: RestorePlan) -> str:
    """What the host peak is held to, in words."""
    host = plan.host
    available = (
        f"{_b(host.available)} available ({host.source}: {_b(host.in_use)} in use of "
        f"{_b(host.limit)})"
        if host is not None
        else "an unknown amount available"
    )
    if plan.budget is None:
        return available
    if plan.budget_given:
        return f"max_host_bytes is {_b(plan.budget)}, with {available}"
    share = round(DEFAULT_BUDGET_SHARE * 100)
    return f"the default budget is {_b(plan.budget)} ({share}% of the {available})"


def host_over(plan: RestorePlan) -> bool:
    """Whether this process's peak is above its budget or what its host has."""
    peak = plan.hosts[plan.process].peak
    over_budget = plan.budget is not None and peak > plan.budget
    over_host = plan.host is not None and peak > plan.host.available
    return over_budget or over_host


def devices_over(plan: RestorePlan) -> list[tuple[Place, int, int]]:
    """This process's devices that would not hold what is restored onto them: each
    with the bytes it would hold and those it has free."""
    found = []
    for place, memory in sorted(plan.devices.items()):
        held = plan.held(place)
        if held > memory.free:
            found.append((place, held, memory.free))
    return found


def _devices_text(over: Sequence[tuple[Place, int, int]]) -> str:
    """The devices over their memory, one clause (several alike said once)."""
    if len(over) == 1:
        place, held, free = over[0]
        return f"{place.name} would hold {_b(held)} of restored arrays and has {_b(free)} free"
    names = (
        f"{over[0][0].name} … {over[-1][0].name}"
        if len(over) > 2
        else " and ".join(p.name for p, _, _ in over)
    )
    most = max(held for _, held, _ in over)
    least = min(free for _, _, free in over)
    return (
        f"{len(over)} devices ({names}) would each hold up to {_b(most)} of restored "
        f"arrays, with as little as {_b(least)} free"
    )


def problems(plan: RestorePlan) -> list[str]:
    """Why the load does not fit; empty when it does."""
    found = []
    peak = plan.hosts[plan.process]
    if host_over(plan):
        found.append(
            f"it needs {_b(peak.peak)} of host memory at its peak where {_limit_text(plan)}"
        )
    over = devices_over(plan)
    if over:
        found.append(_devices_text(over))
    return found


def _replicated(plan: RestorePlan) -> tuple[list[LeafPlan], list[LeafPlan]]:
    """Leaves held whole on several devices, where their copies matter (beyond
    ``REPLICAS_NOTABLE_BYTES`` and a tenth of what the restore holds): those whose
    target had no sharding, and those whose target asks for it."""
    found = [
        leaf
        for leaf in plan.leaves
        if leaf.reader != NOT_READ and leaf.replicas > 1 and leaf.placement.startswith("replicated")
    ]
    total = sum(plan.held(place) for place in plan.places())

    def matters(leaves: list[LeafPlan]) -> list[LeafPlan]:
        extra = sum(leaf.nbytes * (leaf.replicas - 1) for leaf in leaves)
        return leaves if extra >= max(REPLICAS_NOTABLE_BYTES, total // 10) else []

    return (
        matters([f for f in found if not f.given_sharding]),
        matters([f for f in found if f.given_sharding]),
    )


def _live_bytes(plan: RestorePlan) -> int:
    return sum(
        n
        for leaf in plan.leaves
        for place, n in leaf.target.items()
        if place.process == plan.process
    )


def warnings(plan: RestorePlan) -> list[str]:
    """What a person can act on, most pressing first."""
    found = []
    peak = plan.hosts[plan.process]
    if host_over(plan):
        found.append(
            f"the peak host memory ({_b(peak.peak)}) is above the limit: {_limit_text(plan)}; "
            "restore fewer leaves, shard the target over more devices, or free host memory"
        )
    over = devices_over(plan)
    if over:
        found.append(
            f"{_devices_text(over)}: shard the target over more devices, or restore fewer leaves"
        )
    unsharded, asked = _replicated(plan)
    for leaves, why, advice in (
        (
            unsharded,
            "the target gives them no sharding, so they take the saved one, which holds",
            "give the target a sharding",
        ),
        (
            asked,
            "the target's sharding holds",
            "shard them over the mesh unless every device needs them whole",
        ),
    ):
        if leaves:
            copies = max(leaf.replicas for leaf in leaves)
            whole = sum(leaf.nbytes for leaf in leaves)
            found.append(
                f"{_leaves(len(leaves))} ({_b(whole)}) land replicated on each of {copies} "
                f"devices ({why} a whole copy on each): {copies}x the memory, "
                f"{_b(whole * copies)}; {advice}"
            )
    lost = [leaf for leaf in plan.leaves if leaf.reader != NOT_READ and not leaf.parts]
    if lost:
        found.append(
            f"{_leaves(len(lost))} (first {_leaf_name(lost[0])}) have no sharding and the "
            "saved one names devices this job does not have: the load will fail; give the "
            "target a sharding"
        )
    reads = plan.reads(process=plan.process)
    kept = reads.nbytes - reads.beyond
    if reads.beyond >= NOTABLE_BYTES and reads.nbytes >= READS_TOO_MUCH * max(1, kept):
        found.append(
            f"it reads {reads.nbytes / max(1, kept):.1f}x what it keeps ({_b(reads.beyond)} "
            "of chunks outside the parts that need them): the saved chunks straddle the "
            "target's shards; a target sharded as it was saved reads only what it keeps"
        )
    live = _live_bytes(plan)
    if live >= NOTABLE_BYTES:
        found.append(
            f"the target is live state holding {_b(live)}: it stays in memory beside what "
            "the restore makes; pass abstract targets (abstract_restore_target(state)) "
            "and drop the live state first to free it"
        )
    estimated = [name for name, reader in plan.readers.items() if reader.startswith(ORBAX)]
    if estimated and peak.in_flight >= NOTABLE_BYTES:
        why = plan.readers[estimated[0]].removeprefix(ORBAX).strip(" ()")
        found.append(
            f"{', '.join(estimated)} {'is' if len(estimated) == 1 else 'are'} read by "
            f"Orbax's load ({why}), whose {_b(peak.in_flight)} of read buffers are an "
            "estimate"
        )
    return found


def refusal(plan: RestorePlan, *, refused: bool = True) -> str:
    """The paragraph a refused load raises with (``refused``; else the same, of a plan
    alone): needed and available bytes, the largest leaves, and what to change."""
    peak = plan.hosts[plan.process]
    names = sorted(plan.readers)
    then = ", so the load was refused before reading any data" if refused else ""
    parts = [
        f"checkpoint {plan.path!r}: restoring {names} does not fit in memory{then}: "
        f"{'; and '.join(plan.problems)}."
    ]
    if host_over(plan):
        parts.append(
            f"At its peak the load adds {_b(peak.peak)}: {_b(peak.kept)} of restored "
            f"values in host memory, {_b(peak.in_flight)} of read buffers, "
            f"{_b(peak.scratch + peak.overhead)} of decode buffers and bookkeeping."
        )
        host = [p for p in plan.places() if p.process == plan.process and p.in_host_memory]
        biggest = sorted(
            (
                (leaf, sum(n for p, n in leaf.held().items() if p in host))
                for leaf in plan.leaves
                if leaf.reader != NOT_READ
            ),
            key=lambda item: -item[1],
        )[:LARGEST]
        biggest = [item for item in biggest if item[1] > 0]
        if biggest:
            parts.append(f"The largest leaves: {_named(biggest)}.")
    over = devices_over(plan)
    if over:
        fullest = max(over, key=lambda item: item[1])[0]
        parts.append(f"The largest on {fullest.name}: {_named(plan.largest(fullest))}.")
    advice = ["restore fewer leaves (the parameters alone, placeholders for the rest)"]
    if any(_replicated(plan)):
        advice.insert(0, "shard the leaves that land replicated on every device")
    if over:
        advice.insert(0, "shard the target over more devices")
    live = _live_bytes(plan)
    if live:
        advice.append(f"pass abstract targets and drop the live state ({_b(live)})")
    if plan.budget_given and host_over(plan):
        advice.append("raise max_host_bytes if the host has the memory")
    parts.append(
        f"To load it: {'; '.join(advice)}. tinax.explore.restore_plan(path, targets) "
        "shows the whole plan."
    )
    return " ".join(parts)
