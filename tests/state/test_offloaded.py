"""Offloaded results in the state stores: kept per tenant, bounded in memory, living as long as their conversation.

And end to end on Redis: a conversation compacted on one replica has its offloaded result read back on another.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import openai
import pytest

from proxy.engine.strategies.offload import content_reference
from proxy.state import MemoryStore, StateStore
from proxy.state.memory import RECORD_OVERHEAD
from proxy.state.redis import RedisStore
from tests.e2e.test_offload_reads import CLIENT_TOOLS, LOG, SECRET, conversation
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.proxies import LoopbackProxies
from tests.support.reading_model import reading_chat_responder

ALICE, BOB = b"tenant-alice", b"tenant-bob"
TEXT = "build log \u2014 \U0001f525 step 3 failed"


async def test_a_tenant_reads_back_only_what_it_offloaded(store: StateStore) -> None:
    reference = content_reference(TEXT)
    await store.save_offloaded(ALICE, {reference: TEXT})
    assert await store.offloaded(ALICE, reference) == TEXT
    assert await store.offloaded(BOB, reference) is None
    assert await store.offloaded(ALICE, content_reference("other")) is None
    await store.touch_offloaded(BOB, [reference])  # touching what a tenant does not hold creates nothing
    assert await store.offloaded(BOB, reference) is None


async def test_memory_offloads_are_bounded_in_bytes_least_recently_used_first() -> None:
    texts = [f"{k}:" + "x" * 1000 for k in range(10)]
    store = MemoryStore(offload_max_bytes=3 * (1002 + RECORD_OVERHEAD))
    for text in texts[:3]:
        await store.save_offloaded(ALICE, {content_reference(text): text})
    assert await store.offloaded(ALICE, content_reference(texts[0])) == texts[0]  # now the most recently used
    await store.save_offloaded(ALICE, {content_reference(texts[3]): texts[3]})
    held = [text for text in texts[:4] if await store.offloaded(ALICE, content_reference(text)) is not None]
    assert held == [texts[0], texts[2], texts[3]]
    assert store.offloaded_bytes <= 3 * (1002 + RECORD_OVERHEAD)


async def test_touching_keeps_offloads_alive_as_long_as_the_conversation(redis_url: str) -> None:
    now = [0.0]
    memory = MemoryStore(ttl_seconds=10, clock=lambda: now[0])
    reference = content_reference(TEXT)
    await memory.save_offloaded(ALICE, {reference: TEXT})
    now[0] = 9
    await memory.touch_offloaded(ALICE, [reference])
    now[0] = 15
    assert await memory.offloaded(ALICE, reference) == TEXT
    now[0] = 20
    assert await memory.offloaded(ALICE, reference) is None

    redis_store = RedisStore(redis_url, ttl_seconds=60, key_prefix=f"offload-ttl-{uuid.uuid4().hex}:")
    try:
        await redis_store.save_offloaded(ALICE, {reference: TEXT})
        key = redis_store.offload_key(ALICE, reference)
        await redis_store._redis.pexpire(key, 1000)
        await redis_store.touch_offloaded(ALICE, [reference])
        assert 59_000 < await redis_store._redis.pttl(key) <= 60_000
    finally:
        await redis_store.close()


@pytest.fixture
async def upstream() -> AsyncIterator[OpenAIUpstream]:
    async with OpenAIUpstream(context_window=4096, responder=reading_chat_responder) as fake:
        yield fake


async def test_a_result_offloaded_on_one_replica_is_read_on_another(upstream: OpenAIUpstream, redis_url: str) -> None:
    proxies = LoopbackProxies(
        upstream=upstream.base_url,
        context_windows={"gpt-4o-mini": 4096},
        state_url=redis_url,
        tenant_key=uuid.uuid4().hex,
    )
    try:
        first, second = await proxies.start(), await proxies.start()
        history = conversation()
        async with openai.AsyncOpenAI(base_url=first.url, api_key="sk-alice", max_retries=0) as sdk:
            turn = await sdk.chat.completions.create(model="gpt-4o-mini", messages=history, tools=CLIENT_TOOLS)
        assert turn.choices[0].message.content == f"found {SECRET}"
        history += [{"role": "assistant", "content": turn.choices[0].message.content}]
        history += [{"role": "user", "content": "Once more?"}]
        async with openai.AsyncOpenAI(base_url=second.url, api_key="sk-alice", max_retries=0) as sdk:
            raw = await sdk.chat.completions.with_raw_response.create(
                model="gpt-4o-mini", messages=history, tools=CLIENT_TOOLS
            )
        assert raw.parse().choices[0].message.content == f"found {SECRET}"
        assert raw.headers["x-compaction-reads"] == "1"
        assert raw.headers["x-compaction"] == "unchanged"  # the first replica's rewrite replayed: no new offload
        assert upstream.chat_requests[-1]["messages"][-1]["content"] == LOG
    finally:
        await proxies.close()
