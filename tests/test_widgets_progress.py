"""AsyncProgress against real saves on disk and plain response objects."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tinax.checkpointing import save_checkpointables
from widgets import AsyncProgress


class FutureResponse:
    """The AsyncResponse protocol over a concurrent.futures.Future."""

    def __init__(self) -> None:
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def result(self, timeout: float | None = None) -> Any:
        return self.future.result(timeout)

    def on_complete(self, callback: Any) -> None:
        def call(f: concurrent.futures.Future[Any]) -> None:
            if f.exception() is None:
                callback(f.result())

        self.future.add_done_callback(call)


def test_bar_moves_with_bytes_landing_during_a_save(tmp_path: Path) -> None:
    # Random data does not compress, so the bytes on disk track the bytes saved.
    data = np.random.default_rng(0).standard_normal((48 << 20) // 4, dtype=np.float32)
    destination = tmp_path / "step-1"
    response = save_checkpointables(destination, {"model": {"x": data}})
    progress = AsyncProgress(
        response, total_bytes=data.nbytes, watch=destination, description="save", interval=0.005
    )
    seen: list[int] = []
    fractions: list[float] = []
    progress.observe(lambda c: seen.append(c.new), names="bytes_done")
    progress.bar.observe(lambda c: fractions.append(c.new), names="value")
    assert progress.wait(120) == "done"
    intermediate = [b for b in seen if 0 < b < data.nbytes]
    assert intermediate, f"no intermediate byte counts were reported: {seen}"
    assert any(0 < f < 1 for f in fractions)
    assert seen == sorted(seen), "bytes_done must never decrease"
    assert progress.bytes_done == data.nbytes
    assert progress.bar.value == 1.0
    assert progress.bar.bar_style == "success"
    assert "48.0 MiB" in progress.info.value and "/s" in progress.info.value
    assert progress.error == ""
    assert progress.elapsed > 0


def test_without_total_it_is_indeterminate_with_elapsed_time() -> None:
    response = FutureResponse()
    progress = AsyncProgress(response, description="thinking", interval=0.01)
    assert progress.status == "running"
    assert progress.bar.bar_style == "info"
    time.sleep(0.1)
    assert "elapsed" in progress.info.value
    response.future.set_result(42)
    assert progress.wait(10) == "done"
    assert progress.value == 42
    assert progress.info.value.startswith("done in ")
    assert progress.label.value == "thinking"


def test_a_failure_is_shown_in_the_widget_not_raised() -> None:
    response = FutureResponse()
    progress = AsyncProgress(response, total_bytes=100, interval=0.01)
    response.future.set_exception(OSError("disk full <on purpose>"))
    assert progress.wait(10) == "failed"
    assert progress.error == "OSError: disk full <on purpose>"
    assert progress.bar.bar_style == "danger"
    assert progress.error_box.layout.display == ""
    # The message is escaped HTML.
    assert "disk full &lt;on purpose&gt;" in progress.error_box.value


def test_an_already_finished_response(tmp_path: Path) -> None:
    destination = tmp_path / "small"
    response = save_checkpointables(destination, {"x": {"a": np.arange(10)}})
    response.result()
    progress = AsyncProgress(response, total_bytes=80, watch=destination)
    assert progress.wait(10) == "done"
    assert progress.bytes_done == 80


def test_count_bytes_callable_drives_the_bar() -> None:
    response = FutureResponse()
    counter = {"n": 0}
    reached = threading.Event()

    def count() -> int:
        counter["n"] = min(counter["n"] + 10, 50)
        if counter["n"] == 50:
            reached.set()
        return counter["n"]

    progress = AsyncProgress(response, total_bytes=100, count_bytes=count, interval=0.005)
    assert reached.wait(10)
    time.sleep(0.05)
    assert progress.bytes_done == 50
    assert progress.bar.value == pytest.approx(0.5)
    response.future.set_result(None)
    assert progress.wait(10) == "done"
    assert progress.bar.value == 1.0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"response": object()}, TypeError),
        ({"total_bytes": True}, TypeError),
        ({"total_bytes": 1.5}, TypeError),
        ({"total_bytes": -1}, ValueError),
        ({"watch": 3}, TypeError),
        ({"description": None}, TypeError),
        ({"count_bytes": 5}, TypeError),
        ({"watch": "x", "count_bytes": lambda: 0}, TypeError),
        ({"interval": 0}, ValueError),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], error: type[Exception]) -> None:
    arguments: dict[str, Any] = {"response": FutureResponse(), **kwargs}
    response = arguments.pop("response")
    with pytest.raises(error):
        AsyncProgress(response, **arguments)
