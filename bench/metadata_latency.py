"""tinax's reads of a run where every metadata operation costs a round trip, beside the
tinax of another commit (today's main before the opened checkpoint travelled: 17e8a15).

Where many users keep their runs (NFS or Filestore, Lustre, a bucket mounted with
gcsfuse) each open, listing and stat of a file is a round trip of 1-30 ms. This bench
puts a run of ``TrainingRun`` checkpoints behind a small interposed file system: a
shared library built here with ``gcc`` and preloaded (``LD_PRELOAD``) into each reading
process, which holds every ``open``, ``opendir``, ``stat`` (and ``lstat``, ``fstatat``,
``statx``, ``access``, ``readlink``) of a path under the run ``--latency-ms`` (2) before
passing it on: Python's and tensorstore's alike (the count of calls it held is checked
against ``strace``'s in tests/test_syscalls.py's way). Nothing is held elsewhere: the
reading process's imports and its own files cost what they cost.

Each call (``list_checkpoints``, ``verify``, ``diff_table`` of neighbours,
``drift_table``, ``load_training_checkpoint`` of the newest, ``run_table``,
``scan_run``) runs in a fresh process, made once first on another run of the same
shape (imports and start-up behind it), then timed on the slowed run; ``--repeats``
times each, the median shown, for this checkout and for ``--base`` (checked out in a
``git worktree`` of its own, its ``tinax`` first on the path) in the same run. Exits 1
if a call is slower here than there by more than 10 %.

    .venv/bin/python bench/metadata_latency.py [--latency-ms 2] [--base 17e8a15]
        [--repeats 3] [--checkpoints 5] [--calls list_checkpoints verify ...]

Needs ``gcc`` and ``git``; the run is written by this checkout's tinax.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import syscalls  # noqa: E402  (tests/syscalls.py: the run and the calls it measures)

CALLS = (
    "list_checkpoints",
    "verify",
    "diff_table",
    "drift_table",
    "load_training_checkpoint",
    "run_table",
    "scan_run",
)

# The interposed file system: each metadata operation on a path under SLOWFS_ROOT
# waits SLOWFS_DELAY_US first.
_SHIM = r"""
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *root;
static size_t root_length;
static long delay_ns = -1;

static void hold(const char *path) {
    if (delay_ns < 0) {
        root = getenv("SLOWFS_ROOT");
        root_length = root ? strlen(root) : 0;
        const char *us = getenv("SLOWFS_DELAY_US");
        delay_ns = (us ? atol(us) : 2000) * 1000L;
    }
    if (!root || !path || strncmp(path, root, root_length) != 0) return;
    struct timespec wait = {delay_ns / 1000000000L, delay_ns % 1000000000L};
    nanosleep(&wait, NULL);
}

#define NEXT(name) static __typeof__(name) *next; if (!next) next = dlsym(RTLD_NEXT, #name)
#define MODE(flags) mode_t mode = 0; \
    if ((flags) & (O_CREAT | O_TMPFILE)) { va_list a; va_start(a, flags); \
    mode = va_arg(a, int); va_end(a); }

int open(const char *p, int f, ...) { MODE(f); hold(p); NEXT(open); return next(p, f, mode); }
int open64(const char *p, int f, ...) { MODE(f); hold(p); NEXT(open64); return next(p, f, mode); }
int openat(int d, const char *p, int f, ...) {
    MODE(f); hold(p); NEXT(openat); return next(d, p, f, mode); }
int openat64(int d, const char *p, int f, ...) {
    MODE(f); hold(p); NEXT(openat64); return next(d, p, f, mode); }
int stat(const char *p, struct stat *s) { hold(p); NEXT(stat); return next(p, s); }
int stat64(const char *p, struct stat64 *s) { hold(p); NEXT(stat64); return next(p, s); }
int lstat(const char *p, struct stat *s) { hold(p); NEXT(lstat); return next(p, s); }
int lstat64(const char *p, struct stat64 *s) { hold(p); NEXT(lstat64); return next(p, s); }
int fstatat(int d, const char *p, struct stat *s, int f) {
    hold(p); NEXT(fstatat); return next(d, p, s, f); }
int fstatat64(int d, const char *p, struct stat64 *s, int f) {
    hold(p); NEXT(fstatat64); return next(d, p, s, f); }
