"""Offloaded results in the state stores: kept per tenant, bounded in memory, living as long as their conversation.

A conversation refreshes the results it holds now and then, not on every request (`Offloading.refresh`), and the
stores keep them an eighth longer than the rest, so they still outlive the conversation's other state.

And end to end on Redis: a conversation compacted on one replica has its offloaded result read back on another.
"""

from __future__ import annotations

import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator, Callable

import openai
import pytest

from proxy.config import Settings
from proxy.engine import CompactionChain, SlidingWindow
from proxy.engine.strategies.offload import content_reference
from proxy.pipeline.caller import Caller
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.offload.offloading import Offloading
from proxy.simulator.openai_upstream import OpenAIUpstream
from proxy.state import MemoryStore, StateStore
from proxy.state.memory import RECORD_OVERHEAD
from proxy.state.redis import RedisStore
from tests.e2e.test_offload_reads import CLIENT_TOOLS, LOG, SECRET, conversation
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


async def test_touching_keeps_offloads_alive_an_eighth_longer_than_the_rest(redis_url: str) -> None:
    now = [0.0]
    memory = MemoryStore(ttl_seconds=10, clock=lambda: now[0])
    reference = content_reference(TEXT)
    await memory.save_offloaded(ALICE, {reference: TEXT})
    now[0] = 9
    await memory.touch_offloaded(ALICE, [reference])
    now[0] = 20
    assert await memory.offloaded(ALICE, reference) == TEXT  # 9 + 11.25
    now[0] = 20.5
    assert await memory.offloaded(ALICE, reference) is None

    redis_store = RedisStore(redis_url, ttl_seconds=60, key_prefix=f"offload-ttl-{uuid.uuid4().hex}:")
    try:
        await redis_store.save_offloaded(ALICE, {reference: TEXT})
        key = redis_store.offload_key(ALICE, reference)
        await redis_store._redis.pexpire(key, 1000)
        await redis_store.touch_offloaded(ALICE, [reference])
        assert 67_000 < await redis_store._redis.pttl(key) <= 67_500
    finally:
        await redis_store.close()


def _offloading(store: StateStore, ttl_seconds: int, clock: Callable[[], float]) -> Offloading:
    settings = Settings(state_ttl_seconds=ttl_seconds)
    return Offloading(settings, store, CompactionChain([SlidingWindow()]), CompactionMetrics, clock=clock)


async def test_a_conversation_refreshes_what_it_holds_once_per_eighth_of_the_ttl(redis_url: str) -> None:
    now = [0.0]
    redis_store = RedisStore(redis_url, ttl_seconds=80, key_prefix=f"offload-refresh-{uuid.uuid4().hex}:")
    offloading = _offloading(redis_store, 80, lambda: now[0])
    first, second = content_reference(TEXT), content_reference(TEXT + " again")
    try:
        await redis_store.save_offloaded(ALICE, {first: TEXT, second: TEXT + " again"})
        key = redis_store.offload_key(ALICE, first)

        async def pttl_after_request_at(seconds: float, held: tuple[str, ...]) -> int:
            now[0] = seconds
            await redis_store._redis.pexpire(key, 1000)
            await offloading.refresh(ALICE, held)
            return int(await redis_store._redis.pttl(key))

        assert await pttl_after_request_at(0, (first,)) > 89_000  # refreshed: 80 s and an eighth
        assert await pttl_after_request_at(9.9, (first,)) <= 1000  # within 10 s of it: not again
        assert await pttl_after_request_at(9.9, (first, second)) > 89_000  # another set (a new compaction): at once
        assert await pttl_after_request_at(9.9, (first,)) <= 1000
        assert await pttl_after_request_at(10, (first,)) > 89_000
        assert await pttl_after_request_at(10, (first,)) <= 1000  # the same set, the same tenant: remembered
        await redis_store.save_offloaded(BOB, {first: TEXT})
        await redis_store._redis.pexpire(redis_store.offload_key(BOB, first), 1000)
        await offloading.refresh(BOB, (first,))
        assert await redis_store._redis.pttl(redis_store.offload_key(BOB, first)) > 89_000
    finally:
        await redis_store.close()


async def test_what_a_conversation_holds_outlives_its_last_request_by_the_ttl() -> None:
    now = [0.0]
    memory = MemoryStore(ttl_seconds=60, clock=lambda: now[0])
    offloading = _offloading(memory, 60, lambda: now[0])
    reference = content_reference(TEXT)
    await memory.save_offloaded(ALICE, {reference: TEXT})
    for second in range(0, 600, 3):  # a request every 3 s for ten minutes, ten times the TTL
        now[0] = second
        assert await memory.offloaded(ALICE, reference) == TEXT
        await offloading.refresh(ALICE, (reference,))
    now[0] = 597 + 60  # the conversation's other state expires now
    assert await memory.offloaded(ALICE, reference) == TEXT


async def test_what_is_remembered_of_refreshes_does_not_grow_with_the_results_held() -> None:
    offloading = _offloading(MemoryStore(), 60, time.monotonic)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for conversation in range(100):  # each holding 2,000 results, its references made afresh, then dropped
            held = tuple(f"ref_{conversation:08x}{index:024x}" for index in range(2000))
            await offloading.refresh(ALICE, held)
            del held
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 1_000_000  # 100 x 2,000 references kept would be over 15 MB


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


async def test_a_result_redis_lost_is_read_from_the_resent_original_and_stored_again(
    upstream: OpenAIUpstream, redis_url: str
) -> None:
    """Redis evicts under its own memory policy: a result it lost is found in the original the client re-sends."""
    proxies = LoopbackProxies(
        upstream=upstream.base_url,
        context_windows={"gpt-4o-mini": 4096},
        state_url=redis_url,
        tenant_key=uuid.uuid4().hex,
    )
    try:
        proxy = await proxies.start()
        store = proxy.service.store
        assert isinstance(store, RedisStore)
        history = conversation()
        async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-alice", max_retries=0) as sdk:
            turn = await sdk.chat.completions.create(model="gpt-4o-mini", messages=history, tools=CLIENT_TOOLS)
            tenant = Caller.of({"authorization": "Bearer sk-alice"}, proxy.settings).tenant
            assert await store._redis.delete(store.offload_key(tenant, content_reference(LOG))) == 1
            history += [{"role": "assistant", "content": turn.choices[0].message.content}]
            history += [{"role": "user", "content": "Once more?"}]
            raw = await sdk.chat.completions.with_raw_response.create(
                model="gpt-4o-mini", messages=history, tools=CLIENT_TOOLS
            )
        assert raw.headers["x-compaction"] == "unchanged"  # the rewrite replayed: the reference went upstream
        assert raw.parse().choices[0].message.content == f"found {SECRET}"
        assert upstream.chat_requests[-1]["messages"][-1]["content"] == LOG
        assert await store.offloaded(tenant, content_reference(LOG)) == LOG  # stored again
    finally:
        await proxies.close()
