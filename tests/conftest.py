"""Shared test set-up: JAX on the CPU, quiet Orbax logging."""

import logging
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
logging.getLogger("absl").setLevel(logging.ERROR)
