"""Choosing which checkpointables, and which of their subtrees, to restore.

Subtrees are named by key paths (``tinax._format.keys``), so leaving out ``['mu']``
of an optax state leaves out exactly the leaves whose key path starts with
``('mu',)``: the same leaves in ``.target``, in ``.table`` and in the comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import ipywidgets as w
import jax
import pandas as pd

from tinax import explore
from tinax._format.keys import KeyPath, format_key, is_within, key_parts, parse_key

# Orbax skips a leaf whose restore target is this placeholder.
LEFT_OUT = ...


def top_level_subtrees(tree: Any) -> list[KeyPath]:
    """The key path of each direct child of ``tree``.

    None when ``tree`` is a leaf, or a pytree without leaves (stored whole).
    """
    if not jax.tree_util.tree_leaves(tree):
        return []
    children = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda node: node is not tree)[0]
    return [key_parts(path) for path, _ in children if path]


def leave_out(target: Any, subtrees: Collection[KeyPath]) -> Any:
    """``target`` with every leaf inside one of ``subtrees`` replaced by ``LEFT_OUT``."""
    if not subtrees:
        return target

    def place(path: Any, leaf: Any) -> Any:
        parts = key_parts(path)
        return LEFT_OUT if any(is_within(parts, s) for s in subtrees) else leaf

    return jax.tree_util.tree_map_with_path(place, target)


def keep_live(restored: Any, live: Any, subtrees: Collection[KeyPath]) -> Any:
    """``restored`` with every leaf inside one of ``subtrees`` taken from ``live``.

    A load leaves Orbax's placeholder at each left-out leaf; this puts back the
    very object the live state holds there (not read, not copied), so the result
    has the live state's structure and no placeholder in it.
    """
    if not subtrees:
        return restored
    live_leaves = {
        key_parts(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(live)
    }

    def place(path: Any, leaf: Any) -> Any:
        parts = key_parts(path)
        if any(is_within(parts, s) for s in subtrees) and parts in live_leaves:
            return live_leaves[parts]
        return leaf

    return jax.tree_util.tree_map_with_path(place, restored)


def inside(keys: pd.Series, subtrees: Collection[KeyPath]) -> pd.Series:
    """Which of the table ``keys`` lie inside one of ``subtrees``."""
    if not subtrees:
        return pd.Series(False, index=keys.index, dtype=bool)
    return (
        keys.astype(str)
        .map(lambda key: any(is_within(parse_key(key), s) for s in subtrees))
        .astype(bool)
    )


class TargetChoice(w.VBox):
    """A checkbox per checkpointable and per top-level subtree of its restore target.

    A checkpointable's box and its subtrees' boxes agree: unticking it unticks
    them, ticking it again ticks them as they were; ticking a subtree ticks its
    checkpointable, and unticking its last subtree unticks it. ``on_change`` is
    called once per click, however many boxes that click changes.

    Attributes:
      checkboxes: Checkpointable name → its checkbox.
      subtree_checkboxes: ``(name, key)`` → the checkbox of that top-level subtree,
        ``key`` written as tables write it (``['mu']``).
    """

    def __init__(self, targets: Mapping[str, Any], on_change: Callable[[Any], None]) -> None:
        """Builds the checkboxes, all ticked.

        Args:
          targets: Checkpointable name → abstract restore target.
          on_change: Called with the change whenever a box is ticked or unticked.
        """
        self._targets = dict(targets)
        self.checkboxes: dict[str, w.Checkbox] = {}
        self.subtree_checkboxes: dict[tuple[str, str], w.Checkbox] = {}
        self._paths: dict[tuple[str, str], KeyPath] = {}
        rows: list[w.Widget] = []
        for name, tree in self._targets.items():
            box = w.Checkbox(
                value=True, description=name, indent=False, style={"font_weight": "bold"}
            )
            self.checkboxes[name] = box
            subs = []
            for path in top_level_subtrees(tree):
                key = format_key(path)
                sub = w.Checkbox(
                    value=True, description=key, indent=False, layout=w.Layout(width="auto")
                )
                self.subtree_checkboxes[(name, key)] = sub
                self._paths[(name, key)] = path
                subs.append(sub)
            rows.append(box)
            if subs:
                rows.append(w.HBox(subs, layout=w.Layout(flex_flow="row wrap", margin="0 0 0 2em")))
        self._on_change = on_change
        self._cascading = False
        # What each checkpointable's subtrees were when it was unticked, to give back.
        self._remembered: dict[str, dict[str, bool]] = {}
        for name, box in self.checkboxes.items():
            box.observe(lambda change, n=name: self._parent_changed(n, change), names="value")
        for (name, _key), box in self.subtree_checkboxes.items():
            box.observe(lambda change, n=name: self._child_changed(n, change), names="value")
        super().__init__(rows)

    def _subtrees(self, name: str) -> dict[str, w.Checkbox]:
        return {key: box for (n, key), box in self.subtree_checkboxes.items() if n == name}

    def _parent_changed(self, name: str, change: Any) -> None:
        if self._cascading:
            return
        subtrees = self._subtrees(name)
        # A parent's tick shows on its children: unticking it unticks them all
        # (visibly, not just greyed out); ticking it again gives back what they were.
        self._cascading = True
        try:
            if not change["new"]:
                self._remembered[name] = {key: box.value for key, box in subtrees.items()}
                for box in subtrees.values():
                    box.value = False
            else:
                remembered = self._remembered.pop(name, {})
                if not any(remembered.values()):
                    remembered = {}
                for key, box in subtrees.items():
                    box.value = remembered.get(key, True)
        finally:
            self._cascading = False
        self._on_change(change)

    def _child_changed(self, name: str, change: Any) -> None:
        if self._cascading:
            return
        parent = self.checkboxes[name]
        subtrees = self._subtrees(name)
        self._cascading = True
        try:
            if change["new"] and not parent.value:
                # Ticking a subtree of an unticked checkpointable ticks it, with only
                # the subtrees that are ticked now.
                self._remembered.pop(name, None)
                parent.value = True
            elif not any(box.value for box in subtrees.values()):
                # Nothing left under it: the checkpointable itself is left out.
                self._remembered[name] = {}
                parent.value = False
        finally:
            self._cascading = False
        self._on_change(change)

    def chosen(self) -> dict[str, Any]:
        """Name → whole abstract target, for the ticked checkpointables."""
        return {n: t for n, t in self._targets.items() if self.checkboxes[n].value}

    def left_out(self, name: str) -> set[KeyPath]:
        """Key paths of the unticked subtrees of checkpointable ``name``."""
        return {
            self._paths[(n, key)]
            for (n, key), box in self.subtree_checkboxes.items()
            if n == name and not box.value
        }

    @property
    def target(self) -> dict[str, Any]:
        """Name → abstract restore target, with left-out subtrees replaced by ``LEFT_OUT``."""
        return {name: leave_out(tree, self.left_out(name)) for name, tree in self.chosen().items()}

    def table(self) -> pd.DataFrame:
        """``state_table`` rows of the leaves ``target`` restores."""
        chosen = self.chosen()
        if not chosen:
            return explore.state_table({})
        table = explore.state_table(chosen)
        dropped = pd.Series(False, index=table.index, dtype=bool)
        for name in chosen:
            rows = table["checkpointable"] == name
            dropped |= rows & inside(table["key"], self.left_out(name))
        return table[~dropped].reset_index(drop=True)
