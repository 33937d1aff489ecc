"""Claim, then write: one live writer per destination, and stale saves told from live ones.

Other writers are real processes: one that holds a claim and sleeps, one killed with
SIGKILL while it holds one, one that forks before it dies.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from claim_holder import Holder

import tinax.explore as ex
from tinax import _claims
from tinax._format.naming import names, words
from tinax._format.storage.location import local
from tinax.checkpointing import NumpyTarget, load_checkpointables, save_checkpointables


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for holder in started:
        holder.close()


def _model(value: float) -> dict[str, dict[str, np.ndarray]]:
    return {"m": {"w": np.full((4, 4), value, np.float32)}}


def _fake_temporary(destination: Path) -> Path:
    """What a killed save leaves: Orbax's temporary directory with part of the data."""
    temporary = destination.with_name(destination.name + names.TEMPORARY_SUFFIX)
    (temporary / "m").mkdir(parents=True)
    (temporary / "m" / "partial").write_bytes(b"x" * 100)
    return temporary


def _claim_file(destination: Path) -> Path:
    return destination.with_name(names.claim_name(destination.name))


def test_a_claim_records_its_owner_and_is_gone_once_released(tmp_path):
    dest = local(tmp_path / "c")
    held = _claims.claim(dest)
    assert held is not None and held.held
    record = json.loads(_claim_file(tmp_path / "c").read_text())
    assert (record["host"], record["pid"]) == (socket.gethostname(), os.getpid())
    assert abs(record["started_ns"] - time.time_ns()) < 60e9
    state = _claims.probe(dest)
    assert state is not None and state.live is True and state.owner == held.owner
    held.release()
    held.release()  # a second release does nothing
    assert not held.held
    assert not _claim_file(tmp_path / "c").exists()
    assert _claims.probe(dest) is None


def test_a_live_owner_is_refused_and_named(tmp_path, holders):
    holder = Holder(tmp_path / "c")
    holders.append(holder)
    start = time.monotonic()
    with pytest.raises(FileExistsError) as refused:
        _claims.claim(local(tmp_path / "c"))
    waited = time.monotonic() - start
    message = str(refused.value)
    assert str(tmp_path / "c") in message
    assert f"pid {holder.pid}" in message and socket.gethostname() in message
    assert "UTC" in message
    # It waited a moment (a listing's probe is brief), not for ever.
    assert _claims.PATIENCE_SECONDS <= waited < _claims.PATIENCE_SECONDS + 5


def test_the_claim_dies_with_its_process(tmp_path, holders):
    holder = Holder(tmp_path / "c")
    holders.append(holder)
    dest = local(tmp_path / "c")
    assert _claims.probe(dest).live is True
    holder.kill()
    state = _claims.probe(dest)
    assert state is not None and state.live is False
    assert state.owner is not None and state.owner.pid == holder.pid
    with _claims.claim(dest) as mine:
        assert mine is not None and mine.owner.pid == os.getpid()


def test_a_forked_child_does_not_keep_its_parents_claim(tmp_path, holders):
    holder = Holder(tmp_path / "c", fork=True)
    holders.append(holder)
    assert holder.child > 0
    holder.kill()
    os.kill(holder.child, 0)  # the child still runs
    assert _claims.probe(local(tmp_path / "c")).live is False


def test_a_save_to_a_destination_a_live_process_writes_is_refused(tmp_path, holders):
    dest = tmp_path / "c"
    temporary = _fake_temporary(dest)
    holder = Holder(dest)
    holders.append(holder)
    with pytest.raises(FileExistsError, match=f"pid {holder.pid}"):
        save_checkpointables(dest, _model(1.0))
    # The refused save touched nothing of the other writer's.
    assert (temporary / "m" / "partial").read_bytes() == b"x" * 100
    assert not dest.exists()
    listing = ex.list_checkpoints(tmp_path)
    assert list(listing["status"]) == [words.IN_PROGRESS]


def test_a_save_clears_what_a_killed_save_left_and_commits(tmp_path, holders, caplog):
    dest = tmp_path / "c"
    temporary = _fake_temporary(dest)
    holder = Holder(dest)
    holders.append(holder)
    holder.kill()
    listing = ex.list_checkpoints(tmp_path)
    assert list(listing["status"]) == [words.INTERRUPTED]
    with caplog.at_level(logging.WARNING, logger="tinax"):
        save_checkpointables(dest, _model(2.0)).result()
    assert f"removing {temporary}" in caplog.text and f"pid {holder.pid}" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # claim file gone too
    out = load_checkpointables(dest, {"m": {"w": NumpyTarget((4, 4), np.float32)}})
    np.testing.assert_array_equal(out["m"]["w"], np.full((4, 4), 2.0, np.float32))


