"""AsyncProgress against real saves on disk and plain response objects."""

from __future__ import annotations

import concurrent.futures
import mmap
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tinax.widgets import AsyncProgress
from tinax.widgets._meters import load_meter
from tinax.widgets._task import PendingResponse, Task

from tinax.checkpointing import save_checkpointables


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


def _until(condition: Any, timeout: float = 10.0) -> None:
    """Polls ``condition`` until it holds; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        time.sleep(0.005)


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
    # Not a full bar (which reads as finished): a sliding block, and the bar hidden.
    assert progress.indeterminate
    assert progress.bar.layout.display == "none" and progress.bar.value == 0.0
    assert progress.pulse.layout.display != "none"
    assert "animation" in progress.pulse.value
    _until(lambda: "elapsed" in progress.info.value)
    response.future.set_result(42)
    assert progress.wait(10) == "done"
    assert progress.value == 42
    assert not progress.indeterminate and progress.pulse.layout.display == "none"
    assert progress.bar.layout.display != "none"
    assert (progress.bar.value, progress.bar.bar_style) == (1.0, "success")
    assert re.fullmatch(r"done in \d+\.\d+ s", progress.info.value), progress.info.value
    assert progress.label.value == "thinking"


def test_an_indeterminate_failure_ends_in_a_red_bar_with_the_time_taken() -> None:
    response = FutureResponse()
    progress = AsyncProgress(response, interval=0.01)
    response.future.set_exception(RuntimeError("no"))
    assert progress.wait(10) == "failed"
    assert not progress.indeterminate
    assert (progress.bar.value, progress.bar.bar_style) == (1.0, "danger")
    assert re.fullmatch(r"failed in \d+\.\d+ s", progress.info.value), progress.info.value


def test_the_bar_never_passes_its_total() -> None:
    """A counter that runs past the total (metadata, other reads) stops at the total."""
    response = FutureResponse()
    past = threading.Event()
    calls = {"n": 0}

    def count() -> int:
        calls["n"] += 1
        if calls["n"] > 5:
            past.set()
        return 100 * calls["n"]

    progress = AsyncProgress(response, total_bytes=300, count_bytes=count, interval=0.005)
    assert past.wait(10)
    _until(lambda: "300 B / 300 B" in progress.info.value)
    assert not progress.indeterminate  # bytes moved: a bar
    assert progress.bytes_done == 300 and progress.bar.value < 1.0
    response.future.set_result(None)
    assert progress.wait(10) == "done"
    assert progress.bytes_done == 300 and progress.info.value.startswith("done: 300 B in ")


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
    _until(lambda: "50 B / 100 B" in progress.info.value)
    assert progress.bytes_done == 50
    assert progress.bar.value == pytest.approx(0.5)
    response.future.set_result(None)
    assert progress.wait(10) == "done"
    assert progress.bar.value == 1.0


def test_bytes_moved_carries_a_thread_s_progress_to_the_bar() -> None:
    """The work's ``progress(done, total)`` callback, in its own thread, moves the bar."""
    from tinax.widgets._progress import BytesMoved

    moved = BytesMoved()
    assert moved.count() == 0
    response = FutureResponse()
    progress = AsyncProgress(response, total_bytes=100, count_bytes=moved.count, interval=0.005)
    worker = threading.Thread(target=moved.moved, args=(40, 100))
    worker.start()
    worker.join()
    _until(lambda: "40 B / 100 B" in progress.info.value)
    assert moved.count() == progress.bytes_done == 40
    response.future.set_result(None)
    assert progress.wait(10) == "done"


def test_a_sample_taken_while_the_operation_ends_does_not_overwrite_the_end() -> None:
    """The watcher counts bytes while the response completes in another thread."""
    response = FutureResponse()
    counting, release = threading.Event(), threading.Event()
    calls = {"n": 0}

    def count() -> int:
        calls["n"] += 1
        if calls["n"] == 1:  # the watcher's first sample: held until the end is shown
            counting.set()
            assert release.wait(10)
        return 50

    progress = AsyncProgress(response, total_bytes=100, count_bytes=count, interval=0.005)
    assert counting.wait(10)
    response.future.set_result(None)  # on_complete: the bar ends in this thread
    assert progress.status == "done" and progress.info.value.startswith("done: 100 B")
    release.set()
    progress._thread.join(10)
    assert not progress._thread.is_alive()
    assert progress.bar.value == 1.0 and progress.bar.bar_style == "success"
    assert progress.info.value.startswith("done: 100 B in ")


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


