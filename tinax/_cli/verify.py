"""``tinax verify``: a checkpoint, or every checkpoint of a run, checked as a load would."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from tinax import _paths
from tinax._cli import findings
from tinax._cli import terminal as term
from tinax._cli.args import EXIT_NO, EXIT_OK
from tinax._cli.output import _csv, _dump, _progress, _records, _say
from tinax._cli.terminal import Column
from tinax._format.metadata import layout
from tinax._format.naming import names, words
from tinax._format.storage.location import Location
from tinax.explore._listing import list_checkpoints
from tinax.explore._verify.verification import Verification, verify

# Statuses of a listing that are not checkpoints yet, or any more: ``verify`` of a
# run names them without failing for them (``--strict`` fails).
_NOT_CHECKPOINTS = frozenset({words.IN_PROGRESS, words.INTERRUPTED, words.BEING_REMOVED})
# A checkpoint a run's restore found corrupt and set aside: no load takes it, and the
# run has gone on without it; checked again it would only repeat the finding.
_SET_ASIDE = frozenset({words.FOUND_CORRUPT})
_CHECKS = (
    Column("name", "name", priority=0),
    Column("step", "step", term.number, priority=2, right=True),
    Column("verdict", "verdict", priority=0, wrap=True),
)


def is_run(path: str | Location) -> bool:
    """Whether ``path`` is a directory of checkpoints rather than one checkpoint."""
    return not layout.looks_like_checkpoint(_paths.listed_directory(path))


def _verify_one(path: str, data: bool, err: TextIO, description: str) -> Verification:
    with _progress(err, description) as progress:
        return verify(path, data=data, progress=progress if data else None)


def _failed(result: Verification, strict: bool) -> bool:
    return not result.ok or (strict and bool((result.findings["severity"] == words.WARNING).any()))


def _verification_record(result: Verification) -> dict[str, Any]:
    return {
        "path": result.path,
        "ok": result.ok,
        "status": result.status,
        "integrity": result.integrity,
        "health": result.health.verdict,
        "health_reason": result.health.reason,
        "nan": result.health.nan,
        "inf": result.health.inf,
        "verdict": result.verdict,
        "data": result.data,
        "findings": _records(result.findings),
        "leaves": _records(result.leaves),
    }


def _verdict_rows(checked: Sequence[tuple[str, Any, Verification | None, str]]) -> pd.DataFrame:
    """``verify --csv``: one row per finding, and one for a checkpoint without any, so
    that a sound checkpoint's verdict is there too."""
    rows = []
    for path, step, result, verdict in checked:
        findings = result.findings if result is not None else pd.DataFrame()
        base = {
            "path": path,
            "step": step,
            "ok": None if result is None else result.ok,
            "status": None if result is None else result.status,
            "integrity": None if result is None else result.integrity,
            "health": None if result is None else result.health.verdict,
            "verdict": verdict,
        }
        if findings.empty:
            rows.append({**base, "severity": None, "part": None, "message": None})
        for finding in findings.itertuples(index=False):
            rows.append(
                {
                    **base,
                    "severity": finding.severity,
                    "part": finding.part,
                    "message": finding.message,
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "path",
            "step",
            "ok",
            "status",
            "integrity",
            "health",
            "verdict",
            "severity",
            "part",
            "message",
        ],
    )


