"""Checksums of stored values: the record tinax writes with a save, and how readers check it.

(Over 500 lines: the record's format, its typed decoding, the field-by-field checks
that word a refusal of a malformed record, and the checks of what a reader read all
describe one file; apart, each would spell the record's fields again.)

Orbax's array store keeps no checksum of array data (the zarr3 codec chain Orbax
builds has none, and OCDBT checks its B+tree nodes, not the values they point to), so
a flipped byte in a data file reads back as a wrong value. tinax therefore records,
for every value of a pytree checkpointable, an xxh3-64 checksum of its bytes as it
was written: one per stored piece of an array (each process digests the pieces it
wrote, by their index bounds in the global array), one for a scalar or a string. A
reader digests what it read and compares.

The record is ``tinax_checksums/process_<i>.json`` in the checkpointable's
directory, written before the checkpoint commits, so it is as atomic as the rest.
Checkpoints written without it (by Orbax itself, or older tinax) carry none.

This module imports neither JAX nor Orbax: loads (``tinax.checkpointing``) and
``tinax.explore`` both check through it.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import xxhash

from tinax._format.metadata import layout
from tinax._format.naming import names
from tinax._format.storage import files
from tinax._format.storage.location import DIRECTORY, Entry, Location

if TYPE_CHECKING:
    import numpy as np

ALGORITHM = "xxh3_64"


class CorruptDataError(ValueError):
    """Stored data does not match the checksums recorded when it was saved (or a
    checkpoint saved with checksums has lost them)."""

    __module__ = "tinax.checkpointing"


# Index bounds of a piece of an array: one (start, stop) per dimension; () for a scalar.
Bounds = tuple[tuple[int, int], ...]


def digest(value: np.ndarray | bytes) -> str:
    """The checksum of an array's bytes in C order (or of raw bytes), as hex."""
    import numpy as np

    if isinstance(value, bytes):
        return xxhash.xxh3_64_hexdigest(value)
    data = value if value.flags.c_contiguous else np.ascontiguousarray(value)
    # Viewed as bytes: the buffer protocol does not know extended dtypes (bfloat16).
    return xxhash.xxh3_64_hexdigest(data.reshape(-1).view(np.uint8).data)


def string_digest(value: str) -> str:
    """The checksum of a string leaf."""
    return digest(value.encode("utf-8", "surrogatepass"))


def full_bounds(shape: Sequence[int]) -> Bounds:
    """The bounds of a whole array of ``shape``."""
    return tuple((0, int(n)) for n in shape)


@dataclasses.dataclass(frozen=True)
class Piece:
    """One checksummed piece of a value.

    Attributes:
      bounds: Where the piece lies in the whole value (``()`` for scalars, strings).
      digest: Its checksum.
    """

    bounds: Bounds
    digest: str


@dataclasses.dataclass(frozen=True)
class LeafRecord:
    """The checksums of one leaf.

    Attributes:
      kind: ``array`` (arrays and scalars, by their stored dtype) or ``string``.
      dtype: The dtype the checksummed bytes have (``""`` for strings).
      shape: The value's shape (``()`` for scalars and strings).
      pieces: The checksummed pieces; together they cover the value.
    """

    kind: str
    dtype: str
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]


ARRAY = "array"
STRING = "string"
# A whole file a checkpointable's handler wrote (a Grain iterator state), by name.
FILE = "file"


def encode(leaves: Mapping[str, LeafRecord], process_index: int) -> bytes:
    """The JSON document one process writes, for leaves keyed by their key path text."""
    document = {
        "format": names.CHECKSUMS_FORMAT,
        "algorithm": ALGORITHM,
        "process_index": process_index,
        "leaves": {
            key: {
                "kind": leaf.kind,
                "dtype": leaf.dtype,
                "shape": list(leaf.shape),
                "pieces": [[[list(b) for b in p.bounds], p.digest] for p in leaf.pieces],
            }
            for key, leaf in leaves.items()
        },
    }
    return json.dumps(document, separators=(",", ":")).encode("utf-8")


