"""tinax on a bucket at cloud latency, beside raw Orbax: requests and seconds per operation.

Every request to a real bucket is a round trip: 10-30 ms from a VM in its region,
50-150 ms from a laptop. This benchmark runs the tests' GCS emulator (``tests/gcs.py``:
fake-gcs-server behind a counting proxy) with every request held ``--latency-ms`` (30 by
default) before it is forwarded, and measures what a researcher does with a run there:

- a load of the model and optimizer: tinax's ``load_checkpointables`` (checksums on) of
  a ``TrainingRun`` checkpoint beside raw Orbax V1's ``load_checkpointables`` of the same
  state saved by Orbax itself, and ``load_training_checkpoint`` (all five parts);
- ``list_checkpoints`` and ``tinax ls`` of the run, ``run_table``, ``checkpoint_table``,
  ``verify`` (metadata), ``diff_table`` of two neighbours, ``scan_run`` and
  ``drift_table`` over the run;
- the listing of a run of ``--many`` checkpoints (300 by default; 1,000 for the goal
  below, whose set-up takes the emulator some ten minutes: it stores objects in time
  that grows with the number it holds);
- the explorer (``CheckpointExplorer``) on that run: how long until its listing is
  shown, and until a picked checkpoint's leaves are.

The state is a flax NNX model of 24 blocks (``demo/make_big_run.py``'s, ``--width``
wide) with optax's AdamW behind ``nnx.Optimizer``: about 1,200 leaves. The run is
written by ``TrainingRun`` (``--checkpoints`` of them, the weights moved a little at
every save) with the emulator answering at once; then every operation runs in a fresh
Python process (timed from after its imports, as a script or a notebook cell that has
imported tinax already), and the proxy counts the requests that process made.

Goals (exit status 1 if one is missed), at 30 ms a request:

- the tinax load: requests <= 1.2x and seconds <= 1.1x raw Orbax's;
- ``list_checkpoints`` and ``tinax ls``: <= 3 requests a checkpoint; the 1,000-checkpoint
  run listed in <= 3 s; ``run_table`` <= 4 requests a checkpoint;
- ``checkpoint_table`` <= 30 requests, ``verify`` <= 40, ``diff_table`` of two
  neighbours <= 150, ``scan_run`` and ``drift_table`` <= 40 a checkpoint;
- the explorer: the listing shown <= 2 s after it is made, a checkpoint opened <= 1 s.

Usage: python bench/bucket.py [--latency-ms 30] [--width 128] [--checkpoints 20]
       [--many 300] [--rounds 3] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

BUCKET = "tinax-bench"
RUN = f"gs://{BUCKET}/run"
ORBAX = f"gs://{BUCKET}/orbax"
MANY = f"gs://{BUCKET}/many"
BLOCKS = 24

# Imports every operation's process makes before it is timed (gcsfs: the gs:// extra,
# imported on a bucket's first use).
_PRELUDE = """
import json, sys, time
import gcsfs
sys.path.insert(0, {demo!r})
import importlib.util
spec = importlib.util.spec_from_file_location("big_run", {demo!r} + "/make_big_run.py")
big_run = importlib.util.module_from_spec(spec); spec.loader.exec_module(big_run)
CONFIG = dict(big_run.CONFIG, width={width}, blocks={blocks})

def abstract_state(sharded=True):
    # As a restore script builds them: the state's shapes and dtypes, each placed on
    # the process's device (nnx.eval_shape alone gives no sharding: sharded=False).
    import jax
    from flax import nnx
    model, optimizer = nnx.eval_shape(lambda: big_run.make_training(CONFIG))
    state = nnx.state(model), nnx.state(optimizer)
    if not sharded:
        return state
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device)
        if isinstance(x, jax.ShapeDtypeStruct) else x, state)

def report(seconds, **extra):
    print("RESULT " + json.dumps(dict(seconds=seconds, **extra)), flush=True)
"""

# name -> (code run after the prelude, timing itself and calling report)
_OPERATIONS: dict[str, str] = {
    "orbax load": """
from orbax.checkpoint import v1 as ocp
model, optimizer = abstract_state()
start = time.perf_counter()
ocp.load_checkpointables({orbax!r}, {{"model": model, "optimizer": optimizer}})
report(time.perf_counter() - start)
""",
    "tinax load": """
import tinax.checkpointing as tc
model, optimizer = abstract_state()
start = time.perf_counter()
tc.load_checkpointables({newest!r}, {{"model": model, "optimizer": optimizer}})
report(time.perf_counter() - start)
""",
    "orbax load, eval_shape targets": """
