"""Leaf rows, shared by the tables of stored and of live state, and their DataFrame."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

# Column dtypes across every table; any other column holds Python objects.
_DTYPES = {
    "checkpointable": "string",
    "key": "string",
    "kind": "string",
    "dtype": "string",
    "sharding": "string",
    "name": "string",
    "path": "string",
    "status": "string",
    "size": "Int64",
    "nbytes": "Int64",
    "step": "Int64",
    "lossy": "boolean",
    # diff_table and verify
    "value_kind": "string",
    "change": "string",
    "delta": "float64",
    "max_abs_diff": "float64",
    "rel_change": "float64",
    "cosine": "float64",
    "norm": "float64",
    "norm_diff": "float64",
    "nan": "Int64",
    "inf": "Int64",
    "nan_count": "Int64",
    "inf_count": "Int64",
    "decoded": "boolean",
    "decided_by": "string",
    "nonfinite": "string",
    "part": "string",
    "severity": "string",
    "message": "string",
}
# Columns of a table that joins two sides carry the side as a suffix.
_SIDE = re.compile(r"_(checkpoint|target|a|b)$")


class Leaf(NamedTuple):
    """One row of a leaf table; ``None`` where a column does not apply."""

    checkpointable: str
    key: str
    kind: str
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    size: int | None = None
    nbytes: int | None = None
    value: Any = None
    sharding: str | None = None
    chunk_shape: tuple[int, ...] | None = None


LEAF_COLUMNS = Leaf._fields


def column(name: str, values: Sequence[Any]) -> pd.Series:
    """A table column with its stable dtype: ``string``, ``Int64`` or ``object``."""
    dtype = _DTYPES.get(name, _DTYPES.get(_SIDE.sub("", name)))
    if dtype is not None:
        return pd.Series(pd.array(list(values), dtype=dtype))
    cells = np.empty(len(values), dtype=object)
    if isinstance(values, list) and values.count(None) == len(values):
        return pd.Series(cells, dtype=object)  # np.empty of objects holds None
    # Assigned one by one so that tuples and dicts stay single cells.
    for i, value in enumerate(values):
        cells[i] = value
    return pd.Series(cells, dtype=object)


def frame(columns: Sequence[str], records: Iterable[Sequence[Any]]) -> pd.DataFrame:
    """A DataFrame of ``records`` (tuples in ``columns`` order) with stable dtypes."""
    rows = list(records)
    cells = list(zip(*rows, strict=True)) if rows else [() for _ in columns]
    return pd.DataFrame({name: column(name, cells[i]) for i, name in enumerate(columns)})


def leaf_frame(leaves: Iterable[Leaf]) -> pd.DataFrame:
    """The DataFrame of leaf rows, in ``LEAF_COLUMNS`` order."""
    return frame(LEAF_COLUMNS, leaves)


def _spec_element(element: Any) -> str:
    if isinstance(element, list | tuple):
        return "(" + ", ".join(str(e) for e in element) + ")"
    return str(element)


def format_named_sharding(
    axis_names: Sequence[Any], sizes: Sequence[Any], spec: Sequence[Any]
) -> str:
    """``NamedSharding(mesh=(data=2, model=1), spec=(data, None))``."""
    mesh = ", ".join(f"{name}={size}" for name, size in zip(axis_names, sizes, strict=False))
    return f"NamedSharding(mesh=({mesh}), spec=({', '.join(_spec_element(e) for e in spec)}))"


def format_device(device: str) -> str:
    # JAX 0.10 names CPU devices cpu:N; older checkpoints say TFRT_CPU_N.
    return device.replace("TFRT_CPU_", "cpu:")


def format_sharding_record(record: object) -> str | None:
    """Orbax's stored sharding description in the same words as a live sharding."""
    if not isinstance(record, dict):
        return None
    kind = record.get("sharding_type")
    if kind == "SingleDeviceSharding" and isinstance(record.get("device_str"), str):
        return f"SingleDeviceSharding({format_device(record['device_str'])})"
    if kind == "NamedSharding":
        names, sizes, spec = (
            record.get("axis_names"),
            record.get("shape"),
            record.get("partition_spec"),
        )
        if isinstance(names, list) and isinstance(sizes, list) and isinstance(spec, list):
            return format_named_sharding(names, sizes, spec)
    return kind if isinstance(kind, str) else None
