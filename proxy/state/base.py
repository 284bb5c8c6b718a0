"""The state store interface: two kinds of record, both found by the longest matching conversation prefix.

- A *rewrite*: the edit plan the proxy applied to a conversation's original prefix, keyed by that prefix's chain
  hash, so the next request extending it is rewritten the same way.
- An *anchor*: the provider-reported token count for a prefix of what was sent upstream, keyed by its chain hash,
  so the next request extending it is estimated as anchor plus its new messages.
- An *offloaded result*: the full text of a tool result the `tool_result_offloading` strategy replaced with a
  reference, keyed by that reference (a content hash), so the model can read it back through the proxy's read tool.

Every key is scoped by the caller's tenant (a keyed hash of its credential): one caller can never find, read or
overwrite another's records, even for byte-identical conversations.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final, Protocol, TypeVar

from proxy.engine.plan import EditPlan

V = TypeVar("V")

logger = logging.getLogger("compaction_proxy.state")

OFFLOAD_REFRESH_SHARE: Final = 1 / 8
"""Offloaded results are refreshed at most once per this share of the state's time to live, and kept this share
longer than the rest: a result refreshed that long before its conversation's last request still outlives it."""


def offload_ttl(ttl_seconds: float) -> float:
    """How long an offloaded result lives after its last write or refresh (see `OFFLOAD_REFRESH_SHARE`)."""
    return ttl_seconds * (1 + OFFLOAD_REFRESH_SHARE)


class StoreEvents:
    """What a state store refused or let go, reported to whoever counts it (the compaction service's metrics).

    A record read from a shared store comes from outside the process: one that does not fit the request it was found
    for is treated as absent and counted here; the first of each kind is logged as a WARNING (never its contents),
    the rest only counted, so a store full of them cannot write a log line per request.
    """

    def __init__(self) -> None:
        self.count_rejected: Callable[[str], None] = _ignore
        """Called with the record's kind (`rewrite`, `anchor`) for each record refused; set by the service."""
        self.count_evicted: Callable[[str], None] = _ignore
        """Called with the reason for each offloaded result the in-memory store let go early; set by the service."""
        self._warned: set[str] = set()

    def reject(self, kind: str) -> None:
        """Count a stored record of `kind` that was refused, warning the first time."""
        if kind not in self._warned:
            self._warned.add(kind)
            logger.warning(
                "A stored %s did not fit the conversation it was found for and was ignored; further ones are only"
                " counted (compaction_proxy_state_records_rejected).",
                kind,
            )
        self.count_rejected(kind)

    def evict(self, reason: str) -> None:
        """Count an offloaded result let go before its time (see `proxy.state.offload_memory`)."""
        self.count_evicted(reason)


def _ignore(_kind: str) -> None:
    """Count nothing (until the service says where to count)."""


class StateStore(Protocol):
    """Where rewrites and anchors live: in memory for a sidecar, Redis for replicas behind one Service."""

    async def latest_rewrite(
        self, tenant: bytes, chain: Sequence[bytes], start: int = 0
    ) -> tuple[int, EditPlan] | None:
        """The rewrite stored for the longest prefix of `chain` ending at `start` or later: (its last index, plan).

        None when there is none. A record whose plan is not over exactly the prefix it is stored under (one that came
        from outside the proxy) is treated as absent, and reported to `StoreEvents.reject`.
        """
        ...

    async def save_rewrite(self, tenant: bytes, chain_key: bytes, plan: EditPlan) -> None:
        """Remember `plan` for the original prefix whose chain ends in `chain_key`."""
        ...

    async def latest_anchor(self, tenant: bytes, chain: Sequence[bytes], start: int = 0) -> tuple[int, int] | None:
        """The anchor stored for the longest prefix of `chain` ending at `start` or later: (its last index, tokens)."""
        ...

    async def save_anchor(self, tenant: bytes, chain_key: bytes, tokens: int) -> None:
        """Remember the provider's token count for the sent prefix whose chain ends in `chain_key`."""
        ...

    async def save_offloaded(self, tenant: bytes, contents: Mapping[str, str]) -> None:
        """Keep each content under its reference for the tenant, `offload_ttl` after its last write or refresh."""
        ...

    async def offloaded(self, tenant: bytes, reference: str) -> str | None:
        """The content the tenant offloaded under `reference`, or None (another tenant's, expired, never stored)."""
        ...

    async def touch_offloaded(self, tenant: bytes, references: Sequence[str]) -> None:
        """Restart the time to live of these contents: their conversation is still going on."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


async def latest_from(
    latest: Callable[[Sequence[bytes], int], Awaitable[tuple[int, V] | None]],
    chain: Sequence[bytes],
    since: int | None,
    start: int = 0,
) -> tuple[int, V] | None:
    """What `latest` (a store's lookup, bound to a tenant) finds for `chain` from `start`, looking from `since` first.

    A conversation's record was found at `since` on its last turn. While that record is stored, the longest stored
    prefix of `chain` ends there or later, so only the chain from there is looked up: for Redis, one `MGET` of the
    new part instead of the chain's last `scan_limit` keys. When nothing is found there (the record expired, or the
    chain is not the one the hint was found on), the chain from `start` is looked up: the answer is always the full
    one.
    """
    if since is not None and start < since < len(chain):
        found = await latest(chain, since)
        if found is not None:
            return found
    return await latest(chain, start)
