"""``tinax plan``: what restoring a checkpoint will read and hold, per process and per
device, from metadata alone; exit status 0 when it fits, 1 when a load would be
refused.

The checkpoint is planned as it was saved (its shardings), or laid on another mesh
(``--mesh data=4,model=2``: its partitions on a mesh of those axis sizes). The
command never touches an accelerator: JAX runs on the CPU with as many devices as
the shardings need (``--platform tpu`` plans an accelerator's host memory instead,
``--device-memory`` the devices' own).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from typing import Any, TextIO

import pandas as pd

from tinax._cli import terminal as term
from tinax._cli.args import EXIT_NO, EXIT_OK
from tinax._cli.output import _csv, _dump, _records, _say
from tinax._cli.terminal import Column

_COLUMNS = (
    Column("process", "process", term.number, priority=3, right=True),
    Column("device", "device", priority=0),
    Column("memory_bytes", "memory", term.human_bytes, priority=0, right=True),
    Column("limit_bytes", "limit", term.human_bytes, priority=1, right=True),
    Column(
        "fits", "fits", lambda v: "" if term.is_missing(v) else ("yes" if v else "NO"), priority=1
    ),
    Column("read_bytes", "read", term.human_bytes, priority=2, right=True),
    Column("beyond_bytes", "beyond", term.human_bytes, priority=4, right=True),
    Column("chunks", "chunks", term.number, priority=5, right=True),
    Column("files", "files", term.number, priority=6, right=True),
)
_FLAG = "--xla_force_host_platform_device_count"


def _devices_needed(path: str, mesh: Mapping[str, int] | None) -> int:
    """How many devices the saved shardings (or ``mesh``) need, read before JAX starts."""
    import math

    from tinax import _paths
    from tinax._format.metadata import layout, pytree

    if mesh is not None:
        return math.prod(mesh.values())
    checkpoint = _paths.open_checkpoint(path)
    needed = 1
    for item in checkpoint.checkpointables:
        if item.layout != layout.PYTREE:
            continue
        tree = pytree.read_layout(item)
        for record in pytree.read_shardings(tree, [leaf.param for leaf in tree.leaves]).values():
            if isinstance(record.get("shape"), list):
                sizes = [n for n in record["shape"] if isinstance(n, int)]
                needed = max(needed, math.prod(sizes))
            device = re.search(r"(\d+)\s*$", str(record.get("device_str", "")))
            if device is not None:
                needed = max(needed, int(device.group(1)) + 1)
    return needed


def _start_jax(devices: int) -> None:
    """JAX on the CPU with ``devices`` devices, unless this process started it already
    (then it has what it has)."""
    if "jax" in sys.modules:
        return
    os.environ["JAX_PLATFORMS"] = "cpu"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(_FLAG)]
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"{_FLAG}={devices}"])


def _summary(table: pd.DataFrame) -> list[str]:
    attrs = table.attrs
    lines = []
    readers = attrs["readers"]
    by: dict[str, list[str]] = {}
    for name, reader in readers.items():
        by.setdefault(reader, []).append(name)
    said = "; ".join(f"{', '.join(names)}: {reader}" for reader, names in by.items())
    lines.append(f"checkpoint {attrs['path']} ({attrs['leaves']:,} leaves; read by {said})")
    limit = attrs["budget_bytes"]
    available = attrs["available_bytes"]
    where = (
        f"max_host_bytes {term.human_bytes(limit)}"
        if attrs["budget_given"]
        else f"90% of the {term.human_bytes(available)} available ({attrs['available_from']})"
        if available is not None
        else "no limit known"
    )
    rest = attrs["peak_host_bytes"] - attrs["kept_host_bytes"] - attrs["buffer_bytes"]
    lines.append(
        f"peak host memory {term.human_bytes(attrs['peak_host_bytes'])} "
        f"({term.human_bytes(attrs['kept_host_bytes'])} restored in host memory, "
        f"{term.human_bytes(attrs['buffer_bytes'])} of buffers, "
        f"{term.human_bytes(rest)} of bookkeeping) against {where}; "
        f"reads {term.human_bytes(attrs['read_bytes'])}"
        + (
            f"; keeps {term.human_bytes(attrs['after_host_bytes'])} of read buffer after it"
            if attrs["after_host_bytes"]
            else ""
        )
    )
    devices = table[table["device"] != "host"]
    shown = [("in host memory", table[table["device"] == "host"])]
    if not (devices["platform"] == "cpu").all():
        # A CPU device's arrays are host memory: said once, above.
        shown.append(("on a device", devices))
    for label, rows in shown:
        if rows.empty:
            continue
        # Devices of one sharding hold alike: the largest of the fullest is said.
        fullest = rows.loc[rows["memory_bytes"].astype("float").idxmax(), "largest"]
        if not term.is_missing(fullest) and fullest:
            lines.append(f"largest {label}: {fullest}")
    return lines


def plan_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Prints the plan; 0 when it fits, 1 when a load would be refused."""
    del err
    _start_jax(_devices_needed(args.path, args.mesh))
    from tinax.explore._restore_plan import restore_plan

    table = restore_plan(
        args.path,
        mesh=args.mesh,
        max_host_bytes=args.max_host_bytes,
        platform=args.platform,
        device_memory=args.device_memory,
    )
    status = EXIT_OK if table.attrs["fits"] else EXIT_NO
    if args.json:
        _dump({"rows": _records(table), **_jsonable_attrs(table.attrs)}, out)
        return status
    if args.csv:
        _csv(table, out)
        return status
    total = term.width()
    for line in _summary(table):
        _say(line, out, total)
    term.render(table, _COLUMNS, out, total)
    warnings = table.attrs["warnings"]
    if not table.attrs["fits"]:
        _say(f"does not fit: {table.attrs['refusal']}", out, total)
    elif warnings:
        print("warnings:", file=out)
    for warning in warnings if table.attrs["fits"] else []:
        for i, line in enumerate(_wrapped(warning, total - 2)):
            print(("- " if i == 0 else "  ") + line, file=out)
    return status


def _wrapped(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, max(20, width), break_on_hyphens=False) or [""]


def _jsonable_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in attrs.items()}
