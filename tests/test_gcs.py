"""What only gs:// has: request counts, saves killed in place, wrong buckets, no answer.

Against a real fake-gcs-server behind a counting proxy (``tests/gcs.py``): the
requests counted are the ones gcsfs, tensorstore and Orbax really made.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import numpy as np
import pytest
from conftest import BUCKET
from gcs import DENIED_BUCKET, free_port, is_listing, object_name

import tinax.explore as ex
from tinax import _claims
from tinax._format.naming import words
from tinax._format.storage import gcs_listing
from tinax._paths import location
from tinax.checkpointing import (
    load_checkpointables,
    remove_interrupted_save,
    save_checkpointables,
)
from tinax.explore import toolkit

# The OCDBT files that hold array chunks (B+tree nodes live beside the manifest).
_DATA_FILES = "/ocdbt.process_"


def _prefix() -> str:
    return f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"


def _data_reads(made: list[tuple[str, str, int]]) -> list[tuple[str, int]]:
    found = []
    for request in made:
        name = object_name(request)
        if name is not None and _DATA_FILES in name:
            found.append((name, request[2]))
    return found


def _recursive_listings(made: list[tuple[str, str, int]]) -> int:
    return sum(
        1
        for r in made
        if is_listing(r)
        and parse_qs(urlsplit(r[1]).query, keep_blank_values=True).get("delimiter") == [""]
    )


@pytest.fixture(scope="module")
def big_run(gcs):
    """Four checkpoints of three 256 KiB leaves each."""
    run = _prefix()
    rng = np.random.default_rng(0)
    leaves = {name: rng.standard_normal((256, 256)).astype(np.float32) for name in "abc"}
    for step in range(4):
        save_checkpointables(f"{run}/{step}", {"model": {**leaves, "step": step}}).result()
    return run, leaves


def test_a_listing_lists_the_run_once_and_reads_no_array_data(gcs, big_run):
    run, _ = big_run
    with gcs.counting() as first:
        table = ex.list_checkpoints(run, cache=toolkit.ListingCache())
    assert list(table["status"]) == [words.COMPLETE] * 4
    assert _recursive_listings(first) == 1
    # Besides that: one probe that the run exists, and metadata reads.
    assert sum(map(is_listing, first)) <= 2
    assert _data_reads(first) == []

    cache = toolkit.ListingCache()
    ex.list_checkpoints(run, cache=cache)
    with gcs.counting() as again:
        ex.list_checkpoints(run, cache=cache)
    # Unchanged checkpoints are not read again: the run costs one listing.
    assert _recursive_listings(again) == 1 and len(again) <= 3, again


def test_the_table_reads_metadata_and_read_leaf_one_leafs_chunks(gcs, big_run):
    run, leaves = big_run
    with gcs.counting() as table_requests:
        table = ex.checkpoint_table(f"{run}/3")
    assert list(table["shape"][:3]) == [(256, 256)] * 3
    assert _data_reads(table_requests) == []
    assert _recursive_listings(table_requests) == 1

    with gcs.counting() as leaf_requests:
        value = ex.read_leaf(f"{run}/3", "model", "['b']")
    np.testing.assert_array_equal(value, leaves["b"])
    data = _data_reads(leaf_requests)
    leaf_bytes = leaves["b"].nbytes
    assert data and leaf_bytes <= sum(n for _, n in data) < 1.1 * leaf_bytes, data


_KILLED_SAVE = textwrap.dedent(
    """
    import sys
    import numpy as np
    from tinax.checkpointing import save_checkpointables
    big = {str(i): np.full((1024, 1024), i, np.float32) for i in range(24)}
    save_checkpointables(sys.argv[1], {"model": big}).result()
    """
)


def _killed_save(gcs, dest: str) -> None:
    """Starts a real save in another process and kills it before it commits."""
    process = subprocess.Popen([sys.executable, "-c", _KILLED_SAVE, dest])
    key = dest[len("gs://") :].split("/", 1)[1]

    seen = len(gcs.requests())

    def writing_arrays() -> bool:
        nonlocal seen
        made = gcs.requests(seen)
        seen += len(made)
        return any(
            method in ("POST", "PUT") and key in unquote(path) and "ocdbt.process" in unquote(path)
            for method, path, _ in made
        )

    try:
        deadline = time.monotonic() + 120
        while not writing_arrays():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the save ended before it could be killed")
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()


def test_a_save_killed_in_place_is_never_loadable_and_a_new_save_replaces_it(gcs, monkeypatch):
    run = _prefix()
    dest = f"{run}/7"
    _killed_save(gcs, dest)
    listed = ex.list_checkpoints(run)
    assert list(listed["name"]) == ["7"]
    assert listed["status"][0] == words.IN_PROGRESS  # written seconds ago: may be live
    with pytest.raises(ValueError, match="has not committed"):
        ex.checkpoint_table(dest)
    with pytest.raises(ValueError, match="has not committed"):
        load_checkpointables(dest, {"model": {}})
    with pytest.raises(FileExistsError, match="in progress"):
        save_checkpointables(dest, {"model": {"w": np.ones(3)}})

    # Once quiet for longer than a live save stays silent, it is interrupted.
    monkeypatch.setattr(_claims, "QUIET_SECONDS", 0.0)
    listed = ex.list_checkpoints(run)
    assert listed["status"][0] == words.INTERRUPTED
    with pytest.raises(ValueError, match="has not committed"):
        load_checkpointables(dest, {"model": {}})

    # The resumed job saves the same step again: the leftover is removed first.
    save_checkpointables(dest, {"model": {"w": np.arange(3.0)}}).result()
    assert list(ex.list_checkpoints(run)["status"]) == [words.COMPLETE]
    restored = load_checkpointables(dest, {"model": {"w": np.zeros(3)}})
    np.testing.assert_array_equal(restored["model"]["w"], np.arange(3.0))
    assert set(ex.checkpoint_table(dest)["key"]) == {"['w']"}


def test_remove_interrupted_save_removes_an_uncommitted_directory(gcs, monkeypatch):
    run = _prefix()
    _killed_save(gcs, f"{run}/1")
    with pytest.raises(FileExistsError, match="in progress"):
        remove_interrupted_save(f"{run}/1")
    monkeypatch.setattr(_claims, "QUIET_SECONDS", 0.0)
    remove_interrupted_save(f"{run}/1")
    with pytest.raises(FileNotFoundError):
        ex.list_checkpoints(run)
    save_checkpointables(f"{run}/2", {"model": {"w": np.ones(2)}}).result()
    with pytest.raises(ValueError, match="not an Orbax temporary directory or a save"):
        remove_interrupted_save(f"{run}/2")


def test_a_file_where_a_checkpoint_would_go_is_never_taken_for_a_save(gcs, monkeypatch):
    run = _prefix()
    where = location(f"{run}/3")
    where.write_new(b"notes")
    monkeypatch.setattr(_claims, "QUIET_SECONDS", 0.0)
    with pytest.raises(FileExistsError, match="already exists"):
        save_checkpointables(f"{run}/3", {"model": {"w": np.ones(2)}})
    assert where.is_file()


def test_a_wrong_bucket_is_a_clear_error_at_once(gcs):
    url = "gs://no-such-bucket-here/run"
    for call in (
        lambda: ex.list_checkpoints(url),
        lambda: ex.checkpoint_table(f"{url}/1"),
        lambda: load_checkpointables(f"{url}/1", {"model": {}}),
        lambda: save_checkpointables(f"{url}/1", {"model": {"w": np.ones(2)}}),
    ):
        with pytest.raises(FileNotFoundError, match="bucket 'no-such-bucket-here' does not exist"):
            call()


def test_a_bucket_this_account_may_not_read_is_a_clear_error_at_once(gcs):
    url = f"gs://{DENIED_BUCKET}/run"
    with pytest.raises(PermissionError, match=f"cannot .* {url!r}: permission denied"):
        ex.list_checkpoints(url)
    with pytest.raises(PermissionError, match="permission denied"):
        load_checkpointables(f"{url}/1", {"model": {}})


def test_urls_without_a_bucket_or_climbing_out_of_it_are_refused():
    with pytest.raises(ValueError, match="names no bucket"):
        ex.list_checkpoints("gs://")
    with pytest.raises(ValueError, match="climbs above its bucket"):
        ex.list_checkpoints("gs://bucket/../other")


def test_an_endpoint_that_never_answers_is_an_error_within_the_deadline(gcs):
    script = textwrap.dedent(
        """
        import tinax._format.storage.gcs as gcs
        import tinax.explore as ex
        gcs.REQUEST_TIMEOUT = 2.0
        try:
            ex.list_checkpoints("gs://tinax-test/run")
        except OSError as e:
            print(type(e).__name__, e)
        """
    )
    env = {**os.environ, "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{free_port()}"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    # The deadline, not the 60 s bound of the subprocess, ended the call.
    kind, message = result.stdout.split(" ", 1)
    assert kind == "TimeoutError", result.stdout + result.stderr
    assert "'gs://tinax-test/run'" in message and "within 2 s" in message


def _objects(gcs, root: str, names: list[str]) -> Any:
    """``names`` written under ``root`` (``bucket/key``), each holding its own name."""
    import gcsfs

    fs = gcsfs.GCSFileSystem(use_listings_cache=False)
    fs.pipe({f"{root}/{name}": name.encode() for name in names})
    return fs


@pytest.mark.parametrize(
    "shape",
    ["folders", "one folder", "small", "a file"],
)
def test_a_tree_of_many_pages_is_listed_whole_in_a_few_round_trips(gcs, monkeypatch, shape):
    root = _prefix().removeprefix("gs://")
    # Pages of 10 objects: a run of 23 folders of 3 to 7 objects, files among them, is
    # 12 pages.
    if shape == "folders":
        names = [f"step_{i:03d}/f{j}" for i in range(23) for j in range(3 + i % 5)]
        names += ["record.json", "step_005.json", "zz/deep/er/file"]
    elif shape == "one folder":
        names = [f"only/f{j:02d}" for j in range(35)]
    else:
        names = ["a/b", "c"]
    fs = _objects(gcs, root, names)
    path = f"{root}/c" if shape == "a file" else root
    monkeypatch.setattr(gcs_listing, "PAGE", 10)
    with gcs.counting() as made:
        found = gcs_listing.list_tree(fs, path, 30)
    expected = fs.find(path, detail=True)
    assert sorted(found) == sorted(expected)
    assert all(found[k]["size"] == expected[k]["size"] for k in found)
    listings = [r for r in made if is_listing(r)]
    pages = -(-len(expected) // 10)
    if shape == "folders":
        # The first page, the folders, and the ranges (each some pages' worth, read at
        # once): pages of 10 make the ranges short, so their ends cost more than they
        # would at 1,000 a page.
        assert len(listings) <= 1.5 * pages + 2
        queries = [parse_qs(urlsplit(r[1]).query) for r in listings]
        ranges = [q for q in queries if "startOffset" in q and "delimiter" not in q]
        assert len(ranges) >= 5
        # Each range is asked for under its folders' own prefix, not the whole tree's:
        # an emulator scans every name under the prefix for each page.
        key = root.partition("/")[2]
        assert all(len(q["prefix"][0]) > len(f"{key}/") for q in ranges), ranges
    elif shape == "one folder":
        assert len(listings) == pages
    elif shape == "small":
        assert len(listings) == 1
    else:
        assert list(found) == [path]


@pytest.mark.parametrize("padded", [True, False])
def test_a_large_tree_s_folders_are_grouped_where_their_names_branch(padded):
    # 1,000 checkpoints at about 40 objects each: groups of at most 23 folders, in
    # order, none spanning two hundreds of zero-padded steps (where the prefix a group
    # is asked under would widen to all of them).
    folders = sorted(f"run/step_{i:06d}/" if padded else f"run/{i}/" for i in range(1, 1001))
    groups = gcs_listing._groups(folders, 23)
    assert [name for group in groups for name in group] == folders
    # None left (removed since the first page was read): nothing to ask for.
    assert gcs_listing._groups([], 23) == []
    assert all(0 < len(group) <= 23 for group in groups)
    assert len(groups) <= 1.3 * len(folders) / 23
    shared = [gcs_listing._common_start(group[0], group[-1]) for group in groups]
    if padded:
        assert all(len(prefix) >= len("run/step_0001") for prefix in shared)
    else:
        # "run/1/", "run/10/", "run/100/", "run/1000/", "run/101/", ...: a ninth of the
        # names under each group's prefix.
        assert all(len(prefix) >= len("run/1") for prefix in shared)
