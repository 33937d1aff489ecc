"""A titled part of a widget that folds away: the explorer's run, checkpoint, leaf,
diff and data check."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as w


class Section(w.VBox):
    """A heading with a fold button, and a body shown while the section is open.

    The heading stays when the section is folded, so that a folded section is one
    line that still says what it holds (its title is kept up to date by its owner).

    Attributes:
      toggle: The fold button.
      heading: The title, as HTML.
      body: What the section holds.
    """

    def __init__(
        self, name: str, title: str, children: Sequence[w.Widget], *, is_open: bool = True
    ) -> None:
        """Args:
        name: A short name (words); the widget gets the CSS class
          ``tinax-section-<name>``, spaces made dashes.
        title: The heading, as HTML (escaped by the caller).
        children: The body's widgets.
        is_open: Whether the body shows at first.
        """
        self.name = name
        self.toggle = w.Button(layout=w.Layout(width="2.2em", min_width="2.2em", flex="0 0 auto"))
        self.toggle.add_class("tinax-section-toggle")
        self.toggle.on_click(lambda _: self.set_open(not self.is_open))
        self.heading = w.HTML(title, layout=w.Layout(flex="1 1 auto", min_width="0"))
        self.body = w.VBox(list(children))
        super().__init__(
            [
                w.HBox(
                    [self.toggle, self.heading],
                    layout=w.Layout(align_items="center", width="100%"),
                ),
                self.body,
            ]
        )
        self.add_class("tinax-section")
        # A class name with a space would make the browser refuse the whole view.
        self.add_class("tinax-section-" + "-".join(name.split()))
        self.set_open(is_open)

    @property
    def is_open(self) -> bool:
        """Whether the body shows."""
        return self.body.layout.display != "none"

    def set_open(self, value: bool) -> None:
        """Shows (``True``) or folds away (``False``) the body."""
        self.body.layout.display = "" if value else "none"
        self.toggle.icon = "caret-down" if value else "caret-right"
        self.toggle.tooltip = f"fold the {self.name}" if value else f"show the {self.name}"

    def set_title(self, title: str) -> None:
        """Sets the heading (HTML, escaped by the caller)."""
        self.heading.value = title

    def show(self, visible: bool = True) -> None:
        """Shows or hides the whole section, heading included."""
        self.layout.display = "" if visible else "none"

    @property
    def shown(self) -> bool:
        """Whether the section (at least its heading) is on the page."""
        return self.layout.display != "none"
