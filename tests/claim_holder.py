"""Another process that holds (or held) the claim on a checkpoint destination."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

# Holds the claim on argv[1] and, with "fork", forks a child that outlives it; prints
# its pid (and the child's) once the claim is held, then waits to be killed. A forked
# child tells its parent through a pipe once os.fork has returned in it, that is once
# its after-fork handlers (the claim's among them) have run: only then does the parent
# print, so no probe can see the child before it has let the claim go.
_HOLDER = """
import os, sys, time
from tinax import _claims
from tinax._format.storage.location import local
claim = _claims.claim(local(sys.argv[1]))
child = None
if "fork" in sys.argv[2:]:
    ready, tell = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(ready)
        os.write(tell, b"1")
        os.close(tell)
        time.sleep(120)
        os._exit(0)
    os.close(tell)
    assert os.read(ready, 1) == b"1", "the forked child did not start"
    os.close(ready)
print(os.getpid(), child or 0, flush=True)
time.sleep(120)
"""


class Holder:
    """Another process holding the claim on a destination."""

    def __init__(self, destination: Path, *, fork: bool = False) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(destination), *(["fork"] if fork else [])],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline() if self.process.stdout else ""
        assert line, "the claim holder did not start"
        pid, child = map(int, line.split())
        self.pid, self.child = pid, child

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)

    def close(self) -> None:
        if self.process.poll() is None:
            self.kill()
        if self.child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, signal.SIGKILL)
