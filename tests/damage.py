"""Damage done to a checkpoint's files on disk, as tests need it."""

from __future__ import annotations

from pathlib import Path


def biggest_data_file(checkpointable: Path) -> Path:
    """The largest of the checkpointable's array data files (OCDBT's ``d/`` folders)."""
    return max(
        (p for p in checkpointable.rglob("*") if p.parent.name == "d"),
        key=lambda p: p.stat().st_size,
    )


def flip_middle_byte(path: Path) -> Path:
    """Inverts every bit of the byte in the middle of the file at ``path``."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return path
