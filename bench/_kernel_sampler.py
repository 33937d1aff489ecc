"""What the kernel says a process's threads are doing, sampled from outside it.

``python bench/_kernel_sampler.py PID OUT [INTERVAL_S]`` writes one JSON line per
sample to ``OUT`` until ``PID`` exits (or this process is killed): the time
(``time.monotonic``, the clock ``time.perf_counter`` reads in the sampled process
on Linux), each thread's name, scheduler state (``R`` running, ``S`` sleeping,
``D`` waiting uninterruptibly, usually on the disk or on memory), kernel wait
channel and CPU time so far (clock ticks), and the memory counters that say whether the kernel is throttling
writers or reclaiming memory (``/proc/meminfo`` Dirty and Writeback, ``/proc/vmstat``
stall counters).

It is a separate process so that it keeps sampling while the sampled one is
stalled as a whole (a thread holding the GIL in a long call, or every thread
waiting on the kernel). ``bench/accelerator.py --diagnose`` starts it and reads
its samples back around each slow training step.
"""

from __future__ import annotations

import json
import os
import sys
import time

VMSTAT = (
    "nr_dirty",
    "nr_writeback",
    "nr_dirty_threshold",
    "nr_dirty_background_threshold",
    "allocstall_normal",
    "allocstall_movable",
    "pgscan_direct",
    "pgsteal_direct",
    "compact_stall",
    "pgmajfault",
    "thp_fault_alloc",
    "pgfault",
)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _threads(pid: int) -> list[list[str]]:
    found = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        stat = _read(f"/proc/{pid}/task/{tid}/stat")
        if not stat:
            continue
        # "tid (comm) state ...": the name may hold spaces and parentheses.
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split(" ")
        state = fields[0]
        # utime and stime, the 14th and 15th fields: clock ticks on a core so far.
        ticks = int(fields[11]) + int(fields[12]) if len(fields) > 12 else 0
        wchan = _read(f"/proc/{pid}/task/{tid}/wchan").strip() or "0"
        found.append([tid, name, state, wchan, ticks])
    return found


def _memory() -> dict[str, int]:
    counters: dict[str, int] = {}
    for line in _read("/proc/meminfo").splitlines():
        name, _, rest = line.partition(":")
        if name in ("Dirty", "Writeback", "MemFree", "Cached"):
            counters[name.lower() + "_kb"] = int(rest.split()[0])
    for line in _read("/proc/vmstat").splitlines():
        name, _, value = line.partition(" ")
        if name in VMSTAT:
            counters[name] = int(value)
    return counters


def main() -> None:
    pid, out = int(sys.argv[1]), sys.argv[2]
    interval = float(sys.argv[3]) if len(sys.argv) > 3 else 0.01
    with open(out, "w") as f:
        while os.path.exists(f"/proc/{pid}"):
            sample = {"t": time.monotonic(), "threads": _threads(pid), **_memory()}
            f.write(json.dumps(sample) + "\n")
            time.sleep(interval)


if __name__ == "__main__":
    main()
