"""Leaf keys: one spelling for the whole project, and key paths compared as paths.

Orbax records a leaf's place in its pytree as a list of keys, each a sequence index
or a dict key (namedtuple and dataclass fields are stored as dict keys, and every
dict key as a string). tinax holds such a place as a *key path*, a tuple of ``int``
(sequence index) and ``str`` (dict key or field name) parts, and writes it as
``jax.tree_util.keystr`` writes the same path: ``[0]['mu']['dense']['w']``.

Code that asks whether a leaf lies inside a subtree compares key paths
(``is_within``), never the text of their keys: ``['mu']`` is not inside ``['m']``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence
from typing import TypeVar

KeyPart = int | str
KeyPath = tuple[KeyPart, ...]

# The root of a checkpointable that is one value (an iterator, a lone array).
ROOT: KeyPath = ()
ROOT_KEY = ""
# NNX keeps a variable's array under this last key part; dotted names leave it out.
NNX_VALUE = "value"

_Part = TypeVar("_Part", int, str, KeyPart)


def format_key(path: Iterable[KeyPart]) -> str:
    """The text of a key path, as ``jax.tree_util.keystr`` writes it: ``['a'][0]``."""
    out = []
    for part in path:
        if isinstance(part, bool) or not isinstance(part, int | str):
            raise TypeError(f"a key part is an int or a str, got {type(part).__name__}")
        out.append(f"[{part}]" if isinstance(part, int) else f"[{part!r}]")
    return "".join(out)


# One part of a key as written: an index, or a quoted name with backslash escapes.
_PART = re.compile(r"\[(?:\d+|'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")\]", re.ASCII)
# A part without escapes, read without ``ast`` (the common case, many times faster).
# (No line break in a name: ``ast`` refuses one unescaped, so the slow path decides.)
_SIMPLE_PART = re.compile(r"\[(?:(\d+)|'([^'\\\n\r]*)'|\"([^\"\\\n\r]*)\")\]", re.ASCII)


def split_key(text: str) -> tuple[str, ...]:
    """The parts of a key as written, without decoding them: ``"['a'][0]"`` gives
    ``("['a']", "[0]")``. The grammar of ``parse_key``, at the speed of one regular
    expression (a tree of tens of thousands of keys is split in a blink).

    Raises:
      TypeError: If ``text`` is not a string.
      ValueError: If ``text`` is not a sequence of ``[index]`` and ``['name']`` parts.
    """
    if not isinstance(text, str):
        raise TypeError(f"a key is a str, got {type(text).__name__}")
    parts = tuple(_PART.findall(text))
    if sum(len(p) for p in parts) != len(text):
        raise ValueError(f"key {text!r} is not a sequence of [index] and ['name'] parts")
    return parts


def parse_key(text: str) -> KeyPath:
    """The key path that ``format_key`` wrote as ``text``.

    Raises:
      TypeError: If ``text`` is not a string.
      ValueError: If ``text`` is not a sequence of ``[index]`` and ``['name']`` parts.
    """
    if not isinstance(text, str):
        raise TypeError(f"a key is a str, got {type(text).__name__}")
    parts: list[KeyPart] = []
    if "\\" not in text:
        # Keys without escapes in one pass (a 50,000-leaf table is read in a blink).
        length = 0
        for index, single, double in _SIMPLE_PART.findall(text):
            if index:
                parts.append(int(index))
                length += len(index) + 2
            else:
                name = single or double
                parts.append(name)
                length += len(name) + 4
        if length == len(text):
            return tuple(parts)
        parts = []
    for part in split_key(text):
        inner = part[1:-1]
        if inner[:1] in ("'", '"'):
            try:
                parts.append(ast.literal_eval(inner))
            except (ValueError, SyntaxError):
                raise ValueError(f"key {text!r}: {inner} is not a quoted name") from None
        else:
            parts.append(int(inner))
    return tuple(parts)


def ends_with_nnx_value(path: Sequence[object]) -> bool:
    """Whether ``path`` ends in NNX's ``value`` below some other part (an NNX variable's
    array); a lone ``value`` is a name of its own and is kept."""
    return len(path) > 1 and path[-1] == NNX_VALUE


def without_nnx_value(path: tuple[_Part, ...]) -> tuple[_Part, ...]:
    """``path`` without NNX's trailing ``value`` (``ends_with_nnx_value``)."""
    return path[:-1] if ends_with_nnx_value(path) else path


def key_parts(key_path: Iterable[object]) -> KeyPath:
    """The key path of a JAX key path (``tree_flatten_with_path``), as Orbax stores it.

    Sequence indices stay integers; dict keys become strings and attribute names
    (namedtuple and dataclass fields, as in optax states) become names, exactly as
    Orbax records them, so that keys of live state and of a checkpoint join.

    Raises:
      TypeError: If an entry is not one of JAX's four key classes.
    """
    parts: list[KeyPart] = []
    for entry in key_path:
        # JAX's key classes, matched by name: this module must not import JAX.
        kind = type(entry).__name__
        if kind == "SequenceKey":
            parts.append(int(entry.idx))  # type: ignore[attr-defined]
        elif kind == "FlattenedIndexKey":
            parts.append(int(entry.key))  # type: ignore[attr-defined]
        elif kind == "DictKey":
            parts.append(str(entry.key))  # type: ignore[attr-defined]
        elif kind == "GetAttrKey":
            parts.append(str(entry.name))  # type: ignore[attr-defined]
        else:
            raise TypeError(f"not a JAX pytree key: {entry!r} ({kind})")
    return tuple(parts)


def is_within(path: KeyPath, subtree: KeyPath) -> bool:
    """Whether the leaf at ``path`` lies in the subtree at ``subtree`` (or is it)."""
    return path[: len(subtree)] == subtree
