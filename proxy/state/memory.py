"""The in-memory state store: bounded LRU with a time to live, all a sidecar needs."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from proxy.engine.plan import EditPlan

V = TypeVar("V")


class _ExpiringLRU(Generic[V]):
    """A dict bounded to `max_entries` (least recently used evicted first) whose entries expire after `ttl`."""

    def __init__(self, max_entries: int, ttl_seconds: float, clock: Callable[[], float]) -> None:
        self._entries: OrderedDict[bytes, tuple[float, V]] = OrderedDict()
        self._max_entries = max_entries
        self._ttl = ttl_seconds
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, value = entry
        if expires < self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: bytes, value: V) -> None:
        self._entries[key] = (self._clock() + self._ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def latest(self, tenant: bytes, chain: Sequence[bytes]) -> tuple[int, V] | None:
        """The value for the longest prefix of `chain`, scanning from the newest message back."""
        for index in range(len(chain) - 1, -1, -1):
            value = self.get(tenant + chain[index])
            if value is not None:
                return index, value
        return None


class MemoryStore:
    """Rewrites and anchors in process memory, bounded in entries and age.

    :param max_entries: How many records of each kind to keep; the least recently used go first. A conversation
        holds one rewrite (the latest) and a couple of anchors at a time, so this bounds conversations too.
    :param ttl_seconds: How long a record lives after it was last written.
    """

    def __init__(
        self, max_entries: int = 100_000, ttl_seconds: float = 86_400, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rewrites: _ExpiringLRU[EditPlan] = _ExpiringLRU(max_entries, ttl_seconds, clock)
        self.anchors: _ExpiringLRU[int] = _ExpiringLRU(max_entries, ttl_seconds, clock)

    async def latest_rewrite(self, tenant: bytes, chain: Sequence[bytes]) -> tuple[int, EditPlan] | None:
        """The rewrite for the longest stored prefix of `chain`."""
        return self.rewrites.latest(tenant, chain)

    async def save_rewrite(self, tenant: bytes, chain_key: bytes, plan: EditPlan) -> None:
        """Store a rewrite."""
        self.rewrites.put(tenant + chain_key, plan)

    async def latest_anchor(self, tenant: bytes, chain: Sequence[bytes]) -> tuple[int, int] | None:
        """The anchor for the longest stored prefix of `chain`."""
        return self.anchors.latest(tenant, chain)

    async def save_anchor(self, tenant: bytes, chain_key: bytes, tokens: int) -> None:
        """Store an anchor."""
        self.anchors.put(tenant + chain_key, tokens)

    async def close(self) -> None:
        """Nothing to release."""