from orbax.checkpoint import v1 as ocp
model, optimizer = abstract_state(sharded=False)
start = time.perf_counter()
ocp.load_checkpointables({orbax!r}, {{"model": model, "optimizer": optimizer}})
report(time.perf_counter() - start)
""",
    "tinax load, eval_shape targets": """
import tinax.checkpointing as tc
model, optimizer = abstract_state(sharded=False)
start = time.perf_counter()
tc.load_checkpointables({newest!r}, {{"model": model, "optimizer": optimizer}})
report(time.perf_counter() - start)
""",
    "tinax load_training_checkpoint": """
import jax
import tinax.checkpointing as tc
model, optimizer = abstract_state()
import grain
iterator = iter(grain.MapDataset.range(10_000).batch(8).to_iter_dataset())
start = time.perf_counter()
tc.load_training_checkpoint({newest!r}, model, optimizer, jax.random.key(0),
                            {{"loss": 0.0}}, iterator)
report(time.perf_counter() - start)
""",
    "list_checkpoints": """
import tinax.explore as ex
ex.list_checkpoints  # imported before the clock starts, as in a notebook that used it
start = time.perf_counter()
rows = len(ex.list_checkpoints({run!r}))
report(time.perf_counter() - start, rows=rows)
""",
    "tinax ls": """
import io
from tinax._cli.main import main
from tinax._cli import commands  # the command's imports, as the console has made them
out = io.StringIO()
start = time.perf_counter()
status = main(["ls", {run!r}], out, io.StringIO())
report(time.perf_counter() - start, status=status, lines=out.getvalue().count("\\n"))
""",
    "run_table": """
import tinax.explore as ex
ex.run_table
start = time.perf_counter()
rows = len(ex.run_table({run!r}))
report(time.perf_counter() - start, rows=rows)
""",
    "checkpoint_table": """
import tinax.explore as ex
ex.checkpoint_table
start = time.perf_counter()
rows = len(ex.checkpoint_table({newest!r}))
report(time.perf_counter() - start, rows=rows)
""",
    "verify": """
import tinax.explore as ex
ex.verify
start = time.perf_counter()
result = ex.verify({newest!r})
report(time.perf_counter() - start, verdict=result.verdict)
""",
    "diff_table": """
import tinax.explore as ex
ex.diff_table
start = time.perf_counter()
rows = len(ex.diff_table({previous!r}, {newest!r}))
report(time.perf_counter() - start, rows=rows)
""",
    "scan_run": """
import tinax.explore as ex
ex.scan_run
start = time.perf_counter()
rows = len(ex.scan_run({run!r}))
report(time.perf_counter() - start, rows=rows)
""",
    "drift_table": """
import tinax.explore as ex
ex.drift_table
start = time.perf_counter()
rows = len(ex.drift_table({run!r}))
report(time.perf_counter() - start, rows=rows)
""",
    "explorer": """
import tinax.widgets as tw
start = time.perf_counter()
explorer = tw.CheckpointExplorer({many!r})
listed = time.perf_counter() - start
rows = len(explorer.checkpoints)
name = str(explorer.checkpoints["name"].iloc[-1])
start = time.perf_counter()
explorer.open_checkpoint(name)
opened = time.perf_counter() - start
leaves = len(explorer.leaves)
while "checking" in explorer.contents.verdict.value or not explorer.contents.verdict.value:
    time.sleep(0.01)
verdict = time.perf_counter() - start
report(listed, rows=rows, opened_s=opened, leaves=leaves, verdict_s=verdict)
""",
    "list many": """
import tinax.explore as ex
ex.list_checkpoints
start, cpu = time.perf_counter(), time.process_time()
rows = len(ex.list_checkpoints({many!r}))
report(time.perf_counter() - start, rows=rows, client_cpu_s=time.process_time() - cpu)
""",
    # The listing alone, as tinax lists a tree (``gcs_listing``: pages side by side).
    "list tree many": """
import gcsfs
from tinax._format.storage import gcs_listing
fs = gcsfs.GCSFileSystem()
start, cpu = time.perf_counter(), time.process_time()
found = gcs_listing.list_tree(fs, {many!r}[len("gs://"):], timeout=600)
report(time.perf_counter() - start, objects=len(found), client_cpu_s=time.process_time() - cpu)
""",
    # The floor of the one above, with a bare client: gcsfs lists the same tree (every
    # object, page after page) and reads every commit record, 64 at a time.
    "gcsfs many": """
