"""What a checkpoint's commit record (Orbax's ``_CHECKPOINT_METADATA``) says."""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Mapping
from typing import Any

from tinax._format.naming import names
from tinax._format.storage import files
from tinax._format.storage.location import Entry, Location


@dataclasses.dataclass(frozen=True)
class CheckpointRecord:
    """What ``_CHECKPOINT_METADATA`` says.

    Attributes:
      item_handlers: Checkpointable name → handler type name (``None`` where it is
        not a string), a single handler name for a flat checkpoint, or ``None``
        when the record names none.
      committed_nsecs: Commit time in nanoseconds since the epoch, if recorded.
      checksummed: Whether the save recorded that every pytree and iterator
        checkpointable carries tinax checksums (``names.CHECKSUMS_PROMISE``).
      pipelines: The input pipeline each iterator checkpointable was saved from
        (``names.PIPELINES``, read by ``pipeline.saved_pipelines``); empty when
        the save recorded none (Orbax's, an older tinax's).
      custom_metadata: The record's ``custom_metadata`` object (empty if none).
      metrics: The record's ``metrics`` object, Orbax's record of a save's metrics
        (empty if none).
    """

    item_handlers: dict[str, str | None] | str | None
    committed_nsecs: int | None
    checksummed: bool = False
    pipelines: dict[str, Any] = dataclasses.field(default_factory=dict)
    custom_metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)


def read_checkpoint_record(
    path: Location, entries: Mapping[str, Entry] | None = None
) -> CheckpointRecord:
    """Reads the checkpoint's ``_CHECKPOINT_METADATA``; ``entries`` are the checkpoint's
    entries, if the caller has listed them (the file is then not looked at first).

    Raises:
      ValueError: If the file is missing, not JSON, or not Orbax's record; the
        message names the file and what is wrong.
    """
    meta_file = path / names.CHECKPOINT_METADATA
    what = "Orbax checkpoint metadata"
    if entries is None:
        meta = files.read_json_object(meta_file, what=what)
    else:
        data = files.read_listed_bytes(
            meta_file,
            entries.get(names.CHECKPOINT_METADATA),
            what=what,
            max_bytes=files.MAX_SMALL_JSON_BYTES,
        )
        meta = files.parse_json_object(
            data, path=meta_file, what=what, max_depth=files.MAX_JSON_DEPTH
        )
    handlers: Any = meta.get("item_handlers")
    if isinstance(handlers, dict):
        for name in handlers:
            check_checkpointable_name(name, meta_file)
        handlers = {k: v if isinstance(v, str) else None for k, v in handlers.items()}
    elif handlers is not None and not isinstance(handlers, str):
        raise ValueError(
            f"{str(meta_file)!r} has item_handlers of type {type(handlers).__name__}; "
            "expected an object or a string"
        )
    stamp = meta.get("commit_timestamp_nsecs")
    committed = None
    # Later than any plausible date (year 2262) is not a time pandas can show.
    if isinstance(stamp, int) and not isinstance(stamp, bool) and 0 < stamp < 2**63:
        committed = stamp
    custom = meta.get("custom_metadata")
    promise = custom.get(names.CHECKSUMS_PROMISE) if isinstance(custom, dict) else None
    checksummed = isinstance(promise, dict) and promise.get("checksums") is True
    pipelines = custom.get(names.PIPELINES) if isinstance(custom, dict) else None
    metrics = meta.get(names.METRICS)
    return CheckpointRecord(
        item_handlers=handlers,
        committed_nsecs=committed,
        checksummed=checksummed,
        pipelines=pipelines if isinstance(pipelines, dict) else {},
        custom_metadata=custom if isinstance(custom, dict) else {},
        metrics=metrics if isinstance(metrics, dict) else {},
    )


def check_checkpointable_name(name: object, meta_file: Location) -> str:
    """A checkpointable name read from metadata, refused unless it is a plain directory name.

    Raises:
      ValueError: Naming ``meta_file``, if ``name`` is not a string or would climb
        out of the checkpoint.
    """
    if not isinstance(name, str):
        raise ValueError(f"{str(meta_file)!r} has a non-string checkpointable name")
    if not name or name in (".", "..") or posixpath.basename(name) != name or "\\" in name:
        raise ValueError(
            f"{str(meta_file)!r} names checkpointable {name!r}, which is not a plain directory name"
        )
    return name
