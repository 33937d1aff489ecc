"""The restore-target builder's presets (what to restore, chosen in one click), and
putting restored values into the live state.

A preset names a common partial restore: the model alone, its trainable parameters
alone, or the model without its normalisation statistics (BatchNorm's running mean
and variance, which a fine-tune on other data keeps from the live model). Which
leaves are parameters and which are statistics is read from the live state: flax
NNX's variable types where the state holds them (``nnx.Param``, ``nnx.BatchStat``),
otherwise the names flax Linen and BatchNorm use (``batch_stats``, ``mean``, ``var``).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Collection, Mapping
from typing import Any

import ipywidgets as w

from tinax.explore import toolkit

MODEL_ONLY = "model only"
PARAMS_ONLY = "params only"
WITHOUT_STATISTICS = "without normalisation statistics"
EVERYTHING = "everything"
PRESETS = (MODEL_ONLY, PARAMS_ONLY, WITHOUT_STATISTICS, EVERYTHING)

DESCRIPTIONS = {
    MODEL_ONLY: "the model, whole; no optimizer, RNG, auxiliary state or iterator",
    PARAMS_ONLY: "the model's trainable parameters only (nnx.Param): no normalisation "
    "statistics, RNG streams or other variables",
    WITHOUT_STATISTICS: "the model without its normalisation statistics (BatchNorm's running "
    "mean and var), which stay as the live model holds them",
    EVERYTHING: "every checkpointable, whole",
}

# What a leaf of the model is, for the presets.
PARAM = "param"
STATISTIC = "statistic"
OTHER = "other"

# The checkpointable a training checkpoint keeps the model in (TrainingCheckpointNames).
MODEL = "model"
# Names flax Linen and BatchNorm give normalisation statistics.
_STATISTICS_COLLECTION = "batch_stats"
_STATISTIC_NAMES = frozenset({"mean", "var"})
_PARAMS_COLLECTION = "params"


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a preset restores.

    Attributes:
      checkpointables: The checkpointables restored; the others are left out whole.
      left_out: Checkpointable name → keys of the subtrees left out of it.
    """

    checkpointables: frozenset[str]
    left_out: Mapping[str, tuple[str, ...]]


def model_name(names: Collection[str]) -> str | None:
    """The checkpointable holding the model: ``model``, or the only one there is."""
    if MODEL in names:
        return MODEL
    return next(iter(names)) if len(names) == 1 else None


def _part_name(part: object) -> str:
    return str(getattr(part, "key", getattr(part, "name", getattr(part, "idx", part))))


def variable_classes(tree: Any) -> dict[str, str]:
    """Key (as tables write it) of each variable of ``tree`` → ``PARAM``, ``STATISTIC`` or
    ``OTHER``.

    With flax NNX state a variable is a whole ``nnx.Variable`` (its key has no trailing
    ``['value']``); otherwise it is a leaf, classed by its path's names.
    """
    import jax  # only ever called with live state, which JAX made

    nnx = sys.modules.get("flax.nnx")  # imported by whoever made NNX state
    if nnx is not None:
        flat = jax.tree_util.tree_flatten_with_path(
            tree, is_leaf=lambda node: isinstance(node, nnx.Variable)
        )[0]
        if any(isinstance(leaf, nnx.Variable) for _, leaf in flat):
            classes = {}
            for path, leaf in flat:
                if isinstance(leaf, nnx.BatchStat):
                    kind = STATISTIC
                elif isinstance(leaf, nnx.Param):
                    kind = PARAM
                else:
                    kind = OTHER
                classes[toolkit.leaf_key(path)] = kind
            return classes
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    names = [[_part_name(part) for part in path] for path, _ in flat]
    collections = {parts[0] for parts in names if parts}
    by_collection = _PARAMS_COLLECTION in collections
    classes = {}
    for (path, _), parts in zip(flat, names, strict=True):
        if _STATISTICS_COLLECTION in parts or (parts and parts[-1] in _STATISTIC_NAMES):
            kind = STATISTIC
        elif by_collection and parts[:1] != [_PARAMS_COLLECTION]:
            kind = OTHER
        else:
            kind = PARAM
        classes[toolkit.leaf_key(path)] = kind
    return classes


