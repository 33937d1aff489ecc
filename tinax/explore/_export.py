"""A checkpointable streamed into ``.safetensors`` files, region by region.

(Over 500 lines: the plan of the files, the streaming writer and the read-back share
one description of every tensor, its pieces and its place in a file, and are kept
together so that it is defined once.)

Each array is read from the store a region at a time (a few regions in flight), its
recorded checksums digested as the regions go by, and the bytes written straight to
their place in the output file, so that memory holds a fixed budget of regions
whatever the size of the checkpoint or of its largest array. The files are written
in a temporary directory beside the destination, which takes its name only once
every file is complete (and, with ``verify``, read back).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import secrets
import shutil
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from tinax import _paths
from tinax._format import safetensors as st
from tinax._format.arraydata import chunks, rawread
from tinax._format.arraydata.chunks import Box
from tinax._format.callbacks import Progress
from tinax._format.integrity import checksums
from tinax._format.integrity.checksums import Bounds, LeafRecord
from tinax._format.metadata import arrays, layout, pytree
from tinax._format.metadata.layout import Checkpoint
from tinax._format.naming import names, words
from tinax._format.naming.keys import KeyPath
from tinax._format.writing import streaming
from tinax._paths import open_checkpoint
from tinax.explore._numeric import ValueCounts

# Decoded bytes of one region, and of all regions read ahead of the one being written.
REGION_BYTES = 8 << 20
IN_FLIGHT_BYTES = 16 << 20
# The float types an export can cast to (``dtype=``), by the names NumPy gives them.
CAST_DTYPES = st.CAST_DTYPES

KeyFilter = str | Sequence[str] | Callable[[str], bool]
NameFunction = Callable[[KeyPath], str]


@dataclasses.dataclass
class _Tensor:
    """One array to export."""

    key: str
    name: str
    leaf: pytree.StoredLeaf
    shape: tuple[int, ...]
    stored: np.dtype
    written: np.dtype
    chunk_shape: tuple[int, ...] | None
    record: LeafRecord | None
    file: int = 0
    offset: int = 0  # in its file, from the file's start

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.written.itemsize


def _check_options(
    checkpointable: object,
    keys: object,
    dtype: object,
    max_file_bytes: object,
    name: object,
    verify: object,
) -> np.dtype | None:
    if not isinstance(checkpointable, str):
        raise TypeError(f"checkpointable must be a str, got {type(checkpointable).__name__}")
    if keys is not None and not (
        isinstance(keys, str)
        or callable(keys)
        or (isinstance(keys, list | tuple) and all(isinstance(k, str) for k in keys))
    ):
        raise TypeError(
            "keys must be a substring, a sequence of substrings or a callable, "
            f"got {type(keys).__name__}"
        )
    if max_file_bytes is not None:
        if isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, int):
            raise TypeError(f"max_file_bytes must be an int, got {type(max_file_bytes).__name__}")
        if max_file_bytes <= 0:
            raise ValueError(f"max_file_bytes must be positive, got {max_file_bytes}")
    if name is not None and not callable(name):
        raise TypeError(f"name must be a callable, got {type(name).__name__}")
    if not isinstance(verify, bool):
        raise TypeError(f"verify must be a bool, got {type(verify).__name__}")
    if dtype is None:
        return None
    if not isinstance(dtype, str | np.dtype) and not isinstance(dtype, type):
        raise TypeError(f"dtype must be a dtype name, got {type(dtype).__name__}")
    try:
        cast = st.numpy_dtype(dtype if isinstance(dtype, str) else np.dtype(dtype).name)
    except TypeError:
        cast = None
    if cast is None or cast.name not in CAST_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of the float types {list(CAST_DTYPES)}")
    return cast


def _selected(key: str, tensor: str, keys: Any) -> bool:
    if keys is None:
        return True
    if callable(keys):
        return bool(keys(key))
    wanted = [keys] if isinstance(keys, str) else list(keys)
    return any(k in key or k in tensor for k in wanted)


def _destination(out: object) -> Path:
    raw = _paths.text_path(out, what="out")
    if raw.startswith("gs://"):
        raise ValueError(f"out {raw!r}: an export is written to a local directory")
    dest = Path(raw).absolute()
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise ValueError(f"out {raw!r} exists and is not a directory")
    if dest.is_dir() and any(dest.iterdir()):
        raise ValueError(f"out {raw!r} exists and is not empty; choose a new directory")
    if not dest.parent.is_dir():
        raise FileNotFoundError(f"out {raw!r}: its parent directory does not exist")
    return dest


def _pieces(tensor: _Tensor) -> tuple[list[Bounds], bool]:
    """The boxes to read in turn (the recorded pieces, when they tile the array)."""
    whole = checksums.full_bounds(tensor.shape)
    record = tensor.record
    if record is None or record.kind != checksums.ARRAY or record.shape != tensor.shape:
        return [whole], False
    unique = list(dict.fromkeys(piece.bounds for piece in record.pieces))
    covered = sum(math.prod(b - a for a, b in bounds) for bounds in unique)
    if covered != math.prod(tensor.shape) or not unique:
        return [whole], False
    return sorted(unique), True


def _boxes(bounds: Bounds, chunk_shape: tuple[int, ...] | None, itemsize: int) -> list[Box]:
    """Boxes that walk the piece at ``bounds`` in its C order, each about ``REGION_BYTES``.

    Each box takes whole extents of the dimensions after one dimension ``d``, one
    index of those before it and a run along ``d`` (whole chunks where they fit),
    so the boxes' bytes, one after another, are the piece's bytes in C order.
    """
    extents = [b - a for a, b in bounds]
    if not bounds or 0 in extents:
        return [] if bounds else [()]
    rank = len(extents)
    d = streaming.split_axis(extents, itemsize, REGION_BYTES)
    row = math.prod(extents[d + 1 :]) * itemsize
    along = max(1, REGION_BYTES // max(row, 1))
    chunk = 1 if chunk_shape is None or len(chunk_shape) != rank else max(1, chunk_shape[d])
    if along >= chunk:
        along -= along % chunk
    return streaming.runs_along(bounds, d, along)


def _runs(box: Box, shape: tuple[int, ...]) -> tuple[int, list[int]]:
    """How ``box``'s bytes lie in the whole array: run length and each run's first element."""
    if not box:
        return 1, [0]
    rank = len(shape)
    j = rank - 1
    while j > 0 and box[j].start == 0 and box[j].stop == shape[j]:
        j -= 1
    # Dimensions after j are whole: a run spans box[j] times their size.
    inner = math.prod(shape[j + 1 :])
    length = (box[j].stop - box[j].start) * inner
    strides = [math.prod(shape[k + 1 :]) for k in range(rank)]
    starts = [
        sum(i * strides[k] for k, i in enumerate(corner)) + box[j].start * strides[j]
        for corner in itertools.product(*(range(s.start, s.stop) for s in box[:j]))
    ]
    return length, starts


def _pwrite(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data = data[written:]
        offset += written


class _Written:
    """Digests of byte ranges written, to compare with what a re-read finds."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int, int, str]] = []  # file, offset, length, digest

    def add(self, file: int, offset: int, data: memoryview) -> None:
        self.ranges.append((file, offset, len(data), xxhash.xxh3_64_hexdigest(data)))