int statx(int d, const char *p, int f, unsigned m, struct statx *s) {
    hold(p); NEXT(statx); return next(d, p, f, m, s); }
int access(const char *p, int m) { hold(p); NEXT(access); return next(p, m); }
int faccessat(int d, const char *p, int m, int f) {
    hold(p); NEXT(faccessat); return next(d, p, m, f); }
ssize_t readlink(const char *p, char *b, size_t n) {
    hold(p); NEXT(readlink); return next(p, b, n); }
DIR *opendir(const char *p) { hold(p); NEXT(opendir); return next(p); }
"""

_WORKER = r"""
import os, sys, time
import grain
import tinax.explore as ex
import tinax.checkpointing as tc

sys.path.insert(0, {tests!r})
import syscalls

warm, root, call = sys.argv[1:4]

def checkpoints(run):
    return sorted(
        (os.path.join(run, n) for n in os.listdir(run) if n.startswith("step_")),
        key=lambda p: int(p.rsplit("_", 1)[1]),
    )

state = syscalls.state(1)
targets = [tc.abstract_restore_target(state[k]) for k in ("model", "optimizer", "rng", "auxiliary")]
for root_ in (warm, root):
    ckpts = checkpoints(root_)  # listed before the clock starts
    it = iter(grain.MapDataset.range(64).to_iter_dataset())
    start = time.perf_counter()
    eval(syscalls.CALLS[call], globals(), dict(root=root_, ckpts=ckpts, targets=targets, it=it))
    seconds = time.perf_counter() - start
import tinax
assert os.path.dirname(os.path.dirname(tinax.__file__)) == os.environ["PYTHONPATH"], tinax.__file__
print(seconds)
"""


def _build_shim(where: Path) -> Path:
    source, library = where / "slowfs.c", where / "slowfs.so"
    source.write_text(_SHIM, encoding="utf-8")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", "-o", str(library), str(source), "-ldl"], check=True
    )
    return library


def _checkout(commit: str, where: Path) -> Path:
    """``commit`` in a ``git worktree`` of its own (detached), for its ``tinax``."""
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(where), commit],
        check=True,
    )
    return where


def _seconds(call: str, warm: Path, run: Path, shim: Path, latency_us: int, tinax: Path) -> float:
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=str(shim),
        SLOWFS_ROOT=str(run),
        SLOWFS_DELAY_US=str(latency_us),
        PYTHONPATH=str(tinax),
    )
    # A script outside both checkouts, run from where it lies: its own directory, not
    # a checkout's, comes first on the path, then the checkout asked for.
    worker = run.parent / "worker.py"
    worker.write_text(_WORKER.format(tests=str(REPO / "tests")), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(worker), str(warm), str(run), call],
        env=env,
        cwd=run.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{call} ({tinax}) failed:\n{done.stderr[-3000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-ms", type=float, default=2.0)
    parser.add_argument("--base", default="17e8a15", help="the commit to compare with")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--checkpoints", type=int, default=syscalls.CHECKPOINTS)
    parser.add_argument("--calls", nargs="*", default=list(CALLS), choices=list(syscalls.CALLS))
    args = parser.parse_args()
    latency_us = round(args.latency_ms * 1000)
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        shim = _build_shim(scratch)
        base = _checkout(args.base, scratch / "base")
        try:
            run, warm = scratch / "run", scratch / "warm"
            for where in (run, warm):
                where.mkdir()
                syscalls.write_run(where, args.checkpoints)
            print(
                f"{args.checkpoints} checkpoints of a TrainingRun; every open, listing and "
                f"stat under the run held {args.latency_ms:g} ms; seconds, median of "
                f"{args.repeats}, each call in a fresh process"
            )
            print(f"{'call':26} {args.base:>10} {'this':>10} {'this/base':>10}")
            slower = []
            for call in args.calls:
                sides = {}
                for name, tinax in ((args.base, base), ("this", REPO)):
                    sides[name] = statistics.median(
                        _seconds(call, warm, run, shim, latency_us, tinax)
                        for _ in range(args.repeats)
                    )
                ratio = sides["this"] / sides[args.base]
                print(f"{call:26} {sides[args.base]:10.3f} {sides['this']:10.3f} {ratio:10.2f}")
                if ratio > 1.1:
                    slower.append(call)
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False
            )
    if slower:
        print(f"slower than {args.base}: {', '.join(slower)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
