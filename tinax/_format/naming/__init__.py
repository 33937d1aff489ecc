"""How the format spells things: file names, status words, leaf keys, dtypes.

Everything else in ``tinax._format`` (and every layer above) imports its spellings from
here; these modules import nothing of the project.

- ``names``: every file name, suffix and naming pattern (temporary directories,
  iterator files, steps in names, the checksum record and its promise).
- ``words``: the kinds and statuses tables show.
- ``keys``: leaf key paths, their one spelling, and subtree membership.
- ``dtypes``: NumPy dtypes by the names checkpoints and exports store them under.
"""
