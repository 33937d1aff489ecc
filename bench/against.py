"""The local-disk benchmarks of an earlier revision beside the working tree's, round by round.

Usage::

    .venv/bin/python bench/against.py [--base REV] [--rounds N] [--scripts head|own]
        [--bench save_load reads explorer_scale run_timeline] [--workdir DIR]

It checks out ``--base`` (a revision, 6814b7c by default) into a detached worktree in
a temporary directory, then runs each benchmark named by ``--bench`` (all four by
default) from that checkout and from the working tree, alternating base and head
(base first in odd rounds, head first in even ones) over ``--rounds`` rounds (3). Both
sides run the working tree's benchmark scripts, so that they measure the same thing,
each against its own library (``--scripts own``: the base runs its checkout's copies):
the base with its checkout first on ``PYTHONPATH`` and this checkout's ``.venv`` when
every pin of the base's ``requirements.lock`` is in this one's (the base's own ``make
install`` in its worktree otherwise). The benchmarks run with options that keep each run to a minute or
two on a 2-core machine (``BENCHMARKS`` below says which); the checkpoints they write
are kept per side between rounds (the ones ``bench/explorer_scale.py`` writes with
Orbax alone are shared), so only the first round pays for writing them.

For every figure both sides print, it prints the medians over the rounds of the base
and of the head, head/base, and whether that is better or worse: lower is better for
seconds, higher for throughput and for the ``of cat`` shares. The noise of a figure is
the larger of the two sides' spreads between rounds ((max - min) / median, at least
5%); a figure counts as worse when its median moved the wrong way by more than that
noise and every head round is worse than every base round. The load average is
printed at the start and the end, and beside each run: the machine may be shared. A
figure measured against a floor in the same run (``of cat``, ``x floor``) follows the
machine's load more closely than seconds do, but the floor varies too: read it beside
the seconds, and beside the figures of what both sides share (``dd``, raw Orbax). Each run's own output is kept in ``--workdir`` (a temporary
directory, removed at the end, unless given). Exits 1 when a figure got worse.

With few rounds on a busy machine (a load average above its cores) a side that ran
its rounds while the load peaked can look worse beyond the noise when it is not:
rerun the benchmarks that flagged a figure, with more rounds or on a quieter machine,
before looking for a cause.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A figure's values, by its name: (value, True when higher is better).
Figures = dict[str, tuple[float, bool]]


def _save_load(out: str) -> Figures:
    figures: Figures = {}
    workload = ""
    for line in out.splitlines():
        if m := re.match(r"^\((\w)\) [\d,]+ arrays: ", line):
            workload = m.group(1)
        elif m := re.match(r"^(tinax|no-sums|zstd|orbax)\s+(save|load)\s+\d+\s+(\d+)\s", line):
            side, op, median = m.groups()
            figures[f"({workload}) {side} {op} MiB/s"] = (float(median), True)
        elif m := re.match(r"^\s+(\(\w\) tinax/[\w-]+ (?:save|load))\s+([\d.]+)\s", line):
            figures[m.group(1)] = (float(m.group(2)), True)
        elif m := re.search(r"recording (\d+) ms .* checking (\d+) ms", line):
            figures[f"({workload}) recording checksums ms"] = (float(m.group(1)), False)
            figures[f"({workload}) checking checksums ms"] = (float(m.group(2)), False)
        elif m := re.search(r"returns after (\d+) ms .* committed after (\d+) ms", line):
            figures["save_training_checkpoint returns, ms"] = (float(m.group(1)), False)
            figures["save_training_checkpoint committed, ms"] = (float(m.group(2)), False)
        elif m := re.search(
            r"save ([\d.]+) ms vs ([\d.]+) ms, load ([\d.]+) ms vs ([\d.]+) ms", line
        ):
            for name, value in zip(
                ("tinax save", "orbax save", "tinax load", "orbax load"), m.groups(), strict=True
            ):
                figures[f"fixed cost per call, {name} ms"] = (float(value), False)
        elif m := re.search(r"load preflight on .*: (\d+) ms", line):
            figures["(b) load preflight ms"] = (float(m.group(1)), False)
        elif m := re.match(r"^save median\s+(\d+)\s+(\d+)\s", line):
            figures["2-process save MiB/s"] = (float(m.group(1)), True)
            figures["1-process save MiB/s"] = (float(m.group(2)), True)
        elif m := re.search(r"^dd, .* median (\d+) MiB/s", line):
            figures["dd MiB/s"] = (float(m.group(1)), True)
    return figures


def _reads(out: str) -> Figures:
    figures: Figures = {}
    for line in out.splitlines():
        if m := re.match(r"^\s+cat\s+([\d.]+) s", line):
            figures["cat s"] = (float(m.group(1)), False)
        elif m := re.match(
            r"^\s+(verify|diff_table|read_leaf)\b.*?([\d.]+) s\s+\d+ MiB/s\s+([\d.]+) of cat",
            line,
        ):
            name = m.group(1)
            figures[f"{name} s"] = (float(m.group(2)), False)
            figures[f"{name} of cat"] = (float(m.group(3)), True)
        elif m := re.search(r"against live state, .*?: ([\d.]+) s", line):
            figures["diff_table against live state s"] = (float(m.group(1)), False)
        elif m := re.search(r"([\d.]+) ms with the walk kept, ([\d.]+) ms walking", line):
            figures["read_leaf of a wide store, walk kept, ms"] = (float(m.group(1)), False)
            figures["read_leaf of a wide store, walking, ms"] = (float(m.group(2)), False)
    return figures


def _explorer_scale(out: str) -> Figures:
    figures: Figures = {}
    for line in out.splitlines():
        m = re.match(r"^(.*?)\s+([\d.]+)s\s+([\d.]+)s\s+([\d.]+)x\s", line)
        if m:
            name = m.group(1).strip()
            figures[f"{name}, s"] = (float(m.group(2)), False)
            figures[f"{name}, x floor"] = (float(m.group(4)), False)
    return figures


def _run_timeline(out: str) -> Figures:
    figures: Figures = {}
    for line in out.splitlines():
        if m := re.search(r"fresh process: ([\d.]+) s \(import of tinax.explore ([\d.]+) s", line):
            figures["run_table s"] = (float(m.group(1)), False)
            figures["import tinax.explore s"] = (float(m.group(2)), False)
            if both := re.search(r"the two together ([\d.]+) s", line):
                figures["import and run_table s"] = (float(both.group(1)), False)
        elif m := re.search(
            r"files (evicted|cached): ([\d.]+) s.*ratio ([\d.]+).*second call (\d+) ms", line
        ):
            cached = m.group(1)
            figures[f"drift_table, files {cached}, s"] = (float(m.group(2)), False)
            figures[f"drift_table, files {cached}, of cat"] = (float(m.group(3)), True)
            figures[f"drift_table second call, files {cached}, ms"] = (float(m.group(4)), False)
    return figures


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One of the project's benchmarks, as this script runs it."""

    script: str
    # Its options, split at spaces; {work} is the side's directory for it.
    options: str
    parse: Callable[[str], Figures]
    # The checkpoints it writes come from Orbax alone, so both sides can read the same.
    shared_work: bool = False


