"""A leaf named the way a person copies it from a table: dotted, ``keystr`` or ``(root)``.

The terminal shows keys as ``tinax.explore.display`` writes them: dotted
(``blocks.2.mlp.kernel``), NNX's trailing ``value`` left out, the parts every row
shares left out, middle parts elided with ``…`` on a narrow terminal. Any of these
forms names a leaf here, as does its exact ``jax.tree_util.keystr``. A name that
matches no leaf is answered with the nearest leaves' names (``difflib``), not the
first few in alphabetical order.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence

from tinax._format.naming import keys as _keys
from tinax.explore import display

# How many near names a miss suggests.
SUGGESTIONS = 5
# Table widths tried either side of a shortened label's length (see ``_shown_as``).
_WIDTHS_TRIED = 40


class LeafNotFoundError(ValueError, KeyError):
    """No leaf, or more than one, answers to the name given.

    Both a ``ValueError`` (a bad value) and a ``KeyError`` (what a lookup raises).
    """

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def _parts(text: str) -> tuple[str, ...] | None:
    """The parts ``text`` names, as strings, NNX's trailing ``value`` dropped.

    ``None`` when ``text`` is not a key at all (an ellipsis in it, say).
    """
    text = text.strip()
    if text in ("", display._ROOT_LABEL):
        return ()
    if text.startswith("["):
        try:
            parts = tuple(str(p) for p in _keys.parse_key(text))
        except ValueError:
            return None
    elif display.ELLIPSIS in text:
        return None
    else:
        parts = tuple(text.split("."))
        if any(not p for p in parts):
            return None
    return _keys.without_nnx_value(parts)


def _key_parts(key: str) -> tuple[str, ...]:
    return _keys.without_nnx_value(tuple(str(p) for p in _keys.parse_key(key)))


def _elided(text: str, *, loose: bool = False) -> re.Pattern[str]:
    """A label shortened with ``…`` as a pattern over full dotted names (its end fixed,
    since the parts every row shares were left out at its start).

    ``display_keys`` leaves out whole parts (``…mu…7.q.kernel``); ``loose`` also
    takes ``…`` for any text, as a label cut in the middle of a part has it.
    """
    pieces = text.strip().split(display.ELLIPSIS)
    if loose:
        body = ".*".join(re.escape(piece) for piece in pieces)
        return re.compile(r"(?:^|.*\.)" + body + "$", re.DOTALL)
    inner = [re.escape(piece.strip(".")) for piece in pieces if piece.strip(".")]
    end = r"(?:\..*)?" if not pieces[-1].strip(".") else ""
    return re.compile(r"(?:^|.*\.)" + r"(?:\.|\..*\.)".join(inner) + end + "$", re.DOTALL)


def _of(checkpointable: str) -> str:
    return f" of {checkpointable!r}" if checkpointable else ""


def exact_key(keys: Sequence[str], name: str) -> str | None:
    """The one key of ``keys`` that ``name`` writes in full (keystr or dotted), or
    ``None`` when none or several do."""
    if name in keys:
        return name
    wanted = _parts(name)
    if wanted is None:
        return None
    found = [key for key in keys if _key_parts(key) == wanted]
    return found[0] if len(found) == 1 else None


def match_key(
    keys: Sequence[str],
    name: str,
    *,
    checkpointable: str = "",
    shown: Mapping[str, str] | None = None,
) -> str:
    """The one key of ``keys`` that ``name`` names.

    ``name`` is the exact ``keystr`` (``['blocks'][2]['mlp']['kernel']['value']``),
    the dotted form (``blocks.2.mlp.kernel``, with or without NNX's ``.value``),
    ``(root)`` (or ``""``) for a checkpointable that is one value, or the end of
    the dotted form as a table shows it once the parts every row shares are left
    out (``mu.blocks.2.mlp.kernel`` for ``opt_state.0.mu…``), ``…`` standing for
    parts a narrow table elided.

    Args:
      keys: The keys to choose from, in ``keystr`` format.
      name: The name given.
      checkpointable: Named in the error messages.
      shown: The labels a table showed, label → key: a label in it names its key.

    Returns:
      The key, exactly as in ``keys``.

    Raises:
      TypeError: If ``name`` is not a string.
      LeafNotFoundError: If no key, or several, answer to ``name``; the message
        lists the nearest names or the candidates.
    """
    if not isinstance(name, str):
        raise TypeError(f"a leaf's key is a str, got {type(name).__name__}")
    if name in keys:
        return name
    if shown is not None and name in shown:
        return shown[name]
    full = {key: _key_parts(key) for key in keys}
    wanted = _parts(name)
    if wanted is not None:
        exact = [key for key, parts in full.items() if parts == wanted]
        if len(exact) == 1:
            return exact[0]
        if len(exact) > 1:
            return _ambiguous(name, exact, checkpointable)
        size = len(wanted)
        ends = [
            key
            for key, parts in full.items()
            if size and len(parts) > size and parts[-size:] == wanted
        ]
    else:
        ends = []
        for loose in (False, True):
            pattern = _elided(name, loose=loose)
            ends = [key for key, parts in full.items() if pattern.match(".".join(parts))]
            if ends:
                break
    if len(ends) == 1:
        return ends[0]
    if len(ends) > 1 and wanted is None:
        labelled = _shown_as(list(keys), name)
        if labelled is not None:
            return labelled
    if ends:
        return _ambiguous(name, ends, checkpointable)
    if wanted:
        inside = [key for key, parts in full.items() if _holds(parts, wanted)]
        if inside:
            names = [display.readable_key(key) for key in display.sort_keys(inside)]
            more = f", … ({len(names)} in all)" if len(names) > SUGGESTIONS else ""
            raise LeafNotFoundError(
                f"{name!r} is a subtree{_of(checkpointable)}, not a leaf; its leaves: "
                f"{', '.join(names[:SUGGESTIONS])}{more}"
            )
    raise LeafNotFoundError(_miss(name, list(keys), checkpointable))


def _shown_as(keys: list[str], label: str) -> str | None:
    """The one key that a table of ``keys`` labels ``label`` at some width, if one.

    Labels are distinct in a table, but as patterns two can fit one another's keys
    (``mu…0…kernel``); the labelling itself then tells which key was shown.
    """
    found: set[str] = set()
    low, high = max(1, len(label) - _WIDTHS_TRIED), len(label) + _WIDTHS_TRIED
    for width in range(low, high + 1):
        labels = display.display_keys(keys, width=width)
        if label in labels:
            found.add(keys[labels.index(label)])
        if max(map(len, labels)) < width:
            break  # wider tables show the same labels
    return found.pop() if len(found) == 1 else None


def _holds(parts: tuple[str, ...], wanted: tuple[str, ...]) -> bool:
    """Whether ``wanted`` is a run of ``parts`` that ends before the leaf does."""
    size = len(wanted)
    return any(parts[i : i + size] == wanted for i in range(len(parts) - size))


def _ambiguous(name: str, candidates: list[str], checkpointable: str) -> str:
    shown = display.sort_keys(candidates)
    labels = [display.readable_key(key) for key in shown[:SUGGESTIONS]]
    more = f" and {len(shown) - SUGGESTIONS} more" if len(shown) > SUGGESTIONS else ""
    raise LeafNotFoundError(
        f"{name!r} names {len(shown)} leaves{_of(checkpointable)}: "
        f"{', '.join(labels)}{more}; give more of the key"
    )


def _miss(name: str, keys: list[str], checkpointable: str) -> str:
    where = _of(checkpointable)
    if not keys:
        return f"no leaf {name!r}{where}: it has no leaves"
    labels = {display.readable_key(key): key for key in keys}
    wanted = _parts(name)
    probe = ".".join(wanted) if wanted else name.replace(display.ELLIPSIS, "")
    near = difflib.get_close_matches(probe, list(labels), n=SUGGESTIONS, cutoff=0.4)
    if not near:
        # A name given as its end only: compare it with the same ends of the keys.
        ends = {".".join(label.split(".")[-len(probe.split(".")) :]): label for label in labels}
        near = [
            ends[end]
            for end in difflib.get_close_matches(probe, list(ends), n=SUGGESTIONS, cutoff=0.5)
        ]
    if near:
        return f"no leaf {name!r}{where}; the nearest: {', '.join(near)}"
    return f"no leaf {name!r}{where} among its {len(keys)} leaves, nor one near it"
