"""The explorer at scale: a run of 1,000 checkpoints and a checkpoint of 50,000 leaves.

Run with ``.venv/bin/python bench/explorer_scale.py --workdir /tmp/tinax-scale`` (``make
bench`` runs it too). It writes, with Orbax itself, a run of 1,000 one-leaf checkpoints
(``save_pytree``, ``step_000000`` …) and one checkpoint of 50,000 leaves (a model of
1,190 blocks of 14 arrays, an Adam-like optimizer state holding two copies of it, and
a few scalars), then times what a person waits for in the explorer, each beside its
floor measured in the same run:

- listing the run (``list_checkpoints``, nothing cached) against a plain ``os.scandir``
  walk of the run's files;
- ``CheckpointExplorer(run)`` shown (built, listed, its first page drawn) against the
  same walk;
- opening the 50,000-leaf checkpoint in the explorer (until its leaves' keys are
  shown; their shapes and sizes follow from a background thread, timed apart)
  against ``json.loads`` of its largest ``_METADATA``;
- sorting its leaf table by size, filtering its keys, jumping to its last page and
  expanding the largest subtree of its tree, each against the pandas operation under it;
- labelling every one of its keys in 30 characters, as ``tinax ls`` does, against
  sorting them by ``natural_key``.

Writing takes a few minutes the first time; ``--workdir DIR`` keeps the checkpoints
and reuses them. Exits 1 if a goal is missed.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

AdamState = collections.namedtuple("AdamState", ["count", "mu", "nu"])

RUN_CHECKPOINTS = 1_000
BLOCKS = 1_190  # 14 arrays each, three copies (model, mu, nu): 49,980 arrays
SCALARS = 20


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _block(i: int) -> dict[str, Any]:
    def dense(n_in: int, n_out: int) -> dict[str, np.ndarray]:
        return {
            "kernel": np.full((n_in, n_out), i, np.float32),
            "bias": np.zeros((n_out,), np.float32),
        }

    return {
        "attention": {name: dense(8, 8) for name in ("query", "key", "value", "out")},
        "mlp": {"up": dense(8, 32), "down": dense(32, 8)},
        "norm": {"scale": np.ones((8,), np.float32), "bias": np.zeros((8,), np.float32)},
    }


def _model(blocks: int) -> dict[str, Any]:
    return {f"block_{i:04d}": _block(i) for i in range(blocks)}


def write_run(root: Path, count: int) -> Path:
    """``count`` one-leaf checkpoints written by Orbax's ``save_pytree``."""
    from orbax.checkpoint import v1 as ocp

    done = root / "done"
    if done.is_file() and done.read_text() == str(count):
        _log(f"  reusing {root}")
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    start = time.perf_counter()
    for step in range(count):
        ocp.save_pytree(root / f"step_{step:06d}", {"w": np.full((4,), step, np.float32)})
        if step % 100 == 99:
            _log(f"  {step + 1} checkpoints in {time.perf_counter() - start:.0f} s")
    done.write_text(str(count))
    return root


def write_wide(path: Path, blocks: int) -> Path:
    """One checkpoint: ``model``, an Adam-like ``optimizer`` state, and ``auxiliary`` scalars."""
    from orbax.checkpoint import v1 as ocp

    if (path / "_CHECKPOINT_METADATA").is_file():
        _log(f"  reusing {path}")
        return path
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    model = _model(blocks)
    # Orbax takes a mapping at the top of a checkpointable; optax states are tuples below it.
    optimizer = {
        "opt_state": (AdamState(np.array(7, np.int32), _model(blocks), _model(blocks)), ())
    }
    metrics = {f"metric_{i:02d}": float(i) for i in range(SCALARS)}
    ocp.save_checkpointables(path, {"model": model, "optimizer": optimizer, "auxiliary": metrics})
    _log(f"  wrote {path} in {time.perf_counter() - start:.0f} s")
    return path


