"""A checkpoint's leaves as a tree of subtrees, with leaf counts and byte subtotals.

A checkpoint of tens of thousands of leaves is a few levels of a handful of
subtrees each; the tree shows those levels one at a time. Children are worked out
when a subtree is first opened, from the keys of the leaves under it only, so that
showing a checkpoint costs nothing beyond its top level.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

import ipywidgets as w
import numpy as np
import pandas as pd
import traitlets

from tinax.explore import display
from tinax.vocabulary import split_key

from ._guard import shown_in_widget
from ._table import Column, PagedTable, RowLook
from ._text import format_bytes

BY_NAME = "name"
BY_SIZE = "size"
# Segments of the size bar at most; smaller subtrees are counted together.
MAX_SEGMENTS = 6
# A checkpointable holding at least this share of the bytes is split by its subtrees.
_DOMINANT = 0.9
_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1")
_OTHER_COLOR = "#bab0ac"


def key_parts(key: str) -> tuple[str, ...]:
    """The parts of a key as written: ``"['a'][0]"`` gives ``("['a']", "[0]")``.

    A key that does not read as such parts is one part; the empty key has none.
    """
    if not key:
        return ()
    try:
        return split_key(key)
    except ValueError:
        return (key,)


def _natural(part: str) -> tuple[int | str, ...]:
    # Indices and digit names (NNX's ['blocks']['10']) in numeric order, before names.
    return display.natural_key(part)


# NNX keeps each variable's array under this last part; the tree shows the variable.
_NNX_VALUE = "['value']"
# A tree this long is one page that scrolls within itself; longer ones are paged.
TREE_PAGE = 5000
# A key filter finding at most this many leaves opens the tree down to them.
MAX_OPENED = 60


def part_label(part: str) -> str:
    """A key part as the tree shows it: ``['blocks']`` → ``blocks``, ``[0]`` → ``0``."""
    try:
        return display.readable_key(part)
    except ValueError:
        return part


@dataclasses.dataclass(frozen=True)
class Node:
    """A subtree (or a leaf) of a checkpoint.

    Attributes:
      checkpointable: The checkpointable it belongs to.
      path: Its key parts, as written (``("['opt_state']", "[0]")``); ``()`` for a
        whole checkpointable.
      leaves: Leaves under it (1 for a leaf).
      nbytes: Bytes of the leaves under it.
      leaf: The leaf table's index label if the node is a leaf, else ``None``.
    """

    checkpointable: str
    path: tuple[str, ...]
    leaves: int
    nbytes: int
    leaf: Any = None
    rows: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros(0, np.int64), repr=False, compare=False
    )

    @property
    def name(self) -> str:
        """The last key part, or the checkpointable's name for a whole one."""
        if self.path:
            return self.path[-1]
        return self.checkpointable or "(unnamed)"

    @property
    def label(self) -> str:
        """The name as people read it: ``blocks``, ``0``; a checkpointable's name."""
        return part_label(self.path[-1]) if self.path else self.name

    @property
    def key(self) -> str:
        """The key of the subtree: every leaf under it has a key starting with it."""
        return "".join(self.path)

    @property
    def id(self) -> tuple[str, tuple[str, ...]]:
        """``(checkpointable, path)``: names the node in any tree of the same leaves."""
        return (self.checkpointable, self.path)


