"""Warnings raised by a library call in a background thread, shown in the widget that
made the call instead of in the notebook's log."""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any, cast

_lock = threading.Lock()
# The thread of each call whose warnings a widget shows → where they go.
_collectors: dict[int, Callable[[Warning], None]] = {}
# While any call is watched: the ``showwarning`` it replaced, and the filter it added.
_replaced: list[Any] = []
_ALWAYS = ("always", None, Warning, None, 0)


def _filters_changed() -> None:
    # Warnings caches what its filters decided per place; a change must reach it.
    changed = getattr(warnings, "_filters_mutated", None)
    if changed is not None:
        changed()


def _show(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    collect = _collectors.get(threading.get_ident())
    if collect is not None:
        collect(message if isinstance(message, Warning) else category(message))
    elif _replaced:
        _replaced[0](message, category, filename, lineno, file, line)


@contextlib.contextmanager
def warnings_of_this_thread(on_warning: Callable[[Warning], None]) -> Iterator[None]:
    """Passes each warning raised in the calling thread while the block runs to
    ``on_warning``, as it is raised, every time (not once per place in the code).

    Warnings raised meanwhile in other threads are shown as usual (repeats too);
    blocks in several threads at once each get their own thread's warnings.
    """
    me = threading.get_ident()
    with _lock:
        if not _collectors:
            _replaced[:] = [warnings.showwarning]
            warnings.showwarning = _show
            warnings.filterwarnings("always")  # adds _ALWAYS first, and says so
        _collectors[me] = on_warning
    try:
        yield
    finally:
        with _lock:
            del _collectors[me]
            if not _collectors:
                warnings.showwarning = _replaced.pop()
                with contextlib.suppress(ValueError):
                    cast(list[Any], warnings.filters).remove(_ALWAYS)
                _filters_changed()
