"""A mapping bounded by its number of entries: the least recently used entry goes first.

What the proxy learns between requests (windows, calibrations, which models it already warned about) is keyed by
what clients send; every such table is one of these, so no stream of distinct keys can grow it without bound.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most `max_entries` entries; reading or writing an entry makes it the most recent.

    :param max_entries: The bound; writing past it evicts the least recently used entry, in O(1).
    :raises ValueError: If `max_entries` is not positive.
    """

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"`max_entries` must be at least 1, got {max_entries}.")
        self.max_entries = max_entries
        self._entries: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        """The value for `key` (now the most recent), or None."""
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Store `value` as the most recent entry, evicting the least recent one past the bound."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
