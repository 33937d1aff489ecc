"""The private Orbax modules tinax relies on, each behind one function.

Orbax's public V1 API has no way to read the active context, to ask whether a
leaf type has a standard handler, or to learn how long its processes wait for each
other, and does not export the handler of stateful checkpointables (Grain
iterators); these are the only places tinax reaches into
``orbax.checkpoint.experimental.v1._src``. ``pyproject.toml`` bounds
Orbax to the minor release they were written against.
"""

from __future__ import annotations

import functools
from typing import Any

from orbax.checkpoint import v1 as ocp
from orbax.checkpoint.experimental.v1._src.handlers.stateful_checkpointable_handler import (
    StatefulCheckpointableHandler,
)

__all__ = [
    "StatefulCheckpointableHandler",
    "active_context",
    "coordination_timeout",
    "has_standard_leaf_handler",
]


def active_context() -> ocp.Context:
    """The Orbax context the caller made active with ``with ocp.Context(...)``, or a default one."""
    from orbax.checkpoint.experimental.v1._src.context import context

    return context.get_context()


@functools.cache
def _standard_leaf_handlers() -> Any:
    from orbax.checkpoint.experimental.v1._src.serialization import registry

    return registry.StandardLeafHandlerRegistry()


def has_standard_leaf_handler(leaf_type: type) -> bool:
    """Whether Orbax's standard leaf handlers store leaves of ``leaf_type``."""
    return bool(_standard_leaf_handlers().is_handleable(leaf_type))


def coordination_timeout() -> float:
    """Seconds Orbax's processes wait for each other at a barrier before giving up.

    Read at every call: tinax's own cross-process waits use the same bound, so a
    job that lowers Orbax's lowers tinax's too.
    """
    from orbax.checkpoint.experimental.v1._src.synchronization import multihost

    return float(multihost.coordination_timeout())
