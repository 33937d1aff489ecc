"""Where bytes come from and go to: local disk and ``gs://`` behind one small interface.

- ``location``: the storage interface, local disk behind it, and a ``Location`` in it.
- ``gcs``: Google Cloud Storage (``gs://``) behind the same interface, through gcsfs.
- ``gcs_listing``: a large tree of a bucket listed in a few round trips at once.
- ``locate``: the ``Location`` a user's path or URL names (local or ``gs://``).
- ``files``: bounded, no-follow, JSON-only reads; the safety scan of a checkpoint.
- ``copied_files``: the files of a local checkpoint being copied, read safely.
- ``transfer``: a checkpoint's files copied to a disk or a bucket, each read once.
- ``gcs_upload``: the copy to a bucket: large requests at once, each CRC32C-checked.
- ``durable``: files written synced, in the background and before a commit.
- ``removal``: a checkpoint removed so that no reader takes it for complete.
"""
