"""Where a checkpoint made from other checkpoints came from: its lineage record.

A derived or averaged checkpoint (``tinax.checkpointing.derive_checkpoint``,
``average_checkpoints``) holds ``names.LINEAGE`` at its root, written before it
commits: the operation and its arguments, and each source's path, step, weight
(an average's, normalised) and the digest of its checksum records, which names the
exact bytes it was made from. The record's own digest is committed with the
checkpoint in ``_CHECKPOINT_METADATA`` (beside the checksum promise), so a record
edited or removed afterwards is seen. A checkpoint saved from training has none.

JSON only, size-bounded; ``tinax.explore.lineage`` reads it as a table.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import xxhash

from tinax._format.metadata import layout
from tinax._format.naming import names
from tinax._format.storage import files
from tinax._format.storage.location import Location

DERIVE = "derive"
AVERAGE = "average"
# The key of the record's digest in the checksum promise of ``_CHECKPOINT_METADATA``.
PROMISE_KEY = "lineage"
# Sources and arguments: a few hundred bytes each.
MAX_LINEAGE_BYTES = 4 << 20


@dataclasses.dataclass(frozen=True)
class Source:
    """One checkpoint a new one was made from.

    Attributes:
      path: Where it was (a path or a ``gs://`` URL), as opened.
      step: The step its name carries, if any.
      checksums: The digest of its checksum records (``None``: it had none).
      weight: Its weight in an average, normalised (``None`` for a derive).
      health: Its health when it was read whole to make the new checkpoint
        (``healthy`` or ``diverged``; ``None`` in an older record).
      health_reason: Why, in the words every view uses.
    """

    path: str
    step: int | None
    checksums: str | None
    weight: float | None = None
    health: str | None = None
    health_reason: str | None = None


@dataclasses.dataclass(frozen=True)
class Lineage:
    """What a checkpoint was made from, and how.

    Attributes:
      operation: ``derive`` or ``average``.
      arguments: The operation's arguments, as JSON values.
      sources: The checkpoints it was made from, in order.
      created_ns: When it was made, in nanoseconds since the epoch.
    """

    operation: str
    arguments: dict[str, Any]
    sources: tuple[Source, ...]
    created_ns: int


def encode(lineage: Lineage) -> bytes:
    """The record's bytes."""
    document = {
        "format": names.LINEAGE_FORMAT,
        "operation": lineage.operation,
        "arguments": lineage.arguments,
        "sources": [dataclasses.asdict(source) for source in lineage.sources],
        "created_ns": lineage.created_ns,
    }
    return json.dumps(document, indent=1).encode("utf-8")


def digest(data: bytes) -> str:
    """The digest of a record's bytes, as committed beside the checksum promise."""
    return xxhash.xxh3_64_hexdigest(data)


def records_digest(checkpoint: layout.Checkpoint) -> str | None:
    """The digest of a checkpoint's checksum records (every checkpointable's, in name
    order); ``None`` if it has none.

    Raises:
      ValueError: If a record cannot be read.
    """
    hasher = xxhash.xxh3_64()
    found = False
    listed = checkpoint.scan.listing()
    for item in sorted(checkpoint.checkpointables, key=lambda c: c.name):
        record_dir = item.directory / names.CHECKSUMS_DIR
        entries = listed.get(record_dir.path)
        if entries is None:
            continue
        for name in sorted(n for n in entries if names.CHECKSUM_FILE.match(n)):
            # The bytes the checksums' reader read (kept on the opened checkpoint).
            data = checkpoint.read_bytes(
                record_dir / name, what="tinax checksums", max_bytes=files.MAX_METADATA_BYTES
            )
            hasher.update(f"{item.name}/{name}\0{len(data)}\0".encode())
            hasher.update(data)
            found = True
    return hasher.hexdigest() if found else None


def _promised_digest(checkpoint: layout.Checkpoint) -> str | None:
    custom = {} if checkpoint.record is None else checkpoint.record.custom_metadata
    promise = custom.get(names.CHECKSUMS_PROMISE)
    value = promise.get(PROMISE_KEY) if isinstance(promise, dict) else None
    return value if isinstance(value, str) else None


def read_lineage(checkpoint: layout.Checkpoint) -> Lineage | None:
    """The lineage record of the opened ``checkpoint`` (checked against the digest its
    commit record holds, as read when it was opened); ``None`` for one saved from
    training.

    Raises:
      ValueError: If the record is unreadable or not a lineage record, or it does
        not match the digest committed with the checkpoint (or is missing though
        one was committed); the message names the file.
    """
    where = checkpoint.path / names.LINEAGE
    promised = _promised_digest(checkpoint)
    if names.LINEAGE not in checkpoint.entries(checkpoint.path):
        if promised is not None:
            raise ValueError(
                f"checkpoint {str(checkpoint.path)!r} was made with a lineage record, but "
                f"{names.LINEAGE} is missing"
            )
        return None
    data = checkpoint.read_bytes(where, what="tinax lineage record", max_bytes=MAX_LINEAGE_BYTES)
    if promised is not None and digest(data) != promised:
        raise ValueError(
            f"{str(where)!r} does not match the digest committed with the checkpoint: "
            "it was changed after the checkpoint was made"
        )
    document = files.parse_json_object(
        data, path=where, what="tinax lineage record", max_depth=files.MAX_JSON_DEPTH
    )
    return _parse(document, where)


def source_step(path: Location) -> int | None:
    """The step a listing shows for a derived or averaged checkpoint at ``path`` whose
    name carries none: its source's (an average's newest source's), as its lineage
    record says. Only for display: the record is not checked against its digest here
    (``read_lineage`` does that); ``None`` where it is missing or unreadable.
    """
    where = path / names.LINEAGE
    try:
        data = files.read_bytes(where, what="tinax lineage record", max_bytes=MAX_LINEAGE_BYTES)
        document = files.parse_json_object(
            data, path=where, what="tinax lineage record", max_depth=files.MAX_JSON_DEPTH
        )
        made = _parse(document, where)
    except (ValueError, OSError):
        return None
    return max((s.step for s in made.sources if s.step is not None), default=None)


def _parse(document: dict[str, Any], where: Location) -> Lineage:
    def bad(what: str) -> ValueError:
        return ValueError(f"{str(where)!r} (tinax lineage record): {what}")

    if document.get("format") != names.LINEAGE_FORMAT:
        raise bad(f"not a {names.LINEAGE_FORMAT} record")
    operation = document.get("operation")
    arguments = document.get("arguments")
    raw_sources = document.get("sources")
    created = document.get("created_ns")
    if not isinstance(operation, str) or not isinstance(arguments, dict):
        raise bad("no operation and arguments")
    if not isinstance(raw_sources, list) or not raw_sources:
        raise bad("no sources")
    if not isinstance(created, int) or isinstance(created, bool):
        raise bad("no creation time")
    sources = []
    for raw in raw_sources:
        if not isinstance(raw, dict) or not isinstance(raw.get("path"), str):
            raise bad("a source has no path")
        step, sums, weight = raw.get("step"), raw.get("checksums"), raw.get("weight")
        if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
            raise bad(f"source {raw['path']!r} has a step that is not an integer")
        if sums is not None and not isinstance(sums, str):
            raise bad(f"source {raw['path']!r} has a checksum digest that is not text")
        if weight is not None and (not isinstance(weight, int | float) or isinstance(weight, bool)):
            raise bad(f"source {raw['path']!r} has a weight that is not a number")
        verdict, reason = raw.get("health"), raw.get("health_reason")
        sources.append(
            Source(
                raw["path"],
                step,
                sums,
                None if weight is None else float(weight),
                verdict if isinstance(verdict, str) else None,
                reason if isinstance(reason, str) else None,
            )
        )
    return Lineage(operation, arguments, tuple(sources), created)
