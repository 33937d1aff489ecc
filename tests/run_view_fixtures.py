"""Small real runs for the run-view tests (run_table, drift_table, scan_run): written by
tinax's TrainingRun with a layer jump and a NaN planted at known steps, and the planted
steps of the big demo run (demo/make_big_run.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import grain
import numpy as np

from tinax.checkpointing import TrainingRun

REPO = Path(__file__).resolve().parents[1]

# The small run: a checkpoint every step, layers.2 jumps at JUMP_STEP, NaN from NAN_STEP on.
STEPS = (1, 2, 3, 4, 5, 6)
JUMP_STEP = 3
JUMP_LAYER = "layers.2"
NAN_STEP = 5
ROLLBACK_STEP = 4
LAYERS = 4


def _iterator() -> Any:
    return iter(grain.MapDataset.range(64).to_iter_dataset())


def model(step: int) -> dict[str, Any]:
    """The model at ``step``: each layer moves by 1 % a step; layers.2 triples at
    JUMP_STEP; from NAN_STEP on one element of layers.0 is NaN."""
    rng = np.random.default_rng(0)
    layers = []
    for i in range(LAYERS):
        w = rng.standard_normal((8, 8)).astype(np.float32)
        w = w * np.float32(1.0 + 0.01 * step)
        if i == 2 and step >= JUMP_STEP:
            w = w * np.float32(3.0)
        if i == 0 and step >= NAN_STEP:
            w[0, 0] = np.nan
        layers.append({"w": w, "b": np.full((8,), 0.1 * (i + 1) + 0.001 * step, np.float32)})
    return {"embed": {"w": np.ones((4, 8), np.float32)}, "layers": layers}


def write_small_run(root: str) -> str:
    """The small run under ``root`` (local or gs://), written by ``TrainingRun``."""
    it = _iterator()
    with TrainingRun(root, save_every=1, keep=None) as run:
        for step in STEPS:
            next(it)
            loss = float("nan") if step >= NAN_STEP else 1.0 / step
            run.save(
                step,
                model(step),
                {"count": np.int32(step)},
                np.zeros((2,), np.uint32),
                {"loss": loss, "learning_rate": 0.5, "epoch": 1, "tag": "x"},
                it,
            )
    return root


def big_run_script() -> ModuleType:
    """``demo/make_big_run.py`` as a module (its planted steps)."""
    spec = importlib.util.spec_from_file_location(
        "tinax_demo_make_big_run", REPO / "demo" / "make_big_run.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
