"""The metrics a training save records with its commit (``tinax._format.records.metrics``)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from tinax._format.naming.keys import key_parts
from tinax._format.records import metrics


def logged_metrics(auxiliary: Any) -> dict[str, float]:
    """The numeric 0-d values of ``auxiliary`` by dotted key path, as ``run_table`` shows
    them: Python and NumPy numbers, 0-d NumPy and JAX arrays (bfloat16 too).

    A JAX value is read from the host copy the save has started already
    (``_host_copies``): no second transfer from its device. Anything else (arrays
    that are not 0-d, strings, ``None``) is left out.
    """
    found: dict[str, float] = {}
    for path, value in jax.tree_util.tree_flatten_with_path(auxiliary)[0]:
        if isinstance(value, jax.Array):
            if value.shape != () or not value.is_fully_addressable:
                continue
            value = np.asarray(value)
        number = metrics.numeric(value)
        if number is not None:
            found[metrics.metric_name(key_parts(path))] = number
    return found
