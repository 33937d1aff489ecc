"""The records tinax and Orbax keep beside a checkpoint's data: a run's, a save's,
a derived checkpoint's.

- ``runrecord``: a training run's record, and the record of a checkpoint a run's
  restore found corrupt.
- ``tiers``: which directories a two-tier run's records name (its local and durable
  tiers).
- ``savetimes``: how long a save took.
- ``metrics``: a training save's metrics, as logged.
- ``pipeline``: the input pipeline each Grain iterator was saved from, as recorded.
- ``lineage``: the record of what a checkpoint was made from.
"""
