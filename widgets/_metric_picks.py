"""The run timeline's choice of metrics: a toggle per metric the run logged, the ones
picked drawn together on the timeline's one step axis."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ipywidgets as w
import traitlets

from tinax import explore

# The metric picked first when the run does not say which one it is kept by.
PREFERRED_METRICS = ("loss", "train_loss", "eval_loss", "accuracy")


def default_metric(metrics: Sequence[str], kept_by: str | None) -> str | None:
    """The metric shown first: the one the run keeps its best checkpoints by, else a
    loss, else the first the run logged (``None`` when it logged none)."""
    if kept_by in metrics:
        return kept_by
    found = next((m for m in PREFERRED_METRICS if m in metrics), None)
    return found or (metrics[0] if metrics else None)


def kept_by(root: str) -> str | None:
    """The metric the run at ``root`` keeps its best checkpoints by, as its policy
    records it; ``None`` where it records none."""
    policy = explore.run_policy(root)
    best_by = None if policy is None else policy.get("best_by")
    return best_by if isinstance(best_by, str) else None


class MetricPicks(w.HBox):
    """A toggle button per metric; ``picked`` lists those pressed, in the order pressed.

    Attributes:
      picked: The metrics picked, first picked first.
      metrics: Every metric offered.
      buttons: Metric name → its toggle.
    """

    picked: traitlets.List[str] = traitlets.List(traitlets.Unicode(), [])

    def __init__(self) -> None:
        self.metrics: list[str] = []
        self.buttons: dict[str, w.ToggleButton] = {}
        self._syncing = False
        self.row = w.HBox([], layout=w.Layout(flex_flow="row wrap"))
        super().__init__(
            [w.HTML("metrics&nbsp;", layout=w.Layout(flex="0 0 auto")), self.row],
            layout=w.Layout(align_items="center", display="none"),
        )
        self.add_class("tinax-metric-picks")

    def offer(self, metrics: Sequence[str], kept_by: str | None) -> None:
        """Offers ``metrics``, keeping the picks still offered; with none left, picks
        ``default_metric``."""
        metrics = [str(m) for m in metrics]
        if metrics != self.metrics:
            self.metrics = metrics
            self.buttons = {}
            for name in metrics:
                button = w.ToggleButton(
                    value=False,
                    description=name,
                    tooltip=f"draw {name} against step",
                    layout=w.Layout(width="auto"),
                )
                button.observe(lambda change, n=name: self._on_toggle(n, change), names="value")
                self.buttons[name] = button
            self.row.children = tuple(self.buttons.values())
        kept = [m for m in self.picked if m in metrics]
        if not kept:
            first = default_metric(metrics, kept_by)
            kept = [first] if first is not None else []
        self.picked = kept
        self._sync_buttons()
        self.layout.display = "" if metrics else "none"

    @traitlets.validate("picked")
    def _valid_picked(self, proposal: Any) -> list[str]:
        names = list(proposal["value"])
        unknown = [n for n in names if n not in self.metrics]
        if unknown:
            offered = ", ".join(self.metrics) or "none"
            raise ValueError(f"the run logged no metric {unknown[0]!r} (it logged: {offered})")
        return list(dict.fromkeys(names))

    @traitlets.observe("picked")
    def _on_picked(self, _change: Any) -> None:
        self._sync_buttons()

    def _sync_buttons(self) -> None:
        self._syncing = True
        try:
            for name, button in self.buttons.items():
                button.value = name in self.picked
                button.button_style = "info" if name in self.picked else ""
        finally:
            self._syncing = False

    def _on_toggle(self, name: str, change: Any) -> None:
        if self._syncing:
            return
        if change["new"]:
            self.picked = [*self.picked, name]
        else:
            self.picked = [m for m in self.picked if m != name]
