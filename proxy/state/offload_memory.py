"""The offloaded results of the in-memory store: bounded in entries and bytes, and fair between tenants.

One least-recently-used queue for every tenant would let one tenant's flood of offloaded results evict every other
tenant's for good. Here a write that takes the store over its budget evicts the writer's own least recently used results
first, for as long as the writer holds more than an even share of the budget, in bytes or in entries (the budget divided
among the tenants holding any), and more than the result just written; only a writer within its share evicts the least
recently used result of anyone, which is then a result of a tenant holding more than its share or an old one. So a
tenant flooding alone evicts only its own results (a tenant within half the budget keeps all of its own while another
writes results of up to half the budget each), and a single tenant (a sidecar) still has the whole budget.

What is evicted is not lost for good either way: a conversation re-sends its originals every turn, and a read of a
result no longer held is answered from them and stores it again (`proxy.pipeline.offload.reads`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from proxy.state.base import StoreEvents

RECORD_OVERHEAD: Final = 200
"""Bytes one record costs besides its value: the key, the expiry, the dict slot."""


def offload_cost(text: str) -> int:
    """What one offloaded result is charged: its UTF-8 bytes and `RECORD_OVERHEAD`."""
    return RECORD_OVERHEAD + len(text.encode("utf-8", "surrogatepass"))


class TenantOffloads:
    """Offloaded texts by tenant and reference, expiring `ttl_seconds` after their last write or touch.

    :param max_entries: How many results to hold in all.
    :param ttl_seconds: How long a result lives after its last write or touch.
    :param clock: Monotonic seconds.
    :param max_bytes: What the results may cost in all (`offload_cost`); a single larger one is not kept.
    :param events: Where evictions are counted, by reason: `share` (the writer's own, beyond its share), `budget`
        (anyone's least recently used), `too_large` (a result larger than the whole budget, not kept).
    """

    def __init__(
        self, max_entries: int, ttl_seconds: float, clock: Callable[[], float], max_bytes: int, events: StoreEvents
    ) -> None:
        self._order: OrderedDict[tuple[bytes, str], None] = OrderedDict()
        """Every result, least recently used first."""
        self._tenants: dict[bytes, OrderedDict[str, tuple[float, str, int]]] = {}
        """Each tenant's results (expiry, text, cost), least recently used first."""
        self._held: dict[bytes, int] = {}
        self._bytes = 0
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._ttl = ttl_seconds
        self._clock = clock
        self._events = events

    def __len__(self) -> int:
        return len(self._order)

    @property
    def cost(self) -> int:
        """What the results held now cost, as charged."""
        return self._bytes

    def held_by(self, tenant: bytes) -> int:
        """What the tenant's results held now cost."""
        return self._held.get(tenant, 0)

    def get(self, tenant: bytes, reference: str) -> str | None:
        """The tenant's text under `reference`, now the most recently used, or None."""
        results = self._tenants.get(tenant)
        entry = results.get(reference) if results is not None else None
        if results is None or entry is None:
            return None
        if entry[0] < self._clock():
            self._forget(tenant, reference)
            return None
        results.move_to_end(reference)
        self._order.move_to_end((tenant, reference))
        return entry[1]

    def touch(self, tenant: bytes, reference: str) -> None:
        """Restart the time to live of the tenant's text under `reference`, if it is held."""
        text = self.get(tenant, reference)
        if text is not None:
            self.put(tenant, reference, text)

    def put(self, tenant: bytes, reference: str, text: str) -> None:
        """Keep `text` for the tenant, evicting what the budget needs (see the module docstring)."""
        self._forget(tenant, reference)
        cost = offload_cost(text)
        if cost > self._max_bytes:
            self._events.evict("too_large")
            return
        self._tenants.setdefault(tenant, OrderedDict())[reference] = (self._clock() + self._ttl, text, cost)
        self._order[(tenant, reference)] = None
        self._held[tenant] = self._held.get(tenant, 0) + cost
        self._bytes += cost
        while len(self._order) > self._max_entries or self._bytes > self._max_bytes:
            own = self._tenants.get(tenant)
            if own and len(own) > 1 and self._over_share(tenant, own):
                self._forget(tenant, next(iter(own)))
                self._events.evict("share")
            else:
                self._forget(*next(iter(self._order)))
                self._events.evict("budget")

    def _over_share(self, tenant: bytes, own: OrderedDict[str, tuple[float, str, int]]) -> bool:
        """Whether the tenant holds more than an even share of the bytes or of the entries."""
        tenants = len(self._tenants)
        return self._held[tenant] * tenants > self._max_bytes or len(own) * tenants > self._max_entries

    def _forget(self, tenant: bytes, reference: str) -> None:
        results = self._tenants.get(tenant)
        entry = results.pop(reference, None) if results is not None else None
        if results is None or entry is None:
            return
        del self._order[(tenant, reference)]
        self._bytes -= entry[2]
        self._held[tenant] -= entry[2]
        if not results:
            del self._tenants[tenant], self._held[tenant]
