"""What the widgets learn from this process: bytes it has read, memory it holds."""

from __future__ import annotations

from collections.abc import Callable


def process_bytes_read() -> int | None:
    """Bytes this process has read through system calls so far (Linux), else ``None``.

    Loads read a checkpoint's array data with ordinary reads, so the growth of this
    counter while a load runs measures the load's progress.
    """
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            for line in f:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def process_memory() -> int | None:
    """This process's resident memory in bytes (Linux), else ``None``."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def load_meter() -> Callable[[], int | None] | None:
    """A counter of the bytes a load has brought into this process, from now on.

    A load reads the stored bytes (counted by ``process_bytes_read``, but only
    when each read call returns) and then decodes them into new arrays, which
    grows resident memory as it goes. The counter reports whichever has grown
    more, so that a load of one large array moves too. It is an estimate: other
    work in the process adds to both. ``None`` where neither is available.
    """
    read0, memory0 = process_bytes_read(), process_memory()
    if read0 is None and memory0 is None:
        return None

    def count() -> int | None:
        read, memory = process_bytes_read(), process_memory()
        grown = [
            now - then
            for now, then in ((read, read0), (memory, memory0))
            if now is not None and then is not None
        ]
        return max(grown) if grown else None

    return count