BENCHMARKS = {
    "save_load": Benchmark(
        "save_load.py",
        "--gib 0.125 --rounds 2 --small-rounds 1 --small-arrays 1000 --skip-many "
        "--dir {work} --demo-run {work}/demo_run",
        _save_load,
    ),
    "reads": Benchmark("reads.py", "--rounds 2 --wide 2000 --workdir {work}", _reads),
    "explorer_scale": Benchmark(
        "explorer_scale.py",
        "--checkpoints 300 --blocks 300 --repeats 3 --workdir {work}",
        _explorer_scale,
        shared_work=True,
    ),
    "run_timeline": Benchmark("run_timeline.py", "--workdir {work}", _run_timeline),
}


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def _git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def _pins(lock: str) -> set[str]:
    return {line.split()[0] for line in lock.splitlines() if re.match(r"^[\w.-]+==", line)}


def _base_python(rev: str, checkout: Path) -> tuple[Path, dict[str, str]]:
    """The interpreter that runs the base, and what its environment adds."""
    head_lock = (REPO / "requirements.lock").read_text()
    base_lock = _git("show", f"{rev}:requirements.lock")
    missing = _pins(base_lock) - _pins(head_lock)
    if missing:
        print(
            f"the base pins what this checkout lacks ({', '.join(sorted(missing))}): "
            f"make install in {checkout}"
        )
        subprocess.run(["make", "install"], cwd=checkout, check=True)
        return checkout / ".venv" / "bin" / "python", {}
    # This checkout's .venv holds tinax as an editable install of the working tree;
    # the base's checkout, first on the path, is found before it. The editable install
    # maps tinax.widgets to the top-level widgets/ folder: the base's gets a link there.
    (checkout / "tinax" / "widgets").symlink_to("../widgets")
    return Path(sys.executable), {"PYTHONPATH": str(checkout)}


