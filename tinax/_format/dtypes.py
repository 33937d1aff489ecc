"""NumPy dtypes by the names checkpoints and exports store them under."""

from __future__ import annotations

import numpy as np


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype named ``name``: NumPy's own, ml_dtypes' (``bfloat16``, the
    float8s, ``int4``) or tensorstore's (``json``, ``string``: Python objects).

    Raises:
      TypeError: If none of them knows it.
    """
    try:
        return np.dtype(name)
    except TypeError:
        pass
    # Imported only where NumPy lacks the name: ml_dtypes alone takes about a second.
    import ml_dtypes

    found = getattr(ml_dtypes, name, None)
    if found is None:
        import tensorstore as ts

        found = getattr(getattr(ts, name, None), "numpy_dtype", None)
    if found is None:
        raise TypeError(f"unknown dtype {name!r}")
    return np.dtype(found)
