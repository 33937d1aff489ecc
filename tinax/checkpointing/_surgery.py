"""What deriving and averaging checkpoints share: sources opened and checked, the
destination claimed, arrays streamed into the new store, the commit with its lineage.

A new checkpoint is written without JAX or Orbax (``tinax._format.writing.store_writer``),
in Orbax's own layout, so that the restore verdict, every tinax reader and raw Orbax
load it as any other. It is checksummed as a tinax save is (the record in every
pytree and iterator checkpointable, the promise in ``_CHECKPOINT_METADATA``), and
atomic: written under a claim on its destination, in Orbax's temporary directory
renamed at the end (local disk) or in place with ``commit_success.txt`` last
(object stores). Whatever fails on the way is removed before the error is raised.

(Over 500 lines: the sources opened and checked, each array's job planned, its boxes
streamed, digested and written, and the commit with its lineage are one pipeline that
both operations run; the format's writers live in ``tinax._format``.)
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tinax import _paths
from tinax._format.arraydata.chunks import Box
from tinax._format.callbacks import Progress
from tinax._format.integrity import checksums, health
from tinax._format.integrity.checksums import Bounds, CorruptDataError, LeafRecord, Piece
from tinax._format.metadata import arrays, commit_record, layout, pytree
from tinax._format.naming import names, words
from tinax._format.naming.keys import KeyPath, format_key
from tinax._format.records import lineage
from tinax._format.storage import files
from tinax._format.storage.location import FILE, Location
from tinax._format.writing import store_writer, stored_copy, streaming, treeplan
from tinax._format.writing.copy_source import PyTreeSource, open_pytree_source, sharding_key
from tinax._format.writing.new_checkpoint import NewCheckpoint
from tinax.checkpointing import _destination
from tinax.checkpointing._training import STEP_KEY, TrainingCheckpointNames

# Makes the values written from each source's values of one box: into the array given
# (where the box's stored bytes are being made) or, given None, into a ``scratch`` array.
Combine = Callable[[list[np.ndarray], streaming.Scratch, np.ndarray | None], np.ndarray]
# The layouts a new checkpoint can copy file by file.
_COPIED_LAYOUTS = frozenset({layout.ITERATOR, layout.JSON, layout.EMPTY})


# Where a training checkpoint keeps its step (``TrainingCheckpointNames``'s default).
_AUXILIARY = TrainingCheckpointNames().auxiliary
_STEP_KEY = format_key((STEP_KEY,))


@dataclasses.dataclass(frozen=True)
class OpenedSource:
    """A source checkpoint, checked once by the load's preflight.

    Attributes:
      given: The path as the caller gave it.
      checkpoint: Its layout, from the preflight.
      record: What its ``_CHECKPOINT_METADATA`` says.
      custom_metadata: Its ``custom_metadata`` (beside tinax's promise).
    """

    given: str
    checkpoint: layout.Checkpoint
    record: commit_record.CheckpointRecord
    custom_metadata: dict[str, Any] | None

    @property
    def path(self) -> Location:
        return self.checkpoint.path

    def step(self) -> int | None:
        """The step its name carries, else the one a training checkpoint saved in its
        auxiliary state; ``None`` if neither says."""
        found = names.step_from_name(self.path.name)
        if found is not None:
            return found
        held = {item.name: item for item in self.checkpoint.checkpointables}
        item = held.get(_AUXILIARY)
        if item is None or item.layout != layout.PYTREE:
            return None
        try:
            tree = pytree.read_layout(item)
            leaf = next((lf for lf in tree.leaves if lf.key == _STEP_KEY), None)
            if leaf is None or leaf.kind != words.SCALAR:
                return None
            value = pytree.read_scalars(tree, [leaf], arrays.context())[leaf.param]
        except (ValueError, OSError):
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def lineage_source(
        self, weight: float | None = None, found: health.Health | None = None
    ) -> lineage.Source:
        """The source as its lineage records it (with its health, as read)."""
        return lineage.Source(
            path=str(self.path),
            step=self.step(),
            checksums=lineage.records_digest(self.checkpoint),
            weight=weight,
            health=None if found is None else found.verdict,
            health_reason=None if found is None else found.reason,
        )


def check_progress(progress: object) -> Progress | None:
    """Raises ``TypeError`` unless ``progress`` is ``None`` or callable."""
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable(done, total), got {type(progress).__name__}")
    return progress  # type: ignore[return-value]


def check_destination(destination: object) -> Location:
    """A new checkpoint's destination: refused at once if anything is there.

    Raises:
      TypeError, ValueError: For a path that is not one (see ``_paths``).
      FileExistsError: If something exists at ``destination``.
      FileNotFoundError: If its parent directory does not exist.
    """
    return _paths.save_destination(destination)


def open_source(path: object) -> OpenedSource:
    """Opens a source checkpoint through the load's own preflight.

    Raises:
      TypeError, ValueError, FileNotFoundError: As a load raises them.
    """
    if isinstance(path, layout.Checkpoint):
        given = str(path.path)
    else:
        given = _paths.text_path(path, what="source")
    checkpoint = _paths.checkpoint_to_load(path)
    # The commit record as the opening read it: nothing is read again.
    record = checkpoint.record
    return OpenedSource(
        given,
        checkpoint,
        record or commit_record.CheckpointRecord(None, None),
        None if record is None else _custom_metadata(record),
    )


def _custom_metadata(record: commit_record.CheckpointRecord) -> dict[str, Any] | None:
    kept = {k: v for k, v in record.custom_metadata.items() if k != names.CHECKSUMS_PROMISE}
    return kept or None


def check_not_inside(destination: Location, sources: Sequence[OpenedSource]) -> None:
    """Refuses a destination inside one of the sources."""
    for source in sources:
        if destination.storage.inside(destination.path, source.path.path):
            raise ValueError(
                f"destination {str(destination)!r} lies inside the source {str(source.path)!r}"
            )


def selected_names(given: object, source: OpenedSource) -> list[str]:
    """The checkpointables asked for, in the source's order (all when ``None``).

    Raises:
      TypeError: If ``given`` is not a name or a sequence of names.
      ValueError: If it is empty, or names one the source does not hold.
    """
    held = [item.name for item in source.checkpoint.checkpointables]
    return treeplan.select_checkpointables(given, held, f"checkpoint {str(source.path)!r}")


def checked_copy(item: layout.StoredCheckpointable, where: str) -> None:
    """Refuses a checkpointable that cannot be copied file by file, or whose files do
    not match their checksums.

    Raises:
      ValueError: If it is not an iterator, JSON or empty record; ``CorruptDataError``
        if a file is damaged.
    """
    if item.layout not in _COPIED_LAYOUTS:
        raise ValueError(
            f"{where}: checkpointable {item.name!r} is stored as {item.layout!r}, which a new "
            "checkpoint cannot copy; leave it out with checkpointables=[…]"
        )
    records = checksums.read_checksums(item)
    if records is not None:
        problems = checksums.check_files(item, records)
        if problems:
            raise CorruptDataError(f"{where}: checkpointable {item.name!r}: " + "; ".join(problems))


def iterator_record(item: layout.StoredCheckpointable) -> dict[str, LeafRecord]:
    """Checksums of a copied iterator's state files, for one copied without any (read
    through its opened checkpoint: the copy read them already)."""
    found = {}
    for name, entry in item.entries().items():
        if entry.kind == FILE and names.ITERATOR_FILE.match(name):
            data = item.checkpoint.read_bytes(
                item.directory / name,
                what="a checkpointable's file",
                max_bytes=files.MAX_METADATA_BYTES,
            )
            found[name] = LeafRecord(checksums.FILE, "", (), (Piece((), checksums.digest(data)),))
    return found


# -- streaming arrays ------------------------------------------------------------------


@dataclasses.dataclass
class ArrayJob:
    """One array of the new checkpoint, made from the same array of each source.

    Attributes:
      key: Its key in the writer.
      sources: The array in each source (one for a derive).
      wheres: Each source's ``checkpoint …: checkpointable …: leaf …``, for messages.
      pieces: The pieces walked in turn (and recorded for the array written).
      boxes: ``(piece, box)`` in the order they are read.
      chunk: The chunk shape written.
      dtype: The dtype written.
      combine: Makes the values written from each source's values of one box (into
        the array given, or one of its own, valid until the next box: ``Combine``).
      same_bytes: Whether what is written is the first source's bytes unchanged
        (its digests then serve as the new ones).
      stored: Set where the source's stored chunks are copied as they are.
    """

    key: str
    sources: list[streaming.SourceArray]
    wheres: list[str]
    pieces: list[Bounds]
    boxes: list[tuple[Bounds, Box]]
    chunk: tuple[int, ...]
    dtype: np.dtype
    combine: Combine
    same_bytes: bool
    stored: stored_copy.StoredArray | None = None


def plan_job(
    key: str,
    sources: list[streaming.SourceArray],
    wheres: list[str],
    dtype: np.dtype,
    combine: Combine,
) -> ArrayJob:
    """The pieces, chunks and boxes of one array (the first source's pieces walked)."""
    first = sources[0]
    pieces = streaming.tiled_pieces(first.record, first.shape)
    if any(streaming.tiled_pieces(s.record, s.shape) != pieces for s in sources[1:]):
        pieces = [checksums.full_bounds(first.shape)]
    piece_shape = tuple(b - a for a, b in pieces[0])
    chunk = streaming.write_chunk_shape(first.shape, piece_shape, first.chunk_shape, dtype.itemsize)
    itemsize = max([dtype.itemsize, *(s.dtype.itemsize for s in sources)])
    units = [*(s.unit for s in sources), chunk]
    boxes = [
        (piece, box) for piece in pieces for box in streaming.plan_boxes(piece, units, itemsize)
    ]
    same = len(sources) == 1 and dtype == first.dtype
    stored = stored_copy.plan(first) if same else None
    return ArrayJob(key, sources, wheres, pieces, boxes, chunk, dtype, combine, same, stored)


def _read_failure(where: str, error: BaseException) -> ValueError:
    message = streaming.failure_message(error)
    if checksums.undecodable(message) is not None:
        return CorruptDataError(f"{where}: {message}")
    return ValueError(f"{where}: cannot be read: {message}")


def verify_alone(source: streaming.SourceArray, where: str) -> None:
    """Reads one source array through and checks it against its own recorded pieces
    (for an average whose sources are pieced differently from the one walked).

    Raises:
      CorruptDataError, ValueError: As ``stream`` does.
    """
    pieces = streaming.tiled_pieces(source.record, source.shape)
    digests = streaming.PieceDigests(source.record, pieces)
    reads = streaming.Reads()
    for piece in pieces:
        for box in streaming.plan_boxes(piece, [source.unit], source.dtype.itemsize):
            reads.add(piece, [(source, box)])
    for piece, (values,) in reads:
        if isinstance(values, BaseException):
            raise _read_failure(where, values)
        digests.update(piece, values)
        del values
    check_digests(source, where, digests)


def check_digests(
    source: streaming.SourceArray, where: str, digests: streaming.PieceDigests
) -> None:
    """Raises ``CorruptDataError`` naming the leaf if what was read does not match the
    checksums saved with it."""
    bad = digests.mismatches()
    if bad:
        assert source.record is not None
        raise CorruptDataError(
            f"{where.rsplit(': leaf ', 1)[0]}: "
            + checksums.mismatch_message(source.key, source.record, bad)
        )


# Given the values of one source of a job as they are read: the job, the source's
# index, the values (each value once), to count NaN and Inf.
Count = Callable[[ArrayJob, int, np.ndarray], None]


def stream(
    writer: store_writer.PyTreeWriter,
    jobs: Sequence[ArrayJob],
    *,
    progress: Callable[[int], None] | None = None,
    count: Count | None = None,
) -> None:
    """Reads every job's boxes from its sources, checks them against their checksums,
    and writes what ``combine`` makes of them; ``count`` sees every value read.

    Raises:
      CorruptDataError: If a source's bytes do not match their checksums or do not
        decode, naming the checkpoint, checkpointable and leaf.
      ValueError: If a box cannot be read, or ``combine`` refuses it.
    """
    # Arrays kept as they are: their stored chunks copied (files kept whole, linked).
    writer.link_files(stored_copy.whole_files([j.stored for j in jobs if j.stored]))
    for job in jobs:
        if job.stored is not None:
            counted = None if count is None else _counting(count, job)
            stored_copy.copy(
                writer, job.key, job.stored, job.wheres[0], progress=progress, count=counted
            )
    jobs = [job for job in jobs if job.stored is None]
    budget = max(
        streaming.IN_FLIGHT_BYTES,
        3 * streaming.REGION_BYTES * max((len(j.sources) for j in jobs), default=1),
    )
    reads = streaming.Reads(budget)
    for job in jobs:
        for number, (piece, box) in enumerate(job.boxes):
            last = number == len(job.boxes) - 1
            reads.add((job, piece, box, last), [(source, box) for source in job.sources])
    digests: dict[int, tuple[list[streaming.PieceDigests], streaming.PieceDigests | None]] = {}
    scratch = streaming.Scratch()
    # The digests of what was read, and of what is written, are taken on a thread while
    # the caller's thread combines and writes (xxh3 lets go of the interpreter); both
    # end before the box's buffers are used again.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tinax-digest") as digester:
        _stream_boxes(writer, reads, digests, scratch, digester, progress, count)


def _counting(count: Count, job: ArrayJob) -> Callable[[np.ndarray], None]:
    return lambda values: count(job, 0, values)


def _digest_all(
    digests: Sequence[streaming.PieceDigests],
    piece: Any,
    values: Sequence[Any],
    count: Callable[[int, np.ndarray], None] | None = None,
) -> None:
    for index, (digest, value) in enumerate(zip(digests, values, strict=True)):
        digest.update(piece, value)
        if count is not None:
            count(index, value)


def _stream_boxes(
    writer: store_writer.PyTreeWriter,
    reads: streaming.Reads,
    digests: dict[int, tuple[list[streaming.PieceDigests], streaming.PieceDigests | None]],
    scratch: streaming.Scratch,
    digester: concurrent.futures.Executor,
    progress: Callable[[int], None] | None,
    count: Count | None = None,
) -> None:
    for (job, piece, box, last), values in reads:
        state = digests.get(id(job))
        if state is None:
            state = digests[id(job)] = (
                [streaming.PieceDigests(s.record, job.pieces) for s in job.sources],
                None if job.same_bytes else streaming.PieceDigests(None, job.pieces),
            )
        read, written = state
        for where, value in zip(job.wheres, values, strict=True):
            if isinstance(value, BaseException):
                raise _read_failure(where, value)
        counted = None if count is None else functools.partial(count, job)
        pending = [digester.submit(_digest_all, read, piece, values, counted)]
        try:
            for part in streaming.split_box(
                box, job.chunk, job.dtype.itemsize, store_writer.BATCH_BYTES
            ):
                inner = tuple(
                    slice(p.start - b.start, p.stop - b.start)
                    for p, b in zip(part, box, strict=True)
                )
                # Made where it is stored from, when the part is one whole chunk.
                made = writer.chunk_out(job.key, part)
                out = job.combine(
                    [value[inner] for value in values],  # type: ignore[index]
                    scratch,
                    None if made is None else made.values,
                )
                if written is not None:
                    pending.append(digester.submit(written.update, piece, out))
                if made is None:
                    writer.write(job.key, part, out)
                else:
                    writer.write_out(made)
                # The scratch ``out`` is in may be used again by the next part.
                for future in pending[1:]:
                    future.result()
                del pending[1:], out
        finally:
            for future in pending:
                future.result()
        nbytes = sum(np.asarray(v).nbytes for v in values)  # type: ignore[arg-type]
        del values
        if progress is not None:
            progress(nbytes)
        if last:
            for source, where, digest in zip(job.sources, job.wheres, read, strict=True):
                check_digests(source, where, digest)
            writer.set_digests(job.key, (written or read[0]).digests())
            del digests[id(job)]


def write_pytree(
    new: NewCheckpoint,
    tree: PyTreeSource,
    leaves: Sequence[tuple[KeyPath, int]],
    jobs: dict[str, ArrayJob],
    ctx: Any,
    counter: ProgressCounter,
    count: Count | None = None,
) -> None:
    """Writes one pytree checkpointable of the new checkpoint (``count`` sees every
    value read, as ``stream``'s).

    Args:
      new: The new checkpoint.
      tree: The source pytree whose metadata (value types, shardings, strings) the
        leaves take.
      leaves: Each leaf's key path in the new tree and its position in ``tree``.
      jobs: The arrays' jobs, by their new keys.
      ctx: The tensorstore context.
      counter: Counts the bytes read.
    """
    writer = store_writer.PyTreeWriter(new.directory / tree.name, ctx)
    try:
        for path, index in leaves:
            source = tree.leaves[index]
            value_metadata = tree.value_metadata[index]
            job = jobs.get(format_key(path))
            if job is not None:
                writer.add_array(
                    path,
                    value_metadata,
                    shape=job.sources[0].shape,
                    dtype=job.dtype,
                    chunk=job.chunk if job.stored is None else job.stored.grid_shape,
                    ext_metadata=tree.ext_metadata.get(source.param),
                    sharding=tree.shardings.get(sharding_key(source.param)),
                    zarr_json=None if job.stored is None else job.stored.metadata,
                )
            elif source.kind == words.STRING and source.stored:
                writer.add_string(path, value_metadata, tree.string(source))
            else:
                writer.add_empty(path, value_metadata)
        stream(writer, list(jobs.values()), progress=counter, count=count)
        writer.finish()
    except BaseException:
        writer.abort()
        raise


class ProgressCounter:
    """Adds the bytes read up and reports them to the caller's ``progress(done, total)``."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress = progress
        self.total = total
        self.done = 0
        if progress is not None:
            progress(0, total)

    def __call__(self, nbytes: int) -> None:
        self.done += nbytes
        if self.progress is not None:
            self.progress(min(self.done, self.total), self.total)


# -- committing ------------------------------------------------------------------------


def write_checkpoint(
    destination: Location,
    fill: Callable[[NewCheckpoint], dict[str, str | None]],
    custom_metadata: Callable[[], dict[str, Any] | None],
    made: Callable[[], lineage.Lineage],
) -> None:
    """Claims ``destination``, has ``fill`` write the checkpointables into the new
    checkpoint (returning each one's handler), and commits it with its lineage and
    ``custom_metadata`` (both asked for once everything is written: they may say
    what the reads found); removes everything written if anything fails.

    Raises:
      FileExistsError: If a live process claims ``destination`` or something is there.
      Whatever ``fill`` raises.
    """
    claim = _destination.claim_destination(destination)
    new: NewCheckpoint | None = None
    try:
        new = NewCheckpoint(destination)
        # Boxes allocate little, but the collector would walk the heap as they stream.
        with files.paused_gc():
            handlers = fill(new)
        record = lineage.encode(made())
        promise = {"checksums": True, lineage.PROMISE_KEY: lineage.digest(record)}
        custom = {**(custom_metadata() or {}), names.CHECKSUMS_PROMISE: promise}
        new.commit(handlers, custom, record)
    except BaseException:
        if new is not None:
            new.discard()
        raise
    finally:
        if claim is not None:
            claim.release()


def made_now(
    operation: str, arguments: dict[str, Any], sources: list[lineage.Source]
) -> lineage.Lineage:
    """The lineage of a checkpoint made now."""
    return lineage.Lineage(operation, arguments, tuple(sources), time.time_ns())


def copy_checkpointable(new: NewCheckpoint, item: layout.StoredCheckpointable) -> None:
    """Copies an iterator, JSON or empty checkpointable, with checksums for an iterator
    that had none (the new checkpoint promises them)."""
    new.copy_checkpointable(item)
    if item.layout == layout.ITERATOR and checksums.read_checksums(item) is None:
        record = iterator_record(item)
        target = new.directory / item.name / names.CHECKSUMS_DIR / names.checksum_file_name(0)
        target.write_new(checksums.encode(record, 0))


def new_context() -> Any:
    """The tensorstore context of one operation's reads and writes."""
    return store_writer.context()


def pytree_source(source: OpenedSource, name: str) -> PyTreeSource:
    """The pytree checkpointable ``name`` of ``source``, its metadata read."""
    return open_pytree_source(source.checkpoint, source.checkpoint.get(name))
