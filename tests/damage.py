"""Damage done to a checkpoint's files on disk, as tests need it."""

from __future__ import annotations

from pathlib import Path


def biggest_data_file(checkpointable: Path) -> Path:
    """The largest of the checkpointable's array data files (OCDBT's ``d/`` folders)."""
    return max(
        (p for p in checkpointable.rglob("*") if p.parent.name == "d"),
        key=lambda p: p.stat().st_size,
    )


def file_holding(checkpointable: Path, needle: bytes) -> tuple[Path, int]:
    """The one data file of the checkpointable whose bytes contain ``needle``, and where.

    Orbax's writers may spread a checkpointable's arrays over several data files, so
    the largest file need not hold a given array.
    """
    found = [(p, p.read_bytes().find(needle)) for p in checkpointable.rglob("d/*")]
    holding = [(p, at) for p, at in found if at >= 0]
    if len(holding) != 1:
        raise AssertionError(f"{len(holding)} data files hold the bytes, not one")
    return holding[0]


def flip_bits(path: Path, at: int, bits: int = 0xFF) -> Path:
    """Inverts the ``bits`` of the byte at offset ``at`` of the file at ``path``."""
    data = bytearray(path.read_bytes())
    data[at] ^= bits
    path.write_bytes(bytes(data))
    return path


def flip_middle_byte(path: Path, bits: int = 0xFF) -> Path:
    """Inverts the ``bits`` of the byte in the middle of the file at ``path``."""
    return flip_bits(path, path.stat().st_size // 2, bits)


def stored_value(checkpointable: Path, key: str) -> tuple[Path, int]:
    """The data file holding the value of ``key`` in the checkpointable's OCDBT store
    (a chunk: ``w/c/0/0``), and where in that file the value starts.

    OCDBT packs values and B+tree nodes into its data files in whatever order they
    were written: a byte at a fixed offset of a file may be another array's or the
    tree's.
    """
    import tensorstore as ts

    from tinax._format.metadata.arrays import parse_location, walk_ocdbt
    from tinax._paths import location

    for found, value in walk_ocdbt(location(str(checkpointable)), ts.Context()).values.items():
        if found == key.encode():
            if not isinstance(value, str):
                raise ValueError(f"{key} is kept inline in the B+tree, not in a data file")
            ref = parse_location(value)
            return checkpointable / ref.file, ref.offset
    raise KeyError(key)
