"""The contract every state store keeps, run against MemoryStore and against RedisStore on a real redis-server."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from functools import partial
from typing import Any

import pytest

from proxy.config import Settings
from proxy.engine import COMPACTION_META_KEY, DEFAULT_CHAIN, UserMessageWindow, counter_for_model
from proxy.engine.plan import Created, EditPlan, Kept
from proxy.formats.chat_completions.wire import CHAT_COMPLETIONS
from proxy.pipeline.exchange import ForwardPlan, IncomingRequest, UpstreamOutcome
from proxy.pipeline.rewrites import RESTORE_AFTER_MESSAGES
from proxy.pipeline.service import CompactionPipeline
from proxy.state import MemoryStore, StateStore, open_store
from proxy.state.base import latest_from
from proxy.state.codec import encode_plan
from proxy.state.redis import DEFAULT_SCAN_LIMIT, RedisStore

TENANT = b"t" * 16
OTHER_TENANT = b"o" * 16


def chain(length: int, conversation: str = "c") -> list[bytes]:
    """A chain of `length` elements; two conversations share no element."""
    return [hashlib.blake2b(f"{conversation}:{index}".encode(), digest_size=16).digest() for index in range(length)]


def compacted(length: int, text: str = "[earlier messages were removed]") -> EditPlan:
    note = Created({"role": "user", "content": text}, {COMPACTION_META_KEY: {"strategy": "sliding_window"}})
    return EditPlan(length, (Kept(0), note, *(Kept(index) for index in range(max(2, length // 2), length))))


async def test_nothing_stored_finds_nothing(store: StateStore) -> None:
    assert await store.latest_rewrite(TENANT, chain(5)) is None
    assert await store.latest_anchor(TENANT, chain(5)) is None
    assert await store.latest_rewrite(TENANT, []) is None
    assert await store.latest_anchor(TENANT, []) is None


async def test_longest_prefix_wins(store: StateStore) -> None:
    keys = chain(30)
    await store.save_rewrite(TENANT, keys[9], compacted(10, "short"))
    await store.save_rewrite(TENANT, keys[19], compacted(20, "long"))
    await store.save_anchor(TENANT, keys[4], 500)
    await store.save_anchor(TENANT, keys[14], 1500)

    assert await store.latest_rewrite(TENANT, keys) == (19, compacted(20, "long"))
    assert await store.latest_rewrite(TENANT, keys[:19]) == (9, compacted(10, "short"))
    assert await store.latest_rewrite(TENANT, keys[:9]) is None
    assert await store.latest_anchor(TENANT, keys) == (14, 1500)
    assert await store.latest_anchor(TENANT, keys[:14]) == (4, 500)
    # Another conversation shares none of it.
    assert await store.latest_rewrite(TENANT, chain(30, "other")) is None


async def test_tenants_are_isolated(store: StateStore) -> None:
    keys = chain(8)
    await store.save_rewrite(TENANT, keys[7], compacted(8))
    await store.save_anchor(TENANT, keys[7], 900)
    assert await store.latest_rewrite(OTHER_TENANT, keys) is None
    assert await store.latest_anchor(OTHER_TENANT, keys) is None
    # The other tenant writing the same conversation touches nothing of the first's.
    await store.save_rewrite(OTHER_TENANT, keys[7], compacted(8, "other tenant's note"))
    await store.save_anchor(OTHER_TENANT, keys[7], 1)
    assert await store.latest_rewrite(TENANT, keys) == (7, compacted(8))
    assert await store.latest_anchor(TENANT, keys) == (7, 900)


async def test_saving_again_replaces_with_a_later_compaction_and_anchors_with_the_last(store: StateStore) -> None:
    keys = chain(12)
    identity = EditPlan.identity(12)
    await store.save_rewrite(TENANT, keys[11], identity)
    await store.save_rewrite(TENANT, keys[11], compacted(12))
    assert await store.latest_rewrite(TENANT, keys) == (11, compacted(12))
    await store.save_anchor(TENANT, keys[11], 100)
    await store.save_anchor(TENANT, keys[11], 120)
    assert await store.latest_anchor(TENANT, keys) == (11, 120)


async def test_plans_come_back_exactly(store: StateStore) -> None:
    keys = chain(3)
    message = {"role": "tool", "tool_call_id": "call_1", "content": "Ünïcødé — 数据 \u2028", "name": "x"}
    plan = EditPlan(3, (Kept(0), Created(message, {COMPACTION_META_KEY: {"strategy": "p", "n": 1}}, 1), Kept(2)))
    await store.save_rewrite(TENANT, keys[2], plan)
    found = await store.latest_rewrite(TENANT, keys)
    assert found == (2, plan)
    assert found is not None
    assert list(found[1].created()[0].message) == list(message)


async def test_records_expire_after_the_ttl_and_saving_refreshes_it(redis_url: str) -> None:
    """TTL, both stores: the memory store on a fake clock, Redis with a 300 ms TTL and a bounded wait."""
    now = [0.0]
    memory = MemoryStore(ttl_seconds=10, clock=lambda: now[0])
    keys = chain(4)
    await memory.save_rewrite(TENANT, keys[3], compacted(4))
    await memory.save_anchor(TENANT, keys[3], 10)
    now[0] = 9
    await memory.save_anchor(TENANT, keys[3], 11)  # refreshed
    now[0] = 11
    assert await memory.latest_rewrite(TENANT, keys) is None
    assert await memory.latest_anchor(TENANT, keys) == (3, 11)
    now[0] = 20
    assert await memory.latest_anchor(TENANT, keys) is None

    store = RedisStore(redis_url, ttl_seconds=0.3, key_prefix="ttl-test:")
    try:
        await store.save_rewrite(TENANT, keys[3], compacted(4))
        await store.save_anchor(TENANT, keys[3], 10)
        ttl_ms = await store._redis.pttl(store.rewrite_key(TENANT, keys[3]))
        assert 0 < ttl_ms <= 300
        assert 0 < await store._redis.pttl(store.anchor_key(TENANT, keys[3])) <= 300
        await asyncio.sleep(0.2)
        # A save refreshes the TTL, also when the stored plan stays (it is not superseded).
        await store.save_rewrite(TENANT, keys[3], EditPlan.identity(4))
        assert await store._redis.pttl(store.rewrite_key(TENANT, keys[3])) > 200
        assert await store.latest_rewrite(TENANT, keys) == (3, compacted(4))
        deadline = time.monotonic() + 5
        while await store.latest_anchor(TENANT, keys) is not None:
            assert time.monotonic() < deadline, "the anchor did not expire"
            await asyncio.sleep(0.02)
        while await store.latest_rewrite(TENANT, keys) is not None:
            assert time.monotonic() < deadline, "the rewrite did not expire"
            await asyncio.sleep(0.02)
    finally:
        await store.close()


async def test_memory_store_stays_bounded_over_100k_conversations() -> None:
    store = MemoryStore(max_entries=100_000)
    plan = EditPlan.identity(2)
    for number in range(120_000):
        head = number.to_bytes(16, "big")
        await store.save_rewrite(TENANT, head, plan)
        await store.save_anchor(TENANT, head, number)
    assert len(store.rewrites) == 100_000
    assert len(store.anchors) == 100_000
    # The least recently used went first; the newest are all there.
    assert await store.latest_anchor(TENANT, [(0).to_bytes(16, "big")]) is None
    assert await store.latest_anchor(TENANT, [(119_999).to_bytes(16, "big")]) == (0, 119_999)


async def test_redis_keys_are_tenant_scoped_and_carry_no_plain_text(redis_store: RedisStore) -> None:
    keys = chain(2)
    await redis_store.save_rewrite(TENANT, keys[1], compacted(2))
    await redis_store.save_anchor(TENANT, keys[1], 42)
    stored = sorted(
        key.decode() if isinstance(key, bytes) else key
        for key in await redis_store._redis.keys(redis_store._prefix + "*")
    )
    prefix = redis_store._prefix
    assert stored == sorted([f"{prefix}r:{TENANT.hex()}:{keys[1].hex()}", f"{prefix}a:{TENANT.hex()}:{keys[1].hex()}"])
    assert await redis_store._redis.get(stored[1]) == encode_plan(compacted(2))


@pytest.fixture
def mget_sizes(redis_store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many keys each `MGET` of `redis_store` asks for, in order."""
    sizes: list[int] = []
    original = redis_store._redis.mget

    async def counting_mget(keys: list[str]) -> Any:
        sizes.append(len(keys))
        return await original(keys)

    monkeypatch.setattr(redis_store._redis, "mget", counting_mget)
    return sizes