def test_a_pending_response_follows_the_real_one_once_attached(tmp_path: Path) -> None:
    pending: PendingResponse[None] = PendingResponse()
    completed: list[object] = []
    pending.on_complete(completed.append)
    progress = AsyncProgress(pending, description="waiting", interval=0.01)
    with pytest.raises(TimeoutError):
        pending.result(timeout=0.01)
    assert not pending.done()
    _until(lambda: "elapsed" in progress.info.value)
    assert progress.status == "running"
    response = save_checkpointables(tmp_path / "c", {"x": {"a": np.arange(3)}})
    pending.attach(response)
    assert progress.wait(60) == "done"
    assert pending.result() is None and pending.done()
    deadline = time.monotonic() + 10
    while not completed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert completed == [None]


def test_a_pending_response_that_never_starts_fails_the_bar() -> None:
    pending: PendingResponse[None] = PendingResponse()
    progress = AsyncProgress(pending, interval=0.01)
    pending.fail(FileExistsError("taken"))
    assert progress.wait(10) == "failed"
    assert progress.error == "FileExistsError: taken"
    assert pending.done()
    with pytest.raises(FileExistsError):
        pending.result()


@pytest.mark.parametrize("in_thread", [True, False])
def test_task_runs_a_call_behind_the_response_protocol(in_thread: bool) -> None:
    task: Task[int] = Task("sum")
    progress = AsyncProgress(task, interval=0.01)
    values: list[int] = []
    task.on_complete(values.append)
    task.start(
        lambda: threading.current_thread().name.startswith("tinax-") + 41, in_thread=in_thread
    )
    assert progress.wait(10) == "done"
    assert task.result(1) == (42 if in_thread else 41)
    assert values == [task.result()] and task.exception() is None
    with pytest.raises(RuntimeError, match="already started"):
        task.start(lambda: 0, in_thread=False)


def test_a_failing_task_fails_the_bar() -> None:
    task: Task[None] = Task("boom")
    progress = AsyncProgress(task, interval=0.01)

    def boom() -> None:
        raise ValueError("bad target")

    task.start(boom, in_thread=False)  # the failure is kept in the task, not raised
    assert progress.wait(10) == "failed"
    assert isinstance(task.exception(), ValueError)
    assert "bad target" in progress.error


def test_load_meter_counts_bytes_brought_into_the_process() -> None:
    count = load_meter()
    assert count is not None, "Linux exposes /proc/self/io and /proc/self/status"
    before = count() or 0
    # 32 MiB of new pages, touched: resident memory grows (an allocation through
    # malloc could reuse memory an earlier test freed, already resident).
    block = mmap.mmap(-1, 32 << 20)
    values = np.frombuffer(block, np.uint8)
    values[::4096] = 1
    after = count() or 0
    assert after - before >= 16 << 20
    assert int(values.sum()) == 32 << 8
    del values
    block.close()


def test_a_measured_bar_slides_until_bytes_move_then_shows_rate_and_time_left() -> None:
    response = FutureResponse()
    state: dict[str, float] = {"landed": 0.0, "since": 0.0}

    def count() -> int:
        if state["since"]:  # once moving: 1,000 bytes a second, up to 900
            state["landed"] = min(900.0, 100 + 1000 * (time.monotonic() - state["since"]))
        return int(state["landed"])

    progress = AsyncProgress(response, total_bytes=10_000, count_bytes=count, interval=0.005)
    _until(lambda: "elapsed" in progress.info.value)
    assert progress.indeterminate and progress.bar.layout.display == "none"
    state["landed"] = 5  # the metadata: not yet the data
    _until(lambda: progress.bytes_done == 5)
    assert progress.indeterminate
    state["since"] = time.monotonic()
    _until(lambda: not progress.indeterminate)
    assert progress.bar.layout.display != "none"
    _until(lambda: "left" in progress.info.value and "/s" in progress.info.value)
    response.future.set_result(None)
    assert progress.wait(10) == "done"
    assert progress.info.value.startswith("done: 9.8 KiB in ")
