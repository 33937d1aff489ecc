"""A two-tier run listed as one: the checkpoints of both tiers, and where each is.

A run saved by ``TrainingRun(directory, local=LOCAL_DIR, ...)`` keeps checkpoints in two
directories (``tinax._format.records.tiers`` tells which from their records). Listed from
either, it is one table: a step committed in both tiers is one row (``tier`` is
``both``, ``path`` the local copy, the quicker to read); every other row keeps its own
tier. ``promotion`` says which local checkpoints wait for their promotion
(``waiting``) and which one is being copied now (``promoting``).
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from tinax._format.naming import words
from tinax._format.records import tiers
from tinax._format.storage.location import Location

TIER_COLUMNS = ("tier", "promotion")


def with_tiers(
    root: Location,
    table: pd.DataFrame,
    listing: Callable[[Location], pd.DataFrame],
    run: tiers.TwoTierRun | None,
) -> pd.DataFrame:
    """``table`` (the listing of ``root``) with the other tier's checkpoints, if ``root``
    is a tier of a two-tier run; ``table`` itself otherwise.

    Args:
      root: The directory listed.
      table: Its ``list_checkpoints`` rows.
      listing: Lists another directory the same way.
      run: The two-tier run ``root`` is a tier of (``tiers.two_tier_run``), if any.
    """
    if run is None:
        return table
    other = run.other(root)
    other_table = None
    if other is not None:
        try:
            other_table = listing(other)
        except (OSError, ValueError):
            other_table = None  # that tier is not there (yet): this one is listed alone
    here_local = run.local is not None and tiers.same_directory(root, run.local)
    local = table if here_local else other_table
    durable = other_table if here_local else table
    parts = []
    if local is not None:
        parts.append(local.assign(tier=pd.array([words.TIER_LOCAL] * len(local), dtype="string")))
    if durable is not None:
        parts.append(
            durable.assign(tier=pd.array([words.TIER_DURABLE] * len(durable), dtype="string"))
        )
    merged = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    complete = merged["status"] == words.COMPLETE
    steps = merged["step"]
    local_done = set(steps[complete & (merged["tier"] == words.TIER_LOCAL)].dropna().astype(int))
    durable_done = set(
        steps[complete & (merged["tier"] == words.TIER_DURABLE)].dropna().astype(int)
    )
    # A copy whose writer lives (an interrupted one is done again by the resumed run).
    durable_busy = set(
        steps[(merged["status"] == words.IN_PROGRESS) & (merged["tier"] == words.TIER_DURABLE)]
        .dropna()
        .astype(int)
    )
    both = local_done & durable_done
    keep = ~(complete & (merged["tier"] == words.TIER_DURABLE) & steps.isin(both))
    merged = merged[keep].copy()
    is_both = (merged["status"] == words.COMPLETE) & merged["step"].isin(both)
    merged.loc[is_both, "tier"] = words.TIER_BOTH
    promotion: list[str | None] = []
    for status, step, tier in zip(merged["status"], merged["step"], merged["tier"], strict=True):
        waiting = (
            tier == words.TIER_LOCAL
            and status == words.COMPLETE
            and not pd.isna(step)
            and int(step) in run.promote
        )
        if not waiting:
            promotion.append(None)
        elif int(step) in durable_busy:
            promotion.append(words.PROMOTION_RUNNING)
        else:
            promotion.append(words.PROMOTION_WAITING)
    merged["promotion"] = pd.array(promotion, dtype="string")
    merged = merged.sort_values(["step", "name", "tier"], na_position="last", kind="stable")
    merged = merged.reset_index(drop=True)
    errors: dict[str, str] = {}
    unchecked: list[str] = []
    for part in (local, durable):
        if part is not None:
            errors.update(part.attrs.get("errors", {}))
            unchecked.extend(part.attrs.get("unchecked", []))
    merged.attrs["errors"] = errors
    merged.attrs["unchecked"] = sorted(unchecked)
    merged.attrs["remote"] = table.attrs.get("remote", False)
    return merged
