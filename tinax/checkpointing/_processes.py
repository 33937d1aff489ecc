"""Saves on several JAX processes: which process checks, and one verdict for all.

A save runs on every process of a job. What it checks before Orbax starts can fail
on one process and pass on another (the destination is checked on the primary
alone; each process checks its own values), and a process that raised while its
peers went on into Orbax would leave them waiting at Orbax's first barrier. So every
process contributes its verdict to the coordination service's key-value store, waits
for the others (bounded by Orbax's own barrier timeout) and raises the same error as
every other process, or none.

The only module of tinax that reaches into JAX's private modules: JAX has no public
handle on the coordination service's client.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from typing import Any

import jax

# Errors a verdict can carry, by name; anything else arrives as a RuntimeError.
_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        TypeError,
        ValueError,
        KeyError,
        FileExistsError,
        FileNotFoundError,
        NotADirectoryError,
        IsADirectoryError,
        PermissionError,
        TimeoutError,
        OSError,
    )
}
_KEY_PREFIX = "tinax/agree"
# One sequence of rounds per set of participating processes: each of them makes the
# same saves in the same order, so the n-th round has the same key everywhere.
_rounds: dict[tuple[int, ...], Iterator[int]] = {}


def _client() -> Any:
    from jax._src import distributed

    return distributed.global_state.client


def preemption_sync() -> Any | None:
    """JAX's preemption sync manager in a multi-process job, else ``None``.

    ``jax.distributed.initialize`` starts it (unless ``jax_enable_preemption_service``
    is off): its notifier catches SIGTERM, tells every process through the
    coordination service, and ``reached_sync_point(step)`` then returns ``True`` at
    the same step everywhere (the step after the largest any process had reached).
    ``jax.experimental.multihost_utils.reached_preemption_sync_point`` is its public
    face; the manager itself is reached here to tell whether there is one.
    """
    from jax._src import distributed

    state = distributed.global_state
    if state.client is None or process_count() == 1:
        return None
    return state.preemption_sync_manager


def process_index() -> int:
    """This process's index in the job (0 in a single-process job)."""
    return int(jax.process_index())


def process_count() -> int:
    """How many processes the job has."""
    return int(jax.process_count())


def is_primary(primary_host: int | None) -> bool:
    """Whether this process is the one that checks and claims a save's destination.

    Args:
      primary_host: Orbax's ``MultiprocessingOptions.primary_host``; ``None`` makes
        every process primary (each writes to storage of its own).
    """
    return primary_host is None or process_index() == primary_host


def _participants(active: Sequence[int] | None) -> tuple[int, ...]:
    return tuple(sorted(active)) if active else tuple(range(process_count()))


def agree(
    error: Exception | None,
    *,
    what: str,
    timeout: float,
    active_processes: Sequence[int] | None = None,
) -> None:
    """Raises on every process if any process found an error; returns on all otherwise.

    In a single-process job ``error`` itself is raised. With several processes, every
    process raises the same exception type with the same message: the lowest-numbered
    failing process's, followed by which process that was.

    Args:
      error: What this process found, or ``None``.
      what: The operation, for the timeout message (``"the save to '/ckpt'"``).
      timeout: Seconds to wait for the other processes.
      active_processes: The processes taking part (Orbax's ``active_processes``);
        ``None`` for all of them.

    Raises:
      Exception: The agreed error.
      TimeoutError: If not every process arrived within ``timeout``.
    """
    client = _client()
    if process_count() == 1 or client is None:
        if error is not None:
            raise error
        return
    verdict = None if error is None else {"type": type(error).__name__, "message": str(error)}
    participants = _participants(active_processes)
    found = _exchange(verdict, what=what, timeout=timeout, participants=participants, cause=error)
    failures = [(index, record) for index, record in found.items() if record is not None]
    if not failures:
        return
    index, record = min(failures, key=lambda item: item[0])
    kind = _ERRORS.get(record["type"], RuntimeError)
    message = record["message"]
    if kind.__name__ != record["type"]:
        message = f"{record['type']}: {message}"
    raise kind(f"{message} [process {index} of {process_count()}]") from error


def gather(value: Any, *, what: str, timeout: float) -> list[Any]:
    """Every process's ``value`` (JSON-able), in process order; all processes call it.

    Args:
      value: What this process contributes.
      what: The occasion, for the timeout message.
      timeout: Seconds to wait for the other processes.

    Raises:
      TimeoutError: If not every process arrived within ``timeout``.
    """
    if process_count() == 1 or _client() is None:
        return [value]
    participants = _participants(None)
    found = _exchange(value, what=what, timeout=timeout, participants=participants, cause=None)
    return [found[index] for index in participants]


def _exchange(
    value: Any,
    *,
    what: str,
    timeout: float,
    participants: tuple[int, ...],
    cause: BaseException | None,
) -> dict[int, Any]:
    """One round through the coordination service: every participant's ``value``."""
    client = _client()
    counter = _rounds.setdefault(participants, itertools.count())
    number = next(counter)
    tag = "-".join(map(str, participants))
    base = f"{_KEY_PREFIX}/{tag}/{number}"
    client.key_value_set(f"{base}/{process_index()}", json.dumps(value))
    try:
        client.wait_at_barrier(base, int(timeout * 1000), process_ids=list(participants))
    except Exception as e:
        raise TimeoutError(
            f"not every process ({len(participants)} of them) reached {what} within "
            f"{timeout:.0f} s: {e}"
        ) from cause
    found = dict(client.key_value_dir_get(f"{base}/"))
    if process_index() == participants[0] and number > 0:
        # Everyone has passed this round's barrier, so the previous round has been
        # read everywhere; its keys can go.
        client.key_value_delete(f"{_KEY_PREFIX}/{tag}/{number - 1}/")
    return {int(key.rsplit("/", 1)[1]): json.loads(text) for key, text in found.items()}
