"""Hostile round 4 on per-conversation memory: what the proxy keeps between a conversation's requests is bounded in
bytes, measured on the proxy's own process (RSS) against a control run in the same test.

Issue 37: for the Messages API models that bind thinking to its prefix (the model name comes from the client), the
proxy kept a digest per forwarded message per conversation, for up to 4,096 conversations and no byte bound: 40
conversations of 60,000 one-letter messages grew it by 114 MiB against 21 MiB on a non-binding model.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.reliability.fixed_upstream import FixedUpstream
from tests.support import process_proxy
from tests.support.process_proxy import ProcessProxy, StartProcessProxy

start_process_proxy = process_proxy.start_process_proxy

MIB = 1 << 20
BINDING = "claude-fable-5-1"
NON_BINDING = "claude-sonnet-4-5"
CONVERSATIONS = 36
"""Enough that the least an unbounded memory would hold (16 bytes a message) stands well above the allocator's noise
between two processes' RSS: at 12 the margin was 4.7 MiB and one clean-clone run saw 7.6 MiB of noise."""
MESSAGES = 40_000
WINDOW = 150_000
"""Smaller than a conversation's tokens, so each is compacted (and its forward remembered), yet keeping most."""
FORWARDED_MEMORY = 1 * MIB
PREFIX_MEMORY = 1 * MIB
"""Too small to keep any of these requests' parsed messages (bounded by `prefix_memory_bytes` already), so what
grows besides is what the binding models keep of each forward."""


def conversation(model: str, tag: int) -> dict[str, Any]:
    """A Messages API request of `MESSAGES` one-letter messages, distinct from every other tag's from the first."""
    messages = [{"role": "user" if number % 2 == 0 else "assistant", "content": "a"} for number in range(MESSAGES)]
    messages[0] = {"role": "user", "content": f"conversation {tag}"}
    return {"model": model, "max_tokens": 100, "messages": messages}


async def growth_over_conversations(start: StartProcessProxy, upstream: FixedUpstream, model: str) -> int:
    """The RSS growth of a fresh proxy over `CONVERSATIONS` long conversations on `model`, one request each."""
    proxy: ProcessProxy = await start(
        upstream.base_url,
        context_windows={BINDING: WINDOW, NON_BINDING: WINDOW},
        forwarded_memory_bytes=FORWARDED_MEMORY,
        prefix_memory_bytes=PREFIX_MEMORY,
    )
    headers = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01", "content-type": "application/json"}
    async with aiohttp.ClientSession() as http:

        async def send(tag: int) -> None:
            body = json.dumps(conversation(model, tag))
            async with http.post(proxy.url + "/v1/messages", data=body, headers=headers) as response:
                await response.read()
                assert (response.status, response.headers["X-Compaction"]) == (200, "compacted")

        await send(-1)  # warm-up: what every request needs is in the baseline
        before = proxy.rss_bytes()
        for tag in range(CONVERSATIONS):
            await send(tag)
        return proxy.rss_bytes() - before


async def test_what_binding_models_keep_of_each_forward_is_bounded_in_bytes(
    start_process_proxy: StartProcessProxy,
) -> None:
    async with FixedUpstream() as upstream:
        control = await growth_over_conversations(start_process_proxy, upstream, NON_BINDING)
        binding = await growth_over_conversations(start_process_proxy, upstream, BINDING)
    unbounded = CONVERSATIONS * MESSAGES * 16  # a 16-byte digest per message, the least an unbounded memory holds
    assert binding < control + FORWARDED_MEMORY + unbounded / 2, (binding / MIB, control / MIB, unbounded / MIB)
