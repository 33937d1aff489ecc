"""The safetensors format: headers written and read, index files of split exports.

A ``.safetensors`` file is an 8-byte little-endian header length ``n``, ``n`` bytes
of JSON (padded with spaces to a multiple of 8), then the tensors' raw bytes, little
endian, in C order. The header maps each tensor's name to its ``dtype`` code,
``shape`` and ``data_offsets`` (start and end within the data that follows the
header); ``__metadata__`` is a flat map of strings. A model split over several files
has an index, ``model.safetensors.index.json``, in the Hugging Face hub's layout:
``{"metadata": {"total_size": …}, "weight_map": {tensor name: file name}}``.

Readers here trust nothing in a file: the header's length and every tensor's offsets
are checked against each other, against its shape and dtype, and against the file's
size before a tensor byte is read.

This module imports neither JAX nor Orbax: the export (``tinax.explore``) and the
load (``tinax.checkpointing``) both build on it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tinax._format.naming.dtypes import numpy_dtype as numpy_dtype
from tinax._format.naming.keys import without_nnx_value

if TYPE_CHECKING:
    import numpy as np

SUFFIX = ".safetensors"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
METADATA_KEY = "__metadata__"
# The reference reader refuses larger headers; so does this one.
MAX_HEADER_BYTES = 100_000_000
# An index lists one file name per tensor: tens of megabytes for the largest models.
MAX_INDEX_BYTES = 256 << 20

# dtype codes, in the order the reference writer ranks them: tensors are laid out
# with the highest rank first (the widest items first, so every tensor stays aligned),
# then by name.
_CODES: tuple[tuple[str, str], ...] = (
    ("BOOL", "bool"),
    ("U8", "uint8"),
    ("I8", "int8"),
    ("F8_E5M2", "float8_e5m2"),
    ("F8_E4M3", "float8_e4m3fn"),
    ("I16", "int16"),
    ("U16", "uint16"),
    ("F16", "float16"),
    ("BF16", "bfloat16"),
    ("I32", "int32"),
    ("U32", "uint32"),
    ("F32", "float32"),
    ("C64", "complex64"),
    ("F64", "float64"),
    ("I64", "int64"),
    ("U64", "uint64"),
)
# The floating-point dtypes an export may cast arrays to (``dtype=``), as safetensors
# names them.
CAST_DTYPES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
CODE_OF = {name: code for code, name in _CODES}
NAME_OF = {code: name for code, name in _CODES}
_RANK = {code: rank for rank, (code, _) in enumerate(_CODES)}


def is_floating(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is a real floating-point type (ml_dtypes' among them)."""
    if dtype.kind == "f":
        return True
    if dtype.kind != "V":
        return False  # integers, booleans, complex: not ml_dtypes' floats
    import ml_dtypes

    try:
        ml_dtypes.finfo(dtype)
    except (TypeError, ValueError):
        return False
    return dtype.kind != "c"


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file.

    Attributes:
      name: Its name.
      dtype: NumPy's name of its dtype (``float32``, ``bfloat16``).
      shape: Its shape.
      start: Where its bytes start, from the end of the header.
      end: Where they end.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def nbytes_of(dtype: str, shape: Sequence[int]) -> int:
    """Bytes of a tensor of ``dtype`` and ``shape``."""
    return math.prod(int(d) for d in shape) * numpy_dtype(dtype).itemsize


def layout_order(tensors: Iterable[tuple[str, str]]) -> list[str]:
    """Names of ``(name, dtype)`` tensors in the order the reference writer lays them out."""
    return [
        name for name, _ in sorted(tensors, key=lambda item: (-_RANK[CODE_OF[item[1]]], item[0]))
    ]


def encode_header(
    tensors: Sequence[tuple[str, str, tuple[int, ...]]], metadata: Mapping[str, str]
) -> tuple[bytes, dict[str, TensorEntry]]:
    """The header of a file holding ``(name, dtype, shape)`` tensors, and where each lies.

    Tensors are laid out in ``layout_order``; the header (with its length prefix) is
    padded so that the data starts at a multiple of 8 bytes.

    Raises:
      ValueError: If a dtype has no safetensors code or a name repeats.
    """
    by_name: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, dtype, shape in tensors:
        if dtype not in CODE_OF:
            raise ValueError(f"tensor {name!r}: safetensors has no code for dtype {dtype}")
        if name in by_name or name == METADATA_KEY:
            raise ValueError(f"tensor name {name!r} is used twice")
        by_name[name] = (dtype, tuple(int(d) for d in shape))
    document: dict[str, Any] = {METADATA_KEY: dict(metadata)}
    entries: dict[str, TensorEntry] = {}
    offset = 0
    for name in layout_order((n, d) for n, (d, _) in by_name.items()):
        dtype, shape = by_name[name]
        end = offset + nbytes_of(dtype, shape)
        document[name] = {
            "dtype": CODE_OF[dtype],
            "shape": list(shape),
            "data_offsets": [offset, end],
        }
        entries[name] = TensorEntry(name, dtype, shape, offset, end)
        offset = end
    text = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, entries


@dataclasses.dataclass(frozen=True)
class Header:
    """A parsed safetensors header.

    Attributes:
      path: The file.
      data_start: Where the tensor data starts in the file.
      data_bytes: Bytes of tensor data the header describes.
      tensors: The tensors, by name.
      metadata: ``__metadata__``.
    """

    path: Path
    data_start: int
    data_bytes: int
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]


def _bad(path: Path, problem: str) -> ValueError:
    return ValueError(f"{str(path)!r} is not a safetensors file: {problem}")


