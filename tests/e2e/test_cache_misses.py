"""Every cache miss explained, through the real proxy: each cause in the metric, the access log line and the header.

One fake clock runs both the proxy's ledger and the fake upstream's prompt cache, so waiting past the cache's
lifetime is advancing it, never sleeping. The upstream's own usage is what the causes must add up to.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI

from proxy.pipeline.cache_misses import DEFAULT_LIFETIME
from proxy.server.logging import ACCESS_LOGGER
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.support.fake_clock import FakeClock
from tests.support.proxies import LoopbackProxies, RunningProxy
from tests.support.wire_formats.case import PARAGRAPH, SYSTEM

MODEL = "gpt-4o-mini"
WINDOW = 8192
LONG_SYSTEM = SYSTEM + " " + PARAGRAPH * 80
"""About 1300 tokens: a prefix the fake cache keeps (OpenAI caches prefixes of 1024 tokens and more)."""


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def upstream(clock: FakeClock) -> AsyncIterator[OpenAIUpstream]:
    async with OpenAIUpstream(context_window=WINDOW) as fake:
        fake.prompt_cache.clock = clock
        yield fake


@pytest.fixture
async def proxy(upstream: OpenAIUpstream, clock: FakeClock) -> AsyncIterator[RunningProxy]:
    proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={MODEL: WINDOW}, dashboard=True)
    yield await proxies.start(clock=clock)
    await proxies.close()


@pytest.fixture
async def client(proxy: RunningProxy) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=proxy.url, api_key="sk-test") as opened:
        yield opened


class AccessLines(logging.Handler):
    """The chat completions' access lines, each awaited: the proxy logs a request's line once its answer is sent."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict[str, Any]] = []
        self.logged = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "fields", {})
        if record.getMessage() == "request" and fields.get("route") == "chat_completions":
            self.lines.append(fields)
            self.logged.set()

    async def line(self, number: int) -> dict[str, Any]:
        """The `number`th line (from 1), once it is logged."""

        async def logged() -> None:
            while len(self.lines) < number:
                self.logged.clear()
                await self.logged.wait()

        await asyncio.wait_for(logged(), 10)
        return self.lines[number - 1]


@pytest.fixture
def access() -> Iterator[AccessLines]:
    lines = AccessLines()
    logger = logging.getLogger(ACCESS_LOGGER)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    yield lines
    logger.removeHandler(lines)
    logger.setLevel(level)


async def ask(client: AsyncOpenAI, messages: list[dict[str, Any]]) -> tuple[dict[str, str], Any]:
    """Send `messages`; the response headers and the completion."""
    raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    return dict(raw.headers), raw.parse()


def parsed(value: str) -> dict[str, int]:
    """`new=300,compaction=1200` as a mapping."""
    return {cause: int(tokens) for cause, tokens in (pair.split("=") for pair in value.split(",") if pair != "none")}


def misses(proxy: RunningProxy, cause: str) -> float:
    return proxy.metric("compaction_proxy_cache_miss_tokens_total", api="chat_completions", cause=cause)


def uncached(completion: Any) -> int:
    usage = completion.usage
    return int(usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens)


