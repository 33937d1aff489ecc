"""Whether a checkpoint is what was saved: the checks every read passes first, and
the checksums tinax saves.

- ``preflight``: the one check every read passes before anything is read.
- ``checksums``: the checksums tinax saves, and checking values against them.
- ``iterstate``: what a Grain iterator's saved state may hold (load, verify and diff
  check it alike).
- ``health``: whether a run can go on from a checkpoint (healthy, diverged, not yet
  known), beside its integrity (sound, damaged, incomplete): the one verdict.
"""
