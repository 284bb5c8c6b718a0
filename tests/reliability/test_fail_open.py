"""Fail open, proven: with a strategy that raises or a state store whose every method raises, every request,
streamed or not, still gets the upstream's answer, and the compaction-errors metric counts each one.

The faults go in through the designed seams (`CompactionPipeline(settings, store=..., chain=...)`); nothing of
ours is mocked. Already covered in tests/server: a `Compaction` whose prepare/complete raise (server-side net).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NoReturn

import aiohttp
import pytest

from proxy.config import Settings
from proxy.engine import CompactionChain, SlidingWindow, Strategy, Transcript
from proxy.engine.plan import EditPlan
from proxy.pipeline.service import CompactionPipeline
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.reliability.conftest import MODEL, MakeProxy, Proxy, chat_body, post_chat, wait_for

PARAGRAPH = "The deploy failed because the migration locked the orders table for eleven minutes. "


def long_conversation(turns: int = 30) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: " + PARAGRAPH * 4})
        messages.append({"role": "assistant", "content": PARAGRAPH * 4})
    messages.append({"role": "user", "content": "What went wrong?"})
    return messages


class RaisingStrategy(Strategy):
    """A strategy with a bug: it raises whenever it is asked for a plan."""

    name = "raising"

    def __init__(self) -> None:
        self.calls = 0

    def _propose(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        self.calls += 1
        raise RuntimeError("strategy bug")


class RaisingStore:
    """A state store that is down: every method raises (as a Redis client does when the server is gone)."""

    def __init__(self) -> None:
        self.calls = 0

    def _fail(self) -> NoReturn:
        self.calls += 1
        raise ConnectionError("state store unavailable")

    async def latest_rewrite(self, tenant: bytes, chain: Sequence[bytes], start: int = 0) -> NoReturn:
        self._fail()

    async def save_rewrite(self, tenant: bytes, chain_key: bytes, plan: EditPlan) -> NoReturn:
        self._fail()

    async def latest_anchor(self, tenant: bytes, chain: Sequence[bytes], start: int = 0) -> NoReturn:
        self._fail()

    async def save_anchor(self, tenant: bytes, chain_key: bytes, tokens: int) -> NoReturn:
        self._fail()

    async def close(self) -> NoReturn:
        self._fail()


def streamed_text(answer: bytes) -> str:
    """The assistant text of an SSE chat stream, reassembled from its deltas."""
    text = ""
    for event in answer.split(b"\n\n"):
        if event.startswith(b"data: {"):
            for choice in json.loads(event[6:])["choices"]:
                text += choice["delta"].get("content") or ""
    return text


def errors(proxy: Proxy) -> float:
    return proxy.metric("compaction_proxy_compaction_errors_total")


async def assert_every_request_answered(
    proxy: Proxy, upstream: OpenAIUpstream, http: aiohttp.ClientSession, window: str
) -> int:
    """Send non-streamed and streamed requests, over the trigger and under it; each gets the upstream's answer."""
    sent = 0
    for messages in (long_conversation(), long_conversation(2)):
        for stream in (False, True):
            body = chat_body(stream=stream, messages=messages)
            before = len(upstream.chat_requests)
            status, headers, answer = await post_chat(http, proxy, body, **{"X-Context-Window": window})
            sent += 1
            assert status == 200, answer
            assert len(upstream.chat_requests) == before + 1
            if stream:
                assert answer.endswith(b"data: [DONE]\n\n")
                reply = streamed_text(answer)
            else:
                reply = json.loads(answer)["choices"][0]["message"]["content"]
                assert reply == f"ok {len(messages)} messages"  # the upstream saw every message: nothing was cut
            if headers["X-Compaction"] == "error":
                assert upstream.requests[-1].body == body  # forwarded byte for byte
    return sent


async def test_a_raising_strategy_fails_open(make_proxy: MakeProxy, http: aiohttp.ClientSession) -> None:
    async with OpenAIUpstream(context_window=1_000_000) as upstream:
        settings = Settings(upstream=upstream.base_url)
        strategy = RaisingStrategy()
        service = CompactionPipeline(settings, chain=CompactionChain([strategy]))
        proxy = await make_proxy(upstream.base_url, service)
        sent = await assert_every_request_answered(proxy, upstream, http, window="3000")
        assert strategy.calls == 2  # the two over-trigger requests reached the strategy...
        assert errors(proxy) == 2  # ...and each was counted as a fail-open
        await wait_for(
            lambda: proxy.metric("compaction_proxy_requests_total", route="chat_completions", status="200") == sent
        )


async def test_a_raising_strategy_in_the_overflow_retry_relays_the_upstreams_error(
    make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    async with OpenAIUpstream(context_window=4096) as upstream:
        settings = Settings(upstream=upstream.base_url, context_windows={MODEL: 16_384})
        # The strategy that raises comes first; the sliding window after it is never reached.
        service = CompactionPipeline(settings, chain=CompactionChain([RaisingStrategy(), SlidingWindow()]))
        proxy = await make_proxy(upstream.base_url, service)
        for stream in (False, True):
            status, _, answer = await post_chat(http, proxy, chat_body(stream=stream, messages=long_conversation(40)))
            assert status == 400
            assert json.loads(answer)["error"]["code"] == "context_length_exceeded"  # the upstream's own answer
        assert errors(proxy) == 2
        assert len(upstream.chat_requests) == 2  # no retry was sent


async def test_a_store_that_is_down_fails_open(make_proxy: MakeProxy, http: aiohttp.ClientSession) -> None:
    async with OpenAIUpstream(context_window=1_000_000) as upstream:
        settings = Settings(upstream=upstream.base_url)
        store = RaisingStore()
        proxy = await make_proxy(upstream.base_url, CompactionPipeline(settings, store=store))
        sent = await assert_every_request_answered(proxy, upstream, http, window="3000")
        assert store.calls >= sent
        assert errors(proxy) == sent
        # Shutting down with a store that cannot close is logged, not raised.
        await proxy.server.close()


@pytest.mark.parametrize("mode", ["enforce", "observe"])
async def test_both_faults_at_once_in_either_mode(
    make_proxy: MakeProxy, http: aiohttp.ClientSession, mode: str
) -> None:
    async with OpenAIUpstream(context_window=1_000_000) as upstream:
        settings = Settings(upstream=upstream.base_url, mode=mode)
        service = CompactionPipeline(settings, store=RaisingStore(), chain=CompactionChain([RaisingStrategy()]))
        proxy = await make_proxy(upstream.base_url, service, mode=mode)
        sent = await assert_every_request_answered(proxy, upstream, http, window="3000")
        assert errors(proxy) == sent
