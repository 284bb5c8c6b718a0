"""The summary client talks to the configured upstream only, and keeps nothing of one caller for another.

A summary call carries the caller's credential and whole conversation: a redirect must not take them to another
host (nor bring that host's answer back as a summary), and a cookie one caller's answer sets must not ride along
with another caller's call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.simulator.openai_upstream import OpenAIUpstream, Reply
from tests.e2e.conftest import MODEL, WINDOW
from tests.e2e.test_summaries import SUMMARY, is_summary_request, settled, summarizing
from tests.support.proxies import LoopbackProxies, RunningProxy

OTHER_SUMMARY = "## Objective\n- written by a host the proxy was never configured to talk to\n"


def completion(content: str) -> dict[str, Any]:
    """A chat completion answer carrying `content`, as an upstream sends it."""
    return {
        "id": "chatcmpl-summary",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3000, "completion_tokens": 30, "total_tokens": 3030},
    }


def over_the_trigger() -> bytes:
    """A conversation of about 3,500 tokens: over the trigger of the 4k window, so it compacts at once."""
    paragraph = "The deploy failed because the migration locked the orders table for eleven minutes. "
    messages = [{"role": "system", "content": "You are terse."}]
    for turn in range(32):
        messages.append({"role": "user", "content": f"{turn}: " + paragraph * 6})
        messages.append({"role": "assistant", "content": "Noted."})
    messages.append({"role": "user", "content": "What went wrong?"})
    return json.dumps({"model": MODEL, "messages": messages}).encode()


async def send(proxy: RunningProxy, key: str) -> dict[str, str]:
    """Send the conversation as the caller holding `key`; the response headers."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{proxy.url}/chat/completions", data=over_the_trigger(), headers={"Authorization": f"Bearer {key}"}
        ) as response,
    ):
        assert response.status == 200
        return dict(response.headers)


@pytest.fixture
async def proxy_for(upstream: OpenAIUpstream) -> AsyncIterator[Callable[..., Any]]:
    """Proxies summarizing first, in front of `upstream` named `localhost` (cookie jars refuse bare IP addresses)."""
    proxies = LoopbackProxies(
        upstream=f"http://localhost:{upstream.port}",
        context_windows={MODEL: WINDOW},
        strategies=["summarization", "sliding_window", "middle_out"],
    )
    yield proxies.start
    await proxies.close()


@pytest.fixture
async def elsewhere() -> AsyncIterator[tuple[str, list[web.Request]]]:
    """Another host on loopback that would write a summary, and the requests that reached it."""
    reached: list[web.Request] = []

    async def answer(request: web.Request) -> web.Response:
        reached.append(request)
        return web.json_response(completion(OTHER_SUMMARY))

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}", reached
    await server.close()


async def test_a_redirected_summary_call_is_not_followed_and_no_summary_is_used(
    upstream: OpenAIUpstream, proxy_for: Callable[..., Any], elsewhere: tuple[str, list[web.Request]]
) -> None:
    other, reached = elsewhere
    upstream.responder = summarizing(lambda _request: Reply(content="Noted."))
    proxy = await proxy_for()
    upstream.fail_next(status=307, headers={"Location": f"{other}/v1/chat/completions"})

    headers = await send(proxy, "sk-alice")
    await settled(proxy)

    assert reached == [], "the caller's credential and conversation were sent to another host"
    assert headers["X-Compaction"] == "compacted"
    assert headers["X-Compaction-Strategies"] == "sliding_window"
    assert proxy.service.metrics.summary_fallbacks.labels("upstream_error")._value.get() == 1
    forwarded = [request for request in upstream.chat_requests if not is_summary_request(request)]
    assert "<conversation_summary>" not in json.dumps(forwarded[-1])


async def test_one_callers_summary_answer_and_cookie_never_reach_another_caller(
    upstream: OpenAIUpstream, proxy_for: Callable[..., Any]
) -> None:
    upstream.responder = summarizing(lambda _request: Reply(content="Noted."))
    proxy = await proxy_for()
    alice_summary = "## Objective\n- alice's own summary\n"
    upstream.fail_next(
        status=200, body=completion(alice_summary), headers={"Set-Cookie": "session=alice; Path=/; HttpOnly"}
    )
    alice = await send(proxy, "sk-alice")
    assert alice["X-Compaction-Strategies"].startswith("summarization"), "alice's summary answer was not used"

    # Bob sends the very same conversation: his compaction must be summarized by a call of his own.
    bob = await send(proxy, "sk-bob")
    await settled(proxy)

    assert bob["X-Compaction-Strategies"].startswith("summarization")
    bob_calls = [
        request
        for request in upstream.requests
        if request.json and is_summary_request(request.json) and request.headers["Authorization"] == "Bearer sk-bob"
    ]
    assert len(bob_calls) == 1, "bob was served a summary written for alice"
    assert "Cookie" not in bob_calls[0].headers, "alice's cookie was sent with bob's summary call"
    bob_forwarded = json.dumps(upstream.requests[-1].json)
    assert SUMMARY.splitlines()[1] in bob_forwarded and "alice" not in bob_forwarded


async def test_an_oversized_summary_answer_is_not_read_whole_and_the_compaction_falls_back(
    upstream: OpenAIUpstream, proxy_for: Callable[..., Any]
) -> None:
    upstream.responder = summarizing(lambda _request: Reply(content="Noted."))
    proxy = await proxy_for()
    upstream.fail_next(status=200, body=completion("word " * 1_000_000))  # 5 MB: no summary is that long

    headers = await send(proxy, "sk-alice")
    await settled(proxy)

    assert headers["X-Compaction-Strategies"] == "sliding_window"
    assert proxy.service.metrics.summary_fallbacks.labels("answer_too_large")._value.get() == 1


async def test_summaries_waiting_for_a_call_slot_are_bounded_and_the_rest_fall_back() -> None:
    """Each unfinished summary holds its whole conversation: past the running calls and one waiting per slot, none
    is started, so a flood of long conversations cannot pile them up in memory."""
    release = asyncio.Event()
    summary_calls: list[str] = []

    async def upstream(request: web.Request) -> web.Response:
        body = await request.json()
        if is_summary_request(body):
            summary_calls.append(request.headers["Authorization"])
            await release.wait()
            return web.json_response(completion(SUMMARY))
        return web.json_response(completion("Noted."))

    app = web.Application()
    app.router.add_post("/v1/chat/completions", upstream)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    proxies = LoopbackProxies(
        upstream=f"http://127.0.0.1:{server.port}",
        context_windows={MODEL: WINDOW},
        strategies=["summarization", "sliding_window", "middle_out"],
        summary_concurrency=1,
        summary_wait_seconds=0,
    )
    try:
        proxy = await proxies.start()
        for caller in ("sk-1", "sk-2", "sk-3"):
            headers = await send(proxy, caller)
            assert headers["X-Compaction-Strategies"] == "sliding_window"
        fallbacks = proxy.service.metrics.summary_fallbacks
        assert fallbacks.labels("busy")._value.get() == 1, "a third summary was started with two unfinished"
        assert proxy.service.metrics.summaries_started._value.get() == 2
        release.set()
        await settled(proxy)
        assert summary_calls == ["Bearer sk-1", "Bearer sk-2"]
    finally:
        release.set()
        await proxies.close()
        await server.close()
