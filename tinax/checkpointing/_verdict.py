"""The restore verdict: targets checked against the checkpoint's metadata before Orbax reads.

``tinax.explore.compare_table`` shows the same verdict as a table; a load refuses
with one line per leaf that does not fit, so Orbax never starts a read it would
fail half-way through (and never leaves a coroutine or a thread behind).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from typing import Any

from tinax._format.metadata import fit, layout
from tinax._targets import refuse_flax_objects, target_leaves, target_spec
from tinax.checkpointing._switches import switched

_ALLOW_LOSSY = contextvars.ContextVar("tinax_allow_lossy_casts", default=False)


class TargetMismatchError(ValueError, KeyError):
    """A restore refused: the checkpoint lacks a checkpointable, or a target does not fit it.

    Both a ``ValueError`` (a valid call with a bad value) and a ``KeyError`` (what
    Orbax raises for a checkpointable it cannot restore), so code written for
    either keeps working.
    """

    def __str__(self) -> str:
        # KeyError would quote the message; it is prose, shown as it is.
        return str(self.args[0]) if self.args else ""


@contextlib.contextmanager
def allow_lossy_casts(allow: bool = True) -> Iterator[None]:
    """Lets loads in this block cast stored values into target dtypes that cannot hold them all.

    A restore into a different dtype is a cast. One that keeps every value
    (``bfloat16`` into ``float32``, ``int8`` into ``int32``) always goes ahead; one
    that may not (``float32`` into ``bfloat16``, ``int32`` into ``float32``, a float
    into an integer) is refused unless it runs inside this block::

        with tinax.checkpointing.allow_lossy_casts():
            restored = load_checkpointables(path, targets_in_bfloat16)

    The permission belongs to the calling thread (and its ``asyncio`` tasks), like
    ``with ocp.Context(...)``.

    Args:
      allow: ``False`` refuses lossy casts again inside an outer permission.
    """
    with switched(_ALLOW_LOSSY, allow, argument="allow"):
        yield


def lossy_casts_allowed() -> bool:
    """Whether the calling code runs inside ``allow_lossy_casts()``."""
    return _ALLOW_LOSSY.get()


def missing_checkpointables(checkpoint: layout.Checkpoint, wanted: list[str]) -> None:
    """Raises ``TargetMismatchError`` naming the ``wanted`` names the checkpoint lacks."""
    held = [item.name for item in checkpoint.checkpointables]
    missing = [name for name in wanted if name not in held]
    if missing:
        raise TargetMismatchError(
            f"checkpoint {str(checkpoint.path)!r} has no checkpointable(s) {missing}; "
            f"it holds {held}"
        )


def check_targets(checkpoint: layout.Checkpoint, targets: Mapping[str, Any]) -> None:
    """Refuses ``targets`` that do not fit ``checkpoint``, reading metadata only.

    Raises:
      TypeError: If a target holds a flax NNX object (``nnx.Module``,
        ``nnx.Optimizer``) or ``GraphDef`` rather than its state.
      TargetMismatchError: If a checkpointable is missing, or a leaf's kind, shape
        or dtype does not fit (a lossy cast counts unless ``allow_lossy_casts``;
        a typed PRNG key against raw key data never fits), naming each such leaf.
      ValueError: If the checkpoint's metadata cannot be read.
    """
    for name, tree in targets.items():
        refuse_flax_objects(tree, what=f"restore target {name!r}")
    missing_checkpointables(checkpoint, list(targets))
    stored = fit.stored_specs(checkpoint, targets)
    wanted = {
        name: [(path, target_spec(leaf)) for path, leaf in target_leaves(tree)]
        for name, tree in targets.items()
    }
    refused = fit.refusals(fit.judge(stored, wanted), allow_lossy=lossy_casts_allowed())
    if refused:
        raise TargetMismatchError(fit.refusal_message(str(checkpoint.path), refused))