def _plan(
    checkpoint: layout.Checkpoint,
    checkpointable: str,
    keys: Any,
    cast: np.dtype | None,
    name: NameFunction | None,
) -> tuple[pytree.PyTreeLayout, list[_Tensor], bool]:
    item = checkpoint.get(checkpointable)
    if item.layout != layout.PYTREE:
        raise ValueError(
            f"checkpointable {checkpointable!r} in {str(checkpoint.path)!r} holds no arrays "
            f"(it is stored as {item.layout!r})"
        )
    tree = pytree.read_layout(item)
    records = checksums.read_checksums(item)
    ctx = tree.context()
    tensors: list[_Tensor] = []
    seen: dict[str, str] = {}
    for leaf, info in pytree.leaf_infos(tree, ctx):
        if info is None or leaf.kind not in words.STORED_ARRAY_KINDS or not leaf.stored:
            continue
        label = (name or st.tensor_name)(leaf.path)
        if not isinstance(label, str) or not label or label == st.METADATA_KEY:
            raise ValueError(f"name({leaf.path!r}) gave {label!r}, which cannot name a tensor")
        if not _selected(leaf.key, label, keys):
            continue
        if label in seen:
            raise ValueError(
                f"leaves {seen[label]} and {leaf.key} would both be named {label!r}; "
                "pass name= to tell them apart"
            )
        seen[label] = leaf.key
        try:
            stored = arrays.numpy_dtype(info.dtype)
        except TypeError:
            raise ValueError(
                f"leaf {leaf.key} has dtype {info.dtype}, which cannot be read"
            ) from None
        written = cast if cast is not None and st.is_floating(stored) else stored
        if written.name not in st.CODE_OF:
            raise ValueError(f"leaf {leaf.key}: safetensors has no dtype for {written.name}")
        tensors.append(
            _Tensor(
                key=leaf.key,
                name=label,
                leaf=leaf,
                shape=tuple(info.shape),
                stored=stored,
                written=written,
                chunk_shape=info.chunk_shape,
                record=None if records is None else records.get(leaf.key),
            )
        )
    if not tensors:
        raise ValueError(
            f"checkpointable {checkpointable!r} in {str(checkpoint.path)!r} has no arrays"
            + ("" if keys is None else " whose key matches keys")
        )
    return tree, tensors, records is not None