async def test_redis_lookup_is_one_mget_bounded_to_the_newest_512(
    redis_store: RedisStore, mget_sizes: list[int]
) -> None:
    long = chain(DEFAULT_SCAN_LIMIT + 100)
    await redis_store.save_rewrite(TENANT, long[50], compacted(51))  # 100 + 462 elements back: beyond the scan
    await redis_store.save_anchor(TENANT, long[150], 7)  # just inside it
    assert await redis_store.latest_rewrite(TENANT, long) is None
    assert await redis_store.latest_anchor(TENANT, long) == (150, 7)
    assert mget_sizes == [DEFAULT_SCAN_LIMIT, DEFAULT_SCAN_LIMIT]
    assert await redis_store.latest_rewrite(TENANT, long[:100]) == (50, compacted(51))


async def test_a_lookup_from_a_hint_finds_what_a_lookup_of_the_whole_chain_finds(store: StateStore) -> None:
    """Wherever the hint points (a record, no record, past the end), the answer is the whole chain's."""
    generator = random.Random(13)
    for conversation in range(12):
        keys = chain(10, conversation=f"hint-{conversation}")
        for index in generator.sample(range(10), generator.randint(0, 4)):
            await store.save_anchor(TENANT, keys[index], index * 100)
            await store.save_rewrite(TENANT, keys[index], compacted(index + 1))
        for since in (None, *range(12)):
            for latest in (store.latest_anchor, store.latest_rewrite):
                whole: Any = await latest(TENANT, keys)
                assert await latest_from(partial(latest, TENANT), keys, since) == whole


