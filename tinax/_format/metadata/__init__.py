"""What a checkpoint is and holds, from its metadata: Orbax's layouts and the zarr
metadata of its array store. No array data is read here.

- ``layout``: which checkpoint a directory is and what it holds; the opened
  ``Checkpoint``, which keeps what is read of it (each file once).
- ``commit_record``: what the commit record (``_CHECKPOINT_METADATA``) says.
- ``pytree``: a pytree checkpointable's metadata: leaves, strings, shardings, scalars.
- ``arrays``: the array store through tensorstore, and zarr metadata parsing.
- ``budget``: the memory a read may claim; impossible shapes and chunks refused.
- ``jsonitems``: JSON checkpointables, Grain iterator states, empty pytrees.
- ``written``: Orbax's per-process records of the arrays each process wrote.
- ``fit``: whether restore targets fit a checkpoint, leaf by leaf.
- ``hostparts``: what one process of a job saves on its own host, and which files of
  each part make the whole checkpoint.
- ``logged``: the metrics a save logged, as its commit record holds them.
"""
