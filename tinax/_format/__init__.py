"""How Orbax (with Grain and tinax) lays a checkpoint out on disk, and how to read it.

The one place that knows the on-disk format. It sits below both
``tinax.checkpointing`` and ``tinax.explore`` and imports neither JAX, Orbax, pandas
nor ipywidgets: tensorstore reads the array store, everything else is JSON read
through ``storage``.

Vocabulary:

- ``names``: every file name, suffix and naming pattern (temporary directories,
  iterator files, steps in names, the checksum record and its promise).
- ``words``: the kinds and statuses tables show.
- ``keys``: leaf key paths, their one spelling, and subtree membership.
- ``dtypes``: NumPy dtypes by the names checkpoints and exports store them under.

Where bytes come from:

- ``storage``: local disk behind a small interface; a ``Location`` in it.
- ``gcs``: Google Cloud Storage (``gs://``) behind the same interface, through gcsfs.
- ``gcs_listing``: a large tree of a bucket listed in a few round trips at once.
- ``locate``: the ``Location`` a user's path or URL names (local or ``gs://``).
- ``files``: bounded, no-follow, JSON-only reads; the safety scan of a checkpoint.

What a checkpoint is:

- ``layout``: which checkpoint a directory is and what it holds.
- ``preflight``: the one check every read passes before anything is read.
- ``pytree``: a pytree checkpointable's metadata: leaves, strings, shardings, scalars.
- ``jsonitems``: JSON checkpointables, Grain iterator states, empty pytrees.
- ``iterstate``: what a Grain iterator's saved state may hold (load, verify and diff
  check it alike).
- ``runrecord``: a training run's record, and the record of a checkpoint a run's
  restore found corrupt.
- ``written``: Orbax's per-process records of the arrays each process wrote.
- ``pipeline``: the input pipeline each Grain iterator was saved from, as recorded.

Arrays and their bytes:

- ``arrays``: the array store through tensorstore, and zarr metadata parsing.
- ``budget``: the memory a read may claim; impossible shapes and chunks refused.
- ``chunks``: which chunks are stored, and reading an array a region at a time.
- ``checksums``: the checksums tinax saves, and checking values against them.
- ``rawread``: uncompressed chunks read straight from an OCDBT store's data files.
- ``chunkload``: a load's chunks read and decoded (zstd) straight into its buffers.
- ``valuecheck``: every stored value of a checkpoint checked against its checksums.

Copies:

- ``copied_files``: the files of a local checkpoint being copied, read safely.
- ``transfer``: a checkpoint's files copied to a disk or a bucket, each read once.
- ``gcs_upload``: the copy to a bucket: large requests at once, each CRC32C-checked.
- ``tiers``: which directories a two-tier run's records name (its local and durable
  tiers).

Restores:

- ``fit``: whether restore targets fit a checkpoint, leaf by leaf.

New checkpoints made from others (derived, averaged):

- ``treeplan``: which leaves are kept, under which keys, and that they make a tree.
- ``copy_source``: a source pytree's metadata, as a writer stores it again.
- ``streaming``: arrays read box by box, boxes planned, checksums taken as they go.
- ``store_writer``: a pytree checkpointable written in Orbax's layout, box by box.
- ``stored_copy``: arrays kept as they are, copied as their stored chunks, checked.
- ``ocdbt_root``: an OCDBT store's new version, pointing at data files written beside
  tensorstore (the copied chunks).
- ``new_checkpoint``: the new directory, its root files, and its commit.
- ``durable``: the files written synced, in the background and before the commit.
- ``lineage``: the record of what a checkpoint was made from.

Shared by the layers above:

- ``progress``: the callbacks long operations report progress to and stop by.
- ``lru``: the bounded, thread-safe cache that keeps parsed layouts, walks and verdicts.
- ``pools``: thread pools started on first use, and again in a forked child.
"""