import asyncio, gcsfs
fs = gcsfs.GCSFileSystem()
start, cpu = time.perf_counter(), time.process_time()
found = fs.find({many!r})
records = [f for f in found if f.endswith("/_CHECKPOINT_METADATA")]
fs.cat(records, batch_size=64)
report(
    time.perf_counter() - start,
    objects=len(found),
    records=len(records),
    client_cpu_s=time.process_time() - cpu,
)
""",
}


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _state(width: int, seed: int) -> tuple[Any, Any]:
    """The model and optimizer state, the weights moved a little by ``seed``."""
    import importlib.util

    import jax
    import numpy as np
    from flax import nnx

    spec = importlib.util.spec_from_file_location("big_run", REPO / "demo" / "make_big_run.py")
    assert spec is not None and spec.loader is not None
    big_run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(big_run)
    config = dict(big_run.CONFIG, width=width, blocks=BLOCKS)
    model, optimizer = big_run.make_training(config)
    model_state, optimizer_state = nnx.state(model), nnx.state(optimizer)
    rng = np.random.default_rng(seed)

    def moved(x: Any) -> Any:
        if getattr(x, "dtype", None) is not None and np.issubdtype(x.dtype, np.floating):
            return x + 1e-3 * rng.standard_normal(x.shape).astype(x.dtype)
        return x

    return jax.tree.map(moved, model_state), jax.tree.map(moved, optimizer_state)


def write_listing_runs(args: argparse.Namespace, data: Path) -> None:
    """The runs only listed or browsed, as the emulator's initial objects under ``data``.

    One ``TrainingRun`` checkpoint of a narrow model (the same ~1,200 leaves and the
    same files as the run's, a few MB) is saved on local disk, then hard-linked
    ``--many`` and ``--explorer-checkpoints`` times (with the ``commit_success.txt``
    Orbax writes on a bucket): uploading tens of thousands of objects one request at
    a time would take the benchmark's whole budget.
    """
    import grain
    import jax

    from tinax.checkpointing import TrainingRun

    source = data / "source"
    batches = iter(grain.MapDataset.range(1_000).batch(8).to_iter_dataset())
    with TrainingRun(source, save_every=1) as run:
        model, optimizer = _state(16, 0)
        run.save(1, model, optimizer, jax.random.key(1), {"loss": 1.0}, batches)
    checkpoint = source / "step_000001"
    (checkpoint / "commit_success.txt").write_text("Checkpoint commit was successful.\n")
    target = data / BUCKET / MANY.rsplit("/", 1)[1]
    for step in range(1, args.many + 1):
        shutil.copytree(checkpoint, target / f"step_{step:06d}", copy_function=os.link)
    shutil.rmtree(source)


def write_run(args: argparse.Namespace) -> dict[str, str]:
    """Writes the run through the emulator, and Orbax's checkpoint of the same state."""
    import grain
    import jax
    from orbax.checkpoint import v1 as ocp

    from tinax.checkpointing import TrainingRun

    batches = iter(grain.MapDataset.range(10_000).batch(8).to_iter_dataset())
    start = time.perf_counter()
    with TrainingRun(RUN, save_every=1) as run:
        for step in range(1, args.checkpoints + 1):
            model, optimizer = _state(args.width, step)
            next(batches)
            run.save(step, model, optimizer, jax.random.key(step), {"loss": 1 / step}, batches)
    steps = run.steps
    ocp.save_checkpointables(ORBAX, {"model": model, "optimizer": optimizer})
    _log(f"  wrote {len(steps)} checkpoints and Orbax's in {time.perf_counter() - start:.1f} s")
    return {
        "newest": f"{RUN}/step_{steps[-1]:06d}",
        "previous": f"{RUN}/step_{steps[-2]:06d}",
    }


def run_operation(
    name: str, args: argparse.Namespace, paths: dict[str, str], env: dict[str, str]
) -> dict[str, Any]:
    code = textwrap.dedent(_PRELUDE).format(
        demo=str(REPO / "demo"), width=args.width, blocks=BLOCKS
    ) + textwrap.dedent(_OPERATIONS[name]).format(orbax=ORBAX, run=RUN, many=MANY, **paths)
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"{name} failed:\n{result.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-ms", type=float, default=30.0)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--checkpoints", type=int, default=20)
    parser.add_argument("--many", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=[], help="operations to run (default: all)")
    parser.add_argument("--dump", type=Path, help="write each operation's requests there as JSON")
    args = parser.parse_args()

    from gcs import Emulator

    workdir = Path(tempfile.mkdtemp(prefix="tinax-bucket-"))
    _log("writing the listing runs on local disk")
    write_listing_runs(args, workdir)
    emulator = Emulator(data=str(workdir))
    emulator.start()
    env = {**os.environ, **emulator.environment(), "JAX_PLATFORMS": "cpu"}
    os.environ.update(emulator.environment())
    try:
        _log("writing the run (no latency)")
        paths = write_run(args)
        emulator.set_latency(args.latency_ms / 1000)
        names = [n for n in _OPERATIONS if not args.only or n in args.only]
        measured: dict[str, dict[str, Any]] = {}
        for name in names:
            seconds, counts, results = [], [], []
            for _ in range(args.rounds):
                before = len(emulator.requests())
                used = emulator.cpu_seconds()
                result = run_operation(name, args, paths, env)
                # What the emulator and its proxy spent serving it: where it is near the
                # operation's seconds, the emulator is the floor, not the client.
                result["server_cpu_s"] = emulator.cpu_seconds() - used
                results.append(result)
                made = emulator.requests(before)
                counts.append(len(made))
                if args.dump:
                    args.dump.mkdir(parents=True, exist_ok=True)
                    (args.dump / f"{name.replace(' ', '_')}.json").write_text(json.dumps(made))
                seconds.append(result["seconds"])
            measured[name] = {
                "requests": statistics.median(counts),
                "seconds": statistics.median(seconds),
                **{k: v for k, v in result.items() if k != "seconds"},
            }
            for extra in ("opened_s", "verdict_s", "server_cpu_s", "client_cpu_s"):
                if extra in result:
                    measured[name][extra] = statistics.median(r[extra] for r in results)
            _log(f"  {name}: {measured[name]}")
    finally:
        emulator.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return report(measured, args)


