"""A request that reserves room for its reply is compacted early enough that the upstream accepts it.

Providers reject a prompt that leaves less than the requested output (`max_tokens`, `max_completion_tokens`,
`max_output_tokens`) in the window, each with its own error. A conversation at 60% of the window asking for half of
it is refused going direct; through the proxy it is compacted to fit what is left, and the headers say that the
reservation decided it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.support.proxies import LoopbackProxies

MODEL = "gpt-4o-mini"
WINDOW = 8192


@pytest.fixture
async def upstream() -> AsyncIterator[OpenAIUpstream]:
    async with OpenAIUpstream(context_window=WINDOW) as fake:
        yield fake


def conversation(words: int) -> list[dict[str, Any]]:
    """Turns of about `words` words each, to 60% of the window."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are brief."}]
    for turn in range(10):
        messages.append({"role": "user", "content": f"Question {turn}: " + "tell me more " * (words // 3)})
        messages.append({"role": "assistant", "content": "Here is more. " * (words // 3)})
    messages.append({"role": "user", "content": "Now write the long report."})
    return messages


CASES = {
    "chat max_tokens": ("/chat/completions", lambda m: {"messages": m, "max_tokens": WINDOW // 2}, "messages"),
    "chat max_completion_tokens": (
        "/chat/completions",
        lambda m: {"messages": m, "max_completion_tokens": WINDOW // 2},
        "messages",
    ),
    "responses max_output_tokens": (
        "/responses",
        lambda m: {"input": m[1:], "max_output_tokens": WINDOW // 2},
        "input",
    ),
}


@pytest.mark.parametrize("case", CASES)
async def test_the_reply_reservation_makes_room_before_forwarding(upstream: OpenAIUpstream, case: str) -> None:
    path, shape, field = CASES[case]
    body = {"model": MODEL, **shape(conversation(words=200))}
    proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={MODEL: WINDOW})
    try:
        proxy = await proxies.start()
        async with aiohttp.ClientSession() as session:
            async with session.post(upstream.base_url + "/v1" + path, json=body) as direct:
                assert direct.status == 400
                assert (await direct.json())["error"]["code"] == "context_length_exceeded"
            async with session.post(proxy.url + path, json=body) as through:
                assert through.status == 200, await through.text()
                assert through.headers["X-Compaction"] == "compacted"
                assert through.headers["X-Compaction-Reserved"] == str(WINDOW // 2)
                assert int(through.headers["X-Compaction-Tokens-Before"]) < 0.7 * WINDOW
        forwarded = upstream.requests[-1].json
        assert len(forwarded[field]) < len(body[field])
    finally:
        await proxies.close()


async def test_a_small_reservation_changes_nothing(upstream: OpenAIUpstream) -> None:
    body = {"model": MODEL, "messages": conversation(words=200), "max_tokens": 100}
    proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={MODEL: WINDOW})
    try:
        proxy = await proxies.start()
        async with aiohttp.ClientSession() as session, session.post(proxy.url + "/chat/completions", json=body) as r:
            assert r.status == 200
            assert r.headers["X-Compaction"] == "unchanged"
            assert "X-Compaction-Reserved" not in r.headers
    finally:
        await proxies.close()