def _best(call: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def _median(call: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _scandir_walk(root: Path) -> int:
    """Every entry under ``root``, stat'ed without following links: the listing's floor."""
    count = 0
    stack = [str(root)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                entry.stat(follow_symlinks=False)
                count += 1
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return count


# A fresh process, as a person starting a notebook or a script has: the imports are
# timed apart, then the first call (nothing listed, parsed or cached before it), beside
# the os.scandir walk of the same run made in the same process after it. What is timed:
# ``listing``, the first ``list_checkpoints(run)`` (deep: every checkpoint's metadata
# and array metadata read, as its default does); ``explorer``, ``CheckpointExplorer(run)``
# built and its first page drawn (its deep check of the run goes on in the background);
# ``open``, in an explorer whose background check has ended, ``open_checkpoint`` until
# its leaves' keys are shown, the checkpoint's metadata parsed afresh. The operating
# system's file cache is warm in every round (the run was just written or listed).
_FRESH_PROBE = r"""
import json, os, sys, time
start = time.perf_counter()
what, run = sys.argv[1:3]
if what == "listing":
    import tinax.explore as ex
    from tinax.explore import toolkit
else:
    from tinax.widgets import CheckpointExplorer
imported = time.perf_counter() - start
start = time.perf_counter()
if what == "listing":
    table = ex.list_checkpoints(run)
    assert (table["status"] == "complete").all(), table["status"].value_counts()
    rows = len(table)
elif what == "explorer":
    explorer = CheckpointExplorer(run)
    rows = len(explorer.checkpoints)
else:
    explorer = CheckpointExplorer(run)
    explorer.wait(300)
    # Opening the checkpoint parses its metadata afresh (nothing is kept by the process).
    start = time.perf_counter()
    explorer.open_checkpoint(sys.argv[3])
    rows = len(explorer.leaves)
seconds = time.perf_counter() - start
if what != "listing":
    explorer.wait(300)  # its background check ended: the walk does not run beside it
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[4])))
from explorer_scale import _scandir_walk
start = time.perf_counter()
_scandir_walk(run)
walk = time.perf_counter() - start
if what != "listing":
    explorer.close()
print(json.dumps({"imports": imported, "seconds": seconds, "walk": walk, "rows": rows}))
"""


def fresh(what: str, run: Path, checkpoint: str = "") -> dict[str, Any]:
    """``_FRESH_PROBE`` of ``what`` (``listing``, ``explorer`` or ``open``) in a new process."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", _FRESH_PROBE, what, str(run), checkpoint, __file__],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _largest_metadata(checkpoint: Path) -> Path:
    return max(checkpoint.glob("*/_METADATA"), key=lambda p: p.stat().st_size)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=RUN_CHECKPOINTS)
    parser.add_argument("--blocks", type=int, default=BLOCKS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", type=Path, help="keep (and reuse) the checkpoints here")
    args = parser.parse_args()

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tinax-bench-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        _log(f"writing checkpoints under {workdir}")
        run = write_run(workdir / f"run_{args.checkpoints}", args.checkpoints)
        wide_run = workdir / f"wide_{args.blocks}"
        wide = write_wide(wide_run / "step_000001", args.blocks)
        return _measure(run, wide_run, wide, args.repeats)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def _quiet(explorer: Any) -> None:
    """Lets the explorer's background work finish, so that it does not slow the next timing."""
    explorer.wait(300)


def _measure(run: Path, wide_run: Path, wide: Path, repeats: int) -> int:
    from tinax.widgets import CheckpointExplorer

    import tinax.explore as ex
    from tinax.explore import display, toolkit

    results: list[tuple[str, float, float, str, float]] = []

    def row(measure: str, ours: float, floor: float, floor_name: str, goal: float) -> None:
        results.append((measure, ours, floor, floor_name, goal))

    _log("timing the run's listing, first call in a fresh process")
    probes = [fresh("listing", run) for _ in range(repeats)]
    row(
        f"list_checkpoints, first call in a fresh process ({probes[0]['rows']:,} checkpoints)",
        statistics.median(p["seconds"] for p in probes),
        statistics.median(p["walk"] for p in probes),
        "os.scandir walk",
        0.5,
    )
    row(
        "  (import tinax.explore before it)",
        statistics.median(p["imports"] for p in probes),
        statistics.median(p["walk"] for p in probes),
        "os.scandir walk",
        math.inf,
    )

    _log("timing the run's listing")
    walks, quick, deep_cold, deep_warm = [], [], [], []
    for _ in range(repeats):  # Interleaved, so that load on the machine hits all alike.
        walks.append(_best(lambda: _scandir_walk(run), 1))
        quick.append(
            _best(lambda: ex.list_checkpoints(run, cache=toolkit.ListingCache(), deep=False), 1)
        )
        cache = toolkit.ListingCache()
        deep_cold.append(_best(lambda cache=cache: ex.list_checkpoints(run, cache=cache), 1))
        deep_warm.append(_best(lambda cache=cache: ex.list_checkpoints(run, cache=cache), 1))
    walk = statistics.median(walks)
    count = len(ex.list_checkpoints(run, deep=False))
    row(
        f"list_checkpoints(deep=False), {count:,} checkpoints",
        statistics.median(quick),
        walk,
        "os.scandir walk",
        0.3,
    )
    row(
        "list_checkpoints, every checkpoint read (no verdict kept)",
        statistics.median(deep_cold),
        walk,
        "os.scandir walk",
        math.inf,
    )
    row(
        "list_checkpoints, verdicts kept from a first listing",
        statistics.median(deep_warm),
        walk,
        "os.scandir walk",
        math.inf,
    )

    _log("timing the explorer on the run, in a fresh process")
    probes = [fresh("explorer", run) for _ in range(repeats)]
    row(
        f"CheckpointExplorer shown, {count:,} checkpoints, in a fresh process",
        statistics.median(p["seconds"] for p in probes),
        statistics.median(p["walk"] for p in probes),
        "os.scandir walk",
        0.5,
    )
    row(
        "  (import tinax.widgets before it)",
        statistics.median(p["imports"] for p in probes),
        statistics.median(p["walk"] for p in probes),
        "os.scandir walk",
        math.inf,
    )
    _log("timing the 50,000-leaf open in a fresh process")
    probes = [fresh("open", wide_run, wide.name) for _ in range(repeats)]
    row(
        f"open the {probes[0]['rows']:,}-leaf checkpoint, in a fresh process",
        statistics.median(p["seconds"] for p in probes),
        statistics.median(
            _best(lambda: json.loads(_largest_metadata(wide).read_bytes()), 1)
            for _ in range(repeats)
        ),
        "json.loads of its largest _METADATA",
        0.5,
    )

    _log("timing the explorer on the run")
    shown, walks = [], []
    for _ in range(repeats):
        walks.append(_best(lambda: _scandir_walk(run), 1))
        start = time.perf_counter()
        explorer = CheckpointExplorer(run)
        shown.append(time.perf_counter() - start)
        _quiet(explorer)
        explorer.close()
    explorer = CheckpointExplorer(run)
    _quiet(explorer)
    explorer.open_checkpoint(explorer.checkpoints["name"].iloc[-1])
    explorer.open_leaf("state", "['w']")
    _quiet(explorer)
    histories = []
    for _ in range(max(1, repeats // 2)):
        start = time.perf_counter()
        explorer.show_history()
        _quiet(explorer)
        histories.append(time.perf_counter() - start)
    assert len(explorer.history) == count and (explorer.history["error"] == "").all()
    explorer.close()
    row(
        f"CheckpointExplorer shown again, {count:,} checkpoints (verdicts kept)",
        statistics.median(shown),
        statistics.median(walks),
        "os.scandir walk",
        0.5,
    )

    row(
        f"one leaf across the run: {count:,} checkpoints read, plotted",
        statistics.median(histories),
        statistics.median(walks),
        "os.scandir walk",
        math.inf,
    )

    _log("timing the 50,000-leaf checkpoint")
    metadata = _largest_metadata(wide)
    every_metadata = sorted(wide.glob("*/_METADATA"))
    opens, filled, floors, all_floors = [], [], [], []
    explorer = None
    for _ in range(repeats):
        floors.append(_best(lambda: json.loads(metadata.read_bytes()), 1))
        all_floors.append(_best(lambda: [json.loads(p.read_bytes()) for p in every_metadata], 1))
        explorer = CheckpointExplorer(wide_run)
        _quiet(explorer)
        start = time.perf_counter()
        explorer.open_checkpoint(wide.name)
        opens.append(time.perf_counter() - start)
        while explorer.filling:  # shapes, dtypes and sizes being read in the background
            time.sleep(0.002)
        filled.append(time.perf_counter() - start)
        _quiet(explorer)
    assert explorer is not None
    leaves = explorer.leaves
    row(
        f"open a {len(leaves):,}-leaf checkpoint in the explorer",
        statistics.median(opens),
        statistics.median(floors),
        f"json.loads of its largest _METADATA ({metadata.stat().st_size / 2**20:.1f} MiB)",
        0.5,
    )
    row(
        "  (the same open)",
        statistics.median(opens),
        statistics.median(all_floors),
        "json.loads of every _METADATA",
        math.inf,
    )
    row(
        "  its shapes, dtypes and sizes shown too",
        statistics.median(filled),
        statistics.median(floors),
        "json.loads of its largest _METADATA",
        math.inf,
    )

    # `tinax ls` labels every row it prints (the widgets only the rows in view).
    every_key, owners = list(leaves["key"]), list(leaves["checkpointable"])
    labels, label_floors = [], []
    for _ in range(repeats):
        label_floors.append(_best(lambda: sorted(every_key, key=display.natural_key), 1))
        labels.append(
            _best(lambda: display.display_keys(every_key, width=30, checkpointables=owners), 1)
        )
    row(
        f"label all {len(every_key):,} keys in 30 characters (tinax ls)",
        statistics.median(labels),
        statistics.median(label_floors),
        "sorting them by natural_key",
        1.0,
    )

    view = explorer.leaf_view
    sorts, sort_floors = [], []
    for i in range(repeats):
        descending = i % 2 == 0
        sort_floors.append(_best(lambda: leaves.sort_values("nbytes", ascending=False), 1))
        sorts.append(_best(lambda d=descending: view.sort_by("nbytes", ascending=not d), 1))
    row(
        "sort its leaf table by size",
        statistics.median(sorts),
        statistics.median(sort_floors),
        "DataFrame.sort_values",
        0.5,
    )
    view.sort_by(None)

    filters, filter_floors = [], []
    for i in range(repeats):
        text = f"block_{(i * 97) % 1000:04d}"
        filter_floors.append(
            _best(lambda t=text: leaves[leaves["key"].str.contains(t, case=False, regex=False)], 1)
        )
        filters.append(_best(lambda t=text: setattr(explorer.contents.key_filter, "value", t), 1))
    row(
        "filter its keys",
        statistics.median(filters),
        statistics.median(filter_floors),
        "Series.str.contains",
        0.5,
    )
    explorer.contents.key_filter.value = ""

    jumps, jump_floors = [], []
    for i in range(repeats):
        page = view.page_count - i
        start_row = (page - 1) * view.page_size
        jump_floors.append(
            _best(lambda s=start_row: leaves.iloc[s : s + view.page_size].to_dict("records"), 1)
        )
        jumps.append(_best(lambda p=page: view.jump(p), 1))
    row(
        f"jump to a page ({view.page_count:,} pages)",
        statistics.median(jumps),
        statistics.median(jump_floors),
        "DataFrame.iloc of that page",
        0.5,
    )

    tree = explorer.tree_view
    expands, expand_floors = [], []
    keys = leaves.loc[leaves["checkpointable"] == "optimizer", "key"]
    for _ in range(repeats):
        expand_floors.append(
            _best(lambda: keys.str.extract(r"^(\[[^\]]*\])", expand=False).value_counts(), 1)
        )
        tree.show(leaves)  # every subtree closed, nothing worked out
        start = time.perf_counter()
        for key in ("", "['opt_state']", "['opt_state'][0]", "['opt_state'][0]['mu']"):
            tree.toggle(tree.tree.find("optimizer", key))
        expands.append(time.perf_counter() - start)
    opened = tree.tree.find("optimizer", "['opt_state'][0]['mu']")
    row(
        f"open the tree down to {len(tree.tree.children(opened)):,} blocks (4 clicks)",
        statistics.median(expands),
        statistics.median(expand_floors),
        f"first key part of {len(keys):,} keys, counted",
        0.5,
    )
    explorer.close()

    width = max(len(r[0]) for r in results)
    print(f"{'measure':<{width}}  {'explorer':>9}  {'floor':>9}  {'ratio':>7}  floor is; goal")
    missed = False
    for measure, ours, floor, floor_name, goal in results:
        verdict = "(information)"
        if math.isfinite(goal):
            met = ours <= goal
            missed |= not met
            verdict = f"<= {goal:.1f} s {'met' if met else 'MISSED'}"
        print(
            f"{measure:<{width}}  {ours:>8.3f}s  {floor:>8.3f}s  {ours / floor:>6.1f}x  "
            f"{floor_name}; {verdict}"
        )
    return 1 if missed else 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.exit(main())
