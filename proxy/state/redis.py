"""The Redis state store: rewrites and anchors shared by every replica of a gateway behind one Service.

Same semantics as `MemoryStore` (a record lives `ttl_seconds` after it was last written, every key is scoped by the
caller's tenant, lookups find the longest stored prefix of a conversation), with what sharing needs on top:

- **One round trip per lookup.** The candidate keys of a request's chain, newest first, go out in one `MGET`. The scan
  is bounded to the last `scan_limit` (512) elements: the service stores a conversation's rewrite again at a request's
  head once it lies 16 messages back (`RESTORE_AFTER_MESSAGES`), so the stored prefix is a few turns back at most; a
  request that appends more than 512 messages at once simply is not matched and is treated as a new conversation
  (compacted afresh if needed; nothing fails).
- **Atomic rewrite saves, no lost and no forked memory.** Two replicas may answer the same conversation at the same
  time (a client retry that lands elsewhere while a slow summary is still being written, say). A save never lets a
  plan replace the one under its key unless it is a later compaction *of that plan* (`codec.supersedes`): a replica
  carrying an older plan forward cannot erase a compaction another replica just stored (lost memory), and a sibling
  compaction of the same base cannot replace the first one written (a fork: later turns would replay a prefix other
  than the one the upstream already saw and cached). The check is optimistic: a Lua script writes when the key is
  empty or already holds the same plan, and otherwise refreshes the TTL and returns what is stored; the replica then
  decides in Python, and, to replace, runs the script again naming the plan it decided to replace, which writes only
  if that is still what is stored (compare-and-set), retrying a few times if another write slipped in between.
- **Bounded connections.** A blocking pool of `max_connections`: a burst of requests queues for a connection
  instead of failing.
- **Trusting no record.** Whoever can write to the Redis (another deployment sharing it through `key_prefix`, say)
  can write anything under any key. A plan is checked against the prefix its key names before anything proportional
  to what it claims is built (`codec.decode_plan`); a record failing that, or unreadable, counts as absent and is
  reported to `events` (counted, one WARNING per process).
- **Failing fast.** Timeouts are short and a refused connection is retried once without backoff, so a Redis that is
  down costs a request milliseconds; the service treats the store's error as its own and forwards unchanged.

Keys are `<prefix>r:<tenant hex>:<chain hex>` (rewrites), `<prefix>a:<tenant hex>:<chain hex>` (anchors) and
`<prefix>o:<tenant hex>:<reference>` (offloaded results); values are `codec.encode_plan` bytes, decimal token counts
and UTF-8 text. Neither keys nor values are ever logged. Offloaded results are written, or refreshed, in one
pipelined round trip, and live `base.offload_ttl` after their last write or refresh: a little longer than the rest,
since the service refreshes them only now and then.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from proxy.engine.plan import EditPlan
from proxy.state.base import StoreEvents, offload_ttl
from proxy.state.codec import PlanDecodeError, decode_plan, encode_plan, supersedes

logger = logging.getLogger("compaction_proxy.state")

DEFAULT_SCAN_LIMIT: Final = 512
"""How many of a request's newest chain elements a lookup asks for (one `MGET`)."""

_SAVE_REWRITE: Final = """
-- KEYS[1]: the rewrite key. ARGV[1]: the new plan. ARGV[2]: TTL in ms. ARGV[3]: the stored plan the caller decided
-- its plan supersedes, or "" for none. Writes when the key is empty, holds the new plan already, or still holds
-- ARGV[3]; otherwise keeps what is stored, refreshes its TTL and returns it for the caller to judge.
local current = redis.call('GET', KEYS[1])
if (not current) or current == ARGV[1] or (ARGV[3] ~= '' and current == ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return false
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return current
"""


OUTAGE_ERRORS: Final = (RedisConnectionError, RedisTimeoutError, OSError)
"""What a Redis that does not answer raises: an outage to report once, not a failure to log per request."""


