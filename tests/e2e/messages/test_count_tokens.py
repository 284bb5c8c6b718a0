"""`count_tokens` on a conversation the proxy rewrote: counted as the proxy forwards it, never refused.

On a model that binds thinking to its prefix, the model's answers after a compaction carry thinking signed over the
proxy's rewritten conversation. A client that counts its own history (Claude Code does, every few turns) sends those
blocks after a prefix they were not signed over; the API's count runs the same prefix check as creating a message
and would refuse it with a 400. The proxy counts what it would forward instead: the remembered rewrite replayed, the
binding rules applied, the read tool declared where it is.
"""

from __future__ import annotations

from typing import Any

import pytest
from anthropic import AsyncAnthropic

from proxy.simulator.anthropic_upstream import AnthropicUpstream
from tests.e2e.messages.conftest import BINDING, WINDOW, sdk
from tests.support.anthropic_agent import run_agent
from tests.support.proxies import LoopbackProxies

TURNS = 120
EVERY = 3
"""The client counts its tokens every this many turns."""


def prompt_of(usage: dict[str, int]) -> int:
    return usage["input_tokens"] + usage["cache_creation_input_tokens"] + usage["cache_read_input_tokens"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_counts_of_a_rewritten_conversation_are_what_the_upstream_is_then_sent(
    upstream: AnthropicUpstream, proxies: LoopbackProxies, stream: bool
) -> None:
    proxy = await proxies.start()
    counted: list[tuple[int, int, int]] = []
    """Each count: the turn, its tokens, and how many answers the upstream had given before it."""

    async with sdk(proxy) as client:

        async def count(turn: int, body: dict[str, Any]) -> None:
            if turn % EVERY == 0:
                fields = {key: value for key, value in body.items() if key != "max_tokens"}
                answer = await client.messages.count_tokens(**fields)
                counted.append((turn, answer.input_tokens, len(upstream.usages)))

        run = await run_agent(client, BINDING, TURNS, lambda turn: stream, before=count)

    assert "compacted" in run.decisions, "the conversation never needed compacting: the test proves nothing"
    assert upstream.rejections == []
    # Each count equals the prompt the upstream reported for the turn's request, unless that turn compacted anew.
    compared = 0
    for turn, tokens, answered in counted:
        if run.decisions[turn] != "compacted":
            assert tokens == prompt_of(upstream.usages[answered]), f"turn {turn}"
            compared += 1
    after = [turn for turn, _, _ in counted if turn > run.decisions.index("compacted")]
    assert compared > len(counted) // 2 and after, "too few counts compared, or none after a compaction"


async def test_a_count_of_a_conversation_the_proxy_never_rewrote_is_forwarded_as_it_came(
    upstream: AnthropicUpstream, proxies: LoopbackProxies
) -> None:
    proxy = await proxies.start()
    body: dict[str, Any] = {"model": BINDING, "messages": [{"role": "user", "content": "How long is this?"}]}
    async with sdk(proxy) as client:
        counted = await client.messages.count_tokens(**body)
    async with AsyncAnthropic(base_url=upstream.base_url, api_key="sk-ant-test", max_retries=0) as direct:
        assert counted.input_tokens == (await direct.messages.count_tokens(**body)).input_tokens
    assert upstream.count_requests[0][0] == upstream.count_requests[1][0] == body
    assert counted.input_tokens < WINDOW
