"""Keys and sizes as people read them: one way for widgets, terminal and timeline.

Tables keep a leaf's exact key (``jax.tree_util.keystr`` format, ``['blocks'][2]['w']``)
in their ``key`` column; this module only makes display text from it:

- ``natural_key`` / ``sort_keys``: integer parts (indices, and dict keys that are
  digits, such as optax's ``'0'``) compare as numbers, so block 2 comes before block 10.
- ``readable_key``: one key in full, dotted, NNX's trailing ``value`` dropped; the same
  name ``export_safetensors`` gives the tensor (``blocks.2.attn.q.kernel``).
- ``display_keys``: labels for the rows in view. What every row shares is left out
  (``shared_prefix`` says what that was), and with a ``width`` the labels are shortened
  without ever making two distinct keys read alike: layer indices and short names such
  as ``mu``/``nu`` stay, common middle parts give way to ``…`` first.
- ``state_part`` / ``_is_optimizer_state``: the model's leaves are shown first, the
  optimizer's state last.
- ``key_matches``: what a key filter finds, typed dotted or as a keystr.
- ``human_bytes``: the one byte formatter of the project.

It imports neither JAX nor pandas.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from tinax._format.naming import keys as _keys
from tinax._format.safetensors import tensor_name

__all__ = [
    "ELLIPSIS",
    "display_keys",
    "human_bytes",
    "key_matches",
    "natural_key",
    "readable_key",
    "shared_prefix",
    "sort_keys",
    "state_part",
]

_ROOT_LABEL = "(root)"
ELLIPSIS = "…"
_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
# Parts this short (mu, nu, q, k, v, w, b) cost little room and often tell rows apart.
_SHORT = 2
_DIGITS = re.compile(r"(\d+)")


def _parts(key: str) -> tuple[str | int, ...]:
    if not isinstance(key, str):
        raise TypeError(f"a key is a str in keystr format, got {type(key).__name__}")
    try:
        return _keys.parse_key(key)
    except ValueError:
        raise ValueError(
            f"key {key!r} is not in keystr format (a sequence of [index] and ['name'] parts)"
        ) from None


def _is_integer(part: str | int) -> bool:
    return isinstance(part, int) or (part.isascii() and part.isdigit())


def natural_key(key: str) -> tuple[int | str, ...]:
    """A sort key for a keystr in which integer-like parts compare as numbers.

    ``['blocks'][2]`` sorts before ``['blocks'][10]``, and ``['opt_state']['2']``
    before ``['opt_state']['10']``; a key sorts before the keys below it. Text that
    is not a keystr (a label, a file name) sorts with its digit runs as numbers.

    Args:
      key: A key as ``jax.tree_util.keystr`` writes it (``""`` for the root).

    Returns:
      A tuple that orders keys naturally: per part a tag (0 for a number, which
      sorts before a name at the same place) and the number or the name.

    Raises:
      TypeError: If ``key`` is not a string.
    """
    if not isinstance(key, str):
        raise TypeError(f"a key is a str, got {type(key).__name__}")
    try:
        parts: Sequence[str | int] = _keys.parse_key(key)
    except ValueError:
        parts = [p for p in _DIGITS.split(key) if p]
    out: list[int | str] = []
    for p in parts:
        if isinstance(p, int):
            out += (0, p)
        else:
            out += (0, int(p)) if p.isascii() and p.isdigit() else (1, p)
    return tuple(out)


def sort_keys(keys: Iterable[str]) -> list[str]:
    """``keys`` in natural order (``natural_key``)."""
    return sorted(keys, key=natural_key)


def readable_key(key: str) -> str:
    """One key in full as a dotted name: the tensor name ``export_safetensors`` gives it.

    ``"['blocks'][2]['attn']['q']['kernel']['value']"`` → ``"blocks.2.attn.q.kernel"``;
    the root key ``""`` → ``"(root)"``.

    Raises:
      TypeError: If ``key`` is not a string.
      ValueError: If ``key`` is not in keystr format.
    """
    parts = _parts(key)
    return tensor_name(parts) if parts else _ROOT_LABEL


# Names under which optimizer state is saved: a checkpointable of its own
# (``optimizer``) or the top key of a train state (``['opt_state']``).
OPTIMIZER_NAMES = frozenset({"optimizer", "opt_state", "opt", "optim", "optimizer_state"})


# Checkpointables that hold neither the model nor its optimizer: they come between.
OTHER_STATE_NAMES = frozenset(
    {"auxiliary", "aux", "rng", "rngs", "iterator", "dataset", "data", "metrics", "metadata"}
)
# Where a leaf's part of a training state is shown: the model first, the optimizer last.
MODEL, OTHER_STATE, OPTIMIZER_STATE = 0, 1, 2


def _first_name(key: str) -> str:
    text = str(key)
    end = text.find("'", 2)
    return text[2:end].lower() if text.startswith("['") and end > 0 else ""


def _is_optimizer_state(checkpointable: str, key: str) -> bool:
    """Whether a leaf belongs to an optimizer's state (moments, counts) rather than
    the model: its checkpointable or its first key part is named like one."""
    if str(checkpointable).lower() in OPTIMIZER_NAMES:
        return True
    return _first_name(key) in OPTIMIZER_NAMES


def state_part(checkpointable: str, key: str) -> int:
    """Where a leaf's part of a training state is shown: ``MODEL`` (0) first, then
    ``OTHER_STATE`` (1: the iterator, PRNG keys, auxiliary values), then
    ``OPTIMIZER_STATE`` (2)."""
    if _is_optimizer_state(checkpointable, key):
        return OPTIMIZER_STATE
    if str(checkpointable).lower() in OTHER_STATE_NAMES:
        return OTHER_STATE
    return MODEL


def key_matches(keys: Iterable[str], text: str) -> list[bool]:
    """Which ``keys`` a filter's ``text`` finds: in the exact key or in its readable
    name, case ignored (``blocks.7`` and ``['blocks']['7']`` find the same leaves).

    Args:
      keys: Keys in keystr format (text that is not one is searched as it is).
      text: What a person typed; blank finds every key.

    Raises:
      TypeError: If ``text`` is not a string.
    """
    if not isinstance(text, str):
        raise TypeError(f"a filter is a str, got {type(text).__name__}")
    needle = text.strip().lower()
    found = []
    for key in keys:
        if not needle:
            found.append(True)
            continue
        key = str(key)
        if needle in key.lower():
            found.append(True)
            continue
        try:
            found.append(needle in _readable_lower(key))
        except ValueError:
            found.append(False)
    return found


# A filter is typed a key at a time over the same keys: each key's readable name is
# worked out once (parsing 50,000 keys anew took most of each keystroke's time).
@functools.lru_cache(maxsize=1 << 16)
def _readable_lower(key: str) -> str:
    return readable_key(key).lower()


def _trimmed(parts: tuple[str | int, ...]) -> tuple[str, ...]:
    return _keys.without_nnx_value(tuple(str(p) for p in parts))


def _rows(
    keys: Sequence[str], checkpointables: Sequence[str] | None
) -> list[tuple[tuple[str, str], tuple[str, ...]]]:
    """Each row as ``(identity, parts)``: identity ``(checkpointable, key)``, parts the
    checkpointable (where given) and the key's parts, NNX's ``value`` trimmed."""
    if isinstance(keys, str) or not isinstance(keys, Sequence):
        raise TypeError(f"keys must be a sequence of str, got {type(keys).__name__}")
    if checkpointables is None:
        return [(("", k), _trimmed(_parts(k))) for k in keys]
    if isinstance(checkpointables, str) or not isinstance(checkpointables, Sequence):
        raise TypeError(
            f"checkpointables must be a sequence of str, got {type(checkpointables).__name__}"
        )
    if len(checkpointables) != len(keys):
        raise ValueError(f"checkpointables has {len(checkpointables)} names for {len(keys)} keys")
    rows = []
    for name, key in zip(checkpointables, keys, strict=True):
        if not isinstance(name, str):
            raise TypeError(f"a checkpointable name is a str, got {type(name).__name__}")
        rows.append(((name, key), (name, *_trimmed(_parts(key)))))
    return rows


def _common(rows: Sequence[tuple[tuple[str, str], tuple[str, ...]]]) -> int:
    """How many leading parts every row shares, keeping at least one part in each."""
    if len({identity for identity, _ in rows}) < 2:
        return 0
    parts = [p for _, p in rows]
    shortest = min(len(p) for p in parts)
    n = 0
    while n < shortest - 1 and all(p[n] == parts[0][n] for p in parts):
        n += 1
    return n


def shared_prefix(keys: Sequence[str], *, checkpointables: Sequence[str] | None = None) -> str:
    """What ``display_keys`` leaves out of every label, dotted (``"opt_state.0"``); ``""``
    when nothing is. Arguments as for ``display_keys``."""
    rows = _rows(keys, checkpointables)
    return ".".join(rows[0][1][: _common(rows)]) if rows else ""


def _render(parts: Sequence[str], shown: Sequence[bool]) -> str:
    out: list[str] = []
    elided = False
    for part, keep in zip(parts, shown, strict=True):
        if not keep:
            if not elided:
                out.append(ELLIPSIS)
            elided = True
            continue
        if out and not elided:
            out.append(".")
        out.append(part)
        elided = False
    return "".join(out)


def _middle(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters in its middle, keeping more of its end."""
    if len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS
    head = (width - 1) // 3
    tail = width - 1 - head
    return text[:head] + ELLIPSIS + text[len(text) - tail :]


