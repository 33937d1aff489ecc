"""NumPy dtypes by the names checkpoints and exports store them under."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype named ``name``: NumPy's own, ml_dtypes' (``bfloat16``, the
    float8s, ``int4``) or tensorstore's (``json``, ``string``: Python objects).

    Raises:
      TypeError: If none of them knows it.
    """
    import numpy as np

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


# Elements converted at a time by the bit-level conversions below: small enough that a
# block's temporaries stay in a core's cache between passes (what makes them several
# times faster than ml_dtypes' value-at-a-time loop, which holds the interpreter).
CONVERT_BLOCK = 1 << 16


def convert_into(out: np.ndarray, values: np.ndarray) -> None:
    """Copy ``values`` into ``out`` (same shape), converted to ``out``'s dtype bit for bit
    as ``np.copyto(out, values, casting="unsafe")`` does (rounding to nearest even,
    subnormals kept, NaN made ml_dtypes' quiet NaN of the same sign).

    float32 to bfloat16 and bfloat16 to float32 are done on the bits with NumPy's
    integer ufuncs, block by block, releasing the interpreter; everything else, and any
    block holding a NaN, by NumPy itself."""
    import numpy as np

    pair = (values.dtype.name, out.dtype.name)
    if pair not in _BIT_CONVERSIONS or not out.flags.c_contiguous:
        np.copyto(out, values, casting="unsafe")
        return
    _BIT_CONVERSIONS[pair](out.reshape(-1), np.ascontiguousarray(values).reshape(-1))


def _float32_to_bfloat16(out: np.ndarray, values: np.ndarray) -> None:
    import numpy as np

    bits = values.view(np.uint32)
    into = out.view(np.uint16)
    work = np.empty(min(CONVERT_BLOCK, bits.size), np.uint32)
    for start in range(0, bits.size, CONVERT_BLOCK):
        block = bits[start : start + CONVERT_BLOCK]
        if np.isnan(values[start : start + CONVERT_BLOCK].min()):
            part = slice(start, start + CONVERT_BLOCK)
            with np.errstate(invalid="ignore"):  # a NaN is a NaN in bfloat16 too
                np.copyto(out[part], values[part], casting="unsafe")
            continue
        rounded = work[: block.size]
        # Round to nearest, ties to even: add 0x7FFF plus the lowest bit kept, then drop
        # the low 16 bits (a carry into the exponent rounds up to the next binade or inf).
        np.right_shift(block, 16, out=rounded)
        np.bitwise_and(rounded, 1, out=rounded)
        rounded += 0x7FFF
        rounded += block
        rounded >>= 16
        into[start : start + CONVERT_BLOCK] = rounded


def _bfloat16_to_float32(out: np.ndarray, values: np.ndarray) -> None:
    # Exact: bfloat16 is float32's upper half.
    import numpy as np

    widened = out.view(np.uint32)
    widened[...] = values.view(np.uint16)
    widened <<= 16


_BIT_CONVERSIONS = {
    ("float32", "bfloat16"): _float32_to_bfloat16,
    ("bfloat16", "float32"): _bfloat16_to_float32,
}
