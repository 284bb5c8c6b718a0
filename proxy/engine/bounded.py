"""A thread-safe mapping bounded in entries that forgets the least recently used first, in constant time.

Counters remember a count per message and per tool set. A plain dict evicted with `next(iter(d))` is not constant
time: CPython's dict leaves a tombstone for every deleted entry at the front, so each eviction scans past all earlier
ones, and a request of n new messages cost O(n^2). An `OrderedDict` pops its oldest entry in O(1).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """Up to `max_entries` values by key; a lookup that hits makes its entry the most recently used.

    :param max_entries: How many entries to keep; adding one more forgets the least recently used. 0 keeps none.
    """

    def __init__(self, max_entries: int) -> None:
        if max_entries < 0:
            raise ValueError(f"`max_entries` must be at least 0, got {max_entries}.")
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._max_entries = max_entries
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        """The value remembered for `key`, or None."""
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        """Remember `value` for `key` as the most recently used, forgetting the least recently used beyond the bound."""
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            if len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)

    def keys(self) -> list[K]:
        """The keys, least recently used first."""
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._entries.clear()
