"""The Orbax V1 context tinax saves and loads in."""

from __future__ import annotations

from orbax.checkpoint import v1 as ocp

from tinax.checkpointing._empty import EmptyPyTreeHandler
from tinax.checkpointing._orbax import active_context


def context() -> ocp.Context:
    """The caller's active Orbax context, with a handler for leafless pytrees added.

    Options the caller set with ``with ocp.Context(...)`` stay in force.
    """
    active = active_context()
    registry = ocp.handlers.local_registry(
        active.checkpointables.registry, include_global_registry=False
    )
    registry.add(EmptyPyTreeHandler)
    ctx = ocp.Context(active)
    ctx.checkpointables.registry = registry
    return ctx
