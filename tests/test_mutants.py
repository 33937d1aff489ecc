"""A sample of the mutant campaign (tests/mutants.py; the whole of it: ``make mutants``)."""

from __future__ import annotations

import collections

import mutants
import pytest


@pytest.mark.timeout(600)
def test_a_sample_of_mutants_gives_clean_errors_or_the_original_values() -> None:
    records = mutants.run_campaign(sample=60, timeout=60, progress=False)
    seen = {(r["base"], r["mutant"]) for r in records if r["call"] != mutants.MISUSE}
    assert len(seen) >= 55
    families = {mutants.family(m) for _, m in seen}
    assert {
        "flip",
        "truncate",
        "FIFO",
        "symlink",
        "remove",
        "nesting",
        "bomb",
        "strip",
        "swap",
        "hard link",
        "sparse",
        "deep nesting",
    } <= families
    assert mutants.failures(records) == []
    counts = collections.Counter((r["call"], r["outcome"]) for r in records)
    # Damage was really there: most reads refused it, naming the checkpoint.
    assert counts[("load", "clean error")] >= 25
    assert counts[("verify", "clean error")] >= counts[("load", "clean error")]
    assert counts[("list_checkpoints", "ok")] == len(seen)
    # Every misuse call was refused with a clear TypeError or ValueError.
    assert counts[("misuse", "clean error")] == len(mutants._misuse_calls("/nowhere")) > 15


def test_the_campaign_has_over_400_mutants_of_every_kind(tmp_path) -> None:
    bases = mutants.write_bases(tmp_path)
    cases = mutants.all_mutants(bases)
    assert len(cases) >= 400
    described = " | ".join(desc for _, desc, _ in cases)
    for kind in (
        "flip byte at 0.50 of model/ocdbt.process_0/d/",
        "FIFO as",
        "symlink out as",
        "symlink in:",
        "truncate",
        "huge (1 GiB sparse)",
        "nesting bomb",
        "non-UTF-8",
        "linked to the sibling checkpoint's",
        "socket as",
        "bomb: chunk claims 10^12 elements",
        "strip: checksums removed, then a data byte flipped",
        "swap: array data from another checkpoint",
        "hard link: data file to another checkpoint's",
        "sparse: 50 GB manifest.ocdbt",
        "deep nesting: 100k objects in _METADATA",
        "rewrite: iterator state next_index NaN, its checksum to match",
    ):
        assert kind in described, kind


@pytest.mark.timeout(600)
def test_iterator_states_no_iterator_resumes_from_are_refused_by_load_verify_and_diff() -> None:
    records = mutants.run_campaign(only=("rewrite",), timeout=60, progress=False)
    mine = [r for r in records if r["call"] != mutants.MISUSE]
    assert {r["mutant"] for r in mine} == {
        f"rewrite: iterator state {label}, its checksum to match"
        for label in mutants.ITERATOR_REWRITES
    }
    assert mutants.failures(records) == []
    by_call = collections.defaultdict(collections.Counter)
    for r in mine:
        by_call[r["call"]][r["outcome"]] += 1
    count = len(mutants.ITERATOR_REWRITES)
    # The load and verify refuse each, naming the file; diff calls none of them changed.
    assert by_call["load"] == {"clean error": count}
    assert by_call["verify"] == {"clean error": count}
    assert by_call["diff_table"] == {"ok": count}
    assert all("process_0-of-1.json" in r["message"] for r in mine if r["call"] == "load")
