"""What ``verify``'s checks share: the checkpoint under verification, findings, and the
``Check`` base class another check subclasses."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from tinax._format.arraydata import chunks, rawread
from tinax._format.metadata import arrays, pytree
from tinax._format.metadata.commit_record import CheckpointRecord
from tinax._format.metadata.layout import Checkpoint, StoredCheckpointable
from tinax._format.storage import files
from tinax._format.storage.location import Entry, Location


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing ``verify`` found.

    Attributes:
      part: What it is about: a file or directory relative to the checkpoint
        (``model/manifest.ocdbt``), a leaf (``model ['dense']['w']``), or ``""``
        for the checkpoint as a whole.
      severity: ``error`` (it cannot be trusted to load as saved), ``warning``
        or ``info``.
      message: What was found, in words.
    """

    part: str
    severity: str
    message: str


@dataclasses.dataclass(frozen=True)
class StoredArray:
    """An array leaf as ``verify`` reads it.

    Attributes:
      checkpointable: The checkpointable's name.
      key: The leaf's key.
      param: Orbax's name for the array.
      info: What its zarr metadata says.
    """

    checkpointable: str
    key: str
    param: str
    info: arrays.ArrayInfo

    @property
    def part(self) -> str:
        return f"{self.checkpointable} {self.key}".rstrip()


@dataclasses.dataclass
class PyTreeState:
    """A pytree checkpointable as far as the checks have read it.

    Attributes:
      item: The checkpointable.
      tree: Its ``_METADATA``, once read.
      arrays: Its array leaves whose zarr metadata was read.
      contents: Its OCDBT store's keys, once walked.
      readable: Whether its array data can be read at all.
      damaged: Keys of the arrays with chunks in a damaged data file.
    """

    item: StoredCheckpointable
    tree: pytree.PyTreeLayout | None = None
    arrays: list[StoredArray] = dataclasses.field(default_factory=list)
    contents: chunks.StoreContents | None = None
    readable: bool = False
    damaged: set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class VerifyTarget:
    """The checkpoint under verification, as the checks share it.

    Attributes:
      path: The checkpoint directory.
      data: Whether array data is read.
      record: ``_CHECKPOINT_METADATA``, if readable.
      checkpoint: The checkpoint's layout, if it could be opened.
      safe: Whether nothing under ``path`` leads out of it (links, FIFOs), so
        that its array stores may be read.
      trees: Pytree checkpointables by name.
      ctx: The tensorstore context reads share.
      refused: Why a load refuses the checkpoint (its preflight), if it does;
        array stores are then not read.
      listing: The entries of the checkpoint's directory and of every one under it,
        by path, as ``verify`` listed them once (``files.walk``): checks look here
        rather than list or look at a file again.
      scan: The safety walk of that listing (``files.scan``), if it is safe.
      files: The data files its data pass reads raw, each opened once for the whole
        verification (closed when it ends).
    """

    path: Location
    data: bool
    record: CheckpointRecord | None = None
    checkpoint: Checkpoint | None = None
    safe: bool = True
    trees: dict[str, PyTreeState] = dataclasses.field(default_factory=dict)
    ctx: Any = dataclasses.field(default_factory=arrays.context)
    refused: str | None = None
    listing: dict[str, dict[str, Entry]] = dataclasses.field(default_factory=dict)
    scan: files.Scan | None = None
    files: rawread.DataFiles = dataclasses.field(default_factory=rawread.DataFiles)

    def entries(self, where: Location) -> dict[str, Entry]:
        """The entries of the directory ``where`` (the checkpoint's or one under it), as
        listed once when the verification began; empty if it is not a directory."""
        return self.listing.get(where.path, {})

    def relative(self, where: Location) -> str:
        """``where`` as a path relative to the checkpoint."""
        if where.path == self.path.path:
            return ""
        return where.path.removeprefix(self.path.path).lstrip("/" + os.sep)


class LeafScan:
    """Follows one leaf's values as they are read; made by ``Check.leaf``."""

    def update(self, box: chunks.Box, values: np.ndarray) -> None:
        """Takes one region's values (regions arrive in order and tile the array)."""

    def finish(self) -> Iterable[Finding]:
        """Findings once every region was read."""
        return ()


class Check:
    """One kind of check ``verify`` runs; subclass to add one.

    ``structure`` runs first, in order, for every check; then, when data is read,
    ``leaf`` is asked for a ``LeafScan`` for each array leaf, fed with its values.
    """

    def structure(self, target: VerifyTarget) -> Iterable[Finding]:
        """Findings from the checkpoint's files and metadata."""
        return ()

    def leaf(self, target: VerifyTarget, array: StoredArray) -> LeafScan | None:
        """A scan of ``array``'s values, or ``None`` to skip it."""
        return None
