"""Shared test set-up: JAX on the CPU, quiet Orbax logging."""

import logging
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
logging.getLogger("absl").setLevel(logging.ERROR)


import uuid  # noqa: E402

import pytest  # noqa: E402

# The bucket every gs:// test writes to, in the session's emulator.
BUCKET = "tinax-test"


@pytest.fixture(scope="session")
def gcs():
    """A fake-gcs-server for the session, its environment applied to this process.

    Subprocesses, kernels and Jupyter servers a test starts need
    ``gcs.environment()`` too (``os.environ`` carries it to those started plainly).
    """
    from gcs import Emulator

    emulator = Emulator()
    emulator.start()
    saved = {key: os.environ.get(key) for key in emulator.environment()}
    os.environ.update(emulator.environment())
    emulator.create_bucket(BUCKET)
    yield emulator
    emulator.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(params=["local", "gs"])
def root(request, tmp_path) -> str:
    """A fresh directory to write checkpoints in: a local one, then a gs:// prefix."""
    if request.param == "local":
        return str(tmp_path)
    request.getfixturevalue("gcs")
    return f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"
