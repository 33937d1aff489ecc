"""The ``Location`` a user's path or URL names: the one module that picks a storage.

It sits above ``storage`` (local disk) and ``gcs`` (Google Cloud Storage), which
import neither it nor each other's implementation, so no import goes in a circle.
"""

from __future__ import annotations

import os

from tinax._format.storage.location import GCS_SCHEME, Location, local


def location(path: str | os.PathLike[str]) -> Location:
    """The ``Location`` a user's path or URL names: ``gs://bucket/key`` or a local path.

    Nothing is imported for Google Cloud Storage unless ``path`` is a ``gs://`` URL.

    Raises:
      ValueError: If a ``gs://`` URL names no bucket or is not a valid object name.
    """
    text = os.fspath(path)
    if text.startswith(GCS_SCHEME):
        from tinax._format.storage import gcs

        return gcs.location(text)
    return local(text)
