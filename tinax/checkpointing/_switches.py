"""The block-scoped switches of tinax's saves and loads (``with compression():``,
``with allow_lossy_casts():``, …), each a context variable set for one block."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TypeVar

_T = TypeVar("_T")


@contextlib.contextmanager
def switched(
    switch: contextvars.ContextVar[_T], value: _T, *, argument: str | None = None
) -> Iterator[None]:
    """Sets ``switch`` to ``value`` inside the block, for the calling thread (and the
    ``asyncio`` tasks it starts); blocks nest, and the outer value comes back after.

    Args:
      switch: The context variable.
      value: Its value inside the block.
      argument: The name of the user's argument ``value`` came from, when it must be
        a ``bool``.

    Raises:
      TypeError: If ``argument`` is given and ``value`` is not a ``bool``.
    """
    if argument is not None and not isinstance(value, bool):
        raise TypeError(f"{argument} must be a bool, got {type(value).__name__}")
    token = switch.set(value)
    try:
        yield
    finally:
        switch.reset(token)
