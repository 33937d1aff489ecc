"""What a restore plan predicts, beside what the load then reads and holds.

A flax NNX model (an embedding and blocks of two linear layers and a norm) and its
optax adamw state, of each of ``--sizes`` GB, are saved sharded over the devices (an
FSDP layout: each array's first dimension split over all of them where it divides,
else replicated). Each case then runs in a fresh process: it plans the restore from
metadata (``tinax.checkpointing``'s restore plan, what every load computes first),
resets the process's peak resident memory (``/proc/self/clear_refs``), loads, and
reports the peak resident memory above its level before the load and the bytes the
process read (``rchar``), beside the plan's figures.

Cases on a CPU (eight devices, ``--xla_force_host_platform_device_count=8``):

  saved    abstract targets on the sharding the state was saved with;
  fewer    onto a mesh of four devices: each part holds two saved pieces whole;
  other    onto a 2x4 mesh, columns split four ways and each held twice: every part
           cuts the saved pieces (the engine reads the boxes covering them);
  params   the model alone, the norms left out (Orbax's placeholder ``...``), the
           optimizer not restored: what the restore-target builder's presets load;
  cast     the model restored as bfloat16 (a cast: tinax's engine reads it as
           stored and casts it on the host), the optimizer as saved;
  castbudget  the same, inside ``memory_budget`` of the plan's figure with its parts
           in flight cut to ``CAST_BUFFER`` (fewer parts read at once);
  orbaxcast   the same cast through Orbax's load (the engine's casts switched off):
           its time beside the engine's (``s`` column), its reads in flight
           estimated;
  budget   inside ``memory_budget`` of the plan's figure with its read buffers cut to
           64 MiB: on a CPU the other mesh's (fewer parts read at once), on an
           accelerator the saved sharding's (the engine's arena shrinks to fit); the
           measured peak must stay under the budget;
  piecebudget  the budget case's mesh inside a budget that also cuts the reading
           threads' piece buffers to ``PIECE_BUFFER`` (fewer pieces read at once);
  refused  inside a budget of half the plan's peak: refused, nothing read.

On an accelerator (``--accelerator``): the devices JAX finds, no CPU devices made;
the cases saved, params, orbax, budget and refused (one chip has no other mesh), and
beside
the host memory each device's memory once restored (``memory_stats``: bytes in use
after the load less before it) against the plan's figure per device.

Goals (exit status 1 when one is missed): the plan's peak host memory within 15% of
the measured peak increase and its bytes read within 5% of the bytes read, for every
case that loads; the budgeted load's peak under its budget; the refused load refused
having read under 1 MiB.

Usage: python bench/restore_plan.py [--sizes 0.5 2] [--cases saved other ...]
       [--dir DIR] [--accelerator] [--width 1024] [--json FILE]
On a TPU machine (after ``make wheels``, see docs/guides/performance.md):
       python3 bench/restore_plan.py --accelerator
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CPU_DEVICES = 8
CPU_CASES = (
    "saved",
    "fewer",
    "other",
    "params",
    "cast",
    "castbudget",
    "orbaxcast",
    "budget",
    "piecebudget",
    "refused",
)
ACCELERATOR_CASES = ("saved", "params", "cast", "orbaxcast", "budget", "refused")
# The model restored as bfloat16.
CAST_CASES = ("cast", "castbudget", "orbaxcast")
PEAK_GOAL = 0.15
READ_GOAL = 0.05
# The budget case: the plan's figure with its read buffers cut to this.
BUDGET_BUFFER = 64 << 20
# The cast budget case: its parts in flight (in the stored dtype) cut to this.
CAST_BUFFER = 8 << 20
# The piece budget case: the reading threads' buffers cut to this.
PIECE_BUFFER = 8 << 20
# The embedding's rows and the model's width; blocks are added to reach a size.
VOCAB = 8192
WIDTH = 1024


def _blocks(gigabytes: float, width: int) -> int:
    """Blocks for a model whose state with adamw's two moments is ``gigabytes``."""
    embed = VOCAB * width
    block = 2 * width * 4 * width + 4 * width + 3 * width
    return max(1, round((gigabytes * 1e9 / 12 - embed) / block))


