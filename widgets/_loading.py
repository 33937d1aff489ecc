"""Running one load with a progress bar: in a background thread, or in the click."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePath
from typing import Any

from tinax.checkpointing import allow_lossy_casts, load_checkpointables

from ._meters import load_meter
from ._progress import DONE, FAILED, AsyncProgress
from ._task import Task


class Load:
    """One load of targets from a checkpoint, followed by an ``AsyncProgress``.

    Every checkpointable is loaded in one call, so that the library reads them side
    by side and counts the checkpoint's NaN and Inf once over all it read (the
    verdict every view shows then); the bar follows an estimate of the bytes brought
    in (see ``load_meter``).

    Attributes:
      progress: The bar.
      task: The running load, as an ``AsyncResponse``.
    """

    def __init__(
        self,
        path: str,
        targets: dict[str, Any],
        *,
        total_bytes: int,
        description: str,
        finish: Callable[[dict[str, Any]], None],
        allow_lossy: bool = False,
    ) -> None:
        """Prepares the load; ``start`` runs it.

        Args:
          path: The checkpoint.
          targets: Name → restore target.
          total_bytes: Bytes the load brings in, for the bar.
          description: The bar's label.
          finish: Called with the result inside the load, before the bar reports
            done, so that whoever watches the bar finds everything in place.
          allow_lossy: Whether casts that lose values are allowed (the load may
            run in another thread, so the permission is handed over here).
        """
        self._allow_lossy = allow_lossy
        self._path = path
        self._targets = targets
        self._finish = finish
        self.task: Task[dict[str, Any]] = Task("load")
        self.progress = AsyncProgress(
            self.task, total_bytes=total_bytes, count_bytes=load_meter(), description=description
        )
        self.progress.observe(self._on_status, names="status")

    def _on_status(self, change: Any) -> None:
        # The label said what was going on; once it is over it says how it ended.
        name = PurePath(self._path).name
        if change["new"] == DONE:
            self.progress.label.value = f"loaded {name}"
        elif change["new"] == FAILED:
            self.progress.label.value = f"{name}: failed"

    def start(self, *, in_thread: bool) -> BaseException | None:
        """Runs the load; returns its failure when it ran (and failed) in this thread."""
        self.task.start(self._run, in_thread=in_thread)
        return self.task.exception()

    def _run(self) -> dict[str, Any]:
        with allow_lossy_casts(self._allow_lossy):
            restored = load_checkpointables(self._path, dict(self._targets))
        self._finish(restored)
        return restored
