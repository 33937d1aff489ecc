"""A bounded, thread-safe cache that forgets the least recently used entries first.

Reads of a checkpoint keep what they parsed or walked (layouts, store walks, listing
verdicts, drift sums, scans, blocks read ahead) so that the next call on an unchanged checkpoint does
not read it again; each keeps it here, bounded by a number of entries, a number of
bytes, or both.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


class LruCache(Generic[_K, _V]):
    """A map of at most ``max_entries`` entries (and ``max_bytes``, if given) that
    forgets the least recently used first. Every method is thread-safe.

    Args:
      max_entries: How many entries are kept at most (``0`` keeps none; ``None``,
        no bound on the count).
      max_bytes: How many bytes the entries may hold together, as ``size`` tells;
        the newest entry is kept even when it alone holds more.
      size: The bytes a value holds; required with ``max_bytes``.

    Raises:
      TypeError: If a bound is not an int, or ``max_bytes`` comes without ``size``.
      ValueError: If a bound is negative.
    """

    def __init__(
        self,
        max_entries: int | None = None,
        *,
        max_bytes: int | None = None,
        size: Callable[[_V], int] | None = None,
    ) -> None:
        if max_bytes is not None:
            check_bound("max_bytes", max_bytes)
            if size is None:
                raise TypeError("max_bytes needs size, the bytes a value holds")
        self._lock = threading.Lock()
        self._entries: OrderedDict[_K, tuple[_V, int]] = OrderedDict()
        self._bytes = 0
        self._max_bytes = max_bytes
        self._size = size
        self.max_entries = max_entries

    @property
    def max_entries(self) -> int | None:
        """How many entries are kept at most; setting it forgets those past it."""
        return self._max_entries

    @max_entries.setter
    def max_entries(self, value: int | None) -> None:
        if value is not None:
            check_bound("max_entries", value)
        with self._lock:
            self._max_entries = value
            self._trim()

    def get(self, key: _K, default: _V | None = None) -> _V | None:
        """The value kept under ``key`` (now the most recently used), else ``default``."""
        found = self._touch(key)
        return default if found is None else found[0]

    def put(self, key: _K, value: _V) -> None:
        """Keeps ``value`` under ``key`` as the most recently used entry."""
        nbytes = self._size(value) if self._size is not None else 0
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (value, nbytes)
            self._bytes += nbytes
            self._trim()

    def pop(self, key: _K, default: _V | None = None) -> _V | None:
        """Forgets ``key``: its value, else ``default``."""
        with self._lock:
            found = self._entries.pop(key, None)
            if found is None:
                return default
            self._bytes -= found[1]
            return found[0]

    def get_or_compute(self, key: _K, compute: Callable[[], _V]) -> _V:
        """The value kept under ``key``, else what ``compute()`` returns, kept.

        ``compute`` runs outside the lock (two threads missing the same key may both
        run it; the last to finish is kept); what it raises is not kept.
        """
        found = self._touch(key)
        if found is not None:
            return found[0]
        value = compute()
        self.put(key, value)
        return value

    def clear(self) -> None:
        """Forgets every entry."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __iter__(self) -> Iterator[_K]:
        """The keys, least recently used first (a copy: the cache may change meanwhile)."""
        with self._lock:
            return iter(list(self._entries))

    @property
    def nbytes(self) -> int:
        """The bytes the kept values hold together, as ``size`` tells (0 without it)."""
        with self._lock:
            return self._bytes

    def _touch(self, key: _K) -> tuple[_V, int] | None:
        """The entry under ``key`` (a value may be ``None``), now the most recently used."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def _trim(self) -> None:
        entries = self._entries
        if self._max_entries is not None:
            while len(entries) > self._max_entries:
                self._bytes -= entries.popitem(last=False)[1][1]
        if self._max_bytes is not None:
            while len(entries) > 1 and self._bytes > self._max_bytes:
                self._bytes -= entries.popitem(last=False)[1][1]


def check_bound(name: str, value: object) -> None:
    """Refuses ``value`` as a cache's bound ``name`` unless it is a non-negative int.

    Raises:
      TypeError: If ``value`` is not an int (a bool is not one).
      ValueError: If it is negative.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
