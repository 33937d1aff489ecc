"""Jupyter widgets for tinax checkpoints (``pip install "tinax[widgets]"``).

- ``CheckpointExplorer``: browse a run's checkpoints, their leaves and one leaf's statistics.
- ``RestoreTargetBuilder``: abstract restore targets from live state, compared with a
  checkpoint, and a Load button.
- ``SavePanel``: save named checkpointables as a new checkpoint, with progress.
- ``AsyncProgress``: a progress bar bound to an Orbax ``AsyncResponse``.
- ``ExportPanel``: export a checkpoint's arrays to safetensors files, with progress.
- ``RunTimeline``: a run at a glance: metrics, save times, layer drift and NaN against step.

Each is an ipywidgets container; errors from its buttons are shown in the widget.
This package lives in the repository's top-level ``widgets/`` folder and is
installed as ``tinax.widgets``.

Importing it, and browsing a run with ``CheckpointExplorer``, loads neither JAX nor
Orbax: ``RestoreTargetBuilder`` and ``SavePanel`` work on live state, and their
modules are imported when they are first named.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

try:
    import ipywidgets as _ipywidgets  # noqa: F401
    import pandas as _pandas  # noqa: F401

    # Looked up, not imported: matplotlib is imported when a first plot is drawn.
    if importlib.util.find_spec("matplotlib") is None:
        raise ImportError("No module named 'matplotlib'", name="matplotlib")
except ImportError as e:
    raise ImportError(
        f"tinax.widgets needs ipywidgets, matplotlib and pandas ({e.name} is missing): "
        'pip install "tinax[widgets]"'
    ) from e

from ._explorer import CheckpointExplorer
from ._export import ExportPanel
from ._progress import AsyncProgress
from ._timeline import RunTimeline

if TYPE_CHECKING:
    from ._restore import RestoreTargetBuilder
    from ._save import SavePanel

# Widgets over live state, whose modules import JAX: loaded when first named.
_ON_DEMAND = {"RestoreTargetBuilder": "._restore", "SavePanel": "._save"}


def __getattr__(name: str) -> Any:
    module = _ON_DEMAND.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_ON_DEMAND})


__all__ = [
    "AsyncProgress",
    "CheckpointExplorer",
    "ExportPanel",
    "RestoreTargetBuilder",
    "RunTimeline",
    "SavePanel",
]