def _leaf(key: str, entry: object, where: str) -> LeafRecord:
    """One leaf's record, checked field by field (tens of thousands per file: kept lean)."""
    where = f"{where} leaf {key}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is not an object")
    kind, dtype, shape, pieces = (entry.get(k) for k in ("kind", "dtype", "shape", "pieces"))
    if kind not in (ARRAY, STRING, FILE) or not isinstance(dtype, str):
        raise ValueError(f"{where} has no kind and dtype")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError(f"{where} has no shape")
    if not isinstance(pieces, list):
        raise ValueError(f"{where} has no pieces")
    parsed = []
    for piece in pieces:
        try:
            raw, hexdigest = piece
            bounds = tuple((a, b) for a, b in raw)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: a piece is not [bounds, checksum]") from None
        if (
            not isinstance(hexdigest, str)
            or len(bounds) != len(shape)
            or not all(
                type(a) is int and type(b) is int and 0 <= a <= b <= n
                for (a, b), n in zip(bounds, shape, strict=True)
            )
        ):
            raise ValueError(f"{where}: piece {piece!r} does not fit shape {tuple(shape)}")
        parsed.append(Piece(bounds, hexdigest))
    return LeafRecord(kind, dtype, tuple(shape), tuple(parsed))


# The layouts of the checkpointables a tinax save records checksums for: a pytree's
# stored values and an iterator's state files.
CHECKSUMMED_LAYOUTS = (layout.PYTREE, layout.ITERATOR)


def checksummed(checkpoint: layout.Checkpoint) -> list[layout.StoredCheckpointable]:
    """The checkpointables of ``checkpoint`` a tinax save records checksums for (whether
    or not this one did: Orbax's own saves record none)."""
    return [item for item in checkpoint.checkpointables if item.layout in CHECKSUMMED_LAYOUTS]


def missing_promised(checkpoint: layout.Checkpoint) -> list[str]:
    """Checkpointables a checksummed save promised checksums for that have none."""
    if not checkpoint.checksummed:
        return []
    return [item.name for item in checksummed(checkpoint) if not has_checksums(item)]


def check_promise(checkpoint: layout.Checkpoint) -> None:
    """Refuses a checkpoint whose save recorded checksums that are now gone.

    Raises:
      CorruptDataError: Naming the checkpoint and the checkpointables.
    """
    missing = missing_promised(checkpoint)
    if missing:
        raise CorruptDataError(
            f"checkpoint {str(checkpoint.path)!r}: checkpointable(s) {missing} lost the "
            f"checksums saved with them ({names.CHECKSUMS_DIR} is missing): their data "
            "cannot be trusted"
        )


def has_checksums(item: layout.StoredCheckpointable) -> bool:
    """Whether the checkpointable carries tinax checksums (as its checkpoint's walk
    found it)."""
    return names.CHECKSUMS_DIR in item.entries()


def read_checksums(item: layout.StoredCheckpointable) -> dict[str, LeafRecord] | None:
    """The checksums recorded for a checkpointable of an opened checkpoint, by leaf key:
    read the first time they are asked for, and kept on the checkpoint.

    Every process's record is read (size-capped, JSON only, links refused) and their
    pieces merged. ``None`` if the checkpointable carries no checksums.

    Raises:
      ValueError: If the record exists but is unreadable or malformed, naming the file.
    """

    def read() -> dict[str, LeafRecord] | None:
        entry = item.entries().get(names.CHECKSUMS_DIR)
        record_dir = item.directory / names.CHECKSUMS_DIR
        if entry is None:
            return None
        if entry.kind != DIRECTORY:
            raise ValueError(f"{str(record_dir)!r} is not a directory of checksum records")
        return _read_records(
            record_dir,
            item.checkpoint.entries(record_dir),
            # Kept: the lineage of a checkpoint made from this one digests these bytes.
            lambda path, _: item.checkpoint.read_bytes(
                path, what="tinax checksums", max_bytes=files.MAX_METADATA_BYTES
            ),
        )

    return item.checkpoint.kept((_RECORDS, item.directory.path), read)


