"""New checkpoints made from others (derived, averaged), written without JAX or Orbax
in exactly the files Orbax writes.

- ``treeplan``: which leaves are kept, under which keys, and that they make a tree.
- ``copy_source``: a source pytree's metadata, as a writer stores it again.
- ``streaming``: arrays read box by box, boxes planned, checksums taken as they go.
- ``store_writer``: a pytree checkpointable written in Orbax's layout, box by box.
- ``shards``: the bytes of one stored chunk as Orbax's zarr3 layout keeps it.
- ``stored_copy``: arrays kept as they are, copied as their stored chunks, checked.
- ``ocdbt_root``: an OCDBT store's new version, pointing at data files written beside
  tensorstore (the copied chunks).
- ``new_checkpoint``: the new directory, its root files, and its commit.
"""
