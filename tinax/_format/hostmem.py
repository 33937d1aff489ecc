"""How much host memory this process can still take before it is killed.

A container's memory limit is not the machine's: a job in a cgroup of 32 GiB on a
host of 1 TiB is killed at 32 GiB, and ``/proc/meminfo`` knows nothing of it. The
memory available here is the least of what every level of this process's cgroup
leaves (its limit less what it holds, less the page cache the kernel would drop
first) and the kernel's own estimate for the whole machine (``MemAvailable``).
cgroup v2 (``memory.max``, ``memory.current``) and v1 (``memory.limit_in_bytes``,
``memory.usage_in_bytes``) are both read, from wherever they are mounted.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

# A cgroup limit this large is none (v1 writes 2**63 rounded down to a page).
_UNLIMITED = 1 << 62


@dataclasses.dataclass(frozen=True)
class HostMemory:
    """The host memory this process can still take.

    Attributes:
      available: Bytes it can take before it is killed or the machine runs out.
      limit: The tightest memory limit over it (its cgroup's, or the machine's
        memory), in bytes.
      in_use: What counts against that limit now, in bytes.
      source: What set ``available``: ``"cgroup <path>"`` or ``"/proc/meminfo"``.
    """

    available: int
    limit: int
    in_use: int
    source: str


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _number(path: str) -> int | None:
    text = _read(path)
    if text is None:
        return None
    text = text.strip()
    return int(text) if text.isdigit() else None


def _stat(path: str, *fields: str) -> int:
    """The first of ``fields`` that ``path`` (a ``memory.stat``) has, else 0."""
    found: dict[str, int] = {}
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            found[name] = int(value)
    return next((found[f] for f in fields if f in found), 0)


def _mounts(root: str) -> list[tuple[str, str, str, str]]:
    """Every cgroup mount: its root in the hierarchy, where it is mounted (under
    ``root``), its file system type, its options."""
    found = []
    for line in (_read(os.path.join(root, "proc/self/mountinfo")) or "").splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            point = os.path.join(root, fields[4].lstrip("/"))
            found.append((fields[3], point, tail[0], tail[2]))
    return found


def _levels(root: str) -> Iterator[tuple[str, str, bool]]:
    """This process's memory cgroup directories, innermost first, each with its path
    in the hierarchy and whether it is cgroup v2."""
    mounts = _mounts(root)
    for line in (_read(os.path.join(root, "proc/self/cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        v2 = controllers == ""
        if not v2 and "memory" not in controllers.split(","):
            continue
        for top, point, kind, options in mounts:
            if (kind == "cgroup2") != v2 or (not v2 and "memory" not in options.split(",")):
                continue
            # Inside a cgroup namespace the mount's root is this cgroup itself.
            inner = path[len(top) :] if path.startswith(top) and top != "/" else path
            inner = inner.strip("/")
            steps = inner.split("/") if inner else []
            for depth in range(len(steps), -1, -1):
                yield os.path.join(point, *steps[:depth]), "/" + "/".join(steps[:depth]), v2
            break


def _cgroup_memory(root: str) -> HostMemory | None:
    """The tightest cgroup level: the one that leaves the least."""
    best: HostMemory | None = None
    for directory, name, v2 in _levels(root):
        if v2:
            limit = _number(os.path.join(directory, "memory.max"))
            used = _number(os.path.join(directory, "memory.current"))
            reclaimable = _stat(os.path.join(directory, "memory.stat"), "inactive_file")
        else:
            limit = _number(os.path.join(directory, "memory.limit_in_bytes"))
            used = _number(os.path.join(directory, "memory.usage_in_bytes"))
            reclaimable = _stat(
                os.path.join(directory, "memory.stat"), "total_inactive_file", "inactive_file"
            )
        if limit is None or used is None or limit >= _UNLIMITED:
            continue
        held = max(0, used - reclaimable)
        found = HostMemory(max(0, limit - held), limit, held, f"cgroup {name}")
        if best is None or found.available < best.available:
            best = found
    return best


def _meminfo(root: str) -> HostMemory | None:
    fields: dict[str, int] = {}
    for line in (_read(os.path.join(root, "proc/meminfo")) or "").splitlines():
        name, _, rest = line.partition(":")
        value = rest.split()
        if value and value[0].isdigit():
            fields[name] = int(value[0]) * 1024
    if "MemTotal" not in fields:
        return None
    available = fields.get("MemAvailable", fields.get("MemFree", 0))
    return HostMemory(
        available, fields["MemTotal"], fields["MemTotal"] - available, "/proc/meminfo"
    )


def host_memory(root: str = "/") -> HostMemory | None:
    """The host memory this process can still take: the tighter of its cgroup's and the
    machine's (see the module's docstring); ``None`` where neither can be read (not
    Linux).

    Args:
      root: The file system root ``/proc`` and the cgroup mounts are under (tests
        give a made-up one).
    """
    machine = _meminfo(root)
    cgroup = _cgroup_memory(root)
    if machine is None or (cgroup is not None and cgroup.available < machine.available):
        return cgroup
    return machine
