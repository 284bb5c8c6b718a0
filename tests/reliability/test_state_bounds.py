"""The in-memory state store stays bounded: 100k conversations fill it, more evict the least recently used."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from proxy.config import Settings
from proxy.engine import EditPlan
from proxy.formats.chat_completions.wire import CHAT_COMPLETIONS
from proxy.pipeline.exchange import IncomingRequest, UpstreamOutcome
from proxy.pipeline.service import CompactionPipeline
from proxy.state.memory import MemoryStore

CONVERSATIONS = 100_000


def rss_kib() -> int:
    """This process's resident memory, KiB."""
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])


def key(tenant: int, index: int) -> tuple[bytes, bytes]:
    return tenant.to_bytes(16, "big"), hashlib.sha256(f"{tenant}:{index}".encode()).digest()[:16]


async def test_memory_store_holds_100k_conversations_and_evicts_beyond() -> None:
    store = MemoryStore(max_entries=CONVERSATIONS)
    rss_before = rss_kib()
    started = time.perf_counter()
    for index in range(CONVERSATIONS + CONVERSATIONS // 2):  # 150k conversations, one anchor and one rewrite each
        tenant, chain_key = key(index % 7, index)
        await store.save_anchor(tenant, chain_key, 1000 + index)
        await store.save_rewrite(tenant, chain_key, EditPlan.identity(3))
    elapsed = time.perf_counter() - started
    grown = (rss_kib() - rss_before) * 1024
    assert len(store.anchors) == len(store.rewrites) == CONVERSATIONS
    oldest, newest = key(0, 0), key((CONVERSATIONS * 3 // 2 - 1) % 7, CONVERSATIONS * 3 // 2 - 1)
    assert await store.latest_anchor(oldest[0], [oldest[1]]) is None  # evicted
    assert await store.latest_anchor(newest[0], [newest[1]]) == (0, 1000 + CONVERSATIONS * 3 // 2 - 1)
    assert grown < 200 * 1024 * 1024  # bytes: 100k conversations of state fit well under 200 MiB
    print(f"\nSTATE FIGURES saved=150000 kept={CONVERSATIONS} rss_growth_mib={grown / 2**20:.1f} s={elapsed:.1f}")


async def test_touching_a_conversation_keeps_it_over_newer_ones() -> None:
    store = MemoryStore(max_entries=1000)
    tenant, first = key(1, 0)
    await store.save_anchor(tenant, first, 42)
    for index in range(1, 2000):
        if index % 100 == 0:
            assert await store.latest_anchor(tenant, [first]) == (0, 42)  # used: moves to the back of the queue
        await store.save_anchor(*key(1, index), index)
    assert await store.latest_anchor(tenant, [first]) == (0, 42)
    assert len(store.anchors) == 1000


async def test_the_service_bounds_its_store_by_the_setting() -> None:
    """Through the real service: 3,000 conversations, `state_max_conversations=1000`: the store never holds more.

    The window puts each request over the trigger in bytes and under it in tokens, so it is counted and anchored.
    """
    settings = Settings(state_max_conversations=1000, context_windows={"gpt-4o-mini": 64})
    service = CompactionPipeline(settings)
    assert isinstance(service.store, MemoryStore)
    for index in range(3000):
        body = json.dumps(
            {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"conversation {index}"}]}
        ).encode()
        chat = IncomingRequest(
            body, {"Authorization": f"Bearer k{index % 5}"}, "/v1/chat/completions", CHAT_COMPLETIONS
        )
        plan = await service.prepare(chat)
        usage = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
        reply = {"role": "assistant", "content": "ok"}
        assert await service.complete(plan, UpstreamOutcome(status=200, usage=usage, reply=reply)) is None
        assert len(service.store.anchors) <= 1000
    assert len(service.store.anchors) == 1000


async def test_huge_rewrites_are_bounded_by_bytes_not_only_by_count() -> None:
    """A few conversations of 100,000 messages cannot hold more than `max_bytes`, however few entries they are."""
    store = MemoryStore(max_entries=1000, max_bytes=16 * 2**20)
    for index in range(10):
        await store.save_rewrite(*key(2, index), EditPlan.identity(100_000))  # about 6 MiB each
        assert store.rewrites.cost <= 16 * 2**20
    assert len(store.rewrites) == 2
    newest = key(2, 9)
    assert await store.latest_rewrite(newest[0], [newest[1]]) is not None
    await store.save_rewrite(*key(2, 10), EditPlan.identity(1_000_000))  # larger than the whole budget: not kept
    assert await store.latest_rewrite(key(2, 10)[0], [key(2, 10)[1]]) is None