class LeafTree:
    """The subtrees of a leaf table (``checkpoint_table`` rows), worked out as asked for.

    Args:
      leaves: A frame with ``checkpointable``, ``key`` and ``nbytes`` columns.
    """

    def __init__(self, leaves: pd.DataFrame) -> None:
        self.leaves = leaves
        self._labels = leaves.index
        self._keys = leaves["key"].astype(str).to_numpy(dtype=object)
        self._nbytes = (
            pd.to_numeric(leaves["nbytes"], errors="coerce").fillna(0).to_numpy(dtype=np.int64)
        )
        self._parts: list[tuple[str, ...] | None] = [None] * len(leaves)
        self._children: dict[tuple[str, tuple[str, ...]], list[Node]] = {}
        codes, names = pd.factorize(leaves["checkpointable"].astype(str), sort=False)
        self.roots: list[Node] = []
        for code, name in enumerate(names):
            rows = np.flatnonzero(codes == code)
            self.roots.append(self._node(str(name), (), rows))
        self.nbytes = int(self._nbytes.sum())

    def _parts_of(self, row: int) -> tuple[str, ...]:
        parts = self._parts[row]
        if parts is None:
            parts = self._parts[row] = key_parts(self._keys[row])
        return parts

    def _node(self, checkpointable: str, path: tuple[str, ...], rows: np.ndarray) -> Node:
        leaf = None
        if len(rows) == 1:
            parts = self._parts_of(int(rows[0]))
            # An NNX variable (``…['kernel']['value']``) is a leaf under its own name.
            if len(parts) == len(path) or (
                len(parts) == len(path) + 1 and path and parts[-1] == _NNX_VALUE
            ):
                leaf = self._labels[int(rows[0])]
        return Node(
            checkpointable=checkpointable,
            path=path,
            leaves=len(rows),
            nbytes=int(self._nbytes[rows].sum()),
            leaf=leaf,
            rows=rows,
        )

    def children(self, node: Node, *, by: str = BY_NAME) -> list[Node]:
        """The subtrees and leaves one key below ``node``, by name or largest first."""
        if by not in (BY_NAME, BY_SIZE):
            raise ValueError(f"children are sorted by {BY_NAME!r} or {BY_SIZE!r}, not {by!r}")
        found = self._children.get(node.id)
        if found is None:
            depth = len(node.path)
            groups: dict[str, list[int]] = {}
            for row in node.rows.tolist():
                parts = self._parts_of(row)
                if len(parts) > depth:
                    groups.setdefault(parts[depth], []).append(row)
            found = [
                self._node(node.checkpointable, (*node.path, part), np.asarray(rows, np.int64))
                for part, rows in groups.items()
            ]
            found.sort(key=lambda n: _natural(n.name))
            self._children[node.id] = found
        if by == BY_SIZE:
            return sorted(found, key=lambda n: -n.nbytes)  # stable: ties stay by name
        return list(found)

    def sorted_roots(self, *, by: str = BY_NAME) -> list[Node]:
        """The checkpointables, in stored order or largest first."""
        return sorted(self.roots, key=lambda n: -n.nbytes) if by == BY_SIZE else list(self.roots)

    def find(self, checkpointable: str, key: str = "") -> Node:
        """The node of ``checkpointable`` whose key is ``key`` (a leaf's or a subtree's).

        Raises:
          ValueError: If there is none.
        """
        node = next((n for n in self.roots if n.checkpointable == checkpointable), None)
        parts = key_parts(key)
        for depth in range(len(parts)):
            if node is None or node.leaf is not None:
                break
            node = next(
                (c for c in self.children(node) if c.path[depth] == parts[depth]),
                None,
            )
        if node is None:
            raise ValueError(f"no subtree {checkpointable!r} {key} in this checkpoint")
        return node


NodeId = tuple[str, tuple[str, ...]]


def toggled(opened: set[NodeId], node: Node) -> set[NodeId]:
    """The open subtrees once ``node`` is clicked: ``node`` opened if it was closed,
    else closed with every subtree under it (so that it opens again one level deep)."""
    if node.id not in opened:
        return opened | {node.id}
    return {
        i
        for i in opened
        if not (i[0] == node.checkpointable and i[1][: len(node.path)] == node.path)
    }


def shown_nodes(
    roots: Sequence[Node], children: Callable[[Node], list[Node]], opened: Set[NodeId]
) -> list[tuple[Node, int]]:
    """The nodes a tree view shows, in order, with their depths: the roots, and under
    each open subtree its children."""
    out: list[tuple[Node, int]] = []
    stack = [(n, 0) for n in reversed(roots)]
    while stack:
        node, depth = stack.pop()
        out.append((node, depth))
        if node.id in opened and node.leaf is None:
            stack.extend((c, depth + 1) for c in reversed(children(node)))
    return out


def open_mark(node: Node, opened: Set[NodeId]) -> str:
    """The mark before a node's name: ``▾`` open, ``▸`` closed, blank for a leaf."""
    return " " if node.leaf is not None else ("▾" if node.id in opened else "▸")


def tree_table(
    columns: Sequence[Column], look: Callable[[pd.Series], RowLook], page_size: int
) -> PagedTable:
    """The table a tree view draws its nodes in: one page of up to ``TREE_PAGE`` rows
    that scrolls within itself, ``page_size`` rows in view, in the tree's own order
    (not sortable: a sort would tear children from their parents)."""
    return PagedTable(
        columns,
        page_size=TREE_PAGE,
        scroll_rows=page_size,
        look=look,
        empty_text="no leaves",
        sortable=False,
    )


def size_breakdown(tree: LeafTree) -> list[tuple[str, int]]:
    """The checkpoint's bytes by part: by checkpointable, and where one holds nearly
    all of them, by its subtrees (``params`` and ``opt_state`` of a single state);
    at most ``MAX_SEGMENTS`` parts, the smallest counted together as ``other``."""
    parts = [(n.name, n.nbytes) for n in tree.roots]
    total = tree.nbytes
    if total and len(tree.roots) >= 1:
        top = max(tree.roots, key=lambda n: n.nbytes)
        children = tree.children(top, by=BY_SIZE) if top.nbytes >= _DOMINANT * total else []
        if len(children) > 1:
            parts = [(f"{top.name} {c.name}", c.nbytes) for c in children]
            parts += [(n.name, n.nbytes) for n in tree.roots if n is not top]
    parts.sort(key=lambda p: -p[1])
    if len(parts) > MAX_SEGMENTS:
        rest = sum(n for _, n in parts[MAX_SEGMENTS - 1 :])
        parts = [*parts[: MAX_SEGMENTS - 1], ("other", rest)]
    return parts


