"""Read-only inspection of checkpoints and live state as pandas tables.

Metadata first: tables are built from Orbax's metadata without reading array data,
and ``read_leaf`` reads one leaf's bytes only. Keys are ``jax.tree_util.keystr``
key paths, so tables of a checkpoint and of live state join on
``(checkpointable, key)``. This layer imports no ipywidgets and no JAX; it serves
terminals (``tinax`` / ``python -m tinax.explore PATH``), scripts and the widgets
alike.

Two public submodules go with it: ``tinax.explore.display`` shows keys and sizes to
people the one way the project does (readable keys, natural order, bytes), and
``tinax.explore.toolkit`` holds the building blocks of tools made over these tables
(a checkpoint's leaves staged, one leaf's statistics, the verification's parts, a
run directory's names).

Each name is imported when first used (PEP 562), so that ``tinax --help`` and a
script that needs one table do not load pandas and every reader first.
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

if _TYPE_CHECKING:
    from tinax._format.integrity.health import Health
    from tinax._format.metadata.layout import Checkpoint
    from tinax._paths import open_checkpoint
    from tinax.explore import display, toolkit
    from tinax.explore._checkpoint import checkpoint_table, read_leaf
    from tinax.explore._compare import compare_table
    from tinax.explore._diff import diff_table
    from tinax.explore._export import export_safetensors
    from tinax.explore._health import checkpoint_health
    from tinax.explore._lineage import lineage
    from tinax.explore._listing import list_checkpoints
    from tinax.explore._live import state_table
    from tinax.explore._readable import readable
    from tinax.explore._restore_plan import restore_plan
    from tinax.explore._run_view.drift import drift_table
    from tinax.explore._run_view.retention import retention_table, run_policy
    from tinax.explore._run_view.run_table import run_table
    from tinax.explore._run_view.scan import scan_run
    from tinax.explore._verify.verification import verify

# Where each public name lives.
_HOMES = {
    "Checkpoint": "tinax._format.metadata.layout",
    "Health": "tinax._format.integrity.health",
    "checkpoint_health": "tinax.explore._health",
    "open_checkpoint": "tinax._paths",
    "checkpoint_table": "tinax.explore._checkpoint",
    "compare_table": "tinax.explore._compare",
    "diff_table": "tinax.explore._diff",
    "drift_table": "tinax.explore._run_view.drift",
    "export_safetensors": "tinax.explore._export",
    "lineage": "tinax.explore._lineage",
    "list_checkpoints": "tinax.explore._listing",
    "read_leaf": "tinax.explore._checkpoint",
    "readable": "tinax.explore._readable",
    "restore_plan": "tinax.explore._restore_plan",
    "retention_table": "tinax.explore._run_view.retention",
    "run_policy": "tinax.explore._run_view.retention",
    "run_table": "tinax.explore._run_view.run_table",
    "scan_run": "tinax.explore._run_view.scan",
    "state_table": "tinax.explore._live",
    "verify": "tinax.explore._verify.verification",
}
_SUBMODULES = ("display", "toolkit")

__all__ = [
    "Checkpoint",
    "Health",
    "checkpoint_health",
    "checkpoint_table",
    "compare_table",
    "diff_table",
    "display",
    "drift_table",
    "export_safetensors",
    "lineage",
    "list_checkpoints",
    "open_checkpoint",
    "read_leaf",
    "readable",
    "restore_plan",
    "retention_table",
    "run_policy",
    "run_table",
    "scan_run",
    "state_table",
    "toolkit",
    "verify",
]


def __getattr__(name: str) -> _Any:
    if name in _SUBMODULES:
        return _importlib.import_module(f"tinax.explore.{name}")
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tinax.explore' has no attribute {name!r}")
    value = getattr(_importlib.import_module(home), name)
    globals()[name] = value  # once imported, an attribute like any other
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
