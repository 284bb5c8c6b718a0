"""A small Messages request whose bytes (plus the tool-use system prompt) are under the trigger is forwarded as it
came and decided on its size alone, as a chat request is (`proxy.pipeline.byte_bound`); one holding a block the
bytes do not bound (thinking, an image) is counted the full way; the overflow retry still serves the small ones.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from proxy.simulator.anthropic_rules import prompt_segments
from proxy.simulator.anthropic_upstream import AnthropicUpstream
from tests.e2e.messages.conftest import NON_BINDING, base_url
from tests.e2e.messages.test_controls import post
from tests.support.anthropic_agent import SYSTEM, TOOLS
from tests.support.anthropic_conversations import png
from tests.support.proxies import LoopbackProxies, RunningProxy

TOOL_PROMPT_TOKENS = 346


@pytest.fixture
async def proxy(upstream: AnthropicUpstream) -> AsyncIterator[RunningProxy]:
    """A proxy that takes the Claude models' window to be a million tokens."""
    proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={"claude": 1_000_000})
    yield await proxies.start()
    await proxies.close()


def small_body(*blocks: dict[str, Any]) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": "Find the release notes."}, *blocks]
    messages = [{"role": "user", "content": content}]
    return {"model": NON_BINDING, "max_tokens": 256, "system": SYSTEM, "tools": TOOLS, "messages": messages}


async def test_a_small_request_is_forwarded_as_it_came_sized_by_its_bytes(
    upstream: AnthropicUpstream, proxy: RunningProxy
) -> None:
    body = small_body()
    status, headers, raw = await post(base_url(proxy), body)
    assert status == 200, raw
    assert upstream.bodies[-1] == orjson.dumps(body)
    assert headers["X-Compaction"] == "unchanged"
    assert headers["X-Compaction-Tokens-Before-Bound"] == "true"
    bound = int(headers["X-Compaction-Tokens-Before"])
    assert bound == len(upstream.bodies[-1]) + TOOL_PROMPT_TOKENS
    assert bound >= sum(segment.tokens for segment in prompt_segments(body, body["messages"]))


@pytest.mark.parametrize(
    "block",
    [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png(1000, 1000)}},
        {"type": "document", "source": {"type": "url", "url": "https://example.com/notes.pdf"}},
    ],
    ids=["image", "document"],
)
async def test_a_block_the_bytes_do_not_bound_is_counted_the_full_way(
    upstream: AnthropicUpstream, proxy: RunningProxy, block: dict[str, Any]
) -> None:
    status, headers, raw = await post(base_url(proxy), small_body(block))
    assert status == 200, raw
    # Counted as the API charges it: far above the block's few hundred bytes.
    assert int(headers["X-Compaction-Tokens-Before"]) > len(upstream.bodies[-1]) + TOOL_PROMPT_TOKENS


async def test_an_overflow_of_a_request_sized_by_its_bytes_is_retried(upstream: AnthropicUpstream) -> None:
    """The proxy believes the window is a million tokens; the upstream has 2,000 and says so in its error."""
    upstream.context_window = 2_000
    proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={"claude": 1_000_000})
    try:
        proxy = await proxies.start()
        messages: list[dict[str, Any]] = []
        for turn in range(12):
            messages += [
                {"role": "user", "content": f"Question {turn}: " + "detail " * 100},
                {"role": "assistant", "content": f"Answer {turn}: " + "point " * 100},
            ]
        messages.append({"role": "user", "content": "Go on."})
        body = {"model": NON_BINDING, "max_tokens": 256, "messages": messages}
        status, headers, raw = await post(base_url(proxy), body)
    finally:
        await proxies.close()
    assert status == 200, raw
    assert headers["X-Compaction"] == "compacted-after-overflow"
    assert headers["X-Compaction-Context-Window"] == "2000"
