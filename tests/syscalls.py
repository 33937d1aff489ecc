"""The file-system calls one tinax call makes on a run, counted with ``strace -f``.

The calls are measured in a fresh process that has imported tinax and made each of them
once on another run of the same shape (so imports, JIT and thread start-up are behind
them), then makes each on the measured run, one after another; only the system calls
between two markers around each count, on paths under the measured run, from every
thread. A *file open* is an ``open``/``openat`` without ``O_DIRECTORY``, a *directory
listing* an ``openat`` with it (what ``os.scandir`` and every listing start with), and a
*stat* any call that asks after a path (``stat``, ``lstat``, ``newfstatat``, ``statx``,
``access``, ``readlink``).

``python tests/syscalls.py`` prints the table of the calls below for the checkout it is
run from; ``--tinax DIR`` measures the tinax of another checkout (its ``tinax/`` and
``widgets/`` come first on the path) with this one's script, e.g. today's main in a
``git worktree`` beside a change. Needs Debian's ``strace`` (``make test`` installs it).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECKPOINTS = 5
MARK_BEGIN = "/tinax-syscalls-begin-"
MARK_END = "/tinax-syscalls-end-"
TRACED = (
    "open,openat,openat2,stat,lstat,newfstatat,statx,access,faccessat,faccessat2,"
    "readlink,readlinkat"
)
_STATS = {"stat", "lstat", "newfstatat", "statx", "access", "faccessat", "faccessat2"}
_STATS |= {"readlink", "readlinkat"}
_CALL = re.compile(r'^(?:\[pid\s+)?\d*\]?\s*(\w+)\((?:AT_FDCWD|-?\d+)?,?\s*"([^"]*)"(.*)$')

# What each measured call does, given ``root`` (the run) and ``ckpts`` (its checkpoints,
# oldest first); the worker defines ``targets`` for the load and ``elsewhere()``, a new
# directory outside the run for what a call writes.
CALLS = {
    "list_checkpoints": "ex.list_checkpoints(root)",
    "run_table": "ex.run_table(root)",
    "verify": "ex.verify(ckpts[2])",
    "diff_table": "ex.diff_table(ckpts[2], ckpts[3])",
    "drift_table": "ex.drift_table(root)",
    "scan_run": "ex.scan_run(root)",
    "checkpoint_table": "ex.checkpoint_table(ckpts[-1])",
    "read_leaf": "ex.read_leaf(ckpts[-1], 'model', \"['layers'][2]['w']\")",
    "load_training_checkpoint": "tc.load_training_checkpoint(ckpts[-1], *targets, iterator=it)",
    "compare_table": "ex.compare_table(ckpts[-1], dict(model=targets[0]))",
    "lineage": "ex.lineage(ckpts[-1])",
    "export_safetensors": "ex.export_safetensors(ckpts[-1], elsewhere() + '/m.safetensors')",
    "derive_checkpoint": "tc.derive_checkpoint(ckpts[-1], elsewhere() + '/derived')",
    "average_checkpoints": (
        "tc.average_checkpoints(ckpts[-2:], elsewhere() + '/mean', checkpointables=['model'])"
    ),
}

_WORKER = r"""
import os, sys, tempfile
import numpy as np
import jax
import grain
import tinax.explore as ex
import tinax.checkpointing as tc

sys.path.insert(0, {tests!r})
import syscalls

warm, root, *calls = sys.argv[1:]
import tinax
# The checkout asked for, not the one this runs from.
assert tinax.__file__.startswith(os.environ.get("SYSCALLS_TINAX", "")), tinax.__file__

def checkpoints(run):
    return sorted(
        (os.path.join(run, n) for n in os.listdir(run) if n.startswith("step_")),
        key=lambda p: int(p.rsplit("_", 1)[1]),
    )

state = syscalls.state(1)
targets = [tc.abstract_restore_target(state[k]) for k in ("model", "optimizer", "rng", "auxiliary")]
elsewhere = tempfile.mkdtemp  # where a call writes: outside the run, not counted
for root_ in (warm, root):
    for call in calls:
        ckpts = checkpoints(root_)
        it = iter(grain.MapDataset.range(64).to_iter_dataset())
        if root_ == root:
            os.access(syscalls.MARK_BEGIN + call, os.F_OK)
        eval(syscalls.CALLS[call], globals(), dict(root=root_, ckpts=ckpts, targets=targets, it=it))
        if root_ == root:
            os.access(syscalls.MARK_END + call, os.F_OK)
"""


def state(step: int) -> dict[str, object]:
    """A small training state: 4 layers of weights, an optimizer's moments, a key."""
    import numpy as np

    rng = np.random.default_rng(step)
    layers = [
        {
            "w": rng.standard_normal((16, 16)).astype(np.float32),
            "b": np.zeros((16,), np.float32),
        }
        for _ in range(4)
    ]
    model = {"embed": rng.standard_normal((8, 16)).astype(np.float32), "layers": layers}
    optimizer = {"count": np.int32(step), "mu": {"embed": np.zeros((8, 16), np.float32)}}
    return {
        "model": model,
        "optimizer": optimizer,
        "rng": np.zeros((2,), np.uint32),
        "auxiliary": {"loss": 1.0 / step, "learning_rate": 0.5},
    }


