"""A small sample of the save campaigns (``make campaigns`` runs them in full)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _campaign(script: str, *args: str) -> dict[str, dict[str, object]]:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--sides", "tinax", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.parametrize("batches", [(), ("--write-batch-mib", "2")], ids=["at once", "in batches"])
def test_jobs_killed_mid_save_resume_and_nothing_partial_is_listed_complete(
    batches: tuple[str, ...],
) -> None:
    # In batches: each written while the next is copied, as a save from an accelerator.
    args = ("--kills", "2", "--mib", "16", "--seed", "1", *batches)
    tinax = _campaign("preemption.py", *args)["tinax"]
    assert tinax["kills"] == 2
    assert tinax["before_write"] + tinax["mid_write"] + tinax["after_commit"] == 2
    assert (tinax["write_batches"] > 3) == bool(batches)
    assert tinax["refused"] == 0
    # The first checkpoint and every resumed one, each loaded and checked bit for bit.
    assert tinax["listed_complete"] >= 3 and tinax["not_exact"] == 0
    assert tinax["partial_listed_complete"] == 0 and tinax["interrupted_not_listed"] == 0


def test_racing_writers_end_with_one_commit_and_a_refused_loser():
    tinax = _campaign("racing_writers.py", "--trials", "4", "--mib", "16")["tinax"]
    assert tinax == {"one commit, loser refused": 4}


def test_a_training_run_killed_while_saving_and_pruning_resumes_from_its_newest_sound_step():
    tinax = _campaign("run_campaign.py", "--kills", "2", "--mib", "4", "--seed", "1")["tinax"]
    assert tinax["kills"] == 2 and tinax["resumes"] == 2
    assert tinax["refused"] == 0 and tinax["not_from_newest"] == 0
    # Every checkpoint listed complete after each kill was loaded and checked bit for bit.
    assert tinax["listed_complete"] >= 1 and tinax["partial_listed_complete"] == 0


def test_a_two_tier_job_killed_in_local_saves_and_promotions_resumes_from_its_newest_sound_step():
    tinax = _campaign("two_tier_campaign.py", "--kills", "2", "--mib", "1", "--seed", "1")["tinax"]
    assert tinax["kills"] == 2 and tinax["resumes"] == 2 and tinax["refused"] == 0
    # Every copy listed complete in either tier, after each kill, was loaded bit for bit.
    assert tinax["listed_complete"] >= 2 and tinax["partial_listed_complete"] == 0
    assert tinax["not_from_newest"] == 0 and tinax["wrong_next_batch"] == 0
    assert tinax["half_copied_left"] == 0 and tinax["stale_waiting"] == 0
    # The unkilled job that times the kills' windows promoted to the bucket end to end
    # (two random kills may both land before a promotion of their own has finished).
    assert tinax["promotion_seconds"] > 0


def test_a_job_of_several_hosts_killed_in_every_process_resumes_bit_for_bit():
    """Every process killed as its promotion of step 20 starts (seed 5; the kill of one,
    named by the survivor, is tests/test_pod.py's), then a resume from the newest step
    every host holds."""
    done = subprocess.run(
        [sys.executable, str(BENCH / "pod_campaign.py"), "--kills", "1", "--seed", "5"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    found = json.loads(line.removeprefix("RESULT "))
    assert found["kills_of_all"] == 1 and found["in_promotion"] == 1 and found["resumes"] == 1
    # The kill left a promotion half done; the restarted job removed it as it opened.
    assert found["kills_leaving_unfinished"] == 1
    for missed in ("hung", "refused", "not_newest", "not_exact", "wrong_next_batch"):
        assert found.get(missed, 0) == 0, found
    assert found.get("left_after_restart", 0) == 0, found
    # Every checkpoint the bucket's stand-in held complete loaded bit for bit.
    assert found["durable_listed_complete"] >= 1 and found["durable_not_exact"] == 0
