"""Checkpointable names: one portable path component each."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

from tinax._format.naming.names import RESERVED_CHECKPOINTABLE_NAMES

# Characters no portable filesystem accepts in a path component.
_FORBIDDEN_CHARACTERS = frozenset('/\\:*?"<>|')
_MAX_NAME_BYTES = 255
_WINDOWS_DEVICE = re.compile(r"^(con|prn|aux|nul|com[1-9]|lpt[1-9])(\..*)?$", re.IGNORECASE)

# A checkpointable named like one of Orbax's own root files would collide with it, and
# Orbax refuses the names it reserves itself; the comparison is case-insensitive so that
# the same checkpoint stays readable on case-insensitive filesystems.
_RESERVED_FOLDED = frozenset(
    unicodedata.normalize("NFC", n).casefold() for n in RESERVED_CHECKPOINTABLE_NAMES
)


def _fold(name: str) -> str:
    """The form in which two names are compared: NFC, then case folded."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", name).casefold())


def validate_checkpointable_name(name: object) -> str:
    """Validate one checkpointable name as a safe portable path component.

    Args:
      name: Candidate checkpointable name to validate.

    Returns:
      The validated ``name``, unchanged.

    Raises:
      TypeError: If ``name`` is not a string.
      ValueError: If ``name`` is empty, a dot component, contains reserved or
        control characters, ends with a space or dot, exceeds 255 UTF-8 bytes,
        or matches a reserved name.
    """
    if not isinstance(name, str):
        raise TypeError(
            f"checkpointable names must be strings, got {type(name).__name__}: {name!r}"
        )
    if not name:
        raise ValueError("checkpointable name must not be empty")
    if name in (".", ".."):
        raise ValueError(f"checkpointable name {name!r} is a dot path component")
    bad = sorted({c for c in name if c in _FORBIDDEN_CHARACTERS})
    if bad:
        raise ValueError(
            f"checkpointable name {name!r} contains reserved character(s) {' '.join(bad)}"
        )
    controls = [c for c in name if unicodedata.category(c) == "Cc"]
    if controls:
        raise ValueError(
            f"checkpointable name {name!r} contains control character(s) "
            + " ".join(f"U+{ord(c):04X}" for c in controls)
        )
    if name[-1] in " .":
        raise ValueError(f"checkpointable name {name!r} ends with a space or a dot")
    size = len(name.encode("utf-8"))
    if size > _MAX_NAME_BYTES:
        raise ValueError(
            f"checkpointable name is {size} UTF-8 bytes long; the limit is {_MAX_NAME_BYTES}"
        )
    if _WINDOWS_DEVICE.match(name):
        raise ValueError(f"checkpointable name {name!r} is a Windows device name")
    if _fold(name) in _RESERVED_FOLDED:
        raise ValueError(
            f"checkpointable name {name!r} is reserved: Orbax writes or reserves "
            f"{sorted(RESERVED_CHECKPOINTABLE_NAMES)}"
        )
    return name


def validate_distinct_names(names: Iterable[object], *, what: str) -> list[str]:
    """Validates every name and checks that no two clash.

    Two names clash when they are equal after Unicode NFC normalisation and case
    folding, because they would name the same directory on a case-insensitive or
    normalising filesystem.

    Args:
      names: The candidate names, in order.
      what: What the names belong to, for error messages.

    Returns:
      The names as a list, unchanged.

    Raises:
      TypeError: If a name is not a string.
      ValueError: If a name is invalid or two names clash.
    """
    seen: dict[str, str] = {}
    result = []
    for name in names:
        validated = validate_checkpointable_name(name)
        folded = _fold(validated)
        if folded in seen:
            raise ValueError(
                f"{what}: checkpointable names must be portable and distinct, but "
                f"{seen[folded]!r} and {validated!r} are not (equal after Unicode NFC "
                "normalisation and case folding, they name one directory on many filesystems)"
            )
        seen[folded] = validated
        result.append(validated)
    return result