def _parse_entry(path: Path, name: str, raw: object) -> TensorEntry:
    if not isinstance(raw, dict):
        raise _bad(path, f"tensor {name!r} is not described by an object")
    code, shape, offsets = raw.get("dtype"), raw.get("shape"), raw.get("data_offsets")
    if not isinstance(code, str) or code not in NAME_OF:
        raise _bad(path, f"tensor {name!r} has dtype {code!r}, which tinax does not read")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise _bad(path, f"tensor {name!r} has shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int and o >= 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise _bad(path, f"tensor {name!r} has data_offsets {offsets!r}")
    dtype = NAME_OF[code]
    if offsets[1] - offsets[0] != nbytes_of(dtype, shape):
        raise _bad(
            path,
            f"tensor {name!r} ({dtype} {tuple(shape)}) needs {nbytes_of(dtype, shape)} bytes, "
            f"its data_offsets span {offsets[1] - offsets[0]}",
        )
    return TensorEntry(name, dtype, tuple(shape), offsets[0], offsets[1])


def read_header(path: str | os.PathLike[str]) -> Header:
    """The header of the safetensors file at ``path``, checked, without reading tensor data.

    The tensors' offsets must tile the data region from its start without gaps or
    overlaps, as the reference reader demands; whether the file holds all of that
    data is ``check_size``'s question, asked before the data is read.

    Raises:
      FileNotFoundError: If there is no file at ``path``.
      ValueError: If it is not a safetensors file (naming what is wrong).
    """
    where = Path(path)
    if not where.exists():
        raise FileNotFoundError(f"no safetensors file at {str(where)!r}")
    if not where.is_file():
        raise ValueError(f"{str(where)!r} is not a file")
    with open(where, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        prefix = f.read(8)
        if len(prefix) != 8:
            raise _bad(where, f"it is {size} bytes, shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES:
            raise _bad(where, f"its header claims {length} bytes (at most {MAX_HEADER_BYTES})")
        if 8 + length > size:
            raise _bad(where, f"its header claims {length} bytes; the file is {size}")
        text = f.read(length)
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        raise _bad(where, "its header is not JSON") from None
    if not isinstance(document, dict):
        raise _bad(where, "its header is not a JSON object")
    metadata = document.pop(METADATA_KEY, None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise _bad(where, f"{METADATA_KEY} is not a map of strings")
    tensors = {name: _parse_entry(where, name, raw) for name, raw in document.items()}
    end = 0
    for entry in sorted(tensors.values(), key=lambda e: (e.start, e.end)):
        if entry.start != end:
            raise _bad(
                where,
                f"tensor {entry.name!r} starts at byte {entry.start} of the data, "
                f"where {end} was expected (a gap or an overlap)",
            )
        end = entry.end
    return Header(where, 8 + length, end, tensors, dict(metadata))


def check_size(header: Header) -> None:
    """Refuses a file shorter than its header says.

    Raises:
      ValueError: If the file does not hold every tensor's bytes.
    """
    size = header.path.stat().st_size
    if header.data_start + header.data_bytes > size:
        raise _bad(
            header.path,
            f"its tensors need {header.data_start + header.data_bytes} bytes; the file is "
            f"{size} (truncated?)",
        )


def map_tensor(header: Header, name: str) -> np.ndarray:
    """One tensor as a read-only memory map of its file (nothing read until indexed)."""
    import numpy as np

    entry = header.tensors[name]
    dtype = numpy_dtype(entry.dtype)
    if entry.nbytes == 0:
        return np.zeros(entry.shape, dtype)
    mapped = np.memmap(
        header.path,
        dtype=np.uint8,
        mode="r",
        offset=header.data_start + entry.start,
        shape=(entry.nbytes,),
    )
    return mapped.view(dtype).reshape(entry.shape)


def encode_index(
    weight_map: Mapping[str, str], total_size: int, metadata: Mapping[str, str]
) -> bytes:
    """The Hugging Face hub's index of a split export."""
    document = {
        "metadata": {"total_size": int(total_size), **metadata},
        "weight_map": dict(sorted(weight_map.items())),
    }
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def read_index(path: Path) -> dict[str, str]:
    """The weight map of an index file: tensor name → file name in the index's directory.

    Raises:
      ValueError: If it is not an index, or names a file outside its directory.
    """
    if path.stat().st_size > MAX_INDEX_BYTES:
        raise ValueError(f"{str(path)!r} is larger than an index file can be")
    try:
        document = json.loads(path.read_bytes())
    except (ValueError, RecursionError):
        raise ValueError(f"{str(path)!r} is not a safetensors index: not JSON") from None
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise ValueError(f"{str(path)!r} is not a safetensors index: it has no weight_map")
    for file in set(weight_map.values()):
        if "/" in file or "\\" in file or file in (".", "..") or not file:
            raise ValueError(f"{str(path)!r} names {file!r}, which is not a file beside the index")
    return dict(weight_map)


def tensor_name(path: Sequence[int | str]) -> str:
    """A leaf's default tensor name: its key path dotted, NNX's trailing ``value`` dropped.

    ``('dense1', 'kernel', 'value')`` → ``dense1.kernel``; ``(0, 'mu', 'w')`` → ``0.mu.w``.
    """
    # NNX's "value" is a name, never an index: it is dropped before the parts are strings.
    return ".".join(map(str, without_nnx_value(tuple(path))))


def split_file_name(number: int, count: int) -> str:
    """``model-00001-of-00003.safetensors``: file ``number`` (from 1) of ``count``."""
    return f"model-{number:05d}-of-{count:05d}{SUFFIX}"