def test_an_unclaimed_leftover_is_cleared_too(tmp_path):
    # Left by a writer that does not claim (Orbax itself): with the claim held, no
    # tinax save can be writing it.
    dest = tmp_path / "c"
    _fake_temporary(dest)
    save_checkpointables(dest, _model(3.0)).result()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


def test_a_committed_checkpoint_is_never_overwritten(tmp_path):
    dest = tmp_path / "c"
    save_checkpointables(dest, _model(1.0)).result()
    before = sorted((p.relative_to(dest), p.stat().st_mtime_ns) for p in dest.rglob("*"))
    with pytest.raises(FileExistsError, match="already exists"):
        save_checkpointables(dest, _model(9.0))
    assert sorted((p.relative_to(dest), p.stat().st_mtime_ns) for p in dest.rglob("*")) == before
    assert not _claim_file(dest).exists()


class _FullDisk:
    """A stateful checkpointable whose background write fails like a full disk."""

    async def save(self, directory):
        async def write():
            await directory.await_creation()
            raise OSError(errno.ENOSPC, "No space left on device (on purpose)")

        return write()

    async def load(self, directory):
        raise AssertionError("never loaded")


def test_a_failed_save_cleans_up_and_gives_up_its_claim(tmp_path):
    response = save_checkpointables(tmp_path / "c", {"bad": _FullDisk(), **_model(1.0)})
    with pytest.raises(OSError, match="No space left on device") as caught:
        response.result()
    assert caught.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []
    save_checkpointables(tmp_path / "c", _model(1.0)).result()


def test_without_locks_a_leftover_is_refused_as_before(tmp_path, monkeypatch):
    dest = tmp_path / "c"
    temporary = _fake_temporary(dest)

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(FileExistsError, match="no locks"):
        save_checkpointables(dest, _model(1.0))
    assert temporary.is_dir()
    save_checkpointables(tmp_path / "other", _model(1.0)).result()


def test_listing_tells_live_from_interrupted_with_ages(tmp_path, holders):
    save_checkpointables(tmp_path / "step_1", _model(1.0)).result()
    live, dead, unclaimed_old = (tmp_path / f"step_{i}" for i in (2, 3, 4))
    for dest in (live, dead, unclaimed_old):
        _fake_temporary(dest)
    holders.append(Holder(live))
    killed = Holder(dead)
    holders.append(killed)
    killed.kill()
    old = time.time() - 2 * _claims.QUIET_SECONDS
    temporary = unclaimed_old.with_name(unclaimed_old.name + names.TEMPORARY_SUFFIX)
    for path in (temporary / "m" / "partial", temporary / "m", temporary):
        os.utime(path, (old, old))
    listing = ex.list_checkpoints(tmp_path)
    assert list(listing["step"]) == [1, 2, 3, 4]
    assert list(listing["status"]) == [
        words.COMPLETE,
        words.IN_PROGRESS,
        words.INTERRUPTED,
        words.INTERRUPTED,
    ]
    ages = [age.total_seconds() for age in listing["age"]]
    assert all(0 <= age < 120 for age in ages[:3])
    # Unclaimed: aged from the oldest change under it.
    assert 2 * _claims.QUIET_SECONDS - 5 < ages[3] < 2 * _claims.QUIET_SECONDS + 120
    # Claim files are never listed.
    assert not any(names.CLAIM_SUFFIX in name for name in listing["name"])


def test_remove_an_interrupted_save_but_never_a_live_one(tmp_path, holders):
    from tinax.checkpointing import remove_interrupted_save

    live, dead = tmp_path / "a", tmp_path / "b"
    live_tmp, dead_tmp = _fake_temporary(live), _fake_temporary(dead)
    holders.append(Holder(live))
    killed = Holder(dead)
    holders.append(killed)
    killed.kill()
    with pytest.raises(FileExistsError, match="in progress"):
        remove_interrupted_save(live_tmp)
    assert live_tmp.is_dir()
    remove_interrupted_save(dead_tmp)
    assert not dead_tmp.exists() and not _claim_file(dead).exists()
    with pytest.raises(FileNotFoundError):
        remove_interrupted_save(dead_tmp)
    with pytest.raises(ValueError, match="not an Orbax temporary"):
        remove_interrupted_save(tmp_path)
    with pytest.raises(TypeError):
        remove_interrupted_save(3)


def test_an_unclaimed_temporary_is_removed_only_once_it_has_gone_quiet(tmp_path):
    from tinax.checkpointing import remove_interrupted_save

    temporary = _fake_temporary(tmp_path / "c")
    # Orbax used directly takes no claim: while its files change, it may be alive.
    with pytest.raises(FileExistsError, match="changed 0 s ago"):
        remove_interrupted_save(temporary)
    old = time.time() - 2 * _claims.QUIET_SECONDS
    for path in (temporary / "m" / "partial", temporary / "m", temporary):
        os.utime(path, (old, old))
    remove_interrupted_save(temporary)
    assert list(tmp_path.iterdir()) == []