def read_directory_checksums(directory: Location) -> dict[str, LeafRecord] | None:
    """``read_checksums`` of a checkpointable no opened checkpoint holds (one Orbax's
    handler loads from a path it was given), read each time it is called.

    Raises:
      ValueError: As ``read_checksums``.
    """
    record_dir = directory / names.CHECKSUMS_DIR
    if not record_dir.exists():
        return None
    if not record_dir.is_dir():
        raise ValueError(f"{str(record_dir)!r} is not a directory of checksum records")
    entries = record_dir.entries()
    return _read_records(
        record_dir,
        entries,
        lambda path, name: files.read_listed_bytes(
            path, entries[name], what="tinax checksums", max_bytes=files.MAX_METADATA_BYTES
        ),
    )


class _LeafDocument(msgspec.Struct, gc=False):
    """One leaf's record as a save writes it (``encode``)."""

    kind: str
    dtype: str
    shape: list[int]
    pieces: list[tuple[list[tuple[int, int]], str]]


class _RecordDocument(msgspec.Struct, gc=False):
    """One process's record as a save writes it; the fields it does not name are its
    own (``process_index``)."""

    leaves: dict[str, _LeafDocument]
    format: Any = None
    algorithm: Any = None


_RECORD_DECODER = msgspec.json.Decoder(_RecordDocument)
_KINDS = frozenset({ARRAY, STRING, FILE})


_Document = TypeVar("_Document", _RecordDocument, "_UndecodedRecord")


def _typed_document(decoder: msgspec.json.Decoder[_Document], data: bytes) -> _Document | None:
    """One process's record decoded by ``decoder``; ``None`` where it is not a record of
    this format and algorithm that the typed decode accepts."""
    try:
        # msgspec skips the fields the records do not name without looking at them;
        # the generic parse refuses bytes that are not UTF-8 anywhere.
        codecs.decode(data, "utf-8")
        document = decoder.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None
    if document.format != names.CHECKSUMS_FORMAT or document.algorithm != ALGORITHM:
        return None
    return document


def _decode_leaves(data: bytes) -> dict[str, LeafRecord] | None:
    """The leaves of one process's record, decoded straight into their types and checked
    as ``_leaf`` checks them: a wide checkpoint's tens of thousands of records, each
    time it is opened, without a dict per leaf and per piece. ``None`` for anything
    this does not accept (a wrong type, an unknown format or algorithm, JSON only the
    standard library reads, a piece off its shape): the generic read then accepts or
    refuses it, in its words."""
    document = _typed_document(_RECORD_DECODER, data)
    if document is None:
        return None
    leaves: dict[str, LeafRecord] = {}
    for key, entry in document.leaves.items():
        leaf = _typed_leaf(entry)
        if leaf is None:
            return None
        leaves[key] = leaf
    return leaves


def _typed_leaf(entry: _LeafDocument) -> LeafRecord | None:
    """One leaf's decoded record, checked as ``_leaf`` checks it; ``None`` for anything
    ``_leaf`` would refuse (it then says why)."""
    shape = tuple(entry.shape)
    if entry.kind not in _KINDS or (shape and min(shape) < 0):
        return None
    pieces = []
    for bounds, hexdigest in entry.pieces:
        if len(bounds) != len(shape):
            return None
        for (a, b), n in zip(bounds, shape, strict=True):
            if not 0 <= a <= b <= n:
                return None
        pieces.append(Piece(tuple(bounds), hexdigest))
    return LeafRecord(entry.kind, entry.dtype, shape, tuple(pieces))


class _UndecodedRecord(msgspec.Struct, gc=False):
    """One process's record with each leaf's entry left as its JSON text: its keys
    known, its entries decoded one at a time (``read_checksum``)."""

    leaves: dict[str, msgspec.Raw]
    format: Any = None
    algorithm: Any = None


_UNDECODED_DECODER = msgspec.json.Decoder(_UndecodedRecord)
_LEAF_DECODER = msgspec.json.Decoder(_LeafDocument)
# Where ``read_checksums`` keeps the records of a checkpointable on its checkpoint.
_RECORDS = "checksums"


