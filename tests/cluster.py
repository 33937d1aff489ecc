"""N JAX processes on localhost: a real multi-process job for tests and benchmarks.

The launching side (``launch``) starts a worker script N times as one JAX job
(``jax.distributed`` over a loopback coordinator, Gloo collectives on the CPU), with
each worker's output in a file of its own, and guarantees an end: a wall-clock
timeout after which every worker's process group is killed, and fail-fast (once one
worker fails, the others get a second and are killed; their peers would otherwise
sit in a barrier until a heartbeat timeout fires).

The worker side (``join``, ``report``, ``main``) runs inside each worker: it joins
the job with short timeouts, reports JSON results on stdout, and exits at once on an
error instead of waiting in JAX's shutdown barrier for peers that will never come.

This module imports no JAX at module level: the launching side does not need it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

_ADDRESS = "TINAX_CLUSTER_ADDRESS"
_COUNT = "TINAX_CLUSTER_PROCESSES"
_INDEX = "TINAX_CLUSTER_INDEX"
_DEVICES = "TINAX_CLUSTER_DEVICES"
_BARRIER = "TINAX_CLUSTER_BARRIER"
_HEARTBEAT = "TINAX_CLUSTER_HEARTBEAT"
_RESULT = "TINAX-RESULT "
# Seconds: a lost peer is noticed after HEARTBEAT; processes may finish up to SHUTDOWN
# apart; Orbax's (and so tinax's) processes wait BARRIER at a barrier.
HEARTBEAT = 10
SHUTDOWN = 30
BARRIER = 30
INITIALIZATION = 60
# What process 0 prints when the coordinator's port was taken meanwhile.
_PORT_TAKEN = "Failed to add port"


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class Outcome:
    """How a job ended.

    Attributes:
      returncodes: Each worker's exit status (negative: killed by that signal).
      logs: Each worker's output.
      timed_out: Whether the wall-clock timeout ended it.
      seconds: Wall time from launch to the last exit.
      ended: Each worker's exit time, in seconds after the launch.
      launched: The launch's wall-clock time (``time.time()``), to set times the
        workers report against ``ended``.
    """

    returncodes: list[int]
    logs: list[str]
    timed_out: bool
    seconds: float
    ended: list[float] = dataclasses.field(default_factory=list)
    launched: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether every worker exited with status 0 in time."""
        return not self.timed_out and all(rc == 0 for rc in self.returncodes)

    def results(self, process: int) -> list[dict[str, Any]]:
        """What worker ``process`` reported with ``report``, in order."""
        # Another thread's output (JAX's C++ logging) may share a line with a report,
        # before or after it: each report is the first JSON value after its marker.
        decoder = json.JSONDecoder()
        return [
            decoder.raw_decode(line[line.index(_RESULT) + len(_RESULT) :])[0]
            for line in self.logs[process].splitlines()
            if _RESULT in line
        ]

    def result(self, process: int, step: str) -> dict[str, Any]:
        """Worker ``process``'s report of ``step``."""
        found = [r for r in self.results(process) if r.get("step") == step]
        assert len(found) == 1, f"process {process} reported {step!r} {len(found)} times\n{self}"
        return found[0]

    def __str__(self) -> str:
        parts = [
            f"returncodes {self.returncodes}, timed out: {self.timed_out}, {self.seconds:.1f} s"
        ]
        for i, log in enumerate(self.logs):
            text = "\n".join(line for line in log.splitlines() if not line.startswith("[Gloo]"))
            parts.append(f"----- process {i} -----\n{text[-6000:]}")
        return "\n".join(parts)


def _start(
    script: Path, args: Sequence[str], processes: int, devices: int, logs: Path, env: dict
) -> list[subprocess.Popen[bytes]]:
    port = free_port()
    started = []
    for index in range(processes):
        # Proxies can make the coordinator's gRPC connection hang.
        child_env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        child_env.update(env)
        child_env.update(
            {
                _ADDRESS: f"127.0.0.1:{port}",
                _COUNT: str(processes),
                _INDEX: str(index),
                _DEVICES: str(devices),
                "JAX_PLATFORMS": "cpu",
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])
                ),
            }
        )
        # A file, never a pipe: a worker that fills a pipe nobody reads blocks for ever.
        with open(logs / f"process_{index}.log", "wb") as log:
            started.append(
                subprocess.Popen(
                    [sys.executable, str(script), *args],
                    env=child_env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group, killed as one
                )
            )
    return started


def _wait(
    started: list[subprocess.Popen[bytes]],
    begun: float,
    timeout: float,
    grace: float,
    ended: list[float],
) -> tuple[list[int], bool]:
    """Waits for the workers; ``ended`` gets each one's exit time (seconds after
    ``begun``, the ``time.monotonic()`` of the launch, as polled every 50 ms; the
    kill's time for one killed here)."""
    deadline = begun + timeout
    kill_at: float | None = None
    timed_out = False
    ended[:] = [math.inf] * len(started)
    # Poll every worker each time round: any() would stop at the first running one
    # and never notice that a later one died.
    while [p.poll() for p in started].count(None):
        now = time.monotonic()
        for i, p in enumerate(started):
            if p.returncode is not None and ended[i] == math.inf:
                ended[i] = now - begun
        if now >= deadline:
            timed_out = True
            break
        if kill_at is None and any(p.returncode not in (None, 0) for p in started):
            kill_at = now + grace
        if kill_at is not None and now >= kill_at:
            break
        time.sleep(0.05)
    now = time.monotonic() - begun
    for i, p in enumerate(started):
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        if ended[i] == math.inf:
            ended[i] = now
    return [p.wait() for p in started], timed_out