def write_run(root: str | os.PathLike[str], checkpoints: int = CHECKPOINTS) -> str:
    """A run of ``checkpoints`` steps under ``root``, saved by ``TrainingRun``."""
    import grain

    from tinax.checkpointing import TrainingRun

    it = iter(grain.MapDataset.range(64).to_iter_dataset())
    with TrainingRun(root, save_every=1, keep=None) as run:
        for step in range(1, checkpoints + 1):
            next(it)
            s = state(step)
            run.save(step, s["model"], s["optimizer"], s["rng"], s["auxiliary"], it)
    return os.fspath(root)


@dataclasses.dataclass
class Counts:
    """What one call asked of the file system under a run.

    Attributes:
      file_opens: Path → times opened as a file.
      listings: Path → times opened as a directory (listed).
      stats: Calls that asked after a path.
    """

    file_opens: collections.Counter[str]
    listings: collections.Counter[str]
    stats: int

    def as_json(self) -> dict[str, object]:
        return {
            "file_opens": dict(self.file_opens),
            "listings": dict(self.listings),
            "stats": self.stats,
        }

    def most_opened(self) -> tuple[str, int]:
        return self.file_opens.most_common(1)[0] if self.file_opens else ("", 0)

    def most_listed(self) -> tuple[str, int]:
        return self.listings.most_common(1)[0] if self.listings else ("", 0)


def parse(trace: str, root: str, call: str) -> Counts:
    """The calls between the markers of ``call`` in ``trace`` (``strace -f`` output),
    on paths under ``root``."""
    lines = trace.splitlines()
    begin = next(i for i, line in enumerate(lines) if f'"{MARK_BEGIN}{call}"' in line)
    end = next(i for i, line in enumerate(lines) if f'"{MARK_END}{call}"' in line)
    prefix = root.rstrip("/") + "/"
    opens: collections.Counter[str] = collections.Counter()
    listings: collections.Counter[str] = collections.Counter()
    stats = 0
    for line in lines[begin + 1 : end]:
        found = _CALL.match(line.strip())
        if found is None:
            continue
        name, path, rest = found.groups()
        if not (path == root or path.startswith(prefix)):
            continue
        if name.startswith("open"):
            (listings if "O_DIRECTORY" in rest else opens)[path] += 1
        elif name in _STATS:
            stats += 1
    return Counts(opens, listings, stats)


def count(calls: list[str], root: str, warm: str, *, tinax: str | None = None) -> dict[str, Counts]:
    """Each of ``calls`` (keys of ``CALLS``) on the run at ``root``, counted, in one
    worker process.

    Args:
      calls: Which calls, made in this order.
      root: The run measured.
      warm: A run of the same shape, for each call made once before.
      tinax: Another checkout whose tinax to measure, if not this one's.

    Raises:
      RuntimeError: If ``strace`` is missing or the worker fails (with its output).
    """
    strace = shutil.which("strace")
    if strace is None:
        raise RuntimeError("strace is not installed (make test installs Debian's strace)")
    script = _WORKER.format(tests=str(REPO / "tests"))
    env = dict(os.environ)
    if tinax is not None:
        env["PYTHONPATH"] = os.pathsep.join([tinax, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["SYSCALLS_TINAX"] = os.path.abspath(tinax)
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "trace")
        worker = os.path.join(scratch, "worker.py")
        Path(worker).write_text(script, encoding="utf-8")
        command = [strace, "-f", "-qq", "-e", f"trace={TRACED}", "-o", out]
        done = subprocess.run(
            [*command, sys.executable, worker, warm, root, *calls],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{calls} failed:\n{done.stdout}\n{done.stderr}")
        trace = Path(out).read_text(encoding="utf-8", errors="replace")
    real = os.path.realpath(root)
    return {call: parse(trace, real, call) for call in calls}


def table(counts: dict[str, Counts], checkpoints: int = CHECKPOINTS) -> str:
    """The counts as the rows of a text table."""
    rows = [
        f"{'call':26} {'file opens':>10} {'a ckpt':>6} {'max 1 file':>10} "
        f"{'listings':>8} {'a ckpt':>6} {'max 1 dir':>9} {'stats':>6}"
    ]
    for call, c in counts.items():
        opens, listed = sum(c.file_opens.values()), sum(c.listings.values())
        rows.append(
            f"{call:26} {opens:10d} {opens / checkpoints:6.1f} {c.most_opened()[1]:10d} "
            f"{listed:8d} {listed / checkpoints:6.1f} {c.most_listed()[1]:9d} {c.stats:6d}"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tinax", help="the checkout whose tinax to measure")
    parser.add_argument("--calls", nargs="*", default=list(CALLS))
    parser.add_argument("--json", action="store_true", help="the counts as JSON")
    parser.add_argument("--workdir", help="keep the two runs here (written once)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        where = Path(args.workdir or scratch)
        root, warm = where / "run", where / "warm"
        for run in (root, warm):
            if not run.exists():
                run.mkdir(parents=True)
                write_run(run)
        counts = count(args.calls, str(root), str(warm), tinax=args.tinax)
    if args.json:
        print(json.dumps({c: v.as_json() for c, v in counts.items()}, indent=1))
    else:
        print(table(counts))


if __name__ == "__main__":
    main()
