"""The in-memory state store: bounded LRU with a time to live, all a sidecar needs.

It is bounded by entries and by bytes: a rewrite holds one entry per message of its conversation and the messages
compaction created (summaries, cut-down messages), so a few huge conversations must not hold more memory than
many ordinary ones would.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Generic, TypeVar

import orjson

from proxy.engine.plan import Created, EditPlan
from proxy.state.base import StoreEvents, offload_ttl
from proxy.state.offload_memory import RECORD_OVERHEAD, TenantOffloads

V = TypeVar("V")

DEFAULT_MAX_BYTES: Final = 256 * 1024 * 1024
"""What the rewrites of an in-memory store hold at most unless told otherwise."""

DEFAULT_OFFLOAD_BYTES: Final = 64 * 1024 * 1024
"""What the offloaded results of an in-memory store hold at most unless told otherwise."""

PLAN_ENTRY_BYTES: Final = 64
"""Bytes one entry of a plan costs (a `Kept` index object and its slot in the plan's tuple)."""


def plan_bytes(plan: EditPlan) -> int:
    """What a stored plan holds in memory, about: its entries and the messages it created."""
    created = sum(len(orjson.dumps(entry.message, default=str)) for entry in plan.entries if isinstance(entry, Created))
    return RECORD_OVERHEAD + PLAN_ENTRY_BYTES * len(plan.entries) + created


class _ExpiringLRU(Generic[V]):
    """A dict bounded to `max_entries` and `max_bytes`, least recently used evicted first, entries expiring after `ttl`.

    `size` says what a value costs.
    """

    def __init__(
        self,
        max_entries: int,
        ttl_seconds: float,
        clock: Callable[[], float],
        max_bytes: int,
        size: Callable[[V], int],
    ) -> None:
        self._entries: OrderedDict[bytes, tuple[float, V, int]] = OrderedDict()
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._bytes = 0
        self._ttl = ttl_seconds
        self._clock = clock
        self._size = size

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def cost(self) -> int:
        """What the entries held now cost, as charged."""
        return self._bytes

    def get(self, key: bytes) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, value, _cost = entry
        if expires < self._clock():
            self._forget(key)
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: bytes, value: V) -> None:
        cost = self._size(value)
        if cost > self._max_bytes:
            self._forget(key)
            return
        self._forget(key)
        self._entries[key] = (self._clock() + self._ttl, value, cost)
        self._bytes += cost
        while len(self._entries) > self._max_entries or self._bytes > self._max_bytes:
            _key, (_expires, _value, dropped) = self._entries.popitem(last=False)
            self._bytes -= dropped

    def _forget(self, key: bytes) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry[2]

    def latest(self, tenant: bytes, chain: Sequence[bytes], start: int) -> tuple[int, V] | None:
        """The value for the longest prefix of `chain` ending at `start` or later, scanning from the newest back."""
        for index in range(len(chain) - 1, start - 1, -1):
            value = self.get(tenant + chain[index])
            if value is not None:
                return index, value
        return None


class MemoryStore:
    """Rewrites and anchors in process memory, bounded in entries, bytes and age.

    :param max_entries: How many records of each kind to keep; the least recently used go first. A conversation
        holds one rewrite (the latest) and a couple of anchors at a time, so this bounds conversations too.
    :param ttl_seconds: How long a record lives after it was last written (an offloaded result: `offload_ttl`).
    :param max_bytes: What the rewrites may hold in all (see `plan_bytes`); the least recently used go first, and a
        single rewrite larger than this is not kept. Anchors are small and bounded by `max_entries`.
    :param offload_max_bytes: What offloaded results may hold in all (UTF-8 bytes plus `RECORD_OVERHEAD` each),
        shared fairly between tenants (see `TenantOffloads`).
    """

    def __init__(
        self,
        max_entries: int = 100_000,
        ttl_seconds: float = 86_400,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int = DEFAULT_MAX_BYTES,
        offload_max_bytes: int = DEFAULT_OFFLOAD_BYTES,
    ) -> None:
        self.rewrites: _ExpiringLRU[EditPlan] = _ExpiringLRU(max_entries, ttl_seconds, clock, max_bytes, plan_bytes)
        self.rewrites_saved = 0
        """How many rewrites were ever saved: while it stays the same, a lookup that found none would find none."""
        self.anchors: _ExpiringLRU[int] = _ExpiringLRU(
            max_entries, ttl_seconds, clock, max_entries * RECORD_OVERHEAD, lambda _tokens: RECORD_OVERHEAD
        )
        self.events = StoreEvents()
        """Where offloaded results let go early are counted."""
        self.offloads = TenantOffloads(max_entries, offload_ttl(ttl_seconds), clock, offload_max_bytes, self.events)

    async def latest_rewrite(
        self, tenant: bytes, chain: Sequence[bytes], start: int = 0
    ) -> tuple[int, EditPlan] | None:
        """The rewrite for the longest stored prefix of `chain` from `start` (the proxy's own plans: no check)."""
        return self.rewrites.latest(tenant, chain, start)

    async def save_rewrite(self, tenant: bytes, chain_key: bytes, plan: EditPlan) -> None:
        """Store a rewrite."""
        self.rewrites.put(tenant + chain_key, plan)
        self.rewrites_saved += 1

    async def latest_anchor(self, tenant: bytes, chain: Sequence[bytes], start: int = 0) -> tuple[int, int] | None:
        """The anchor for the longest stored prefix of `chain` from `start`."""
        return self.anchors.latest(tenant, chain, start)

    async def save_anchor(self, tenant: bytes, chain_key: bytes, tokens: int) -> None:
        """Store an anchor."""
        self.anchors.put(tenant + chain_key, tokens)

    async def save_offloaded(self, tenant: bytes, contents: Mapping[str, str]) -> None:
        """Store offloaded results."""
        for reference, content in contents.items():
            self.offloads.put(tenant, reference, content)

    async def offloaded(self, tenant: bytes, reference: str) -> str | None:
        """An offloaded result of the tenant."""
        return self.offloads.get(tenant, reference)

    async def touch_offloaded(self, tenant: bytes, references: Sequence[str]) -> None:
        """Keep offloaded results alive."""
        for reference in references:
            self.offloads.touch(tenant, reference)

    @property
    def offloaded_bytes(self) -> int:
        """What the offloaded results held now cost, as charged against `offload_max_bytes`."""
        return self.offloads.cost

    async def close(self) -> None:
        """Nothing to release."""