def launch(
    script: str | os.PathLike[str],
    *args: object,
    processes: int,
    devices: int = 2,
    timeout: float = 180.0,
    grace: float = 1.0,
    barrier: int | None = None,
    heartbeat: int | None = None,
    env: dict[str, str] | None = None,
) -> Outcome:
    """Runs ``script`` as a job of ``processes`` JAX processes and waits for its end.

    Args:
      script: The worker script; it calls ``join`` before touching JAX.
      *args: Its command-line arguments.
      processes: How many processes.
      devices: CPU devices per process.
      timeout: Seconds after which every worker still running is killed.
      grace: Seconds the others get once one worker has failed.
      barrier: Seconds Orbax's (and tinax's) processes wait at a barrier; ``BARRIER``
        by default.
      heartbeat: Seconds after which JAX's coordination service takes a silent
        process for dead (and aborts every other); ``HEARTBEAT`` by default.
      env: Extra environment variables.

    Returns:
      How it ended.
    """
    logs = Path(tempfile.mkdtemp(prefix="tinax-cluster-"))
    argv = [str(a) for a in args]
    env = dict(env or {})
    if barrier is not None:
        env[_BARRIER] = str(barrier)
    if heartbeat is not None:
        env[_HEARTBEAT] = str(heartbeat)
    try:
        for _attempt in range(3):
            start, launched = time.monotonic(), time.time()
            started = _start(Path(script), argv, processes, devices, logs, env)
            ended: list[float] = []
            returncodes, timed_out = _wait(started, start, timeout, grace, ended)
            texts = [
                (logs / f"process_{i}.log").read_text(errors="replace") for i in range(processes)
            ]
            outcome = Outcome(
                returncodes, texts, timed_out, time.monotonic() - start, ended, launched
            )
            if not (processes > 1 and _PORT_TAKEN in texts[0]):
                return outcome
            # The coordinator's port was taken between choosing it and binding it.
        return outcome
    finally:
        shutil.rmtree(logs, ignore_errors=True)
        # The coordinator's port was taken between choosing it and binding it.
    return outcome


# -- inside a worker --------------------------------------------------------------------


def index() -> int:
    """This worker's process index (0 outside a job)."""
    return int(os.environ.get(_INDEX, "0"))


def count() -> int:
    """How many processes the job has (1 outside a job)."""
    return int(os.environ.get(_COUNT, "1"))


def join() -> Any:
    """Joins the job, before anything touches a JAX backend; returns the ``jax`` module.

    Sets the CPU device count, starts ``jax.distributed`` on the loopback coordinator
    with short timeouts, and lowers Orbax's barrier timeout (300 s, with no public
    option) to ``BARRIER`` (or ``barrier`` given to ``launch``) so that a test never
    waits minutes for a dead peer.
    """
    import jax

    jax.config.update("jax_num_cpu_devices", int(os.environ.get(_DEVICES, "1")))
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if count() > 1:
        jax.distributed.initialize(
            coordinator_address=os.environ[_ADDRESS],
            # The default binds every interface; a test job stays on loopback.
            coordinator_bind_address=os.environ[_ADDRESS],
            num_processes=count(),
            process_id=index(),
            initialization_timeout=INITIALIZATION,
            heartbeat_timeout_seconds=int(os.environ.get(_HEARTBEAT, HEARTBEAT)),
            shutdown_timeout_seconds=SHUTDOWN,
        )
    from orbax.checkpoint._src.multihost import multihost as v0_multihost
    from orbax.checkpoint.experimental.v1._src.synchronization import multihost

    seconds = int(os.environ.get(_BARRIER, BARRIER))
    multihost._DEFAULT_BARRIER_TIMEOUT = seconds
    v0_multihost._DEFAULT_BARRIER_TIMEOUT = seconds
    return jax


def report(step: str, **values: Any) -> None:
    """Prints one result line for the launching side (``Outcome.results``)."""
    print(_RESULT + json.dumps({"step": step, "process": index(), **values}), flush=True)


def main(body: Callable[[], None]) -> None:
    """Runs ``body``; then leaves the job together with the others.

    On an exception, prints it and exits at once with status 1: an ordinary exit
    would wait in JAX's shutdown barrier for peers that are themselves stuck
    waiting for this process. Except once tinax has found a process lost
    (``ProcessTimeoutError``): then tinax's own exit handler ends the process as it
    ends a training script, process 0 (which holds JAX's coordination service)
    after the others have left.
    """
    try:
        body()
        import jax

        if count() > 1:
            jax.distributed.shutdown()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        processes = sys.modules.get("tinax.checkpointing._processes")
        if processes is not None and processes.lost() is not None:
            sys.exit(1)
        os._exit(1)
