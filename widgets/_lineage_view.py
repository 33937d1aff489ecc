"""What a derived or averaged checkpoint was made from, as a line to follow: each
source by its full path, a link that opens it, with its step."""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from typing import Any

import ipywidgets as w
import pandas as pd

from tinax.explore import checkpoint_health, lineage
from tinax.explore.toolkit import lineage_summary, path_exists

from ._links import LinkLine, Part
from ._section import Section
from ._soundness import HEALTH_LOOKS
from ._text import error_html

_GREY = "#555"


def how_made(table: pd.DataFrame) -> str:
    """How the operation chose and changed what it copied, in words (``checkpointables
    model; cast to bfloat16``): ``lineage_summary``'s words beyond its sources."""
    bare = table.copy()
    bare["arguments"] = [{} for _ in range(len(bare))]
    said, plain = lineage_summary(table), lineage_summary(bare)
    rest = said[len(plain) :].strip() if said.startswith(plain) else ""
    return rest[1:-1] if rest.startswith("(") and rest.endswith(")") else rest


def lineage_parts(
    table: pd.DataFrame,
    *,
    exists: Callable[[str], bool],
    health_of: Callable[[str], Any] = lambda _source: None,
) -> list[Part]:
    """A lineage table as parts of a line: each source a link (numbered by its row),
    with its step, its health (``health_of``: a ``Health``, or ``None`` where not
    known) and weight; a source gone from where it was, not a link."""
    if table.empty:
        return []
    operation = str(table["operation"].iloc[0])
    sources = [str(s) for s in table["source"]]
    if operation == "average":
        parts = [Part(f"average of {len(sources)}: ", color=_GREY)]
    else:
        verb = "derived from" if operation == "derive" else f"{operation} of"
        parts = [Part(f"{verb} ", color=_GREY)]
    weights = table["weight"] if operation == "average" else [None] * len(sources)
    for i, (source, step, weight) in enumerate(zip(sources, table["step"], weights, strict=True)):
        if i:
            parts.append(Part(", ", color=_GREY))
        there = exists(source)
        parts.append(
            Part(
                source,
                link=i if there else None,
                title=f"open {source}" if there else "no longer there",
                code=True,
                css="tinax-lineage-source",
            )
        )
        about = [] if pd.isna(step) else [f"step {int(step):,}"]
        health = health_of(source) if there else None
        if weight is not None and not pd.isna(weight):
            about.append(f"weight {float(weight):.3g}")
        if not there:
            about.append("no longer there")
        if health is not None:
            color, mark = HEALTH_LOOKS.get(health.verdict, (_GREY, ""))
            parts.append(Part(f" ({', '.join([*about, ''])}" if about else " (", color=_GREY))
            parts.append(
                Part(
                    f"{mark} {health.verdict}",
                    title=health.reason,
                    color=color,
                    css="tinax-lineage-health",
                )
            )
            parts.append(Part(")", color=_GREY))
        elif about:
            parts.append(Part(f" ({', '.join(about)})", color=_GREY))
    how = how_made(table)
    if how:
        parts.append(Part(f" · {how}", color=_GREY))
    return parts


class LineageView(w.VBox):
    """The open checkpoint's sources, each a link: one in the explorer's run opens
    there (``open_listed``); one elsewhere opens in an explorer of its own directory
    (made by ``explore_elsewhere``) under the line, which a second click closes.

    Attributes:
      line: The line of links.
      sources: The sources' paths, as the lineage names them.
      elsewhere: The section holding the explorer of a source outside the run.
    """

    def __init__(
        self,
        *,
        open_listed: Callable[[str], bool],
        explore_elsewhere: Callable[[str], w.Widget],
        on_error: Callable[[BaseException], None],
    ) -> None:
        """Args:
        open_listed: Opens a source if the run lists it; returns whether it did.
        explore_elsewhere: An explorer of a source's directory, that source open.
        on_error: Shows an error raised by a click.
        """
        self._open_listed = open_listed
        self._explore_elsewhere = explore_elsewhere
        self.sources: list[str] = []
        self.line = LinkLine(self.open_source, on_error)
        self.message = w.HTML("")
        self.elsewhere = Section("source", "", [])
        # Set off from the page it sits in: an explorer within the explorer.
        self.elsewhere.body.layout = w.Layout(border_left="3px solid #ddd", padding="0 0 0 8px")
        self.elsewhere.show(False)
        self._shown_elsewhere: str | None = None
        super().__init__([self.line, self.message, self.elsewhere])
        self.add_class("tinax-lineage")

    def show(self, path: str | None, opened: Any = None) -> None:
        """Shows what ``path`` was made from (nothing for a checkpoint saved from
        training, or for ``None``); ``opened``: the checkpoint as opened already, read
        through rather than opened again."""
        self.close_elsewhere()
        self.message.value = ""
        self.sources = []
        if path is None:
            self.line.show([])
            return
        try:
            table = lineage(path if opened is None else opened)
        except (OSError, ValueError) as e:
            self.line.show([])
            self.message.value = error_html(e, title="Its lineage cannot be read:")
            return
        self.sources = [str(s) for s in table["source"]]
        self.line.show(lineage_parts(table, exists=path_exists, health_of=checkpoint_health))

    def open_source(self, number: int) -> None:
        """Opens the source numbered ``number`` (a click on its link).

        Raises:
          IndexError: If there is no such source.
        """
        source = self.sources[number]
        if self._open_listed(source):
            return
        if self._shown_elsewhere == source:
            self.close_elsewhere()
            return
        explorer = self._explore_elsewhere(source)
        self.elsewhere.set_title(
            f"<b>Source</b> <code>{html.escape(source)}</code> (outside this run)"
        )
        self.elsewhere.body.children = (explorer,)
        self.elsewhere.show(True)
        self.elsewhere.set_open(True)
        self._shown_elsewhere = source

    def close_elsewhere(self) -> None:
        """Closes the explorer of a source outside the run, if one is open."""
        for child in self.elsewhere.body.children:
            child.close()
        self.elsewhere.body.children = ()
        self.elsewhere.show(False)
        self._shown_elsewhere = None


def same_place(a: str, b: str) -> bool:
    """Whether two paths name the same checkpoint: local ones through their links."""
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)
