"""How Orbax (with Grain and tinax) lays a checkpoint out on disk, and how to read it.

The one place that knows the on-disk format. It sits below both
``tinax.checkpointing`` and ``tinax.explore`` and imports neither JAX, Orbax, pandas
nor ipywidgets: tensorstore reads the array store, everything else is JSON read
through ``storage``.

- ``names``: every file name, suffix and naming pattern (temporary directories,
  iterator files, steps in names).
- ``words``: the kinds and statuses tables show.
- ``keys``: leaf key paths, their one spelling, and subtree membership.
- ``storage``: local disk behind a small interface; a ``Location`` in it.
- ``gcs``: Google Cloud Storage (``gs://``) behind the same interface, through gcsfs.
- ``locate``: the ``Location`` a user's path or URL names (local or ``gs://``).
- ``files``: bounded, no-follow, JSON-only reads; the safety scan of a checkpoint.
- ``layout``: which checkpoint a directory is and what it holds.
- ``pytree``: a pytree checkpointable's metadata: leaves, arrays, strings, shardings.
- ``arrays``: the array store through tensorstore.
"""