def display_keys(
    keys: Sequence[str],
    *,
    width: int | None = None,
    checkpointables: Sequence[str] | None = None,
) -> list[str]:
    """Labels for rows in view, in the same order, that people can tell apart.

    Leading parts that every row shares are left out (``shared_prefix`` gives them),
    so are NNX's trailing ``value`` parts; the rest reads dotted, as
    ``readable_key`` writes it. With ``width``, a label longer than ``width``
    characters is shortened: parts common to many rows give way to ``…`` first,
    integer parts (layer indices) and short names (``mu``, ``nu``, ``q``) last, and
    no step ever makes a label equal to another row's. Two distinct keys therefore
    never share a label; a label stays longer than ``width`` rather than do so. The
    same key twice gets the same label. One distinct key is shown in full.

    Args:
      keys: Keys in keystr format, one per row.
      width: The most characters a label should take, or ``None`` for no limit.
      checkpointables: The checkpointable of each row, when rows of several are
        in view; its name is then the first part of the row's label.

    Returns:
      One label per key.

    Raises:
      TypeError: If ``keys`` is not a sequence of strings or ``width`` not an int.
      ValueError: If a key is not in keystr format or ``width`` is below 1.
    """
    if width is not None:
        if isinstance(width, bool) or not isinstance(width, int):
            raise TypeError(f"width must be an int or None, got {type(width).__name__}")
        if width < 1:
            raise ValueError(f"width must be at least 1, got {width}")
    rows = _rows(keys, checkpointables)
    if not rows:
        return []
    start = _common(rows)
    tails = {identity: parts[start:] for identity, parts in rows}
    labels = {identity: ".".join(tail) if tail else _ROOT_LABEL for identity, tail in tails.items()}
    # Dotted names can meet (['a.b'] and ['a']['b'], ['x'] and ['x']['value']):
    # those rows keep their exact keystr form.
    seen = Counter(labels.values())
    for identity, label in list(labels.items()):
        if seen[label] > 1:
            name, key = identity
            labels[identity] = f"{name}:{key}" if name and start == 0 else key or _ROOT_LABEL
    if width is not None:
        _shorten(tails, labels, width)
    return [labels[identity] for identity, _ in rows]


