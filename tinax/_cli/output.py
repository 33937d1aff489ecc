"""The ``tinax`` command's output: JSON, CSV, wrapped lines, rows in natural order and
progress bars."""

from __future__ import annotations

import contextlib
import csv
import json
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import pandas as pd

from tinax._cli import terminal as term
from tinax._cli.terminal import jsonable
from tinax.explore import display
from tinax.explore._readable import human_duration


def _seconds(value: Any) -> str:
    """Seconds a save took, as the widgets show them (``'0.25 s'``, ``'1 min 15 s'``)."""
    return human_duration(value, precise=True)


def _records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows as JSON objects (``jsonable``: a NaN cell is null and named in the
    row's ``nonfinite_values``; a missing one is null)."""
    columns = list(table.columns)
    return [
        jsonable(dict(zip(columns, row, strict=True)))
        for row in table.itertuples(index=False, name=None)
    ]


def _dump(value: Any, out: TextIO) -> None:
    json.dump(jsonable(value), out)
    print(file=out)


def _csv(table: pd.DataFrame, out: TextIO) -> None:
    """``table`` as CSV with the table's own column names."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(list(table.columns))
    for row in table.itertuples(index=False, name=None):
        writer.writerow([term.csv_cell(cell) for cell in row])


def _machine(table: pd.DataFrame, as_json: bool, out: TextIO) -> None:
    if as_json:
        _dump(_records(table), out)
    else:
        _csv(table, out)


_say = term.say


def _natural(table: pd.DataFrame, by_checkpointable: bool = True) -> pd.DataFrame:
    """Rows in natural key order (layers by number), checkpointables in their order."""
    if table.empty:
        return table
    order = {name: i for i, name in enumerate(dict.fromkeys(table["checkpointable"]))}
    positions = sorted(
        range(len(table)),
        key=lambda i: (
            order[table["checkpointable"].iat[i]] if by_checkpointable else 0,
            display.natural_key(str(table["key"].iat[i])),
        ),
    )
    return table.iloc[positions].reset_index(drop=True)


@contextlib.contextmanager
def _progress(
    err: TextIO, description: str, *, unit: str = "bytes"
) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on ``err`` when it is a terminal (rich's), else nothing; counts
    ``unit`` (bytes, with a rate, or things such as pairs)."""
    if not getattr(err, "isatty", lambda: False)():
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    counts: tuple[ProgressColumn, ...] = (
        (DownloadColumn(binary_units=True), TransferSpeedColumn())
        if unit == "bytes"
        else (MofNCompleteColumn(),)
    )
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        *counts,
        TimeRemainingColumn(),
        console=Console(file=err, width=term.width()),
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total or None)

        yield update
