"""Jupyter widgets for tinax checkpoints (``pip install "tinax[widgets]"``).

- ``CheckpointExplorer``: browse a run's checkpoints, their leaves and one leaf's statistics.
- ``RestoreTargetBuilder``: abstract restore targets from live state, compared with a
  checkpoint, and a Load button.
- ``SavePanel``: save named checkpointables as a new checkpoint, with progress.
- ``AsyncProgress``: a progress bar bound to an Orbax ``AsyncResponse``.
- ``ExportPanel``: export a checkpoint's arrays to safetensors files, with progress.

Each is an ipywidgets container; errors from its buttons are shown in the widget.
This package lives in the repository's top-level ``widgets/`` folder and is
installed as ``tinax.widgets``.
"""

try:
    import ipywidgets as _ipywidgets  # noqa: F401
    import matplotlib as _matplotlib  # noqa: F401
    import pandas as _pandas  # noqa: F401
except ImportError as e:
    raise ImportError(
        f"tinax.widgets needs ipywidgets, matplotlib and pandas ({e.name} is missing): "
        'pip install "tinax[widgets]"'
    ) from e

from ._explorer import CheckpointExplorer
from ._export import ExportPanel
from ._progress import AsyncProgress
from ._restore import RestoreTargetBuilder
from ._save import SavePanel

__all__ = [
    "AsyncProgress",
    "CheckpointExplorer",
    "ExportPanel",
    "RestoreTargetBuilder",
    "SavePanel",
]