def _shorten(
    tails: dict[tuple[str, str], tuple[str, ...]], labels: dict[tuple[str, str], str], width: int
) -> None:
    """Shortens ``labels`` in place towards ``width``, never letting two become equal."""
    taken = Counter(labels.values())
    # How many rows hold each part at each depth: the commoner, the less it tells.
    often = Counter((i, p) for tail in tails.values() for i, p in enumerate(tail))
    # A part nearly every row holds (optax's ['0']) tells nothing, index or not.
    nearly_all = max(2, math.ceil(0.9 * len(tails)))

    def swap(old: str, new: str) -> bool:
        if new == old or taken[new]:
            return False
        taken[old] -= 1
        taken[new] += 1
        return True

    for identity, tail in tails.items():
        label = labels[identity]
        if len(label) <= width or ".".join(tail) != label:
            if len(label) > width and swap(label, _middle(label, width)):
                labels[identity] = _middle(label, width)
            continue
        shown = [True] * len(tail)
        # The last part names the leaf; indices and short names tell rows apart.
        order = sorted(
            range(len(tail) - 1),
            key=lambda i: (
                often[(i, tail[i])] < nearly_all
                and (_is_integer(tail[i]) or len(tail[i]) <= _SHORT),
                -often[(i, tail[i])],
                -len(tail[i]),
                i,
            ),
        )
        for i in order:
            beside = (i > 0 and not shown[i - 1]) or not shown[i + 1]
            if len(label) <= width and not (beside and often[(i, tail[i])] >= nearly_all):
                # A part every row holds goes with its elided neighbour: one "…", less noise.
                break
            shown[i] = False
            new = _render(tail, shown)
            if len(new) < len(label) and swap(label, new):
                label = new
            else:
                shown[i] = True
        if len(label) > width and swap(label, _middle(label, width)):
            label = _middle(label, width)
        labels[identity] = label


def human_bytes(n: Any, *, missing: str = "") -> str:
    """A byte count in binary units: ``1536`` → ``'1.5 KiB'``, ``87`` → ``'87 B'``.

    Args:
      n: A number of bytes (int, float, NumPy scalar); ``None``, NaN, ``pandas.NA``
        and ``NaT`` are missing values.
      missing: The text for a missing value.

    Raises:
      TypeError: If ``n`` is neither a number nor a missing value.
    """
    if n is None:
        return missing
    if isinstance(n, bool | str | bytes):
        raise TypeError(f"a byte count is a number, got {type(n).__name__}")
    try:
        value = float(n)
    except (TypeError, ValueError):
        if type(n).__name__ in ("NAType", "NaTType"):
            return missing
        raise TypeError(f"a byte count is a number, got {type(n).__name__}") from None
    if math.isnan(value):
        return missing
    for unit in _BYTE_UNITS:
        if abs(value) < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
