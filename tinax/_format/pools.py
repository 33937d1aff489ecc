"""Thread pools that live as long as the process: started on first use, and anew in a
forked child (which inherits a pool's object but none of its threads)."""

from __future__ import annotations

import concurrent.futures
import os
import threading


class ProcessPool:
    """A lazily started ``ThreadPoolExecutor`` of ``threads`` threads, one per process.

    Args:
      threads: How many threads the pool runs.
      name: The prefix of its threads' names (``tinax-read``), as a debugger lists them.
    """

    def __init__(self, threads: int, name: str) -> None:
        self.threads = threads
        self.name = name
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def executor(self) -> concurrent.futures.ThreadPoolExecutor:
        """The pool, started on first use in this process."""
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    self.threads, thread_name_prefix=self.name
                )
                self._pid = os.getpid()
            return self._pool