def _build(blocks: int, width: int = WIDTH) -> Any:
    """The model and its optimizer (a function, so that ``nnx.eval_shape`` takes it)."""
    import optax
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.up = nnx.Linear(width, 4 * width, rngs=rngs)
            self.down = nnx.Linear(4 * width, width, rngs=rngs)
            self.norm = nnx.LayerNorm(width, rngs=rngs)

    class Model(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.embed = nnx.Embed(VOCAB, width, rngs=rngs)
            self.blocks = nnx.List([Block(rngs) for _ in range(blocks)])

    def make() -> tuple[Any, Any]:
        model = Model(nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)

    return make


def _sharding(shape: tuple[int, ...], case: str) -> Any:
    """Where a leaf of ``shape`` lands in ``case``."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = jax.devices()
    if case in ("budget", "piecebudget"):
        case = "saved" if devices[0].platform != "cpu" else "other"
    if case == "fewer":
        mesh = Mesh(np.array(devices[: max(1, len(devices) // 2)]), ("fsdp",))
    elif case == "other":
        mesh = Mesh(np.array(devices).reshape(2, len(devices) // 2), ("data", "model"))
        if len(shape) == 2 and shape[1] % mesh.shape["model"] == 0:
            return NamedSharding(mesh, PartitionSpec(None, "model"))
        return NamedSharding(mesh, PartitionSpec())
    else:
        mesh = Mesh(np.array(devices), ("fsdp",))
    count = mesh.devices.size
    if shape and shape[0] % count == 0:
        return NamedSharding(mesh, PartitionSpec("fsdp"))
    return NamedSharding(mesh, PartitionSpec())


def _targets(blocks: int, width: int, case: str) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    model, optimizer = nnx.eval_shape(_build(blocks, width))

    def place(tree: Any) -> Any:
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=_sharding(x.shape, case)),
            tree,
        )

    targets = {"model": place(nnx.state(model)), "optimizer": place(nnx.state(optimizer))}
    if case == "params":
        # The norms left out, and no optimizer: what a preset of the builder loads.
        norms = nnx.state(model, nnx.Param)

        def keep(path: Any, leaf: Any) -> Any:
            return ... if "norm" in jax.tree_util.keystr(path) else leaf

        targets = {"model": jax.tree_util.tree_map_with_path(keep, place(norms))}
    elif case in CAST_CASES:
        targets["model"] = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16, sharding=x.sharding),
            targets["model"],
        )
    return targets


def _status() -> dict[str, int]:
    text = Path("/proc/self/status").read_text()
    return {k: int(re.search(rf"{k}:\s+(\d+)", text).group(1)) * 1024 for k in ("VmRSS", "VmHWM")}


def _read_chars() -> int:
    return int(re.search(r"rchar: (\d+)", Path("/proc/self/io").read_text()).group(1))


def _device_bytes() -> dict[str, int]:
    import jax

    found = {}
    for device in jax.local_devices():
        stats = device.memory_stats() or {}
        if "bytes_in_use" in stats:
            found[f"{device.platform}:{device.id}"] = int(stats["bytes_in_use"])
    return found


def save(path: str, blocks: int, width: int) -> int:
    """Saves the state sharded over every device; returns its bytes."""
    import jax
    from flax import nnx

    from tinax.checkpointing import save_checkpointables

    model, optimizer = _build(blocks, width)()
    state = {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}
    state = jax.tree.map(lambda x: jax.device_put(x, _sharding(x.shape, "saved")), state)
    save_checkpointables(path, state).result()
    return sum(x.nbytes for x in jax.tree.leaves(state))


def load(path: str, blocks: int, width: int, case: str) -> dict[str, Any]:
    """One case in this process: the plan's figures, then the load's."""
    import contextlib
    import gc
    import time

    import jax

    import tinax.checkpointing as tc
    from tinax import _paths
    from tinax.checkpointing import _casts, _restore_plan

    targets = _targets(blocks, width, case)
    checkpoint = _paths.open_checkpoint(path)
    if case == "orbaxcast":
        _casts.ENGINE_CASTS = frozenset()  # every cast left to Orbax's load
    # The model cast to bfloat16 loses precision: a cast the load is told to make.
    stack = contextlib.ExitStack()
    stack.enter_context(tc.allow_lossy_casts(case in CAST_CASES))
    planned = _restore_plan.plan_restore(checkpoint, targets)
    planned.close()
    plan = planned.plan
    peak = plan.hosts[plan.process]
    reads = plan.reads(process=plan.process)
    report: dict[str, Any] = {
        "case": case,
        "readers": plan.readers,
        "plan": {
            "peak": peak.peak,
            "kept": peak.kept,
            "in_flight": peak.in_flight,
            "scratch": peak.scratch,
            "overhead": peak.overhead,
            "after": peak.after,
            "read": reads.nbytes + plan.metadata_bytes,
            "devices": {p.name: plan.held(p) for p in plan.places() if p.platform != "host"},
        },
    }
    budget = None
    if case == "budget":
        budget = peak.kept + peak.scratch + peak.overhead + min(peak.in_flight, BUDGET_BUFFER)
    elif case == "piecebudget":
        buffers = min(peak.in_flight, BUDGET_BUFFER) + min(peak.scratch, PIECE_BUFFER)
        budget = peak.kept + peak.overhead + buffers
    elif case == "castbudget":
        budget = peak.kept + peak.scratch + peak.overhead + min(peak.in_flight, CAST_BUFFER)
    elif case == "refused":
        budget = peak.peak // 2
    if budget is not None:
        within = _restore_plan.plan_restore(checkpoint, targets, max_host_bytes=budget)
        within.close()
        report["budget"] = budget
        report["plan"]["peak"] = within.plan.hosts[plan.process].peak
        report["plan"]["in_flight"] = within.plan.hosts[plan.process].in_flight
        report["plan"]["after"] = within.plan.hosts[plan.process].after
        report["plan"]["scratch"] = within.plan.hosts[plan.process].scratch
        report["plan"]["piece_readers"] = within.plan.limits.piece_readers
    gc.collect()
    devices_before = _device_bytes()
    Path("/proc/self/clear_refs").write_text("5")
    before, read_before = _status(), _read_chars()
    block = tc.memory_budget(budget) if budget is not None else contextlib.nullcontext()
    started = time.perf_counter()
    try:
        with block:
            restored = tc.load_checkpointables(checkpoint, targets)
        jax.block_until_ready(restored)
        report["seconds"] = time.perf_counter() - started
        report["refused"] = False
    except tc.RestoreTooLargeError as e:
        report["refused"] = True
        report["refusal"] = str(e)
    after = _status()
    stack.close()
    report["measured"] = {
        "peak": after["VmHWM"] - before["VmRSS"],
        "read": _read_chars() - read_before,
        "devices": {name: n - devices_before.get(name, 0) for name, n in _device_bytes().items()},
    }
    return report


def _run(args: list[str], accelerator: bool) -> dict[str, Any]:
    env = dict(os.environ)
    if not accelerator:
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={CPU_DEVICES}"
    done = subprocess.run(
        [sys.executable, __file__, *args], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _mib(n: float) -> str:
    return f"{n / 2**20:9.1f}"


def _judge(report: dict[str, Any]) -> list[str]:
    """The goals ``report`` misses."""
    missed = []
    plan, measured = report["plan"], report["measured"]
    if report["case"] == "refused":
        if not report["refused"]:
            missed.append("refused: the load was not refused")
        if measured["read"] >= 1 << 20:
            missed.append(f"refused: read {measured['read']} bytes before refusing")
        return missed
    if report["refused"]:
        return [f"{report['case']}: refused: {report.get('refusal')}"]
    peak_ratio = plan["peak"] / max(1, measured["peak"])
    read_ratio = plan["read"] / max(1, measured["read"])
    if abs(peak_ratio - 1) > PEAK_GOAL:
        missed.append(f"{report['case']}: peak host memory planned {peak_ratio:.3f}x")
    if abs(read_ratio - 1) > READ_GOAL:
        missed.append(f"{report['case']}: bytes read planned {read_ratio:.3f}x")
    if report.get("budget") is not None and measured["peak"] > report["budget"]:
        missed.append(f"{report['case']}: peak {measured['peak']} above its budget")
    return missed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.5, 2.0], metavar="GB")
    parser.add_argument("--cases", nargs="+", default=None)
    parser.add_argument("--dir", default=None, help="where to save (default: a temporary one)")
    parser.add_argument("--accelerator", action="store_true")
    parser.add_argument("--width", type=int, default=WIDTH, help=f"the model's width ({WIDTH})")
    parser.add_argument("--json", default=None, metavar="FILE", help="write the reports here")
    parser.add_argument("--save", nargs=2, metavar=("PATH", "BLOCKS"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--load", nargs=3, metavar=("PATH", "BLOCKS", "CASE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.save:
        print(json.dumps({"bytes": save(args.save[0], int(args.save[1]), args.width)}))
        return 0
    if args.load:
        print(json.dumps(load(args.load[0], int(args.load[1]), args.width, args.load[2])))
        return 0
    cases = args.cases or (ACCELERATOR_CASES if args.accelerator else CPU_CASES)
    root = Path(args.dir or tempfile.mkdtemp(prefix="tinax-restore-plan-"))
    root.mkdir(parents=True, exist_ok=True)
    reports, missed = [], []
    print(
        f"{'case':8} {'GB':>4} {'peak MiB plan':>14} {'measured':>9} {'ratio':>6} "
        f"{'read MiB plan':>14} {'measured':>9} {'ratio':>6} {'s':>6}  reader"
    )
    try:
        for size in args.sizes:
            blocks = _blocks(size, args.width)
            path = root / f"state_{size:g}GB_{args.width}"
            width = ["--width", str(args.width)]
            if not path.exists():
                _run(["--save", str(path), str(blocks), *width], args.accelerator)
            for case in cases:
                report = _run(["--load", str(path), str(blocks), case, *width], args.accelerator)
                report["gigabytes"] = size
                reports.append(report)
                plan, measured = report["plan"], report["measured"]
                readers = sorted(set(report["readers"].values()))
                # A refused load reads and holds next to nothing: no ratio to its plan.
                peak_ratio, read_ratio = (
                    ("-", "-")
                    if report["refused"]
                    else (
                        f"{plan['peak'] / max(1, measured['peak']):.3f}",
                        f"{plan['read'] / max(1, measured['read']):.3f}",
                    )
                )
                print(
                    f"{case:8} {size:4g} {_mib(plan['peak']):>14} {_mib(measured['peak'])} "
                    f"{peak_ratio:>6} {_mib(plan['read']):>14} "
                    f"{_mib(measured['read'])} {read_ratio:>6} "
                    f"{report.get('seconds', 0):6.2f}  "
                    f"{', '.join(r.split(' (')[0] for r in readers)}"
                    + ("  (refused)" if report["refused"] else "")
                )
                for name, held in sorted(plan["devices"].items()):
                    got = measured["devices"].get(name)
                    if got is not None and args.accelerator:
                        print(f"{'':8} {name:>6} device MiB plan {_mib(held)} measured {_mib(got)}")
                missed += _judge(report)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1))
    for line in missed:
        print(f"MISSED {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