def report(measured: dict[str, dict[str, Any]], args: argparse.Namespace) -> int:
    n = args.checkpoints
    per_checkpoint = {"list_checkpoints", "tinax ls", "run_table", "scan_run", "drift_table"}
    print(
        f"\ngs:// at {args.latency_ms:.0f} ms a request; {n} checkpoints of a {BLOCKS}-block"
        f" NNX model (width {args.width}) with AdamW; medians of {args.rounds} fresh processes"
    )
    print(f"{'operation':34} {'requests':>9} {'per ckpt':>9} {'seconds':>8} {'server CPU s':>13}")
    for name, m in measured.items():
        per = f"{m['requests'] / n:.1f}" if name in per_checkpoint else ""
        print(
            f"{name:34} {m['requests']:>9.0f} {per:>9} {m['seconds']:>8.2f}"
            f" {m['server_cpu_s']:>13.2f}"
        )
    goals: list[tuple[str, float, float]] = []
    if "orbax load" in measured and "tinax load" in measured:
        orbax, ours = measured["orbax load"], measured["tinax load"]
        goals.append(("load requests vs Orbax", ours["requests"] / orbax["requests"], 1.2))
        goals.append(("load seconds vs Orbax", ours["seconds"] / orbax["seconds"], 1.1))
    for name, bound in (
        ("list_checkpoints", 3),
        ("tinax ls", 3),
        ("run_table", 4),
        ("scan_run", 40),
        ("drift_table", 40),
    ):
        if name in measured:
            goals.append((f"{name} requests a checkpoint", measured[name]["requests"] / n, bound))
    for name, bound in (("checkpoint_table", 30), ("verify", 40), ("diff_table", 150)):
        if name in measured:
            goals.append((f"{name} requests", measured[name]["requests"], bound))
    if "explorer" in measured:
        found = measured["explorer"]
        goals.append(("explorer: listing shown, s", found["seconds"], 2))
        goals.append(("explorer: a checkpoint opened, s", found["opened_s"], 1))
    if "list many" in measured:
        goals.append((f"list of {args.many} checkpoints, s", measured["list many"]["seconds"], 3))
    print(f"\n{'goal':44} {'measured':>9} {'bound':>7}")
    missed = 0
    for what, value, bound in goals:
        ok = value <= bound
        missed += not ok
        print(f"{what:44} {value:>9.2f} {bound:>7.2f}  {'ok' if ok else 'MISSED'}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