def _split(tensors: list[_Tensor], max_file_bytes: int | None) -> list[list[_Tensor]]:
    """Tensors in stored order, cut into files of at most ``max_file_bytes`` of data
    (a larger tensor alone in its file)."""
    if max_file_bytes is None:
        return [tensors]
    files: list[list[_Tensor]] = [[]]
    size = 0
    for tensor in tensors:
        if files[-1] and size + tensor.nbytes > max_file_bytes:
            files.append([])
            size = 0
        files[-1].append(tensor)
        size += tensor.nbytes
    return files


def export_safetensors(
    path: str | os.PathLike[str] | Checkpoint,
    out: str | os.PathLike[str],
    *,
    checkpointable: str = "model",
    keys: KeyFilter | None = None,
    dtype: str | None = None,
    max_file_bytes: int | None = None,
    name: NameFunction | None = None,
    verify: bool = False,
    progress: Progress | None = None,
) -> list[Path]:
    """Writes a checkpointable's arrays as ``.safetensors`` files, streamed from the store.

    Arrays are read a region at a time and written in place, so memory holds a
    fixed budget of regions (tens of megabytes) whatever the size of the
    checkpoint. An array saved by several processes is written whole. Checksums
    recorded with the save are checked on the way: a corrupt array stops the
    export. Scalars are 0-d tensors; strings and empty leaves have no tensor form
    and are left out.

    The files are named after the checkpointable: ``model.safetensors``, or,
    over ``max_file_bytes``, ``model-00001-of-0000N.safetensors`` … with
    ``model.safetensors.index.json`` in the Hugging Face hub's layout
    (``optimizer.safetensors`` … for ``checkpointable="optimizer"``). The
    directory is made with the process's umask, like ``mkdir``. Each header's ``__metadata__`` records the
    source checkpoint (``tinax.source``), its step (``tinax.step``), the
    checkpointable and, for a cast, the dtype. The directory ``out`` appears only
    when complete.

    Args:
      path: A checkpoint directory, local or ``gs://``.
      out: A new local directory (or an empty one) for the files.
      checkpointable: The checkpointable to export.
      keys: Which leaves: a substring of the key (``"['dense1']"``) or of the
        tensor name (``"dense1."``), a sequence of them (any matching), or a
        callable taking the key (``jax.tree_util.keystr`` format) and returning
        whether to export it. All arrays by default.
      dtype: A float dtype (``"bfloat16"``, ``"float16"``, …) to cast the
        floating-point arrays to; integer arrays (PRNG key data among them) keep
        theirs.
      max_file_bytes: Split the tensors into files of at most this many bytes
        of data (a larger tensor gets a file of its own).
      name: ``name(key_path) -> str`` naming each tensor, ``key_path`` a tuple of
        ``str`` (dict keys, attribute names) and ``int`` (sequence indices) parts.
        By default the parts dotted, NNX's trailing ``value`` dropped
        (``dense1.kernel``).
      verify: Read the written files back and compare them with what was written
        before the directory takes its name.
      progress: ``progress(done, total)`` in bytes, called as regions land.

    Returns:
      The paths of the files written, the index last when there is one.

    Raises:
      TypeError: If an argument has the wrong type.
      FileNotFoundError: If ``path`` does not exist, or ``out``'s parent does not.
      ValueError: If the checkpoint or checkpointable cannot be read, has no
        arrays to export, ``out`` exists and is not an empty directory, ``dtype``
        is not a float dtype, names collide, or stored data does not match its
        checksum.

    Warns:
      RuntimeWarning: Before the directory takes its name, when tensors written
        hold NaN or Inf (a run that diverged; a cast to a narrow float that
        overflowed), naming them with their counts.
    """
    cast = _check_options(checkpointable, keys, dtype, max_file_bytes, name, verify)
    dest = _destination(out)
    checkpoint = open_checkpoint(path)
    tree, tensors, checked = _plan(checkpoint, checkpointable, keys, cast, name)
    groups = _split(tensors, max_file_bytes)
    metadata = {
        "format": "flax",
        "tinax.source": str(checkpoint.path),
        "tinax.checkpointable": checkpointable,
        "tinax.checksums": "checked" if checked else "none recorded",
    }
    step = names.step_from_name(checkpoint.path.name)
    if step is not None:
        metadata["tinax.step"] = str(step)
    if cast is not None:
        metadata["tinax.dtype"] = f"floating-point arrays cast to {cast.name}"
    file_names = _file_names(checkpointable, len(groups))
    index_file = _index_file(checkpointable)
    work = _work_directory(dest)
    try:
        fds: list[int] = []
        try:
            for number, group in enumerate(groups):
                header, entries = st.encode_header(
                    [(t.name, t.written.name, t.shape) for t in group], metadata
                )
                fd = os.open(work / file_names[number], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                fds.append(fd)
                _pwrite(fd, memoryview(header), 0)
                data_size = sum(t.nbytes for t in group)
                os.ftruncate(fd, len(header) + data_size)
                for tensor in group:
                    tensor.file = number
                    tensor.offset = len(header) + entries[tensor.name].start
            written = _Written() if verify else None
            counts = _stream(tree, tensors, fds, written, progress)
            for fd in fds:
                os.fsync(fd)
        finally:
            for fd in fds:
                os.close(fd)
        if len(groups) > 1:
            weight_map = {t.name: file_names[t.file] for t in tensors}
            total = sum(t.nbytes for t in tensors)
            (work / index_file).write_bytes(st.encode_index(weight_map, total, metadata))
        if written is not None:
            _verify_written(work, file_names, tensors, written)
        nonfinite = [
            (t.name, c.nan, c.inf) for t, c in zip(tensors, counts, strict=True) if c.nan or c.inf
        ]
        if nonfinite:
            # Said before the export takes its name: weights that would load as NaN.
            warnings.warn(
                _nonfinite_warning(str(checkpoint.path), nonfinite), RuntimeWarning, stacklevel=2
            )
        _install(work, dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    result = [dest / file for file in file_names]
    if len(groups) > 1:
        result.append(dest / index_file)
    return result


def _stem(checkpointable: str) -> str:
    # A flat V0 checkpoint's single item has no name: its weights are the model's.
    return checkpointable or "model"


def _file_names(checkpointable: str, count: int) -> list[str]:
    """``optimizer.safetensors``, or ``optimizer-00001-of-00002.safetensors`` …

    Named after the checkpointable (``model.safetensors`` for the model, the Hugging
    Face hub's name), so that exports of two checkpointables never read alike.
    """
    stem = _stem(checkpointable)
    if count == 1:
        return [f"{stem}{st.SUFFIX}"]
    return [f"{stem}-{i:05d}-of-{count:05d}{st.SUFFIX}" for i in range(1, count + 1)]


def _index_file(checkpointable: str) -> str:
    """``model.safetensors.index.json`` (the hub's), ``optimizer.safetensors.index.json``."""
    return f"{_stem(checkpointable)}{st.SUFFIX}.index.json"


def _work_directory(dest: Path) -> Path:
    """A new hidden directory beside ``dest``, made with the process's umask.

    ``tempfile.mkdtemp`` makes it ``drwx------``, which the finished export would
    keep once renamed: a directory shared with a group must stay readable by it.
    """
    for _ in range(100):
        work = dest.parent / f".{dest.name}.{secrets.token_hex(6)}.partial"
        try:
            os.mkdir(work, 0o777)
        except FileExistsError:
            continue
        return work
    raise FileExistsError(f"cannot make a work directory beside {str(dest)!r}")


def _install(work: Path, dest: Path) -> None:
    """Gives the finished directory its name (onto an empty ``dest`` too)."""
    try:
        os.rename(work, dest)
    except OSError as e:
        raise ValueError(f"cannot move the export into {str(dest)!r}: {e}") from None
    fd = os.open(dest.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Digests:
    """The recorded pieces of one array, digested as their boxes arrive in C order."""

    def __init__(self, tensor: _Tensor, pieces: list[Bounds], checked: bool) -> None:
        self.tensor = tensor
        self.checked = checked
        self.hashers = {bounds: xxhash.xxh3_64() for bounds in pieces} if checked else {}

    def update(self, piece: Bounds, values: np.ndarray) -> None:
        hasher = self.hashers.get(piece)
        if hasher is not None:
            hasher.update(np.ascontiguousarray(values).reshape(-1).view(np.uint8).data)

    def check(self, where: str) -> None:
        record = self.tensor.record
        if not self.checked or record is None:
            return
        bad = [
            checksums.Mismatch(piece.bounds, piece.digest, found)
            for piece in record.pieces
            if (found := self.hashers[piece.bounds].hexdigest()) != piece.digest
        ]
        if bad:
            raise ValueError(
                f"checkpoint {where}: {checksums.mismatch_message(self.tensor.key, record, bad)}"
            )


# A warning of non-finite weights names at most this many tensors.
_NONFINITE_NAMED = 10


def _nonfinite_warning(source: str, found: list[tuple[str, int, int]]) -> str:
    """``export of 'run/step_000245': 3 tensors hold NaN or Inf: dense.kernel (512 NaN), …``."""
    named = []
    for tensor, nan, inf in found[:_NONFINITE_NAMED]:
        parts = [f"{nan:,} NaN" if nan else "", f"{inf:,} Inf" if inf else ""]
        named.append(f"{tensor} ({', '.join(p for p in parts if p)})")
    more = f", … and {len(found) - _NONFINITE_NAMED} more" if len(found) > _NONFINITE_NAMED else ""
    count = len(found)
    return (
        f"export of {source!r}: {count} tensor{'s' * (count != 1)} hold{'s' * (count == 1)} "
        f"NaN or Inf: {', '.join(named)}{more} (the weights written load as NaN/Inf)"
    )


class _Regions:
    """A source array as ``chunks.read_arrays`` reads it: its chunks read raw from its
    data files where it is stored so (``streaming.SourceArray``), else through
    tensorstore."""

    def __init__(self, source: streaming.SourceArray) -> None:
        self.source = source

    def __getitem__(self, box: Box) -> _Region:
        return _Region(self.source, box)


@dataclasses.dataclass(frozen=True)
class _Region:
    source: streaming.SourceArray
    box: Box

    def read(self) -> Any:
        return self.source.read(self.box)


def _stream(
    tree: pytree.PyTreeLayout,
    tensors: list[_Tensor],
    fds: list[int],
    written: _Written | None,
    progress: Progress | None,
) -> list[ValueCounts]:
    """Writes every tensor's regions in place; returns each tensor's NaN and Inf
    counts, as written (a cast to a narrow float can make Inf of large values)."""
    # Each data file opened once for the whole export, however many arrays it holds.
    with rawread.DataFiles() as data_files:
        return _stream_from(tree, tensors, fds, written, progress, data_files)


def _stream_from(
    tree: pytree.PyTreeLayout,
    tensors: list[_Tensor],
    fds: list[int],
    written: _Written | None,
    progress: Progress | None,
    data_files: rawread.DataFiles,
) -> list[ValueCounts]:
    counts = [ValueCounts(t.written) for t in tensors]
    records = {t.key: t.record for t in tensors if t.record is not None}
    sources = streaming.source_arrays(
        tree, [t.leaf for t in tensors], records or None, tree.context(), data_files
    )
    total = sum(t.nbytes for t in tensors)
    done = 0
    if progress is not None:
        progress(0, total)
    digests: list[_Digests] = []

    def reads() -> Iterator[chunks.ArrayRead]:
        for index, tensor in enumerate(tensors):
            pieces, checked = _pieces(tensor)
            digests.append(_Digests(tensor, pieces, checked))
            array = _Regions(sources[tensor.key])
            for bounds in pieces:
                boxes = _boxes(bounds, tensor.chunk_shape, tensor.stored.itemsize)
                yield chunks.ArrayRead((index, bounds), array, boxes, tensor.stored.itemsize)

    where = repr(str(tree.directory))
    last = -1
    for (index, bounds), box, values in chunks.read_arrays(
        reads(), in_flight_bytes=IN_FLIGHT_BYTES
    ):
        tensor = tensors[index]
        if index != last:
            if last >= 0:
                digests[last].check(where)
            last = index
        if isinstance(values, chunks.ReadFailure):
            raise ValueError(
                f"checkpointable at {where}: cannot read leaf {tensor.key}: {values.message}"
            )
        values = np.asarray(values)
        digests[index].update(bounds, values)
        if values.dtype != tensor.written:
            values = values.astype(tensor.written)
        counts[index].update(values)
        data = np.ascontiguousarray(values).reshape(-1).view(np.uint8)
        length, starts = _runs(box, tensor.shape)
        step = length * tensor.written.itemsize
        for i, start in enumerate(starts):
            piece = memoryview(data[i * step : (i + 1) * step])  # type: ignore[arg-type]
            offset = tensor.offset + start * tensor.written.itemsize
            _pwrite(fds[tensor.file], piece, offset)
            if written is not None:
                written.add(tensor.file, offset, piece)
        done += data.size
        if progress is not None:
            progress(done, total)
    if last >= 0:
        digests[last].check(where)
    return counts


def _verify_written(
    work: Path, file_names: list[str], tensors: list[_Tensor], written: _Written
) -> None:
    """Reads every written byte range back and compares it with what was written."""
    for number, file in enumerate(file_names):
        header = st.read_header(work / file)
        st.check_size(header)
        expected = {t.name: (t.written.name, t.shape) for t in tensors if t.file == number}
        found = {n: (e.dtype, e.shape) for n, e in header.tensors.items()}
        if found != expected:
            raise ValueError(f"export {file!r}: its header does not list the tensors written")
    handles = [open(work / file, "rb") for file in file_names]  # noqa: SIM115
    try:
        for number, offset, length, digest in written.ranges:
            handle = handles[number]
            handle.seek(offset)
            if xxhash.xxh3_64_hexdigest(handle.read(length)) != digest:
                raise ValueError(
                    f"export {file_names[number]!r}: the {length} bytes written at offset "
                    f"{offset} read back differently"
                )
    finally:
        for handle in handles:
            handle.close()