def _undecoded_records(
    item: layout.StoredCheckpointable,
) -> list[tuple[Location, dict[str, msgspec.Raw]]] | None:
    """Every process's record of ``item``, its leaves' entries undecoded, kept on the
    checkpoint; ``None`` where the typed decode does not accept a record (or there is
    none): ``read_checksums`` then reads them whole, accepting or refusing in its words.

    Raises:
      ValueError: If a record file cannot be read (as ``read_checksums``).
    """

    def read() -> list[tuple[Location, dict[str, msgspec.Raw]]] | None:
        if names.CHECKSUMS_DIR not in item.entries():
            return None
        record_dir = item.directory / names.CHECKSUMS_DIR
        found = []
        for name in sorted(item.checkpoint.entries(record_dir)):
            if not names.CHECKSUM_FILE.match(name):
                continue
            path = record_dir / name
            data = item.checkpoint.read_bytes(
                path, what="tinax checksums", max_bytes=files.MAX_METADATA_BYTES
            )
            document = _typed_document(_UNDECODED_DECODER, data)
            if document is None:
                return None
            found.append((path, document.leaves))
        return found or None

    return item.checkpoint.kept(("undecoded checksums", item.directory.path), read)


def recorded_keys(item: layout.StoredCheckpointable) -> Collection[str] | None:
    """The keys of ``read_checksums(item)``, without decoding each leaf's record where
    they are not decoded yet (``read_checksum`` decodes one): for a reader of one leaf
    of a wide checkpoint. ``None`` if the checkpointable carries no checksums.

    Raises:
      ValueError: If a record file is unreadable or, read whole, malformed.
    """
    undecoded = _undecoded_unless_read(item)
    if undecoded is None:
        records = read_checksums(item)
        return None if records is None else records.keys()
    keys: set[str] = set()
    for _, leaves in undecoded:
        keys.update(leaves)
    return keys


def read_checksum(item: layout.StoredCheckpointable, key: str) -> LeafRecord | None:
    """Leaf ``key``'s record of ``read_checksums(item)``, its entries alone decoded and
    checked where the checkpointable's records are not decoded yet (its other leaves'
    entries are not looked at); ``None`` if it has none.

    Raises:
      ValueError: If a record file is unreadable, or this leaf's entry is malformed or
        disagrees between processes, in the words of ``read_checksums``.
    """
    undecoded = _undecoded_unless_read(item)
    if undecoded is None:
        records = read_checksums(item)
        return None if records is None else records.get(key)
    merged: LeafRecord | None = None
    for path, leaves in undecoded:
        entry = leaves.get(key)
        if entry is not None:
            merged = _merged(path, key, merged, _decode_entry(path, key, entry))
    return merged


def _undecoded_unless_read(
    item: layout.StoredCheckpointable,
) -> list[tuple[Location, dict[str, msgspec.Raw]]] | None:
    """``_undecoded_records(item)``, unless ``read_checksums`` has decoded the records
    already (then ``None``: they are there to use)."""
    if item.checkpoint.holds((_RECORDS, item.directory.path)):
        return None
    return _undecoded_records(item)


def _merged(path: Location, key: str, known: LeafRecord | None, leaf: LeafRecord) -> LeafRecord:
    """Leaf ``key``'s record in the file at ``path`` joined to what the records read
    before it said of the leaf (``known``): its pieces added to theirs.

    Raises:
      ValueError: If they disagree on its kind, dtype or shape, naming the file.
    """
    if known is None:
        return leaf
    if (known.kind, known.dtype, known.shape) != (leaf.kind, leaf.dtype, leaf.shape):
        raise ValueError(f"{str(path)!r}: leaf {key} disagrees with another process")
    return dataclasses.replace(known, pieces=known.pieces + leaf.pieces)


def _decode_entry(path: Location, key: str, entry: msgspec.Raw) -> LeafRecord:
    """One leaf's entry of the record at ``path``, decoded typed, else checked field by
    field (``_leaf``) and refused in its words."""
    try:
        leaf = _typed_leaf(_LEAF_DECODER.decode(entry))
    except msgspec.DecodeError:
        leaf = None
    if leaf is not None:
        return leaf
    return _leaf(key, json.loads(bytes(entry)), repr(str(path)))


