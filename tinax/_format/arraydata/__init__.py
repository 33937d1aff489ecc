"""Array data read from the array store (OCDBT and zarr3 chunks), checked as it is read.

- ``chunks``: which chunks are stored, and reading an array a region at a time.
- ``rawread``: uncompressed chunks read straight from an OCDBT store's data files.
- ``blocks``: data files on a bucket read in large blocks, ahead of the reader.
- ``chunkload``: a load's chunks read and decoded (zstd) straight into its buffers.
- ``readplan``: what reading a box of an array costs (chunks, bytes, files), from
  metadata alone.
- ``valuecheck``: every stored value of a checkpoint checked against its checksums.
- ``nonfinite``: NaN and infinities counted in values read, the one count every view
  and every load makes.
"""