def opening(question: str = "What failed first?") -> list[dict[str, Any]]:
    return [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": question}]


async def answered(
    client: AsyncOpenAI, messages: list[dict[str, Any]], paragraphs: int = 4
) -> tuple[dict[str, str], Any]:
    """Ask, then keep the answer and a next question of `paragraphs` in `messages` (as a client does)."""
    headers, completion = await ask(client, messages)
    messages.append({"role": "assistant", "content": completion.choices[0].message.content})
    messages.append({"role": "user", "content": "And then? " + PARAGRAPH * paragraphs})
    return headers, completion


async def test_a_first_request_misses_as_first(proxy: RunningProxy, client: AsyncOpenAI, access: AccessLines) -> None:
    headers, completion = await ask(client, opening())
    assert headers["x-compaction-cache-misses"] == "first"
    line = await access.line(1)
    assert parsed(line["cache_misses"]) == {"first": completion.usage.prompt_tokens} == {"first": uncached(completion)}
    assert misses(proxy, "first") == completion.usage.prompt_tokens
    assert line["conversation_hash"] == headers["x-compaction-conversation"]


async def test_waiting_past_the_cache_lifetime_misses_as_expiry(
    proxy: RunningProxy, client: AsyncOpenAI, clock: FakeClock, access: AccessLines
) -> None:
    messages = opening()
    _, first = await answered(client, messages)
    clock.advance(DEFAULT_LIFETIME - 1)
    headers, within = await answered(client, messages)
    assert headers["x-compaction-cache-misses"] == "new"
    assert within.usage.prompt_tokens_details.cached_tokens > 0
    assert "expiry" not in parsed((await access.line(2))["cache_misses"])
    clock.advance(DEFAULT_LIFETIME + 1)
    headers, expired = await ask(client, messages)
    assert expired.usage.prompt_tokens_details.cached_tokens == 0  # the fake upstream forgot the prefix
    assert headers["x-compaction-cache-misses"] == "new,expiry"
    logged = parsed((await access.line(3))["cache_misses"])
    assert logged == {
        "new": expired.usage.prompt_tokens - within.usage.prompt_tokens,
        "expiry": within.usage.prompt_tokens,
    }
    assert sum(logged.values()) == uncached(expired)
    assert misses(proxy, "expiry") == within.usage.prompt_tokens
    assert first.usage.prompt_tokens < within.usage.prompt_tokens


async def test_a_client_that_edits_an_earlier_message_misses_as_client(
    proxy: RunningProxy, client: AsyncOpenAI, access: AccessLines
) -> None:
    messages = opening()
    for _turn in range(3):
        await answered(client, messages)
    messages[3] = {"role": "user", "content": "And then, in short? " + PARAGRAPH * 4}  # an earlier question, edited
    headers, edited = await ask(client, messages)
    assert headers["x-compaction-cache-misses"] == "new,client"
    logged = parsed((await access.line(4))["cache_misses"])
    assert logged["client"] > 0 and "compaction" not in logged
    assert sum(logged.values()) == uncached(edited)
    assert misses(proxy, "client") == logged["client"]
    assert proxy.metric("compaction_proxy_proxy_cache_miss_tokens_total") == 0


async def test_a_conversation_the_proxy_compacts_misses_as_compaction(
    proxy: RunningProxy, client: AsyncOpenAI, access: AccessLines
) -> None:
    messages = opening()
    for turn in range(1, 41):
        headers, completion = await answered(client, messages, paragraphs=16)
        if headers["x-compaction"] == "compacted":
            compacted = turn
            break
    else:
        pytest.fail("the proxy never compacted the conversation")
    assert headers["x-compaction-cache-misses"] == "new,compaction"
    logged = parsed((await access.line(compacted))["cache_misses"])
    assert logged["compaction"] > 0 and "client" not in logged
    assert sum(logged.values()) == uncached(completion)
    assert misses(proxy, "compaction") == logged["compaction"]
    assert proxy.metric("compaction_proxy_proxy_cache_miss_tokens_total") == logged["compaction"]


async def test_the_retry_after_an_overflow_is_recorded_as_the_compaction_it_is(
    upstream: OpenAIUpstream, clock: FakeClock, access: AccessLines
) -> None:
    # The proxy believes the window is far larger than the upstream's: the upstream refuses, the proxy compacts and
    # retries; the one answer the client gets is the retry's, and so is the one record.
    proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={MODEL: 400_000}, dashboard=True)
    proxy = await proxies.start(clock=clock)
    try:
        messages = opening() + [{"role": "user", "content": PARAGRAPH * 40} for _ in range(24)]
        async with AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0) as client:
            headers, completion = await ask(client, messages)
        assert headers["x-compaction"] == "compacted-after-overflow"
        assert headers["x-compaction-cache-misses"] == "first"
        line = await access.line(1)
        assert parsed(line["cache_misses"]) == {"first": uncached(completion)}
        conversation = proxy.service.ledger.conversation(headers["x-compaction-conversation"])
        assert conversation is not None
        (record,) = conversation["records"]
        assert record["compaction"] is not None and record["prompt_tokens"] == completion.usage.prompt_tokens
    finally:
        await proxies.close()