def _parse_leaves(path: Location, data: bytes) -> dict[str, LeafRecord]:
    """The leaves of one process's record, checked field by field.

    Raises:
      ValueError: If the record is not JSON, not tinax's, or a leaf's record is
        malformed, naming the file and the leaf.
    """
    decoded = _decode_leaves(data)
    if decoded is not None:
        return decoded
    # Checked field by field below, so no depth walk of its many entries.
    document = files.parse_json_object(data, path=path, what="tinax checksums", max_depth=None)
    if document.get("format") != names.CHECKSUMS_FORMAT:
        raise ValueError(f"{str(path)!r} is not a {names.CHECKSUMS_FORMAT} record")
    if document.get("algorithm") != ALGORITHM:
        raise ValueError(
            f"{str(path)!r} uses checksum algorithm {document.get('algorithm')!r}; "
            f"this version of tinax checks {ALGORITHM!r}"
        )
    leaves = document.get("leaves")
    if not isinstance(leaves, dict):
        raise ValueError(f"{str(path)!r} has no leaves")
    where = repr(str(path))
    return {key: _leaf(key, entry, where) for key, entry in leaves.items()}


def _read_records(
    record_dir: Location,
    entries: Mapping[str, Entry],
    read: Callable[[Location, str], bytes],
) -> dict[str, LeafRecord]:
    found = sorted(name for name in entries if names.CHECKSUM_FILE.match(name))
    if not found:
        raise ValueError(f"{str(record_dir)!r} holds no checksum record")
    merged: dict[str, LeafRecord] = {}
    for name in found:
        path = record_dir / name
        for key, leaf in _parse_leaves(path, read(path, name)).items():
            merged[key] = _merged(path, key, merged.get(key), leaf)
    return merged


def check_files(item: layout.StoredCheckpointable, records: Mapping[str, LeafRecord]) -> list[str]:
    """Checks the files recorded (kind ``file``) in a checkpointable's directory, each
    read through its opened checkpoint (once, whoever else reads it).

    Returns:
      What is wrong, one message per damaged or missing file; empty if nothing.
    """
    return _check_files(
        item.directory,
        records,
        lambda where: item.checkpoint.read_bytes(
            where, what="a checksummed file", max_bytes=files.MAX_METADATA_BYTES
        ),
    )


def check_directory_files(directory: Location, records: Mapping[str, LeafRecord]) -> list[str]:
    """``check_files`` of a checkpointable no opened checkpoint holds.

    Returns:
      As ``check_files``.
    """
    return _check_files(
        directory,
        records,
        lambda where: files.read_bytes(
            where, what="a checksummed file", max_bytes=files.MAX_METADATA_BYTES
        ),
    )


def _check_files(
    directory: Location, records: Mapping[str, LeafRecord], read: Callable[[Location], bytes]
) -> list[str]:
    problems = []
    for name, record in sorted(records.items()):
        if record.kind != FILE:
            continue
        if "/" in name or name in (".", ".."):
            problems.append(f"checksum record names {name!r}, which is not a file name")
            continue
        try:
            data = read(directory / name)
        except ValueError as e:
            problems.append(str(e))
            continue
        problem = file_problem(name, data, record)
        if problem is not None:
            problems.append(problem)
    return problems


def file_problem(name: str, data: bytes, record: LeafRecord) -> str | None:
    """What is wrong with the bytes ``data`` of the recorded file ``name``, or ``None``."""
    if digest(data) != record.pieces[0].digest:
        return f"file {name!r} is corrupt: it does not match its checksum"
    return None


def _contains(outer: Bounds, inner: Bounds) -> bool:
    return all(o0 <= i0 and i1 <= o1 for (o0, o1), (i0, i1) in zip(outer, inner, strict=True))


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """A piece whose bytes do not match its checksum."""

    bounds: Bounds
    expected: str
    found: str


def check_pieces(
    record: LeafRecord, loaded: Iterable[tuple[Bounds, np.ndarray]]
) -> tuple[list[Mismatch], list[Piece]]:
    """Checks the recorded pieces of one array against pieces of it that were read.

    Args:
      record: The leaf's checksums.
      loaded: ``(bounds, values)`` of the parts of the array at hand (all of it, or
        the shards one process holds).

    Returns:
      The recorded pieces whose bytes differ, and those no loaded part contains
      (another process holds them, or they straddle the parts).
    """
    parts = list(loaded)
    bad: list[Mismatch] = []
    uncovered: list[Piece] = []
    for piece in record.pieces:
        for bounds, values in parts:
            if not _contains(bounds, piece.bounds):
                continue
            if bounds != piece.bounds:
                values = values[
                    tuple(
                        slice(p0 - b0, p1 - b0)
                        for (b0, _), (p0, p1) in zip(bounds, piece.bounds, strict=True)
                    )
                ]
            found = digest(values)
            if found != piece.digest:
                bad.append(Mismatch(piece.bounds, piece.digest, found))
            break
        else:
            uncovered.append(piece)
    return bad, uncovered


