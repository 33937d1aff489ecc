"""Every public name has a user outside its package, or a stated reason to be public.

A user is code that imports it from the public module: the widgets (which reach the
layers below through their public faces only), the command line, the benchmarks, the
demo and the notebooks. Names without such a user are public for a reason given below
(the seed's contract, what users catch or switch, a plug-in interface, the words tables
hold); anything else stays private in its module.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PUBLIC_MODULES = (
    "tinax.checkpointing",
    "tinax.checkpointing.legacy.v0",
    "tinax.explore",
    "tinax.explore.display",
    "tinax.explore.toolkit",
    "tinax.vocabulary",
    "tinax.widgets",
)
USERS = ("widgets", "tinax/_cli", "bench", "demo", "notebooks")

# Public without a user in this repository, and why.
REASONS = {
    # The seed's contract (seeds/001): the legacy V0 functions, saved and loaded.
    "tinax.checkpointing.legacy.v0": {"save_legacy_v0_pytree", "save_legacy_v0_grain_iterator"},
    # What a user catches (a restore into another input pipeline) and the switch that
    # lets a deliberate change through (docs/guides).
    "tinax.checkpointing": {
        "PipelineMismatchError",
        "allow_pipeline_change",
        "DivergedCheckpointError",
    },
    # The health verdict of one checkpoint, as a script asks for it (docs/guides/integrity.md).
    "tinax.explore": {"checkpoint_health", "Health"},
    # verify(checks=...)'s plug-in interface: what a check of one's own subclasses,
    # receives and returns, and the defaults it is added to.
    "tinax.explore.toolkit": {
        "DEFAULT_CHECKS",
        "Finding",
        "LeafScan",
        "StoredArray",
        "VerifyTarget",
    },
}


def _user_code() -> str:
    return "\n".join(
        path.read_text(encoding="utf-8", errors="replace")
        for folder in USERS
        for path in sorted((REPO / folder).rglob("*"))
        if path.suffix in (".py", ".ipynb")
    )


def _table_words() -> set[str]:
    """The vocabulary's words that a public table's column holds (kinds, statuses,
    tiers, verdicts, severities, ...) and the collections of them: users match on these
    whether or not code here does."""
    from tinax._format.naming import words

    collections = {
        name
        for name, value in vars(words).items()
        if name.isupper() and isinstance(value, tuple | frozenset)
    }
    held = set().union(*(getattr(words, name) for name in collections))
    return collections | {
        name
        for name, value in vars(words).items()
        if name.isupper() and isinstance(value, str) and value in held
    }


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_public_name_has_a_user_or_a_reason(module: str) -> None:
    names = set(importlib.import_module(module).__all__)
    code = _user_code()
    reasons = REASONS.get(module, set())
    if module == "tinax.vocabulary":
        reasons = reasons | _table_words()
    unused = sorted(
        name for name in names - reasons if not re.search(rf"\b{re.escape(name)}\b", code)
    )
    assert unused == [], f"{module} exports names no user outside it needs: {unused}"
    stale = sorted(set(REASONS.get(module, ())) - names)
    assert stale == [], f"reasons given for names {module} no longer exports: {stale}"


def test_the_public_face_stays_small() -> None:
    counts = {m: len(importlib.import_module(m).__all__) for m in PUBLIC_MODULES}
    # 161 names before every one was held to a user (68 in the vocabulary); the restore
    # plan added three (restore_plan, memory_budget and the RestoreTooLargeError a load
    # raises); the health verdict eleven: seven words tables hold, its error, its call
    # and its value, and the call that sets a run's diverged checkpoints aside.
    assert sum(counts.values()) <= 168, counts
    assert counts["tinax.vocabulary"] <= 70, counts


def test_the_check_finds_a_name_without_a_user() -> None:
    assert not re.search(r"\bnever_used_anywhere\b", _user_code())
    assert "OK" in _table_words() and "kept_best" not in _table_words()
