"""Storage for leafless pytrees, which Orbax's PyTree handler refuses.

A stateless optimizer has ``()`` as state and auxiliary state may be ``{}``. Such a
checkpointable is written as a small JSON description of its containers, so that it
round-trips and a reader can tell what was there.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any

from orbax.checkpoint.experimental.v1 import handlers as ocp_handlers

from tinax._format.metadata import jsonitems
from tinax._format.naming import names
from tinax._paths import location
from tinax.checkpointing import _loading_from
from tinax.checkpointing._storable import is_leafless


def describe(tree: Any) -> Any:
    """A JSON description of a leafless pytree's containers."""
    if tree is None:
        return None
    if isinstance(tree, dict):
        return {"dict": {str(k): describe(v) for k, v in tree.items()}}
    if isinstance(tree, list):
        return {"list": [describe(v) for v in tree]}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return {
            "namedtuple": type(tree).__qualname__,
            "fields": {f: describe(getattr(tree, f)) for f in tree._fields},
        }
    if isinstance(tree, tuple):
        return {"tuple": [describe(v) for v in tree]}
    # Registered pytree nodes (optax, flax structs): their type name is what a
    # reader can use.
    return {"node": f"{type(tree).__module__}.{type(tree).__qualname__}"}


def _rebuild(description: Any) -> Any:
    if description is None:
        return None
    if "dict" in description:
        return {k: _rebuild(v) for k, v in description["dict"].items()}
    if "list" in description:
        return [_rebuild(v) for v in description["list"]]
    if "tuple" in description:
        return tuple(_rebuild(v) for v in description["tuple"])
    raise ValueError(
        f"stored empty pytree holds a {next(iter(description))} node; pass a restore target"
    )


class EmptyPyTreeHandler(ocp_handlers.CheckpointableHandler[Any, Any]):
    """Saves and loads checkpointables that are pytrees without leaves."""

    async def _write(self, directory: Any, description: Any) -> None:
        path = await directory.await_creation()
        text = json.dumps({"format": names.EMPTY_PYTREE_FORMAT, "structure": description})
        await asyncio.to_thread((path / names.EMPTY_PYTREE).write_text, text)

    async def save(self, directory: Any, checkpointable: Any) -> Awaitable[None]:
        return self._write(directory, describe(checkpointable))

    async def _read(self, directory: Any, target: Any) -> Any:
        # The same bounded, no-follow reader as every other metadata read, through the
        # opened checkpoint a load of tinax's reads from.
        item = _loading_from.opened_item(str(directory))
        if item is None:
            where = location(str(directory))
            stored = await asyncio.to_thread(jsonitems.read_empty_record_at, where)
        else:
            stored = await asyncio.to_thread(jsonitems.read_empty_record, item)
        if target is None:
            return _rebuild(stored)
        if describe(target) != stored:
            raise ValueError(
                f"restore target {describe(target)} does not match the stored empty pytree "
                f"{stored} in {directory}"
            )
        return target

    async def load(self, directory: Any, abstract_checkpointable: Any = None) -> Awaitable[Any]:
        return self._read(directory, abstract_checkpointable)

    async def metadata(self, directory: Any) -> Any:
        return None

    def is_handleable(self, checkpointable: Any) -> bool:
        return is_leafless(checkpointable)

    def is_abstract_handleable(self, abstract_checkpointable: Any) -> bool | None:
        if abstract_checkpointable is None:
            return None
        return is_leafless(abstract_checkpointable)