def size_bar_html(parts: Sequence[tuple[str, int]]) -> str:
    """A horizontal bar of the parts' shares of the bytes, with a legend."""
    total = sum(n for _, n in parts)
    if total <= 0:
        return ""
    segments, legend = [], []
    for i, (name, nbytes) in enumerate(parts):
        color = _OTHER_COLOR if name == "other" else _COLORS[i % len(_COLORS)]
        share = nbytes / total
        label = f"{name}: {format_bytes(nbytes)} ({share:.0%})"
        segments.append(
            f'<div class="tinax-size-segment" data-part="{html.escape(name)}" '
            f'title="{html.escape(label)}" style="width:{share * 100:.2f}%;'
            f'background:{color};height:100%"></div>'
        )
        legend.append(
            f'<span style="margin-right:1em;white-space:nowrap">'
            f'<span style="display:inline-block;width:0.8em;height:0.8em;background:{color};'
            f'margin-right:0.3em"></span>{html.escape(label)}</span>'
        )
    return (
        '<div class="tinax-size-bar" style="display:flex;width:100%;max-width:48em;height:1em;'
        'border:1px solid #ccc">' + "".join(segments) + "</div>"
        f'<div style="font-size:90%">{"".join(legend)}</div>'
    )


# A size not read yet.
PENDING = "…"


def _format_size(value: Any) -> str:
    return PENDING if value is PENDING else format_bytes(value)


def _format_count(value: Any) -> str:
    return f"{int(value):,}" if value is not None and value == value else ""


def _format_share(value: Any) -> str:
    if value is PENDING:
        return PENDING
    return f"{float(value):.1%}" if value is not None and value == value else ""


TREE_COLUMNS = (
    Column("label", "subtree", key=True, exact="exact"),
    Column("leaves", "leaves", _format_count, align="right"),
    Column("nbytes", "size", _format_size, align="right"),
    Column("share", "share", _format_share, align="right", essential=False),
)


def _tree_look(row: pd.Series) -> RowLook:
    # Left-aligned and indented like treescope's: the depth is room, not spaces.
    return RowLook(depth=int(row["depth"]), mark=str(row["mark"]))


