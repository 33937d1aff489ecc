"""Jupyter widgets for tinax checkpoints.

- ``CheckpointExplorer``: browse a run's checkpoints, their leaves and one leaf's statistics.
- ``RestoreTargetBuilder``: abstract restore targets from live state, compared with a
  checkpoint, and a Load button.
- ``SavePanel``: save named checkpointables as a new checkpoint, with progress.
- ``AsyncProgress``: a progress bar bound to an Orbax ``AsyncResponse``.

Each is an ipywidgets container; errors from its buttons are shown in the widget.
"""

from widgets._explorer import CheckpointExplorer
from widgets._progress import AsyncProgress
from widgets._restore import RestoreTargetBuilder
from widgets._save import SavePanel

__all__ = ["AsyncProgress", "CheckpointExplorer", "RestoreTargetBuilder", "SavePanel"]