class RedisStore:
    """Rewrites and anchors in Redis, shared by replicas, each record expiring `ttl_seconds` after its last write.

    :param url: A `redis://`, `rediss://` or `unix://` URL (database, password and TLS options as redis-py reads them).
    :param ttl_seconds: How long a record lives after it was last written (fractions allowed; stored in ms).
    :param key_prefix: Prepended to every key, so several deployments can share one Redis.
    :param scan_limit: How many of a chain's newest elements a lookup considers.
    :param timeout_seconds: Connect, per-command and pool-wait timeout: a stalled Redis must not stall requests.
    :param max_connections: Connections per replica; a burst beyond them waits (up to the timeout) for a free one
        instead of failing, as redis-py's default pool would after 100.
    :param max_save_attempts: Compare-and-set rounds a contested rewrite save tries before leaving the stored plan.
    :param ca_bundle: For a `rediss://` URL, a PEM file of CA certificates trusted in addition to the default trust
        (redis-py loads its `ssl_ca_certs` on top of the system's); None trusts the default only.
    """

    def __init__(
        self,
        url: str,
        ttl_seconds: float,
        key_prefix: str = "cp:",
        *,
        scan_limit: int = DEFAULT_SCAN_LIMIT,
        timeout_seconds: float = 1.0,
        max_connections: int = 64,
        max_save_attempts: int = 8,
        ca_bundle: Path | None = None,
    ) -> None:
        if ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive")
        if scan_limit <= 0:
            raise ValueError("scan_limit must be positive")
        self._ttl_ms = max(1, round(ttl_seconds * 1000))
        self._offload_ttl_ms = max(1, round(offload_ttl(ttl_seconds) * 1000))
        self._prefix = key_prefix
        self._scan_limit = scan_limit
        self._max_save_attempts = max(1, max_save_attempts)
        self._pool: BlockingConnectionPool = BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout_seconds,
            socket_timeout=timeout_seconds,
            socket_connect_timeout=timeout_seconds,
            retry=Retry(NoBackoff(), 1),
            **({"ssl_ca_certs": str(ca_bundle)} if ca_bundle is not None else {}),
        )
        self._redis: Redis = Redis(connection_pool=self._pool)
        self._save_rewrite = self._redis.register_script(_SAVE_REWRITE)
        self.events = StoreEvents()
        """Where records refused as not fitting are reported."""
        self.outage_errors: tuple[type[BaseException], ...] = OUTAGE_ERRORS
        """What this store raises while it does not answer (see `proxy.failures.OutageLog`)."""

    def rewrite_key(self, tenant: bytes, chain_key: bytes) -> str:
        """The key of the rewrite stored for a tenant's prefix."""
        return f"{self._prefix}r:{tenant.hex()}:{chain_key.hex()}"

    def anchor_key(self, tenant: bytes, chain_key: bytes) -> str:
        """The key of the anchor stored for a tenant's sent prefix."""
        return f"{self._prefix}a:{tenant.hex()}:{chain_key.hex()}"

    async def _newest_first(
        self, kind: str, tenant: bytes, chain: Sequence[bytes], start: int
    ) -> list[tuple[int, bytes]]:
        """The stored values among the last `scan_limit` prefixes of `chain` from `start`, newest first (one MGET)."""
        indices = range(len(chain) - 1, max(start, len(chain) - self._scan_limit) - 1, -1)
        if not indices:
            return []
        keys = [f"{self._prefix}{kind}:{tenant.hex()}:{chain[index].hex()}" for index in indices]
        values: list[Any] = await self._redis.mget(keys)
        return [(index, value) for index, value in zip(indices, values, strict=True) if value is not None]

    async def latest_rewrite(
        self, tenant: bytes, chain: Sequence[bytes], start: int = 0
    ) -> tuple[int, EditPlan] | None:
        """The rewrite for the longest stored prefix of `chain` from `start`.

        A record that is not a plan over exactly the prefix its key names (unreadable, another format version, or
        written by someone else sharing the Redis) counts as absent: it is checked before it is expanded, so it costs
        its bytes, never what it claims (`codec.decode_plan`).
        """
        for index, value in await self._newest_first("r", tenant, chain, start):
            try:
                return index, decode_plan(value, index + 1)
            except PlanDecodeError:
                self.events.reject("rewrite")
        return None

    async def save_rewrite(self, tenant: bytes, chain_key: bytes, plan: EditPlan) -> None:
        """Store `plan` unless its key holds a plan it does not supersede (see the module docstring); refresh TTL."""
        key = self.rewrite_key(tenant, chain_key)
        blob = encode_plan(plan)
        replacing = b""
        for _attempt in range(self._max_save_attempts):
            current = await self._save_rewrite(keys=[key], args=[blob, self._ttl_ms, replacing])
            if current is None:
                return
            try:
                stored = decode_plan(current, plan.source_length)
            except PlanDecodeError:
                self.events.reject("rewrite")
                replacing = current  # unreadable (corrupt, or another format version): ours is better than nothing
                continue
            if not supersedes(plan, stored):
                return  # the stored plan is newer or was first: it stays (its TTL was refreshed)
            replacing = current
        logger.warning("A rewrite kept changing under concurrent saves; the stored one was left in place.")

    async def latest_anchor(self, tenant: bytes, chain: Sequence[bytes], start: int = 0) -> tuple[int, int] | None:
        """The anchor for the longest stored prefix of `chain` from `start`; an unreadable one counts as absent."""
        for index, value in await self._newest_first("a", tenant, chain, start):
            try:
                return index, int(value)
            except ValueError:
                self.events.reject("anchor")
        return None

    async def save_anchor(self, tenant: bytes, chain_key: bytes, tokens: int) -> None:
        """Store an anchor (the provider's count for exactly that prefix: the last write is as good as any)."""
        await self._redis.set(self.anchor_key(tenant, chain_key), str(tokens), px=self._ttl_ms)

    def offload_key(self, tenant: bytes, reference: str) -> str:
        """The key of a tenant's offloaded result."""
        return f"{self._prefix}o:{tenant.hex()}:{reference}"

    async def save_offloaded(self, tenant: bytes, contents: Mapping[str, str]) -> None:
        """Store offloaded results (one pipelined round trip)."""
        if not contents:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for reference, content in contents.items():
                pipe.set(
                    self.offload_key(tenant, reference),
                    content.encode("utf-8", "surrogatepass"),
                    px=self._offload_ttl_ms,
                )
            await pipe.execute()

    async def offloaded(self, tenant: bytes, reference: str) -> str | None:
        """An offloaded result of the tenant, or None."""
        value: Any = await self._redis.get(self.offload_key(tenant, reference))
        return None if value is None else bytes(value).decode("utf-8", "surrogatepass")

    async def touch_offloaded(self, tenant: bytes, references: Sequence[str]) -> None:
        """Restart the TTL of offloaded results (one pipelined round trip)."""
        if not references:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for reference in references:
                pipe.pexpire(self.offload_key(tenant, reference), self._offload_ttl_ms)
            await pipe.execute()

    async def ping(self) -> bool:
        """Whether Redis answers a PING now, within the store's timeout (the proxy is not ready while it does not)."""
        try:
            return bool(await self._redis.ping())
        except (RedisError, OSError):
            return False

    async def close(self) -> None:
        """Close the client and disconnect the connection pool."""
        await self._redis.aclose()
        await self._pool.aclose()
