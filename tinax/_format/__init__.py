"""How Orbax (with Grain and tinax) lays a checkpoint out on disk, and how to read it.

The one place that knows the on-disk format. It sits below both
``tinax.checkpointing`` and ``tinax.explore`` and imports neither JAX, Orbax, pandas
nor ipywidgets: tensorstore reads the array store, everything else is JSON read
through ``storage``.

Its subpackages import one way, each only those listed before it (and the shared
modules below; ``tests/test_layering.py`` checks it); each ``__init__`` lists its modules:

- ``naming``: how the format spells things: file names, status words, leaf keys, dtypes.
- ``storage``: where bytes come from and go to: local disk and ``gs://``, bounded reads,
  copies, removals.
- ``metadata``: what a checkpoint is and holds, from its metadata (layouts, pytree
  metadata, the array store's zarr metadata, whether restore targets fit).
- ``integrity``: the check every read passes first, and the checksums tinax saves.
- ``arraydata``: array data read from the array store, checked as it is read.
- ``records``: what tinax and Orbax record beside the data (a run's record, save times,
  metrics, the input pipeline, lineage); it imports ``naming``, ``storage`` and
  ``metadata`` only.
- ``writing``: new checkpoints made from others, in Orbax's own layout.

Shared by the layers above, importing only ``naming``:

- ``callbacks``: the progress and cancel callbacks long operations take.
- ``hostmem``: the host memory this process can still take (cgroup-aware).
- ``lru``: the bounded, thread-safe cache of kept reads.
- ``pools``: thread pools started on first use, and again in a forked child.
- ``safetensors``: the safetensors format (headers, index files of split exports).
"""
