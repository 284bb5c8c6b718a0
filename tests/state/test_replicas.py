"""Two real proxies sharing one real Redis answer alternate turns of one conversation as if they were one proxy.

The proxies are the real app and compaction service on loopback (aiohttp `TestServer`), in front of the OpenAI-like
upstream; an agent keeps its full history client-side and sends each turn to the other replica. What the upstream
receives must extend byte for byte between compactions, compactions must happen, and the whole sequence of forwarded
prompts must be exactly the one a single proxy with in-memory state forwards.

Also here: a Redis that is down or fails mid-request never fails a request; the proxy forwards unchanged.
"""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest
import redis.exceptions

from proxy.pipeline.service import CompactionPipeline
from proxy.simulator.openai_upstream import OpenAIUpstream
from proxy.state.redis import RedisStore
from tests.support.agent_run import TOOLS, agent_responder, messages_array, run_agent
from tests.support.proxies import LoopbackProxies

MODEL = "gpt-4o-mini"
WINDOW = 4096
TENANT_KEY = "shared-tenant-key-for-replicas"

StartProxy = Callable[..., Awaitable[tuple[str, CompactionPipeline]]]


@pytest.fixture
async def upstream() -> AsyncIterator[OpenAIUpstream]:
    async with OpenAIUpstream(context_window=WINDOW) as fake:
        yield fake


@pytest.fixture
async def start_proxy(upstream: OpenAIUpstream) -> AsyncIterator[StartProxy]:
    """`await start_proxy(**settings)`: a proxy in front of `upstream`; its `/v1` base URL and compaction service."""
    proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={MODEL: WINDOW}, tenant_key=TENANT_KEY)

    async def start(**overrides: Any) -> tuple[str, CompactionPipeline]:
        proxy = await proxies.start(**overrides)
        return proxy.url, proxy.service

    yield start
    await proxies.close()


async def run_alternating(base_urls: list[str], tasks: int, steps: int) -> list[str]:
    """An agent run whose every turn goes to the next proxy in `base_urls`; returns each turn's X-Compaction."""
    clients = [openai.AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0) for url in base_urls]
    rotation = itertools.cycle(clients)

    async def turn(messages: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
        raw = await next(rotation).chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
        )
        return raw.parse().choices[0].message.model_dump(exclude_none=True), raw.headers.get("x-compaction", "")

    try:
        return await run_agent(turn, tasks, steps)
    finally:
        for client in clients:
            await client.close()


def forwarded_prompts(upstream: OpenAIUpstream) -> list[bytes]:
    return [messages_array(r.body) for r in upstream.requests if r.path.endswith("/chat/completions")]


async def test_alternating_replicas_send_the_upstream_a_byte_identical_prefix(
    upstream: OpenAIUpstream, start_proxy: StartProxy, redis_url: str
) -> None:
    upstream.responder = agent_responder()
    state_url = redis_url.rsplit("/", 1)[0] + "/3"  # a database of its own: nothing else in these tests uses it
    cleaner = RedisStore(state_url, ttl_seconds=60)
    await cleaner._redis.flushdb()
    await cleaner.close()
    replica_a, _ = await start_proxy(state_url=state_url)
    replica_b, _ = await start_proxy(state_url=state_url)

    headers = await run_alternating([replica_a, replica_b], tasks=4, steps=12)
    prompts = forwarded_prompts(upstream)

    assert len(prompts) == len(headers) >= 40
    compactions = headers.count("compacted")
    assert compactions >= 2, f"only {compactions} compactions in {len(headers)} turns: the test proves nothing"
    assert "error" not in headers
    for turn, (previous, current, header) in enumerate(zip(prompts, prompts[1:], headers[1:], strict=False), 1):
        if header == "compacted":
            continue
        assert current.startswith(previous[:-1]), f"turn {turn} (replica {'AB'[turn % 2]}) changed the prefix"
    # Compactions were replayed across replicas, not redone: each one removed something for good.
    assert all(usage["prompt_tokens"] <= WINDOW for usage in upstream.usages)
    cached = sum(usage["prompt_tokens_details"]["cached_tokens"] for usage in upstream.usages)
    assert cached / sum(usage["prompt_tokens"] for usage in upstream.usages) > 0.5

    # And it is exactly what one proxy with its state in memory sends.
    upstream.clear()
    upstream.responder = agent_responder()
    single, _ = await start_proxy()
    assert await run_alternating([single], tasks=4, steps=12) == headers
    assert forwarded_prompts(upstream) == prompts


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_redis_down_forwards_unchanged_and_fast(upstream: OpenAIUpstream, start_proxy: StartProxy) -> None:
    base_url, _ = await start_proxy(state_url=f"redis://127.0.0.1:{_closed_port()}/0")
    body = b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}'
    # A window the body passes in bytes (not in tokens): the request is counted, and its anchors asked of the store.
    headers = {"Authorization": "Bearer sk-test", "X-Context-Window": "64"}
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            started = time.monotonic()
            async with http.post(f"{base_url}/chat/completions", data=body, headers=headers) as response:
                assert response.status == 200
                assert response.headers["X-Compaction"] == "error"
                await response.read()
            assert time.monotonic() - started < 2
    assert [r.body for r in upstream.requests] == [body] * 3


async def test_redis_failing_after_the_answer_still_relays_it(
    upstream: OpenAIUpstream, start_proxy: StartProxy, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store fails while recording the upstream's usage (`complete`): the client still gets its answer."""
    base_url, service = await start_proxy(state_url=redis_url)
    assert isinstance(service.store, RedisStore)

    async def refuse(*_args: Any) -> None:
        raise redis.exceptions.ConnectionError("Redis went away")

    monkeypatch.setattr(service.store, "save_anchor", refuse)
    errors_before = service.metrics.errors._value.get()
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0) as client:
        reply = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Context-Window": "64"},  # over the trigger in bytes: counted and anchored
        )
    assert reply.choices[0].message.content
    assert service.metrics.errors._value.get() == errors_before + 1