class TreeView(w.VBox):
    """The leaves of a checkpoint as a tree: click a subtree to open or close it,
    a leaf to pick it. Subtrees show their leaf count, bytes and share of the
    checkpoint, sorted by name (indices as numbers) or largest first. The tree is
    one list that scrolls within itself past ``page_size`` rows, so that opening a
    subtree never pushes its neighbours to another page. Names read as people
    read them (``blocks``, ``7``, an NNX variable as a leaf); hovering or copying
    gives the exact key. ``narrow`` shows only the subtrees holding given leaves
    (a key filter's).

    While the leaves' sizes are being read (``show(..., sized=False)``), sizes and
    shares read "…" and subtrees are in name order, "by size" waiting for them.

    Attributes:
      picked: The leaf table's index label of the last leaf clicked, or ``None``.
      tree: The ``LeafTree`` shown.
      nodes: The nodes shown, in order (all pages).
      sized: Whether the leaves' sizes are known.
    """

    picked = traitlets.Any(None, allow_none=True)

    def __init__(self, *, page_size: int, on_error: Any) -> None:
        guard = shown_in_widget(on_error)
        self.tree = LeafTree(pd.DataFrame(columns=["checkpointable", "key", "nbytes"]))
        self.nodes: list[Node] = []
        self.sized = True
        self._open: set[NodeId] = set()
        self.order = w.ToggleButtons(
            options=[("by name", BY_NAME), ("by size", BY_SIZE)],
            value=BY_NAME,
            style={"button_width": "6em"},
        )
        self.order.observe(guard(lambda _: self._redraw(keep_page=False)), names="value")
        self.collapse_button = w.Button(description="close all", icon="compress")
        self.collapse_button.on_click(guard(lambda _: self.collapse()))
        self._all = self.tree.leaves
        self._only: pd.Index | None = None
        self.table = tree_table(TREE_COLUMNS, _tree_look, page_size)
        self.table.observe(guard(self._on_pick), names="selected")
        super().__init__([w.HBox([self.order, self.collapse_button]), self.table])
        self.add_class("tinax-leaf-tree")

    def show(self, leaves: pd.DataFrame, *, sized: bool = True) -> None:
        """Shows the tree of ``leaves``, every subtree closed.

        Args:
          leaves: The leaf table.
          sized: Whether its ``nbytes`` are read; ``False`` shows sizes as being
            read until ``fill`` brings them.
        """
        self._all, self._only = leaves, None
        self.tree = LeafTree(leaves)
        self._set_sized(sized)
        self._open = set()
        if len(self.tree.roots) == 1 and self.tree.roots[0].leaf is None:
            self._open.add(self.tree.roots[0].id)  # one checkpointable: its top level
        self._redraw(keep_page=False)

    def fill(self, leaves: pd.DataFrame) -> None:
        """Shows the same leaves with their sizes read: open subtrees stay open."""
        self._all = leaves
        self.tree = LeafTree(leaves if self._only is None else leaves.loc[self._kept(leaves)])
        self._set_sized(True)
        self._redraw(keep_page=True)

    def narrow(self, labels: pd.Index | None) -> None:
        """Shows only the leaves with these index labels and the subtrees above them
        (``None``: every leaf). A few leaves found are shown opened to."""
        self._only = None if labels is None else pd.Index(labels)
        leaves = self._all if self._only is None else self._all.loc[self._kept(self._all)]
        self.tree = LeafTree(leaves)
        if self._only is not None and 0 < len(leaves) <= MAX_OPENED:
            for root in self.tree.roots:
                self._open_all(root)
        self._redraw(keep_page=False)

    def _kept(self, leaves: pd.DataFrame) -> pd.Index:
        assert self._only is not None
        return leaves.index.intersection(self._only, sort=False)

    def _open_all(self, node: Node) -> None:
        if node.leaf is None:
            self._open.add(node.id)
            for child in self.tree.children(node):
                self._open_all(child)

    def _set_sized(self, sized: bool) -> None:
        self.sized = sized
        self.order.disabled = not sized
        self.order.tooltip = None if sized else "sizes are being read"

    def is_open(self, node: Node) -> bool:
        """Whether ``node``'s children are shown."""
        return node.id in self._open

    def toggle(self, node: Node) -> None:
        """Opens a closed subtree, closes an open one (and everything under it)."""
        if node.leaf is not None:
            raise ValueError(f"{node.checkpointable!r} {node.key} is a leaf, not a subtree")
        self._open = toggled(self._open, node)
        self._redraw(keep_page=True, reveal=node)

    def expand(self, checkpointable: str, key: str = "") -> Node:
        """Opens the subtree ``key`` of ``checkpointable`` and those above it; returns it."""
        node = self.tree.find(checkpointable, key)
        parts = node.path
        for depth in range(len(parts) + (0 if node.leaf is not None else 1)):
            self._open.add((checkpointable, parts[:depth]))
        self._redraw(keep_page=True, reveal=node)
        return node

    def collapse(self) -> None:
        """Closes every subtree."""
        self._open = set()
        self._redraw(keep_page=False)

    def _visible(self) -> list[tuple[Node, int]]:
        by = self.order.value if self.sized else BY_NAME
        return shown_nodes(
            self.tree.sorted_roots(by=by), lambda n: self.tree.children(n, by=by), self._open
        )

    def _redraw(self, *, keep_page: bool, reveal: Node | None = None) -> None:
        visible = self._visible()
        self.nodes = [node for node, _ in visible]
        total = self.tree.nbytes or 1
        # Each leaf's key looked up in one mapping: ``.loc`` a leaf took 0.1 ms.
        keys = dict(zip(self.tree.leaves.index, self.tree.leaves["key"], strict=True))
        frame = pd.DataFrame(
            {
                "label": [node.label for node in self.nodes],
                "exact": [self._exact(node, keys) for node in self.nodes],
                "depth": [depth for _, depth in visible],
                "mark": [open_mark(n, self._open) for n in self.nodes],
                "leaves": [n.leaves for n in self.nodes],
                "nbytes": [n.nbytes if self.sized else PENDING for n in self.nodes],
                "share": [n.nbytes / total if self.sized else PENDING for n in self.nodes],
            }
        )
        self.table.show(frame, keep_page=keep_page)
        if reveal is not None:
            index = next((i for i, n in enumerate(self.nodes) if n.id == reveal.id), None)
            if index is not None and index not in self.table.visible_labels():
                self.table.show_row(index)

    @staticmethod
    def _exact(node: Node, keys: Mapping[Any, Any]) -> str:
        if node.leaf is not None:
            return str(keys[node.leaf]) or node.checkpointable
        return node.key or node.checkpointable

    def _on_pick(self, change: Any) -> None:
        index = change["new"]
        if index is None:
            return
        self.table.selected = None  # a click opens, closes or picks; nothing stays selected
        node = self.nodes[index]
        if node.leaf is not None:
            self.picked = None
            self.picked = node.leaf
        else:
            self.toggle(node)