async def test_a_resent_conversation_asks_redis_for_its_new_part_only(
    redis_store: RedisStore, mget_sizes: list[int]
) -> None:
    """Once its rewrite and anchor were found, each lookup starts where they were: not at the chain's head - 512.

    The chain drops whole turns (the default's user message window would keep every one of these long user messages,
    and a forwarded conversation that grows past RESTORE_AFTER_MESSAGES could not tell a lookup from its head apart).
    """
    strategies = [name for name in DEFAULT_CHAIN if name != UserMessageWindow.name]
    settings = Settings(context_windows={"gpt-4o-mini": 40_000}, strategies=strategies)
    service = CompactionPipeline(settings, store=redis_store)
    asked = mget_sizes
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Review the repository."}]
    compactions = 0
    for turn in range(24):
        messages += [
            {"role": "user", "content": f"Step {turn}: " + "read the next file and report. " * 600},
            {"role": "assistant", "content": f"Done with step {turn}."},
        ]
        asked.clear()
        body = json.dumps({"model": "gpt-4o-mini", "messages": messages}).encode()
        plan = await service.prepare(
            IncomingRequest(body, {"Authorization": "Bearer sk-hint"}, "/v1/chat/completions", CHAT_COMPLETIONS)
        )
        assert isinstance(plan, ForwardPlan)
        prompt = counter_for_model("gpt-4o-mini").messages_tokens(json.loads(plan.body)["messages"]) + 3
        await service.complete(plan, UpstreamOutcome(200, usage={"prompt_tokens": prompt, "total_tokens": prompt + 1}))
        compactions += plan.response_headers.get("X-Compaction") == "compacted"
        if compactions and turn > 8:  # its rewrite found once: both lookups start where they found theirs
            assert asked and max(asked) <= RESTORE_AFTER_MESSAGES + 2, (turn, asked)
    assert compactions >= 3
    assert len(messages) == 49  # a lookup from the head asks for every one of them
    await service.aclose()


async def test_unreadable_records_count_as_absent(redis_store: RedisStore) -> None:
    keys = chain(6)
    await redis_store.save_rewrite(TENANT, keys[2], compacted(3))
    await redis_store._redis.set(redis_store.rewrite_key(TENANT, keys[4]), b"[99, 5, []]")  # a future format
    await redis_store._redis.set(redis_store.anchor_key(TENANT, keys[4]), b"garbage")
    await redis_store.save_anchor(TENANT, keys[1], 3)
    assert await redis_store.latest_rewrite(TENANT, keys) == (2, compacted(3))
    assert await redis_store.latest_anchor(TENANT, keys) == (1, 3)
    # A save replaces what it cannot read.
    await redis_store.save_rewrite(TENANT, keys[4], compacted(5))
    assert await redis_store.latest_rewrite(TENANT, keys) == (4, compacted(5))


async def test_open_store_picks_redis_for_redis_urls(redis_url: str) -> None:
    settings = Settings(upstream="http://127.0.0.1:9", state_url=redis_url, state_ttl_seconds=5)
    store = open_store(settings)
    assert isinstance(store, RedisStore)
    assert store._ttl_ms == 5000
    await store.save_anchor(TENANT, b"k" * 16, 1)
    assert await store.latest_anchor(TENANT, [b"k" * 16]) == (0, 1)
    await store.close()
    tls = open_store(Settings(upstream="http://127.0.0.1:9", state_url="rediss://cache.example:6380/1"))
    assert isinstance(tls, RedisStore)
    await tls.close()
    assert isinstance(open_store(Settings(upstream="http://127.0.0.1:9")), MemoryStore)


def test_redis_store_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="ttl"):
        RedisStore("redis://127.0.0.1:1", ttl_seconds=0)
    with pytest.raises(ValueError, match="scan_limit"):
        RedisStore("redis://127.0.0.1:1", ttl_seconds=1, scan_limit=0)


def test_memory_only_users_do_not_import_redis() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from proxy.config import Settings; from proxy.state import open_store;"
        "open_store(Settings(upstream='http://x')); print('redis' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
