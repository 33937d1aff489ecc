"""Which leaves a new checkpoint takes from a pytree checkpointable, under which keys.

A derived checkpoint keeps the leaves whose dotted key (the name
``tinax.explore.display`` shows and ``export_safetensors`` gives a tensor:
``blocks.0.up.kernel``, NNX's trailing ``value`` left out) matches a regular
expression, and may rewrite those keys with ``(pattern, replacement)`` pairs. The
tree is then rebuilt from the new keys, and it must be one Orbax can store and
restore: no two leaves under one key or one stored name, no leaf that is also a
subtree, and every sequence (a tuple or a list, as optax's chained states) whole,
its indices 0, 1, … with none missing. What cannot be such a tree is refused,
naming the leaves.

A dotted key is split into parts only where it was rewritten: a key left as it was
keeps its exact path (dots inside a dict key stay inside it). A part of a rewritten
key is a sequence index where the source had an index at that place, a dict key
(Orbax stores every dict key as a string) everywhere else.

JAX-free: ``tinax.checkpointing`` plans its writes with it, ``tinax.explore`` its
previews.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence

import numpy as np

from tinax._format.metadata import arrays, layout, pytree
from tinax._format.metadata.pytree import StoredLeaf
from tinax._format.naming import words
from tinax._format.naming.keys import NNX_VALUE, KeyPart, KeyPath, ends_with_nnx_value, format_key
from tinax._format.safetensors import is_floating, tensor_name

Rename = tuple[re.Pattern[str], str]


@dataclasses.dataclass(frozen=True)
class PlannedLeaf:
    """One leaf of the new tree.

    Attributes:
      source: The leaf as stored in the source.
      path: Its key path in the new tree (``int`` parts are sequence indices).
      key: ``path`` in ``jax.tree_util.keystr`` format.
      param: Orbax's name for its stored value (the path's parts joined by ``.``).
    """

    source: StoredLeaf
    path: KeyPath
    key: str
    param: str

    @property
    def renamed(self) -> bool:
        """Whether the leaf has another key than in the source."""
        return self.path != self.source.path


def dotted_key(path: KeyPath) -> str:
    """The dotted key of a leaf: ``('blocks', 0, 'up', 'kernel', 'value')`` →
    ``blocks.0.up.kernel``; ``""`` for the root of a checkpointable that is one value."""
    return tensor_name(path) if path else ""


def param_name(path: KeyPath) -> str:
    """Orbax's name for a stored value: the key path's parts joined by ``.``."""
    return ".".join(str(part) for part in path)


def _renamed_path(leaf: StoredLeaf, name: str, new_name: str, checkpointable: str) -> KeyPath:
    """The key path of a leaf whose dotted key ``name`` was rewritten to ``new_name``."""
    parts = new_name.split(".")
    if not new_name or any(not part for part in parts):
        raise ValueError(
            f"checkpointable {checkpointable!r}: rename turns {name or '(root)'!r} into "
            f"{new_name!r}, which is not a dotted key (empty parts)"
        )
    path: list[KeyPart] = []
    for i, part in enumerate(parts):
        # An index stays an index where the source had one at that place.
        before = leaf.path[i] if i < len(leaf.path) else None
        index = isinstance(before, int) and part.isascii() and part.isdigit()
        path.append(int(part) if index else part)
    # NNX's array name, left out of the dotted key, goes back where it was.
    if ends_with_nnx_value(leaf.path):
        path.append(NNX_VALUE)
    return tuple(path)


def plan_leaves(
    checkpointable: str,
    leaves: Sequence[StoredLeaf],
    *,
    keys: re.Pattern[str] | None = None,
    rename: Sequence[Rename] = (),
) -> list[PlannedLeaf]:
    """The leaves kept from one pytree checkpointable, with their new keys, in stored order.

    Args:
      checkpointable: Its name, for messages.
      leaves: Its stored leaves (``pytree.PyTreeLayout.leaves``).
      keys: Keep only leaves whose dotted key this finds (``re.search``); all when
        ``None``. An empty leaf (``None``, an empty optax state) that a kept
        sequence needs in order to stay whole is kept too.
      rename: ``(pattern, replacement)`` pairs applied in turn to each kept
        leaf's dotted key (``pattern.sub``).

    Returns:
      The kept leaves; empty when none is kept.

    Raises:
      ValueError: If a rewritten key is not a dotted key, or the new keys do not
        make a tree (see ``check_tree``), naming the leaves.
    """
    kept: list[PlannedLeaf] = []
    for leaf in leaves:
        name = dotted_key(leaf.path)
        if keys is not None and not keys.search(name):
            continue
        kept.append(_renamed(checkpointable, leaf, name, rename))
    if keys is not None and kept:
        kept = _fill_sequences(checkpointable, leaves, kept, rename)
    check_tree(checkpointable, kept)
    return kept


def _renamed(
    checkpointable: str, leaf: StoredLeaf, name: str, rename: Sequence[Rename]
) -> PlannedLeaf:
    new_name = name
    for pattern, replacement in rename:
        try:
            new_name = pattern.sub(replacement, new_name)
        except (re.error, IndexError) as e:
            raise ValueError(
                f"rename {pattern.pattern!r} → {replacement!r} cannot rewrite "
                f"{name or '(root)'!r}: {e}"
            ) from None
    path = leaf.path if new_name == name else _renamed_path(leaf, name, new_name, checkpointable)
    return PlannedLeaf(leaf, path, format_key(path), param_name(path))


def _fill_sequences(
    checkpointable: str,
    leaves: Sequence[StoredLeaf],
    kept: list[PlannedLeaf],
    rename: Sequence[Rename],
) -> list[PlannedLeaf]:
    """``kept`` with the empty leaves that fill the holes of the sequences it keeps
    (optax's empty states between the states a key filter found), in stored order."""
    sequences = {
        planned.source.path[:i]
        for planned in kept
        for i, part in enumerate(planned.source.path)
        if isinstance(part, int)
    }
    if not sequences:
        return kept
    chosen = {id(planned.source) for planned in kept}
    extra = {
        id(leaf): _renamed(checkpointable, leaf, dotted_key(leaf.path), rename)
        for leaf in leaves
        if id(leaf) not in chosen
        and leaf.kind == words.EMPTY
        and leaf.path
        and isinstance(leaf.path[-1], int)
        and leaf.path[:-1] in sequences
    }
    if not extra:
        return kept
    by_source = {id(planned.source): planned for planned in kept}
    by_source.update(extra)
    filled = [by_source[id(leaf)] for leaf in leaves if id(leaf) in by_source]
    # Only those that fill a hole: an empty leaf after the last index kept is not needed.
    return [
        planned for planned in filled if id(planned.source) not in extra or _fills(planned, kept)
    ]


def _fills(candidate: PlannedLeaf, planned: Sequence[PlannedLeaf]) -> bool:
    """Whether an empty leaf stands before a kept index of its sequence."""
    parent, index = candidate.path[:-1], candidate.path[-1]
    return any(
        other is not candidate
        and len(other.path) > len(parent)
        and other.path[: len(parent)] == parent
        and isinstance(other.path[len(parent)], int)
        and other.path[len(parent)] > index  # type: ignore[operator]
        for other in planned
    )


def check_tree(checkpointable: str, planned: Iterable[PlannedLeaf]) -> None:
    """Refuses new keys that do not make a tree Orbax can store and restore.

    Raises:
      ValueError: Naming the source leaves, if two leaves get one key or one stored
        name, a leaf is also a subtree of others, a node holds both sequence
        indices and dict keys, or a sequence misses an index.
    """
    where = f"checkpointable {checkpointable!r}"
    by_key: dict[KeyPath, PlannedLeaf] = {}
    by_param: dict[str, PlannedLeaf] = {}
    children: dict[KeyPath, set[KeyPart]] = {}
    for leaf in planned:
        other = by_key.get(leaf.path) or by_param.get(leaf.param)
        if other is not None:
            what = "key" if other.path == leaf.path else "stored name"
            raise ValueError(
                f"{where}: leaves {other.source.key or '(root)'} and "
                f"{leaf.source.key or '(root)'} would both get the {what} "
                f"{dotted_key(leaf.path) or '(root)'!r}; change keys or rename"
            )
        by_key[leaf.path] = by_param[leaf.param] = leaf
        for i, part in enumerate(leaf.path):
            children.setdefault(leaf.path[:i], set()).add(part)
    for node in children:
        found = by_key.get(node)
        if found is not None:
            below = next(p for p in by_key if len(p) > len(node) and p[: len(node)] == node)
            raise ValueError(
                f"{where}: {dotted_key(node) or '(root)'!r} would be both a leaf (from "
                f"{found.source.key or '(root)'}) and a subtree (holding "
                f"{by_key[below].source.key}); change keys or rename"
            )
    for node, parts in children.items():
        indices = sorted(p for p in parts if isinstance(p, int))
        if indices and len(indices) != len(parts):
            raise ValueError(
                f"{where}: {dotted_key(node) or '(root)'!r} would hold both sequence "
                f"indices and names ({sorted(map(str, parts))}); a tree node is one or the other"
            )
        if indices and indices != list(range(len(indices))):
            missing = sorted(set(range(indices[-1] + 1)) - set(indices))
            raise ValueError(
                f"{where}: the sequence {dotted_key(node) or '(root)'!r} would miss index "
                f"{', '.join(map(str, missing[:5]))}: a tuple or list cannot have holes; "
                "keep its other entries too, or rename them to names"
            )


def compile_keys(keys: object, *, what: str = "keys") -> re.Pattern[str] | None:
    """A ``keys`` argument as a compiled pattern (``None`` stays ``None``).

    Raises:
      TypeError: If it is neither a string nor a compiled pattern.
      ValueError: If it is not a valid regular expression.
    """
    if keys is None:
        return None
    if isinstance(keys, re.Pattern):
        if not isinstance(keys.pattern, str):
            raise TypeError(f"{what} must be a pattern of text, not of bytes")
        return keys
    if not isinstance(keys, str):
        raise TypeError(f"{what} must be a regular expression (a str), got {type(keys).__name__}")
    try:
        return re.compile(keys)
    except re.error as e:
        raise ValueError(f"{what} {keys!r} is not a regular expression: {e}") from None


def compile_rename(rename: object) -> list[Rename]:
    """A ``rename`` argument as ``(pattern, replacement)`` pairs.

    Takes a sequence of ``(regex, replacement)`` pairs (or ``"regex=replacement"``
    texts, as the command line writes them, split at the last ``=``), or a mapping of
    regex to replacement.

    Raises:
      TypeError: If it is not such a sequence or mapping of text.
      ValueError: If a pattern is not a valid regular expression, or a text has no ``=``.
    """
    if rename is None:
        return []
    items: list[object]
    if isinstance(rename, dict):
        items = list(rename.items())
    elif isinstance(rename, str | bytes) or not isinstance(rename, Iterable):
        raise TypeError(
            "rename must be a list of (regex, replacement) pairs, got " + type(rename).__name__
        )
    else:
        items = list(rename)
    pairs: list[Rename] = []
    for item in items:
        if isinstance(item, str):
            # Split at the last "=": a pattern may hold one (a lookahead, "(?=…)").
            pattern, sep, replacement = item.rpartition("=")
            if not sep:
                raise ValueError(f"rename {item!r} is not PATTERN=REPLACEMENT")
            item = (pattern, replacement)
        if (
            not isinstance(item, tuple | list)
            or len(item) != 2
            or not isinstance(item[1], str)
            or not isinstance(item[0], str | re.Pattern)
        ):
            raise TypeError(f"rename takes (regex, replacement) pairs of text, got {item!r}")
        compiled = compile_keys(item[0], what="a rename pattern")
        assert compiled is not None
        pairs.append((compiled, item[1]))
    return pairs


def compile_cast(cast: object) -> np.dtype | None:
    """The floating-point dtype ``cast`` names (``None`` stays ``None``).

    Raises:
      TypeError: If it is not a dtype, a dtype's type or a dtype's name.
      ValueError: If it names no dtype, or one that is not floating-point.
    """
    if cast is None:
        return None
    if isinstance(cast, bool) or not isinstance(cast, str | np.dtype | type):
        raise TypeError(
            f"cast must be a dtype or its name (e.g. 'bfloat16'), got {type(cast).__name__}"
        )
    try:
        dtype = arrays.numpy_dtype(cast) if isinstance(cast, str) else np.dtype(cast)
    except TypeError:
        raise ValueError(f"cast {cast!r} names no dtype") from None
    if not is_floating(dtype):
        raise ValueError(
            f"cast {dtype.name!r} is not a floating-point dtype; only floating-point leaves "
            "are cast (bfloat16, float16, float32, float64, float8_…)"
        )
    return dtype


def written_dtype(leaf: StoredLeaf, stored: np.dtype, cast: np.dtype | None) -> np.dtype:
    """The dtype a leaf is written in: ``cast`` for a floating-point array (not a Python
    scalar), its own for every other."""
    if cast is not None and leaf.kind in words.ARRAY_KINDS and is_floating(stored):
        return cast
    return stored


def select_checkpointables(given: object, held: Sequence[str], where: str) -> list[str]:
    """The checkpointables asked for, in stored order (all when ``None``).

    Raises:
      TypeError: If ``given`` is not a name or a list of names.
      ValueError: If it is empty, or names one that ``held`` lacks.
    """
    if given is None:
        return list(held)
    if isinstance(given, str):
        wanted: list[object] = [given]
    elif isinstance(given, list | tuple | set | frozenset):
        wanted = list(given)
    else:
        raise TypeError(
            f"checkpointables must be a name or a list of names, got {type(given).__name__}"
        )
    if not wanted:
        raise ValueError("checkpointables must name at least one checkpointable")
    for name in wanted:
        if not isinstance(name, str):
            raise TypeError(f"checkpointables must be names (str), got {type(name).__name__}")
        if name not in held:
            raise ValueError(f"{where} has no checkpointable {name!r}; it holds {list(held)}")
    return [name for name in held if name in wanted]


@dataclasses.dataclass
class CheckpointPlan:
    """What a derived checkpoint takes from its source.

    Attributes:
      order: The checkpointables kept, in stored order.
      leaves: For each kept pytree, its leaves with their new keys.
      trees: For each kept pytree, its layout.
    """

    order: list[str]
    leaves: dict[str, list[PlannedLeaf]]
    trees: dict[str, pytree.PyTreeLayout]


def plan_checkpoint(
    checkpoint: layout.Checkpoint,
    checkpointables: object,
    keys: re.Pattern[str] | None,
    rename: Sequence[Rename],
) -> CheckpointPlan:
    """Which checkpointables and leaves a derived checkpoint keeps, under which keys.

    With ``keys``, a pytree left without a leaf is left out, and so is a checkpointable
    that is not a pytree (an iterator's state has no keys) unless ``checkpointables``
    names it.

    Raises:
      TypeError, ValueError: As ``select_checkpointables`` and ``plan_leaves`` raise
        them; ``ValueError`` also when nothing is kept.
    """
    where = f"checkpoint {str(checkpoint.path)!r}"
    held = [item.name for item in checkpoint.checkpointables]
    names = select_checkpointables(checkpointables, held, where)
    plan = CheckpointPlan([], {}, {})
    for name in names:
        item = checkpoint.get(name)
        if item.layout == layout.PYTREE:
            tree = pytree.read_layout(item)
            planned = plan_leaves(name, tree.leaves, keys=keys, rename=rename)
            if not planned and (keys is not None or not tree.leaves):
                continue
            plan.leaves[name] = planned
            plan.trees[name] = tree
        elif keys is not None and checkpointables is None:
            continue
        plan.order.append(name)
    if not plan.order:
        raise ValueError(
            f"{where}: no leaf of {names} has a dotted key that keys {keys.pattern!r} finds"
            if keys is not None
            else f"{where}: nothing to derive from {names}"
        )
    return plan


def check_same_leaves(trees: Sequence[tuple[str, Sequence[StoredLeaf]]]) -> None:
    """Refuses pytrees (of checkpoints averaged together) whose leaves differ in key or
    kind, naming the first difference.

    Args:
      trees: Each source's ``checkpoint '…': checkpointable '…'`` and leaves.

    Raises:
      ValueError: ``the sources differ: …``.
    """
    (first_where, first), *others = trees
    for where, leaves in others:
        for a, b in zip(first, leaves, strict=False):
            if a.key != b.key:
                raise ValueError(
                    f"the sources differ: {first_where} has leaf {a.key or '(root)'} where "
                    f"{where} has {b.key or '(root)'}"
                )
            if a.kind != b.kind:
                raise ValueError(
                    f"the sources differ: {first_where}: leaf {a.key or '(root)'} is {a.kind} "
                    f"but in {where} it is {b.kind}"
                )
        if len(first) != len(leaves):
            longer, shorter = (
                ((first_where, first), (where, leaves))
                if len(first) > len(leaves)
                else ((where, leaves), (first_where, first))
            )
            extra = longer[1][len(shorter[1])]
            raise ValueError(
                f"the sources differ: {longer[0]}: leaf {extra.key or '(root)'} is not in "
                f"{shorter[0]}"
            )
