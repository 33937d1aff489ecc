"""Choosing which checkpointables, and which of their subtrees, to restore.

Subtrees are named by key paths (``tinax._format.naming.keys``), so leaving out ``['mu']``
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
from tinax.vocabulary import KeyPath, is_within, key_parts, parse_key

from ._table import Column, PagedTable, RowLook
from ._text import format_bytes
from ._tree import LeafTree, Node, open_mark, shown_nodes, toggled

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

    def within(key: str) -> bool:
        parts = parse_key(key)  # once per key, not once per subtree
        return any(is_within(parts, s) for s in subtrees)

    return keys.astype(str).map(within).astype(bool)


class TickBox:
    """The tick of one subtree of a ``TargetChoice``, read and set like a checkbox."""

    def __init__(self, choice: TargetChoice, checkpointable: str, key: str) -> None:
        self._choice = choice
        self.checkpointable = checkpointable
        self.key = key
        self.disabled = False

    @property
    def value(self) -> bool:
        """Whether anything under it is restored (a partly ticked subtree is ticked)."""
        return self._choice.ticked(self.checkpointable, self.key) is not False

    @value.setter
    def value(self, value: bool) -> None:
        if value != self.value or self._choice.ticked(self.checkpointable, self.key) is None:
            self._choice.tick(self.checkpointable, self.key, bool(value))


def _choice_look(row: pd.Series) -> RowLook:
    state = row["state"]
    return RowLook(
        depth=int(row["depth"]),
        mark=str(row["mark"]),
        check=state is not False,
        mixed=state is None,
        color=None if state is not False else "#888",
    )


_CHOICE_COLUMNS = (
    # Subtrees named as the explorer's tree names them (blocks, 0, kernel), the exact
    # key on hover and copy.
    Column("label", "restore", key=True, exact="exact"),
    Column("leaves", "leaves", lambda n: f"{int(n):,}", align="right"),
    Column("nbytes", "size", format_bytes, align="right"),
)


class TargetChoice(w.VBox):
    """The restore targets as a tree with a tick box on every subtree, at any depth.

    Unticking a subtree leaves out every leaf under it (``['batch_stats']`` of a
    model, ``['mu']`` of an optimizer, a single kernel); a partly ticked subtree
    shows a mixed box. Unticking a whole checkpointable leaves it out and ticking
    it again gives back its subtrees as they were. Clicking a row opens or closes
    it. ``on_change`` is called once per click.

    Attributes:
      checkboxes: Checkpointable name → its ``TickBox``.
      subtree_checkboxes: ``(name, key)`` → the ``TickBox`` of a top-level subtree,
        ``key`` written as tables write it (``['mu']``).
      view: The tree's table.
    """

    def __init__(
        self,
        targets: Mapping[str, Any],
        on_change: Callable[[Any], None],
        *,
        page_size: int = 30,
    ) -> None:
        """Builds the tree, everything ticked, each checkpointable open one level.

        Args:
          targets: Checkpointable name → abstract restore target.
          on_change: Called (with ``None``) whenever a click changes the ticks.
          page_size: Rows of the tree per page.
        """
        self._targets = dict(targets)
        self._on_change = on_change
        self.leaf_table = explore.state_table(self._targets)
        self.tree = LeafTree(self.leaf_table)
        self._row_keys = self.leaf_table["key"].astype(str).to_numpy(dtype=object)
        self._row_names = self.leaf_table["checkpointable"].astype(str).to_numpy(dtype=object)
        # Row positions (in ``leaf_table``) of the leaves left out.
        self._unticked: set[int] = set()
        # What a checkpointable's ticks were when it was unticked whole, to give back.
        self._remembered: dict[str, set[int]] = {}
        self._open = {root.id for root in self.tree.roots if root.leaf is None}
        self.nodes: list[Node] = []
        self.checkboxes = {name: TickBox(self, name, "") for name in self._targets}
        self.subtree_checkboxes: dict[tuple[str, str], TickBox] = {}
        for root in self.tree.roots:
            if root.leaf is None:
                for child in self.tree.children(root):
                    self.subtree_checkboxes[(root.checkpointable, child.key)] = TickBox(
                        self, root.checkpointable, child.key
                    )
        self.view = PagedTable(
            _CHOICE_COLUMNS,
            page_size=page_size,
            look=_choice_look,
            empty_text="nothing to restore",
            sortable=False,
            on_check=self._on_check,
        )
        self.view.observe(self._on_pick, names="selected")
        super().__init__([self.view])
        self.add_class("tinax-target-choice")
        self._redraw()

    # -- ticks --------------------------------------------------------------------

    def _node(self, checkpointable: str, key: str) -> Node:
        if checkpointable not in self._targets:
            raise ValueError(f"no checkpointable {checkpointable!r} to restore")
        return self.tree.find(checkpointable, key)

    def _state(self, node: Node) -> bool | None:
        rows = node.rows.tolist()
        out = sum(1 for r in rows if r in self._unticked)
        if out == 0:
            return True
        return False if out == len(rows) else None

    def ticked(self, checkpointable: str, key: str = "") -> bool | None:
        """Whether the subtree ``key`` of ``checkpointable`` is restored: ``True``
        (all of it), ``False`` (none) or ``None`` (part of it).

        Raises:
          ValueError: If there is no such subtree.
        """
        return self._state(self._node(checkpointable, key))

    def tick(self, checkpointable: str, key: str = "", value: bool = True) -> None:
        """Ticks (restores) or unticks (leaves out) the subtree ``key`` of
        ``checkpointable`` (``""``: the whole checkpointable), at any depth.

        Raises:
          ValueError: If there is no such subtree.
        """
        node = self._node(checkpointable, key)
        rows = set(node.rows.tolist())
        name_rows = set(self._node(checkpointable, "").rows.tolist())
        if value:
            if not node.path and self._state(node) is False:
                remembered = self._remembered.pop(checkpointable, set())
                self._unticked -= rows
                if remembered != name_rows:
                    self._unticked |= remembered
            else:
                self._unticked -= rows
        else:
            if not node.path:
                self._remembered[checkpointable] = self._unticked & name_rows
            self._unticked |= rows
            if name_rows <= self._unticked and node.path:
                self._remembered[checkpointable] = set()
        self._redraw()
        self._on_change(None)

    def _on_check(self, label: Any, value: bool) -> None:
        node = self.nodes[label]
        self.tick(node.checkpointable, node.key, value)

    # -- what is chosen -----------------------------------------------------------

    def chosen(self) -> dict[str, Any]:
        """Name → whole abstract target, for the checkpointables with anything ticked."""
        return {
            root.checkpointable: self._targets[root.checkpointable]
            for root in self.tree.roots
            if self._state(root) is not False
        }

    def left_out(self, name: str) -> set[KeyPath]:
        """Key paths of the largest wholly unticked subtrees of checkpointable ``name``."""
        if name not in self._targets:
            raise ValueError(f"no checkpointable {name!r} to restore")
        out: set[KeyPath] = set()
        stack = [r for r in self.tree.roots if r.checkpointable == name]
        while stack:
            node = stack.pop()
            state = self._state(node)
            if state is True:
                continue
            if state is False and node.path:
                out.add(parse_key(node.key))
            elif node.leaf is None:
                stack.extend(self.tree.children(node))
        return out

    @property
    def target(self) -> dict[str, Any]:
        """Name → abstract restore target, with left-out subtrees replaced by ``LEFT_OUT``."""
        return {name: leave_out(tree, self.left_out(name)) for name, tree in self.chosen().items()}

    def table(self) -> pd.DataFrame:
        """``state_table`` rows of the leaves ``target`` restores."""
        keep = [i for i in range(len(self.leaf_table)) if i not in self._unticked]
        return self.leaf_table.iloc[keep].reset_index(drop=True)

    # -- the view -----------------------------------------------------------------

    def _on_pick(self, change: Any) -> None:
        index = change["new"]
        if index is None:
            return
        self.view.selected = None  # a click opens or closes; nothing stays selected
        node = self.nodes[index]
        if node.leaf is not None:
            return
        self._open = toggled(self._open, node)
        self._redraw(keep_page=True)

    def expand(self, checkpointable: str, key: str = "") -> None:
        """Opens the subtree ``key`` of ``checkpointable`` and every one above it."""
        node = self._node(checkpointable, key)
        for depth in range(len(node.path) + 1):
            self._open.add((checkpointable, node.path[:depth]))
        self._redraw(keep_page=True)

    def _redraw(self, *, keep_page: bool = True) -> None:
        out = shown_nodes(self.tree.roots, self.tree.children, self._open)
        self.nodes = [n for n, _ in out]
        frame = pd.DataFrame(
            {
                "label": [n.label for n in self.nodes],
                "exact": [n.key or n.checkpointable for n in self.nodes],
                "depth": [d for _, d in out],
                "mark": [open_mark(n, self._open) for n in self.nodes],
                "state": pd.Series([self._state(n) for n in self.nodes], dtype=object),
                "leaves": [n.leaves for n in self.nodes],
                "nbytes": [n.nbytes for n in self.nodes],
            }
        )
        self.view.show(frame, keep_page=keep_page)
