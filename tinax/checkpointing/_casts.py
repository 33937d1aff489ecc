"""The dtype casts tinax's load engine (``_fast_load``) makes itself, bit for bit as
Orbax's load makes them.

Orbax's load reads a leaf whose target asks for another dtype through tensorstore's
``cast`` driver over the stored array: each chunk is converted as it is read, by
tensorstore's own conversion routines. Those are not NumPy's (ml_dtypes'): a NaN
keeps its payload (quieted) where NumPy makes every NaN one quiet NaN, and a
float64 goes to float16 through float32, rounding twice. So the engine converts
with the same routines, tensorstore's ``cast`` over the part it read on the host,
after its checksums have matched the stored bytes: the values are Orbax's, every
bit (rounding to nearest even, NaN, Inf, subnormals, overflow to Inf), which
``tests/test_cast_loads.py`` checks against Orbax's own load.

Only casts between the float dtypes (``ENGINE_CASTS``) are made here; any other
(an integer, a bool, a float8) is left to Orbax, with its reason.
"""

from __future__ import annotations

import numpy as np

# The dtypes the engine casts between; a benchmark empties it to time Orbax's casts.
ENGINE_CASTS = frozenset({"float16", "bfloat16", "float32", "float64"})


def why_not(stored: np.dtype, target: np.dtype, *, on_device: bool) -> str | None:
    """Why a leaf stored as ``stored`` restored as ``target`` is left to Orbax, or
    ``None`` where the engine casts it (``on_device``: the target is a ``jax.Array``,
    whose dtype JAX must hold as it is)."""
    if stored.name not in ENGINE_CASTS or target.name not in ENGINE_CASTS:
        return f"a cast from {stored.name} to {target.name} is left to Orbax"
    if on_device:
        import jax

        if jax.dtypes.canonicalize_dtype(target) != target:
            return f"JAX holds {target.name} as {jax.dtypes.canonicalize_dtype(target).name}"
    return None


def cast_into(out: np.ndarray, values: np.ndarray) -> None:
    """Writes ``values`` into ``out`` (same shape, any strides), converted to ``out``'s
    dtype as Orbax's load converts them (tensorstore's conversion).

    Runs on tensorstore's threads: the calling thread waits without the interpreter.
    """
    import tensorstore as ts

    if out.size == 0:
        return
    source = ts.cast(ts.array(values, copy=False, write=False), out.dtype)
    ts.array(out, copy=False, write=True).write(source).result()