def verify_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``tinax verify PATH``: 0 when every checkpoint is sound, 1 when one is not or
    diverged (or, with ``--strict``, warned of or not checked)."""
    if is_run(args.path):
        return _verify_run(args, out, err)
    result = _verify_one(args.path, args.data, err, "reading data")
    failed = _failed(result, args.strict)
    if args.json:
        _dump(_verification_record(result), out)
    elif args.csv:
        step = _step_of(result.path)
        _csv(_verdict_rows([(result.path, step, result, result.verdict)]), out)
    else:
        total = term.width()
        if args.quiet:
            print(str(result), file=out)  # one unwrapped line
            return EXIT_NO if failed else EXIT_OK
        if len(result.findings):
            findings.print_groups(findings.groups(result.findings), out, total)
        _say(str(result), out, total)
    return EXIT_NO if failed else EXIT_OK


def _step_of(path: str) -> int | None:
    return names.step_from_name(Path(path).name)


def _worth_showing(result: Verification) -> bool:
    return bool(result.findings["severity"].isin([words.ERROR, words.WARNING]).any())


def _verify_run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    listing = list_checkpoints(args.path)
    if listing.empty:
        raise ValueError(
            f"{args.path!r} holds no checkpoint: nothing to verify (give a checkpoint "
            "directory or a run directory with checkpoints in it)"
        )
    checked: list[tuple[str, Any, Verification | None, str]] = []
    failed = False
    for row in listing.itertuples(index=False):
        step = None if pd.isna(row.step) else int(row.step)
        if row.status in _NOT_CHECKPOINTS:
            checked.append((row.path, step, None, f"not checked: {row.status} save"))
            failed = failed or args.strict
            continue
        if row.status in _SET_ASIDE:
            checked.append((row.path, step, None, f"not checked: set aside, {row.status}"))
            failed = failed or args.strict
            continue
        result = _verify_one(row.path, args.data, err, f"reading {row.name}")
        checked.append((row.path, step, result, result.verdict))
        failed = failed or _failed(result, args.strict)
    if args.json:
        _dump(
            {
                "path": args.path,
                "ok": not failed,
                "checkpoints": [
                    {"path": p, "step": s, "status": v}
                    if r is None
                    else {"step": s, **_verification_record(r)}
                    for p, s, r, v in checked
                ],
            },
            out,
        )
    elif args.csv:
        _csv(_verdict_rows(checked), out)
    elif args.quiet:
        # The verdicts alone, one unwrapped line per checkpoint (for grep and cut).
        for path, _, _, verdict in checked:
            print(f"{Path(path).name}: {verdict}", file=out)
    else:
        total = term.width()
        table = pd.DataFrame(
            {
                "name": [Path(p).name for p, _, _, _ in checked],
                "step": pd.array([s for _, s, _, _ in checked], dtype="Int64"),
                "verdict": [v for _, _, _, v in checked],
            }
        )
        term.render(table, _CHECKS, out, total)
        # The findings of the checkpoints that are not sound, or warned of, grouped.
        findings.print_run_findings(
            [(p, r) for p, _, r, _ in checked if r is not None and _worth_showing(r)],
            out,
            total,
        )
        print(file=out)
        _say(run_summary([r for _, _, r, _ in checked], args.data), out, total)
    return EXIT_NO if failed else EXIT_OK


def run_summary(results: Sequence[Verification | None], data: bool) -> str:
    """The line under ``verify`` of a run: how many are sound (and healthy), diverged,
    damaged; whose health is not yet known (``None``: a checkpoint not checked)."""
    checked = [r for r in results if r is not None]
    sound = [r for r in checked if r.ok]
    healthy = sum(1 for r in sound if r.health.verdict == words.HEALTHY)
    unknown = len(sound) - healthy
    diverged = sum(1 for r in checked if r.status == words.DIVERGED)
    damaged = sum(1 for r in checked if r.status == words.NOT_SOUND)
    word = "sound and healthy" if sound and not unknown else "sound"
    told = [f"{len(sound)} of {len(results)} checkpoints {word}"]
    if diverged:
        told.append(f"{diverged} diverged")
    if damaged:
        told.append(f"{damaged} not sound")
    scope = "metadata and data" if data else "metadata"
    note = f"{scope} checked"
    if unknown:
        note += f"; the health of {unknown} not yet known: " + (
            "their data could not all be read" if data else "--data reads their data"
        )
    return ", ".join(told) + f" ({note})"
