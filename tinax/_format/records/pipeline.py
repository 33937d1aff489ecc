"""The input pipeline a Grain iterator was saved from, as recorded in the checkpoint.

A save records, for each iterator checkpointable, how Grain describes the dataset
behind it (``tinax.checkpointing`` makes the record): one line per node from the
source to the output, each as Grain's own ``str`` of it (``RangeMapDataset(start=0,
stop=1000, step=1)``, ``BatchMapDataset(batch_size=4, drop_remainder=False)``) with
the seed a node draws from, where it has one (``ShuffleMapDataset(seed=0)``). The
record lives in ``_CHECKPOINT_METADATA``'s ``custom_metadata`` under
``names.PIPELINES``, committed with the checkpoint; ``commit_record.CheckpointRecord``
reads it. This module reads and compares records; it knows nothing of Grain.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from tinax._format.naming import names

# A record names at most this many nodes: a pipeline is a handful; a record of
# thousands is not one tinax wrote.
MAX_NODES = 1000
MAX_NODE_CHARS = 2000


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """An input pipeline as Grain describes it.

    Attributes:
      nodes: One description per node, from the source to the output.
      grain: The Grain version that described it.
    """

    nodes: tuple[str, ...]
    grain: str = ""

    def record(self) -> dict[str, Any]:
        """The JSON record a save writes."""
        return {"format": names.PIPELINE_FORMAT, "grain": self.grain, "nodes": list(self.nodes)}


def parse(record: object) -> Pipeline | None:
    """A pipeline from its record; ``None`` for anything that is not a record tinax
    wrote (an unknown format: nothing to compare against)."""
    if not isinstance(record, Mapping) or record.get("format") != names.PIPELINE_FORMAT:
        return None
    nodes = record.get("nodes")
    if not isinstance(nodes, list) or len(nodes) > MAX_NODES:
        return None
    if not all(isinstance(n, str) and len(n) <= MAX_NODE_CHARS for n in nodes):
        return None
    grain = record.get("grain")
    return Pipeline(tuple(nodes), grain if isinstance(grain, str) else "")


def saved_pipelines(pipelines: Mapping[str, Any]) -> dict[str, Pipeline]:
    """The pipelines of a checkpoint's record (``layout.Checkpoint.pipelines``), by
    iterator checkpointable."""
    out = {}
    for name, record in pipelines.items():
        found = parse(record)
        if isinstance(name, str) and found is not None:
            out[name] = found
    return out


def differences(saved: Pipeline, now: Pipeline) -> list[str]:
    """What differs between the pipeline saved and the one given, node by node:
    ``"saved BatchMapDataset(batch_size=4, …), now BatchMapDataset(batch_size=8, …)"``,
    ``"saved ShuffleMapDataset(seed=0), now none"``, ``"added MapMapDataset(…)"``.
    Empty when they are the same."""
    out: list[str] = []
    matcher = difflib.SequenceMatcher(a=saved.nodes, b=now.nodes, autojunk=False)
    for op, a0, a1, b0, b1 in matcher.get_opcodes():
        if op == "equal":
            continue
        old, new = list(saved.nodes[a0:a1]), list(now.nodes[b0:b1])
        if op == "replace" and len(old) == len(new):
            out.extend(f"saved {o}, now {n}" for o, n in zip(old, new, strict=True))
        else:
            out.extend(f"saved {o}, now none" for o in old)
            out.extend(f"added {n}" for n in new)
    return out


def describe(nodes: Sequence[str]) -> str:
    """The pipeline in one line, source first: ``Range… → Shuffle… → Batch…``."""
    return " → ".join(nodes) if nodes else "(no dataset nodes)"
