"""The bounded cache every kept read goes through (``tinax._format.lru``)."""

from __future__ import annotations

import threading

import pytest

from tinax._format.lru import LruCache


def test_the_least_recently_used_entry_goes_first() -> None:
    cache: LruCache[str, int] = LruCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # now "b" is the least recently used
    cache.put("c", 3)
    assert list(cache) == ["a", "c"] and "b" not in cache and cache.get("b") is None
    cache.max_entries = 1
    assert list(cache) == ["c"]
    cache.max_entries = 0
    cache.put("d", 4)
    assert len(cache) == 0


def test_a_bytes_bound_keeps_the_newest_entry_even_alone_over_it() -> None:
    cache: LruCache[str, bytes] = LruCache(max_bytes=10, size=len)
    cache.put("a", b"1234")
    cache.put("b", b"5678")
    assert list(cache) == ["a", "b"] and cache.nbytes == 8
    cache.put("c", b"90")  # 10 bytes: still within
    assert list(cache) == ["a", "b", "c"]
    cache.put("a", b"x")  # replaced, not counted twice
    assert cache.nbytes == 7 and list(cache) == ["b", "c", "a"]
    assert cache.pop("b") == b"5678" and cache.pop("b") is None
    assert cache.nbytes == 3 and list(cache) == ["c", "a"]
    cache.put("d", b"y" * 20)
    assert list(cache) == ["d"] and cache.nbytes == 20
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0


def test_get_or_compute_computes_once_and_keeps_none_but_not_errors() -> None:
    cache: LruCache[str, int | None] = LruCache(4)
    calls: list[str] = []

    def compute(value: int | None) -> int | None:
        calls.append("x")
        return value

    assert cache.get_or_compute("k", lambda: compute(7)) == 7
    assert cache.get_or_compute("k", lambda: compute(8)) == 7
    assert cache.get_or_compute("none", lambda: compute(None)) is None
    assert cache.get_or_compute("none", lambda: compute(9)) is None
    assert len(calls) == 2

    def fail() -> int:
        raise OSError("unreadable")

    with pytest.raises(OSError, match="unreadable"):
        cache.get_or_compute("bad", fail)
    assert "bad" not in cache


def test_threads_share_one_bounded_cache() -> None:
    cache: LruCache[int, int] = LruCache(16)
    barrier = threading.Barrier(4)

    def work(offset: int) -> None:
        barrier.wait()
        for i in range(2000):
            key = (i * 7 + offset) % 40
            assert cache.get_or_compute(key, lambda key=key: key * key) == key * key

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cache) == 16 and all(cache.get(k) == k * k for k in cache)


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"max_entries": -1}, ValueError),
        ({"max_entries": True}, TypeError),
        ({"max_entries": 2.0}, TypeError),
        ({"max_bytes": 10}, TypeError),  # no size to measure with
        ({"max_bytes": -1, "size": len}, ValueError),
    ],
)
def test_bad_bounds_are_refused(arguments: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        LruCache(**arguments)  # type: ignore[arg-type]