def plan(preset: str, live: Mapping[str, Any]) -> Plan:
    """What ``preset`` restores of the live state ``live`` (name → pytree).

    Raises:
      ValueError: If ``preset`` is not one of ``PRESETS``, or it needs a model and
        no checkpointable is named ``model`` (nor is there only one).
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; the presets are {', '.join(PRESETS)}")
    if preset == EVERYTHING:
        return Plan(frozenset(live), {})
    model = model_name(list(live))
    if model is None:
        raise ValueError(
            f"the preset {preset!r} restores the checkpointable named {MODEL!r}, and there "
            f"is none among {', '.join(map(repr, live))}"
        )
    if preset == MODEL_ONLY:
        return Plan(frozenset({model}), {})
    classes = variable_classes(live[model])
    drop = {OTHER, STATISTIC} if preset == PARAMS_ONLY else {STATISTIC}
    return Plan(
        frozenset({model}),
        {model: tuple(key for key, kind in classes.items() if kind in drop)},
    )


class PresetButtons(w.HBox):
    """One button per preset; a preset that cannot apply to the live state is disabled,
    its tooltip saying why.

    Attributes:
      buttons: Preset → its button.
    """

    def __init__(self, live: Mapping[str, Any], pick: Callable[[str], None]) -> None:
        self.buttons: dict[str, w.Button] = {}
        for label in PRESETS:
            button = w.Button(
                description=label,
                tooltip=DESCRIPTIONS[label],
                layout=w.Layout(width="auto", flex="0 0 auto"),
            )
            button.on_click(lambda _button, label=label: pick(label))
            self.buttons[label] = button
        model = model_name(list(live))
        classes = {} if model is None else variable_classes(live[model])
        for label, button in self.buttons.items():
            if label == EVERYTHING:
                continue
            if model is None:
                button.disabled = True
                button.tooltip = f"no checkpointable is named {MODEL!r}"
            elif label == WITHOUT_STATISTICS and STATISTIC not in classes.values():
                button.disabled = True
                button.tooltip = "the model holds no normalisation statistics"
        super().__init__(
            [w.HTML("presets:"), *self.buttons.values()],
            layout=w.Layout(flex_flow="row wrap", align_items="center"),
        )

    def show(self, preset: str) -> None:
        """Marks the button of ``preset`` (``""``: none) as the one the ticks follow."""
        for label, button in self.buttons.items():
            button.button_style = "info" if label == preset else ""


def is_nnx_state(value: object) -> bool:
    """Whether ``value`` is flax NNX state (``nnx.state(model)``)."""
    nnx = sys.modules.get("flax.nnx")  # loaded by whoever made NNX state
    return nnx is not None and isinstance(value, nnx.State)


def apply_to_live(live: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
    """Puts each restored NNX state of ``result`` into the live state of the same name
    with ``nnx.update``; returns the names it applied."""
    applied = [name for name in result if is_nnx_state(live[name])]
    if applied:
        nnx = sys.modules["flax.nnx"]  # loaded already: the live state is NNX's

        for name in applied:
            nnx.update(live[name], result[name])
    return applied


def apply_hint(live: Mapping[str, Any], names: Collection[str]) -> str:
    """How to put restored values into the notebook's objects, as code to copy: NNX state
    goes into its module with ``nnx.update``; other values replace the old ones."""
    lines = []
    for name in names:
        if is_nnx_state(live[name]):
            lines.append(f'nnx.update({name}, builder.result["{name}"])')
        else:
            lines.append(f'{name} = builder.result["{name}"]')
    return "; ".join(lines)
