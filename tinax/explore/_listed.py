"""What a listing reads of each committed checkpoint, handed to whoever reads it next.

A listing of a run that does not check each checkpoint in depth (``list_checkpoints``'s
default) reads, of each committed one, its top directory (one listing), its commit
record and its save's record (two small files): enough for its row (what it holds,
when it committed, how large it is). Those reads travel on with the listing
(``_listing.RunListing``): ``run_table`` takes metrics and save times from them, and a
reader that opens the checkpoint (``drift_table``, ``scan_run``) starts from its top
listing and commit record (``open_listed``), so that nothing is read twice.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from tinax._format.integrity import preflight
from tinax._format.metadata import commit_record, layout
from tinax._format.naming import names
from tinax._format.records import savetimes
from tinax._format.storage import files
from tinax._format.storage.location import DIRECTORY, Entry, Location


@dataclasses.dataclass(frozen=True)
class Listed:
    """A committed checkpoint as a listing read it.

    Attributes:
      path: The checkpoint directory.
      entries: Its top directory's entries, as listed.
      record: Its commit record (naming its checkpointables).
      save: Its save's record (how long it took, how large it is), if tinax wrote one.
      nbytes: Its size: as its save recorded it, else as a walk of it found it.
    """

    path: Location
    entries: dict[str, Entry]
    record: commit_record.CheckpointRecord
    save: savetimes.SaveTimes | None
    nbytes: int

    @property
    def checkpointables(self) -> tuple[str, ...]:
        """The checkpointables its record names."""
        handlers = self.record.item_handlers
        return tuple(handlers) if isinstance(handlers, dict) else ()

    def missing(self) -> str | None:
        """What its top directory lacks that its record names, if anything: a load
        refuses it (``layout.identify`` says why in the same words)."""
        for name in self.checkpointables:
            entry = self.entries.get(name)
            if entry is None or entry.kind != DIRECTORY:
                return (
                    f"checkpoint {str(self.path)!r} lists checkpointable {name!r} in "
                    f"{names.CHECKPOINT_METADATA} but has no directory for it"
                )
        return None


def read_listed(path: Location, entries: dict[str, Entry]) -> Listed | None:
    """What a listing reads of the committed checkpoint ``path``, whose top directory it
    listed as ``entries``: its commit record and its save's record (a walk of it only
    where its save recorded no size). ``None`` where the record does not read, or does
    not name its checkpointables (only the full check tells what it is).
    """
    try:
        record = commit_record.read_checkpoint_record(path, entries)
    except ValueError:
        return None
    if not isinstance(record.item_handlers, dict):
        return None
    entry = entries.get(names.SAVE_TIMES)
    save = savetimes.read_save_times(path, entry)
    nbytes = savetimes.recorded_size(save, entry)
    if nbytes is None:
        try:
            nbytes = files.scan(path, entries.values()).nbytes
        except ValueError:
            return None  # not safe to read: the full check says why
    return Listed(path, entries, record, save, nbytes)


def open_listed(listed: Listed) -> layout.Checkpoint:
    """The checkpoint ``listed`` opened as ``open_checkpoint`` opens it, from the top
    listing and commit record the listing read (neither is read again).

    Raises:
      ValueError: As ``open_checkpoint``, naming what is wrong.
    """
    scan = files.scan(listed.path, listed.entries.values())
    return preflight.check(listed.path, scan, listed.record)


class ListingRows(NamedTuple):
    """A listing as rows, before it is made a table: each row a dict of the listing's
    columns (commit time and age in nanoseconds), and the table's ``attrs``; ``tiers``:
    whether it lists both tiers of a two-tier run (with their columns, rows or none)."""

    rows: list[dict[str, Any]]
    attrs: dict[str, Any]
    tiers: bool = False
