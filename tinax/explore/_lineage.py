"""Where a derived or averaged checkpoint came from: its lineage as a table, and in words."""

from __future__ import annotations

import os
from typing import Any

import pandas as pd

from tinax._format.metadata.layout import Checkpoint
from tinax._format.records import lineage as _lineage
from tinax._paths import open_checkpoint

LINEAGE_COLUMNS = (
    "source",
    "step",
    "health",
    "health_reason",
    "operation",
    "weight",
    "checksums",
    "arguments",
    "created",
)


def lineage(path: str | os.PathLike[str] | Checkpoint) -> pd.DataFrame:
    """What a checkpoint was made from: one row per source of a derived or averaged one.

    Columns: ``source`` (the source's path or ``gs://`` URL), ``step`` (``Int64``,
    from its name), ``health`` and ``health_reason`` (the source's verdict when it
    was read whole to make this one: ``healthy`` or ``diverged`` and why; missing in
    an older record), ``operation`` (``derive`` or ``average``), ``weight`` (an
    average's normalised weight of that source; missing for a derive),
    ``checksums`` (the digest of the source's checksum records when it was read:
    the exact bytes it was made from; missing if it had none), ``arguments`` (the
    operation's arguments, a dict, the same in every row) and ``created`` (when it
    was made, UTC). ``attrs["operation"]`` and ``attrs["arguments"]`` repeat them.
    Empty (with these columns) for a checkpoint saved from training.

    Args:
      path: A checkpoint directory, local or ``gs://``.

    Raises:
      TypeError: If ``path`` is not a path.
      FileNotFoundError: If it does not exist.
      ValueError: If it is not a readable checkpoint, or its lineage record is
        unreadable or was changed after it was made.
    """
    checkpoint = open_checkpoint(path)
    found = _lineage.read_lineage(checkpoint)
    if found is None:
        table = _table([])
        table.attrs.update(operation=None, arguments=None)
        return table
    created = pd.Timestamp(found.created_ns, unit="ns", tz="UTC")
    rows = [
        {
            "source": source.path,
            "step": source.step,
            "health": source.health,
            "health_reason": source.health_reason,
            "operation": found.operation,
            "weight": source.weight,
            "checksums": source.checksums,
            "arguments": dict(found.arguments),
            "created": created,
        }
        for source in found.sources
    ]
    table = _table(rows)
    table.attrs.update(operation=found.operation, arguments=dict(found.arguments))
    return table


def _table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    def column(name: str) -> list[Any]:
        return [row[name] for row in rows]

    return pd.DataFrame(
        {
            "source": pd.array(column("source"), dtype="string"),
            "step": pd.array(column("step"), dtype="Int64"),
            "health": pd.array(column("health"), dtype="string"),
            "health_reason": pd.array(column("health_reason"), dtype="string"),
            "operation": pd.array(column("operation"), dtype="string"),
            "weight": pd.array(column("weight"), dtype="Float64"),
            "checksums": pd.array(column("checksums"), dtype="string"),
            "arguments": pd.Series(column("arguments"), dtype=object),
            "created": pd.Series(column("created"), dtype="datetime64[ns, UTC]"),
        },
        columns=list(LINEAGE_COLUMNS),
    )


def _name(source: str) -> str:
    return source.rstrip("/").rsplit("/", 1)[-1] or source


def _about(step: Any, verdict: Any, reason: Any) -> str:
    """`` (step 70, diverged: its logged loss is NaN)``: a source's step and verdict."""
    said = [] if pd.isna(step) else [f"step {int(step)}"]
    if not pd.isna(verdict):
        said.append(f"{verdict}: {reason}" if verdict != "healthy" else str(verdict))
    return f" ({', '.join(said)})" if said else ""


def lineage_summary(table: pd.DataFrame, *, full_paths: bool = False) -> str:
    """A lineage table in a line of words: ``derived from step_000250 (cast to bfloat16,
    checkpointables model)`` or ``average of 3: step_000200 (weight 0.2), …``; ``""``
    for a checkpoint saved from training.

    Args:
      table: ``lineage(path)``.
      full_paths: Name the sources by their paths (else by their last part).
    """
    if table.empty:
        return ""
    arguments: dict[str, Any] = table["arguments"].iloc[0] or {}
    sources = [
        (str(s) if full_paths else _name(str(s))) + _about(step, verdict, reason)
        for s, step, verdict, reason in zip(
            table["source"], table["step"], table["health"], table["health_reason"], strict=True
        )
    ]
    operation = str(table["operation"].iloc[0])
    if operation == _lineage.AVERAGE:
        weights = [float(w) for w in table["weight"].fillna(0.0)]
        equal = len(set(weights)) <= 1
        parts = [
            s if equal else f"{s} (weight {w:.3g})" for s, w in zip(sources, weights, strict=True)
        ]
        text = f"average of {len(sources)}: " + ", ".join(parts)
        chosen = []
        if arguments.get("checkpointables"):
            chosen.append(f"checkpointables {', '.join(arguments['checkpointables'])}")
        if arguments.get("keys"):
            chosen.append(f"keys {arguments['keys']}")
        return text + (f" ({'; '.join(chosen)})" if chosen else "")
    how = []
    if arguments.get("checkpointables"):
        how.append(f"checkpointables {', '.join(arguments['checkpointables'])}")
    if arguments.get("keys"):
        how.append(f"keys {arguments['keys']}")
    if arguments.get("cast"):
        how.append(f"cast to {arguments['cast']}")
    for pattern, replacement in arguments.get("rename") or ():
        how.append(f"renamed {pattern} → {replacement}")
    verb = "derived from" if operation == _lineage.DERIVE else f"{operation} of"
    return f"{verb} {', '.join(sources)}" + (f" ({'; '.join(how)})" if how else "")
