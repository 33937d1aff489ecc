"""tinax: JAX training checkpoints you can see and trust.

Importing ``tinax`` is inert: it loads no JAX, pandas or ipywidgets. Import the
layer you need:

- ``tinax.checkpointing``: atomic Orbax V1 + Grain saves and loads.
- ``tinax.explore``: checkpoints and live state as pandas tables.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
