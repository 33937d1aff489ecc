"""How a save moves an accelerator's arrays to the host: early, and in batches.

Orbax's save call copies every array it saves from its devices to the host, and
only once the whole state is there does its background thread start writing. On a
TPU v5e the copy of a 2.8 GB state took 0.9-1.4 s and the writing after it about
0.7 s (``bench/accelerator.py``). tinax starts the copies when its save call
starts, so that they run while it checks the values, claims the destination and
makes the checkpoint's directories (in the call, not after it, as Orbax does by
default), and has Orbax write each batch of arrays as soon as it is on the host
(``_orbax.write_while_copying``), so that only the last batch's writing is left
when the call returns. Arrays already in host memory (a CPU's) are saved in
Orbax's own order: there is no copy to overlap.

While that writing goes on after the call, the training loop trains, and its thread
needs a core at the end of every step: such saves compress on ``FREE_CORES`` threads
fewer than the host has cores (``encode_threads``).
"""

from __future__ import annotations

import os
from typing import Any

import jax

# An accelerator's arrays reach the writer in this many batches, none smaller than
# the minimum.
WRITE_BATCHES = 4
MIN_WRITE_BATCH_BYTES = 64 << 20
# While a save from an accelerator writes in the background, the training loop goes
# on, and its thread needs a core the moment each step ends to dispatch the next:
# tensorstore compresses on one thread a core by default, and on a TPU host of 13
# cores 13 compressing threads beside a 20 ms step doubled it, where 11 left it as it
# was (``bench/transfer_probe.py``). Such saves compress on this many threads fewer
# than the host has cores: one for the loop, one for the runtime's own threads, two
# for tinax's digests.
FREE_CORES = 4


def _on_accelerator(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array) and any(
        getattr(device, "platform", "cpu") != "cpu" for device in leaf.sharding.device_set
    )


def write_batch_bytes(checkpointable: Any) -> int | None:
    """How many bytes of arrays a save of ``checkpointable`` writes at a time while
    it copies the next ones to the host; ``None`` when none of its arrays is on an
    accelerator."""
    total = sum(
        int(leaf.nbytes)
        for leaf in jax.tree_util.tree_leaves(checkpointable)
        if _on_accelerator(leaf)
    )
    if total == 0:
        return None
    return max(MIN_WRITE_BATCH_BYTES, -(-total // WRITE_BATCHES))


def encode_threads(checkpointable: Any) -> int | None:
    """How many threads a save of ``checkpointable`` encodes its arrays on (compressing
    them among it); ``None`` (tensorstore's default, one a core) when none of its
    arrays is on an accelerator: no training loop waits on that host's cores then."""
    if write_batch_bytes(checkpointable) is None:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) - FREE_CORES)


def start_host_copies(tree: Any) -> None:
    """Starts copying the arrays of ``tree`` that live on an accelerator to the host.

    Orbax waits for each copy later, and a copy under way is not made twice. Only
    arrays whose every device holds a different part are started: of a replicated
    array Orbax copies the replica its process writes, which may be another one.
    An array that cannot be copied (deleted, donated) is left to the save's own
    checks, which name it.
    """
    for leaf in jax.tree_util.tree_leaves(tree):
        if not _on_accelerator(leaf):
            continue
        try:
            devices = leaf.sharding.device_set
            if len(devices) > 1:
                parts = leaf.sharding.devices_indices_map(leaf.shape).values()
                if len({tuple((s.start, s.stop) for s in part) for part in parts}) < len(devices):
                    continue
            leaf.copy_to_host_async()
        except (RuntimeError, ValueError):
            continue
