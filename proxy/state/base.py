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

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final, Protocol, TypeVar

from proxy.engine.plan import EditPlan

V = TypeVar("V")

OFFLOAD_REFRESH_SHARE: Final = 1 / 8
"""Offloaded results are refreshed at most once per this share of the state's time to live, and kept this share
longer than the rest: a result refreshed that long before its conversation's last request still outlives it."""


def offload_ttl(ttl_seconds: float) -> float:
    """How long an offloaded result lives after its last write or refresh (see `OFFLOAD_REFRESH_SHARE`)."""
    return ttl_seconds * (1 + OFFLOAD_REFRESH_SHARE)


class StateStore(Protocol):
    """Where rewrites and anchors live: in memory for a sidecar, Redis for replicas behind one Service."""

    async def latest_rewrite(self, tenant: bytes, chain: Sequence[bytes]) -> tuple[int, EditPlan] | None:
        """The rewrite stored for the longest prefix of `chain`: (index of its last message, plan), or None."""
        ...

    async def save_rewrite(self, tenant: bytes, chain_key: bytes, plan: EditPlan) -> None:
        """Remember `plan` for the original prefix whose chain ends in `chain_key`."""
        ...

    async def latest_anchor(self, tenant: bytes, chain: Sequence[bytes]) -> tuple[int, int] | None:
        """The anchor stored for the longest prefix of `chain`: (index of its last message, tokens), or None."""
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
    latest: Callable[[Sequence[bytes]], Awaitable[tuple[int, V] | None]], chain: Sequence[bytes], since: int | None
) -> tuple[int, V] | None:
    """What `latest` (a store's lookup, bound to a tenant) finds for `chain`, looking from `since` first.

    A conversation's record was found at `since` on its last turn. While that record is stored, the longest stored
    prefix of `chain` ends there or later, so only the chain from there is looked up: for Redis, one `MGET` of the
    new part instead of the chain's last `scan_limit` keys. When nothing is found there (the record expired, or the
    chain is not the one the hint was found on), the whole chain is looked up: the answer is always the full one.
    """
    if since is not None and 0 < since < len(chain):
        found = await latest(chain[since:])
        if found is not None:
            return found[0] + since, found[1]
    return await latest(chain)