def _run(
    name: str, side: str, scripts: Path, python: Path, env: dict[str, str], work: Path
) -> Figures:
    """One run of benchmark ``name``, its script taken from ``scripts``; its figures.

    It runs in ``work``, never in a checkout, whose ``tinax`` a ``python -c`` would
    import first.
    """
    bench = BENCHMARKS[name]
    directory = work / ("shared" if bench.shared_work else side) / name
    directory.mkdir(parents=True, exist_ok=True)
    options = [o.format(work=directory) for o in bench.options.split()]
    before = _load()
    start = time.perf_counter()
    done = subprocess.run(
        [str(python), str(scripts / "bench" / bench.script), *options],
        cwd=work,
        env={**os.environ, "JAX_PLATFORMS": "cpu", **env},
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    log = work / "logs" / f"{name}-{side}-{len(list((work / 'logs').glob(f'{name}-{side}-*')))}.txt"
    log.write_text(done.stdout + "\n--- stderr\n" + done.stderr)
    figures = bench.parse(done.stdout)
    # The benchmarks exit 1 when a goal of their own is missed; that is no failure here.
    status = "" if done.returncode in (0, 1) and figures else f" FAILED (exit {done.returncode})"
    print(
        f"  {name:15} {side:5} {seconds:6.0f} s, {len(figures)} figures; {before}{status}",
        flush=True,
    )
    if status:
        print("    " + "\n    ".join((done.stdout + done.stderr).splitlines()[-15:]))
    return figures


def _spread(values: list[float]) -> float:
    median = statistics.median(values)
    return (max(values) - min(values)) / median if median else 0.0


def report(name: str, base: list[Figures], head: list[Figures]) -> list[str]:
    """Prints one benchmark's table; returns the figures that got worse beyond the noise."""
    names = [f for f in base[0] if all(f in r for r in base + head)]
    if not names:
        print(f"\n{name}: no figure printed by both sides")
        return []
    width = max(len(f) for f in names)
    print(f"\n{name} (medians of {len(base)} rounds)")
    print(f"  {'figure':<{width}}  {'base':>9}  {'head':>9}  {'head/base':>9}  {'noise':>6}")
    worse = []
    for figure in names:
        higher_better = base[0][figure][1]
        b = [r[figure][0] for r in base]
        h = [r[figure][0] for r in head]
        mb, mh = statistics.median(b), statistics.median(h)
        ratio = mh / mb if mb else float("nan")
        # At least 5%: figures printed to one or two digits look steady when they are not.
        noise = max(_spread(b), _spread(h), 0.05)
        change = (mb / mh if mh else float("inf")) if higher_better else ratio
        separated = min(h) > max(b) if not higher_better else max(h) < min(b)
        if change > 1 + noise and separated and len(b) > 1:
            verdict = "WORSE"
            worse.append(f"{name}: {figure}")
        elif (
            change < 1 / (1 + noise)
            and len(b) > 1
            and (max(h) < min(b) if not higher_better else min(h) > max(b))
        ):
            verdict = "better"
        else:
            verdict = ""
        print(
            f"  {figure:<{width}}  {mb:>9.4g}  {mh:>9.4g}  {ratio:>9.2f}  "
            f"{noise * 100:>5.0f}%  {verdict}"
        )
    return worse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="6814b7c", help="the revision to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bench", nargs="+", choices=sorted(BENCHMARKS), default=list(BENCHMARKS))
    parser.add_argument(
        "--scripts",
        choices=("head", "own"),
        default="head",
        help="whose benchmark scripts the base runs: the working tree's, or its own",
    )
    parser.add_argument("--workdir", type=Path, help="keep the checkpoints and outputs here")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    rev = _git("rev-parse", "--verify", f"{args.base}^{{commit}}")
    head = _git("rev-parse", "HEAD")
    # What the head runs: the library and the benchmarks' code (not their results).
    changed = _git("status", "--porcelain", "--", "tinax", "widgets", "bench/*.py")
    dirty = " with changes not committed" if changed else ""
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tinax-against-"))
    (work / "logs").mkdir(parents=True, exist_ok=True)
    checkout = Path(tempfile.mkdtemp(prefix="tinax-base-")) / "tree"
    print(
        f"base {rev[:12]} against head {head[:12]}{dirty}, {args.rounds} rounds, "
        f"benchmarks: {', '.join(args.bench)}"
    )
    print(f"at start ({time.strftime('%Y-%m-%d %H:%M %Z')}): {_load()}", flush=True)
    _git("worktree", "add", "--detach", str(checkout), rev)
    try:
        base_python, base_env = _base_python(rev, checkout)
        sides = {
            "base": (checkout if args.scripts == "own" else REPO, base_python, base_env),
            "head": (REPO, Path(sys.executable), {}),
        }
        results: dict[str, dict[str, list[Figures]]] = {
            name: {"base": [], "head": []} for name in args.bench
        }
        for round_ in range(args.rounds):
            order = ["base", "head"] if round_ % 2 == 0 else ["head", "base"]
            print(f"round {round_ + 1} of {args.rounds}", flush=True)
            for name in args.bench:
                for side in order:
                    root, python, env = sides[side]
                    results[name][side].append(_run(name, side, root, python, env, work))
    finally:
        _git("worktree", "remove", "--force", str(checkout))
        shutil.rmtree(checkout.parent, ignore_errors=True)
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nat end ({time.strftime('%Y-%m-%d %H:%M %Z')}): {_load()}")
    worse: list[str] = []
    for name in args.bench:
        base_runs = [r for r in results[name]["base"] if r]
        head_runs = [r for r in results[name]["head"] if r]
        if base_runs and head_runs:
            worse += report(name, base_runs, head_runs)
    print()
    if worse:
        print(f"worse than the base beyond the noise between rounds ({len(worse)}):")
        print("  " + "\n  ".join(worse))
    else:
        print("no figure worse than the base beyond the noise between rounds")
    print(json.dumps({"base": rev, "head": head, "worse": worse}))
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
