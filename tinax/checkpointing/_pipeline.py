"""The Grain input pipeline behind an iterator: recorded with a save, checked on restore.

An iterator's saved state is a position (``next_index``…) in one stream of data; set
into an iterator over another pipeline (batches of 8 instead of 4, no shuffle, a map
added, another source) it resumes silently on other data. So a save records how
Grain describes the dataset behind each iterator, and a restore into a pipeline
described otherwise is refused, naming what differs, unless the change is allowed
(``allow_pipeline_change``). Checkpoints saved without a record still restore.

The description is Grain's own: each node's ``str`` (what Grain's statistics and
debugging name it by), the seed a node draws from (``_seed``, which Grain's shuffles
and random maps keep), and for a source its own ``repr`` and length. Where in a file a
lambda was written is left out (editing a script above it changes nothing), and so
are the nodes that only move data along (prefetching, options), whose settings
change speed, not data, and nodes that do not describe themselves (an iterator
class of your own without a ``__str__``: Python's default text is an address).
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator
from typing import Any

import grain

from tinax._format.metadata import layout
from tinax._format.records import pipeline as recorded
from tinax.checkpointing import _orbax, _processes
from tinax.checkpointing._switches import switched
from tinax.checkpointing._verdict import TargetMismatchError

_ALLOW_CHANGE = contextvars.ContextVar("tinax_allow_pipeline_change", default=False)

# Nodes that move data along without changing it: left out of the description.
_PLUMBING = re.compile(
    r"^_?(Prefetch|ThreadPrefetch|MultiprocessPrefetch|ProcessPrefetch|WithOptions|"
    r"WithSeed|Output|MpContext)"
)
# Where a function was written, as Grain names transformations ("<lambda> @ .../x.py:12").
_LOCATION = re.compile(r" @ [^,()]*:\d+")
# A source's repr is part of its description when it is this short (not a whole list).
_MAX_REPR = 200


@_processes.register_error
class PipelineMismatchError(TargetMismatchError):
    """A restore refused: the iterator given reads another input pipeline than the one
    its checkpoint was saved from (a ``TargetMismatchError``: a ``ValueError`` and a
    ``KeyError``)."""


@contextlib.contextmanager
def allow_pipeline_change(allow: bool = True) -> Iterator[None]:
    """Lets restores in this block set a saved iterator state into a changed pipeline.

    A restore refuses an iterator whose pipeline is described otherwise than the one
    saved (another batch size, seed, source or transformation): the saved position
    would resume another stream of data. Inside this block the state is restored
    anyway, for a change made on purpose::

        with tinax.checkpointing.allow_pipeline_change():
            restored = run.restore(model, optimizer, rng, aux, iter(new_pipeline))

    The permission belongs to the calling thread (and its ``asyncio`` tasks).

    Args:
      allow: ``False`` refuses changed pipelines again inside an outer permission.
    """
    with switched(_ALLOW_CHANGE, allow, argument="allow"):
        yield


def _is_dataset(value: object) -> bool:
    return isinstance(value, grain.MapDataset | grain.IterDataset)


def _children(node: object) -> list[object]:
    """What ``node`` reads from: its parents (iterators or datasets), and for an
    iterator the datasets it holds (``PrefetchDatasetIterator``'s map dataset)."""
    found = list(getattr(node, "_parents", ()) or ())
    if isinstance(node, grain.DatasetIterator):
        found += [v for v in vars(node).values() if _is_dataset(v) and v not in found]
    return found


def _with(text: str, extra: str) -> str:
    """``Name(a=1)`` with ``, extra`` added inside its parentheses (or ``Name(extra)``)."""
    if text.endswith(")") and "(" in text:
        return f"{text[:-1]}, {extra})"
    return f"{text}({extra})"


def _node(node: object) -> str | None:
    """One node as Grain describes it; ``None`` for one that only moves data along."""
    kind = type(node).__name__
    if _PLUMBING.match(kind):
        return None
    if type(node).__str__ is object.__str__ and type(node).__repr__ is object.__repr__:
        # A node that does not describe itself (a wrapper of your own): its default
        # text is only its address, which no other process would write alike.
        return None
    try:
        text = _LOCATION.sub("", str(node))
    except Exception:  # a user's node whose __str__ fails: its type names it
        text = kind
    seed = getattr(node, "_seed", None)
    if isinstance(seed, int) and not isinstance(seed, bool):
        text = _with(text, f"seed={seed}")
    source = getattr(node, "_source", None)
    if source is not None:
        shown = repr(source) if type(source).__repr__ is not object.__repr__ else ""
        if shown and len(shown) <= _MAX_REPR and not isinstance(source, list | tuple):
            text = _with(text, shown)
        with contextlib.suppress(TypeError):  # a source without a length
            text = _with(text, f"len={len(source)}")
    return text[: recorded.MAX_NODE_CHARS]


def fingerprint(iterator: grain.DatasetIterator) -> recorded.Pipeline:
    """How Grain describes the pipeline behind ``iterator``: its nodes from the source
    to the output (``recorded.Pipeline``)."""
    nodes: list[str] = []
    seen: set[int] = set()

    def visit(node: object) -> None:
        if id(node) in seen or len(seen) >= recorded.MAX_NODES:
            return
        seen.add(id(node))
        for child in _children(node):
            visit(child)
        described = _node(node)
        if described is not None:
            nodes.append(described)

    visit(iterator)
    return recorded.Pipeline(tuple(nodes), getattr(grain, "__version__", ""))


def records(checkpointables: dict[str, Any]) -> dict[str, Any]:
    """The pipeline record of every Grain iterator among a save's checkpointables."""
    return {
        name: fingerprint(value).record()
        for name, value in checkpointables.items()
        if isinstance(value, grain.DatasetIterator)
    }


def _refusal(
    checkpoint: layout.Checkpoint, name: str, iterator: grain.DatasetIterator
) -> str | None:
    saved = recorded.saved_pipelines(checkpoint.pipelines).get(name)
    if saved is None:
        return None  # saved without a record (Orbax, an older tinax): nothing to compare
    now = fingerprint(iterator)
    found = recorded.differences(saved, now)
    if not found:
        return None
    return (
        f"checkpoint {str(checkpoint.path)!r}: iterator {name!r} was saved from another "
        "input pipeline than the one given; its position would resume other data:\n  "
        + "\n  ".join(found)
        + f"\n  saved: {recorded.describe(saved.nodes)}\n  now:   {recorded.describe(now.nodes)}"
        + "\nif the change is deliberate, restore inside "
        "`with tinax.checkpointing.allow_pipeline_change():`"
    )


def check_pipelines(checkpoint: layout.Checkpoint, iterators: dict[str, Any]) -> None:
    """Refuses to restore an iterator into a pipeline other than the one it was saved
    from, before anything is restored.

    In a job of several processes each reads its own shard (a slice of its own), and
    the record is the primary's: the primary compares, and every process agrees.

    Raises:
      PipelineMismatchError: Naming what differs and how to allow it.
    """
    error: Exception | None = None
    if _processes.process_index() == 0 and not _ALLOW_CHANGE.get():
        for name, iterator in iterators.items():
            if not isinstance(iterator, grain.DatasetIterator):
                continue
            message = _refusal(checkpoint, name, iterator)
            if message is not None:
                error = PipelineMismatchError(message)
                break
    _processes.agree(
        error,
        what=f"the pipeline check of {str(checkpoint.path)!r}",
        timeout=_processes.timeout_of(_orbax.coordination_timeout()),
    )
