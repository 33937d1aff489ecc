"""A new checkpoint written file by file and committed as Orbax commits one.

Where Orbax commits by renaming (local disk), the checkpoint is written in its
temporary directory (``<name>.orbax-checkpoint-tmp``, which listings show as a save
in progress, or interrupted once its writer's claim is gone) and renamed to its name
once whole; nothing is ever at the destination before that. Where it cannot (object
stores), it is written in place and committed by ``commit_success.txt``, written last
after ``_CHECKPOINT_METADATA``, Orbax's own rule. Every file is written durably; the
rename is made durable too.

Used by the writers of checkpoints made from others; the caller claims the
destination first (``tinax._claims``) and calls ``discard`` on any failure.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from tinax._format.metadata import layout
from tinax._format.naming import names
from tinax._format.storage import durable, files
from tinax._format.storage.location import Location

# What Orbax writes into ``commit_success.txt``.
_COMMIT_TEXT = "Checkpoint commit was successful to {}"


class NewCheckpoint:
    """A checkpoint being written to ``destination``.

    Attributes:
      destination: Where it will be once committed.
      directory: Where it is written meanwhile (the temporary directory, or the
        destination itself on storage without renames).
      committed: Whether ``commit`` has succeeded.
    """

    def __init__(self, destination: Location) -> None:
        """Makes the directory it is written in.

        Raises:
          FileExistsError: If the temporary directory exists already (the caller's
            claim removed any left by an interrupted save, so another writer made it).
          OSError: If it cannot be made.
        """
        self.destination = destination
        self.committed = False
        self.init_ns = time.time_ns()
        if destination.storage.commits_by_rename:
            self.directory = destination.parent / (destination.name + names.TEMPORARY_SUFFIX)
            # With the process's umask, as Orbax makes it: a group's run stays readable.
            os.mkdir(self.directory.path, 0o777)
        else:
            self.directory = destination

    def copy_checkpointable(self, item: layout.StoredCheckpointable) -> int:
        """Copies a checkpointable that is not an array store (a Grain iterator's state,
        a JSON record, an empty pytree) file by file; returns the bytes copied.

        Raises:
          ValueError: If one of its files is too large to be a state file.
        """
        copied = 0
        target = self.directory / item.name
        # The files its checkpoint's walk found (which refused anything but files and
        # directories), read through it: a state file its check read is not read again.
        for where, _ in item.checkpoint.files_under(item.directory):
            relative = where.path[len(item.directory.path) :].strip("/")
            data = item.checkpoint.read_bytes(
                where, what="a checkpointable's file", max_bytes=files.MAX_METADATA_BYTES
            )
            if len(data) > files.MAX_METADATA_BYTES:
                raise ValueError(f"{str(where)!r} is too large to be a state file")
            out = target
            for part in relative.split("/"):
                out = out / part
            out.write_new(data)
            copied += len(data)
        return copied

    def commit(
        self,
        item_handlers: dict[str, str | None],
        custom_metadata: dict[str, Any] | None,
        lineage: bytes | None,
    ) -> None:
        """Writes the root files and commits: after this, the checkpoint is at its
        destination, whole.

        Args:
          item_handlers: Each checkpointable's handler, as Orbax records it.
          custom_metadata: Committed in ``_CHECKPOINT_METADATA`` (the checksum promise).
          lineage: The lineage record's bytes, if any.

        Raises:
          OSError: If a file cannot be written or the directory cannot be renamed
            (the destination then holds nothing).
        """
        root = self.directory
        # Every file written so far, durable before the record that commits it.
        durable.sync_tree(root)
        if lineage is not None:
            (root / names.LINEAGE).write_new(lineage)
        (root / names.ORBAX_MARKER).write_new(b"")
        record = {
            "item_handlers": item_handlers,
            "metrics": {},
            "performance_metrics": {},
            "init_timestamp_nsecs": self.init_ns,
            "commit_timestamp_nsecs": time.time_ns(),
            "custom_metadata": custom_metadata,
        }
        (root / names.CHECKPOINT_METADATA).write_new(json.dumps(record).encode("utf-8"))
        # Last: on an object store this is what commits.
        (root / names.COMMIT_SUCCESS).write_new(
            _COMMIT_TEXT.format(str(self.destination)).encode("utf-8")
        )
        if root != self.destination:
            # Never onto something there: os.rename would replace an empty directory.
            if self.destination.exists():
                raise FileExistsError(
                    f"checkpoint destination {str(self.destination)!r} appeared while it "
                    "was being written; it is left as it is"
                )
            os.rename(root.path, self.destination.path)
            _sync_directory(self.destination.parent.path)
        self.committed = True

    def discard(self) -> None:
        """Removes what was written, unless it committed."""
        if not self.committed:
            self.directory.remove_tree()


def _sync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
