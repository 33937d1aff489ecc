"""A training save's metrics: the numeric 0-d values of its auxiliary state, as logged.

``run_table`` shows them as columns. They are in the auxiliary checkpointable itself,
where reading them costs its metadata, its checksum record and its array store (four
round trips a checkpoint on a bucket); a tinax training save also records them under
``names.METRICS_RECORD`` in the commit record's ``custom_metadata``, which a listing
reads anyway, as ``{"checkpointable": name, "values": {dotted key: number}}``. JSON
has no NaN or infinity: those are recorded as the strings ``"nan"``, ``"inf"`` and
``"-inf"``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from tinax._format.metadata.logged import recorded


def numeric(value: Any) -> float | None:
    """``value`` as a float when it is a real number (not a bool): a Python or NumPy
    number, a 0-d array of one, ml_dtypes' (``bfloat16``) included; else ``None``."""
    if isinstance(value, bool | np.bool_):
        return None
    if isinstance(value, int | float | np.integer | np.floating):
        return float(value)
    if isinstance(value, np.generic | np.ndarray) and np.shape(value) == ():
        dtype = value.dtype
        if dtype.kind in "iuf" or (dtype.kind == "V" and dtype.names is None):
            try:
                return float(np.asarray(value).astype(np.float64))
            except (TypeError, ValueError):
                return None
    return None


def metric_name(path: tuple[Any, ...]) -> str:
    """The column a metric at key path ``path`` is shown in: its keys dotted."""
    return ".".join(str(part) for part in path) or "(root)"


def record(checkpointable: str, values: Mapping[str, float]) -> dict[str, Any]:
    """What a save puts under ``names.METRICS_RECORD`` for the metrics ``values`` of
    the auxiliary checkpointable ``checkpointable``."""
    return {
        "checkpointable": checkpointable,
        "values": {
            key: value if math.isfinite(value) else str(value).lower()
            for key, value in values.items()
        },
    }


__all__ = ["metric_name", "numeric", "record", "recorded"]
