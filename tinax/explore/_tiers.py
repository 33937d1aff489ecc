"""A two-tier run listed as one: the checkpoints of both tiers, and where each is.

A run saved by ``TrainingRun(directory, local=LOCAL_DIR, ...)`` keeps checkpoints in two
directories (``tinax._format.records.tiers`` tells which from their records). Listed
from either, it is one table: a step committed in both tiers is one row (``tier`` is
``both``, ``path`` the local copy, the quicker to read); every other row keeps its own
tier. ``promotion`` says which local checkpoints wait for their promotion
(``waiting``) and which one is being copied now (``promoting``).

Rows are plain dicts here (``_listed.ListingRows``): the table is made of them last.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tinax._format.naming import words
from tinax._format.records import tiers
from tinax._format.storage.location import Location
from tinax.explore import _health
from tinax.explore._listed import ListingRows

TIER_COLUMNS = ("tier", "promotion")


def sort_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """A listing's order: by step (rows without one last), then name, then tier."""
    step = row["step"]
    return (step is None, step or 0, str(row["name"]), str(row.get("tier") or ""))


def with_tiers(
    root: Location,
    listed: ListingRows,
    listing: Callable[[Location], ListingRows],
    run: tiers.TwoTierRun | None,
) -> ListingRows:
    """``listed`` (the listing of ``root``) with the other tier's checkpoints, if ``root``
    is a tier of a two-tier run; ``listed`` itself otherwise.

    Args:
      root: The directory listed.
      listed: Its rows.
      listing: Lists another directory the same way.
      run: The two-tier run ``root`` is a tier of (``tiers.two_tier_run``), if any.
    """
    if run is None:
        return listed
    other = run.other(root)
    other_listed = None
    if other is not None:
        try:
            other_listed = listing(other)
        except (OSError, ValueError):
            other_listed = None  # that tier is not there (yet): this one is listed alone
    here_local = run.local is not None and tiers.same_directory(root, run.local)
    local = listed if here_local else other_listed
    durable = other_listed if here_local else listed
    rows: list[dict[str, Any]] = []
    for part, tier in ((local, words.TIER_LOCAL), (durable, words.TIER_DURABLE)):
        if part is not None:
            rows += [{**row, "tier": tier} for row in part.rows]

    def steps(tier: str, status: str = words.COMPLETE) -> set[int]:
        return {
            r["step"]
            for r in rows
            if r["status"] == status and r["tier"] == tier and r["step"] is not None
        }

    both = steps(words.TIER_LOCAL) & steps(words.TIER_DURABLE)
    # A copy whose writer lives (an interrupted one is done again by the resumed run).
    durable_busy = steps(words.TIER_DURABLE, words.IN_PROGRESS)
    merged = []
    for row in rows:
        in_both = row["status"] == words.COMPLETE and row["step"] in both
        if in_both and row["tier"] == words.TIER_DURABLE:
            continue  # the step is its local copy's row
        if in_both:
            row["tier"] = words.TIER_BOTH
        waiting = (
            row["tier"] == words.TIER_LOCAL
            and row["status"] == words.COMPLETE
            and row["step"] is not None
            and row["step"] in run.promote
        )
        row["promotion"] = (
            None
            if not waiting
            else words.PROMOTION_RUNNING
            if row["step"] in durable_busy
            else words.PROMOTION_WAITING
        )
        merged.append(row)
    merged.sort(key=sort_key)
    parts = [p for p in (local, durable) if p is not None]
    attrs: dict[str, Any] = {
        "errors": {k: v for p in parts for k, v in p.attrs.get("errors", {}).items()},
        _health.HEALTHS: {k: v for p in parts for k, v in p.attrs.get(_health.HEALTHS, {}).items()},
        "unchecked": sorted(u for p in parts for u in p.attrs.get("unchecked", [])),
        "remote": listed.attrs.get("remote", False),
    }
    return ListingRows(merged, attrs, tiers=True)