def describe_bounds(bounds: Bounds) -> str:
    """``[0:4, 0:8]``: a piece of an array as a reader would slice it."""
    return "[" + ", ".join(f"{a}:{b}" for a, b in bounds) + "]"


def mismatch_message(key: str, record: LeafRecord, bad: Sequence[Mismatch]) -> str:
    """What to say about a leaf whose stored bytes do not match their checksums."""
    first = bad[0]
    where = "" if not first.bounds else f" (piece {describe_bounds(first.bounds)})"
    more = f" and {len(bad) - 1} more piece(s)" if len(bad) > 1 else ""
    return (
        f"leaf {key}: the stored data is corrupt: its checksum is {first.found}, "
        f"{first.expected} was recorded when it was saved{where}{more}"
    )


# Tensorstore's words for a stored chunk whose bytes do not decode (a flipped byte in
# a zstd-compressed chunk, most often): damage, as a checksum that does not match is.
# Its codecs name themselves: ``ZSTD_decompressStream() failed: Data corruption
# detected``, ``Error decoding chunk …``, or the status ``DATA_LOSS``.
_UNDECODABLE = (
    re.compile(r"\w+_decompress\w*\(\) failed[^;]*|Error decoding[^;]*"),
    re.compile(r"DATA_LOSS: [^;]*"),
)


_SAID_UNDECODABLE = "the stored data is corrupt: it does not decode ("


def undecodable(message: str) -> str | None:
    """The codec's complaint if ``message`` (a failed read's) says stored bytes do not
    decode, else ``None``; a message already worded by ``undecodable_words`` gives
    back the complaint it quotes."""
    said = message.find(_SAID_UNDECODABLE)
    if said >= 0 and message.endswith(")"):
        return message[said + len(_SAID_UNDECODABLE) : -1]
    for words in _UNDECODABLE:
        found = words.search(message)
        if found:
            return found.group(0).strip()
    return None


def undecodable_words(complaint: str) -> str:
    """What to say about stored bytes that do not decode, given the codec's complaint."""
    return f"{_SAID_UNDECODABLE}{complaint})"


def undecodable_message(key: str, complaint: str) -> str:
    """What to say about a leaf whose stored bytes do not decode."""
    return f"leaf {key}: {undecodable_words(complaint)}"


def check_read_value(item: layout.StoredCheckpointable, key: str, value: Any) -> str | None:
    """Checks one whole value read from a checkpointable against its record.

    For readers that read a leaf themselves (``tinax.explore.read_leaf``). Returns
    what is wrong, or ``None`` (also when the checkpointable carries no checksums).

    Raises:
      ValueError: If the record itself is unreadable.
    """
    import numpy as np

    record = read_checksum(item, key)
    if record is None:
        return None
    if isinstance(value, np.ndarray):
        if str(value.dtype) != record.dtype or value.shape != record.shape:
            return f"leaf {key}: stored as {value.dtype} {value.shape}, recorded as {record.dtype} {record.shape}"
        bad, _ = check_pieces(record, [(full_bounds(value.shape), value)])
        return mismatch_message(key, record, bad) if bad else None
    if check_value(record, value) is False:
        return f"leaf {key}: the stored value is corrupt: it does not match its checksum"
    return None


def check_value(record: LeafRecord, value: Any) -> bool | None:
    """Whether a scalar or string read back matches its record; ``None`` if not comparable.

    A scalar is compared in its stored dtype, and only when what was read is of the
    same kind (a target may ask for a float to come back as an int).
    """
    import numpy as np

    if record.kind == STRING:
        return string_digest(value) == record.pieces[0].digest if isinstance(value, str) else None
    try:
        dtype = np.dtype(record.dtype)
        found = np.asarray(value)
    except (TypeError, ValueError):
        return None
    if found.shape != () or found.dtype.kind != dtype.kind:
        return None
    return digest(found.astype(dtype)) == record.pieces[0].digest
