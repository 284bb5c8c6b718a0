"""A compaction on a turn whose newest message carries the client's cache breakpoint is replayed on the next turn.

A client that moves its breakpoint to its newest message every turn (Claude Code, `tests.support.anthropic_agent`)
sends a user message's text as a text block carrying `cache_control` on the turn it is newest, and as a plain string
on the next. Both read the same to the model; the rewrite remembered on the first turn must be found on the second,
else the proxy compacts the conversation again and the provider's cache serves none of the prompt it had written.
"""

from __future__ import annotations

from typing import Any

from proxy.simulator.anthropic_upstream import AnthropicUpstream
from tests.support.anthropic_agent import with_breakpoint_last
from tests.support.proxies import LoopbackProxies
from tests.support.wire_formats import MESSAGES

WINDOW = 8000
"""A 14-turn conversation of `MESSAGES.conversation` (about 7,500 tokens) is over the trigger, its target (3,200)
over the cache's 1,024-token minimum."""


async def test_the_turn_after_a_compaction_replays_it_when_the_breakpoint_moved(
    anthropic_upstream: AnthropicUpstream,
) -> None:
    anthropic_upstream.context_window = WINDOW
    proxies = LoopbackProxies(upstream=anthropic_upstream.base_url, context_windows={MESSAGES.model: WINDOW})
    try:
        proxy = await proxies.start()
        first = MESSAGES.conversation(14, paragraphs=10)
        messages: list[dict[str, Any]] = first["messages"]
        assert isinstance(messages[-1]["content"], str), "the newest message is a user's text"
        status, headers, answer = await MESSAGES.post(proxy, {**first, "messages": with_breakpoint_last(messages)})
        assert (status, headers["X-Compaction"]) == (200, "compacted"), headers

        later = [*messages, {"role": "assistant", "content": answer["content"]}, {"role": "user", "content": "And?"}]
        status, headers, answer = await MESSAGES.post(proxy, {**first, "messages": with_breakpoint_last(later)})
    finally:
        await proxies.close()

    assert (status, headers["X-Compaction"]) == (200, "unchanged"), "the remembered compaction was not replayed"
    compacted, replayed = (MESSAGES.comparable_entries(body["messages"]) for body in anthropic_upstream.requests[-2:])
    assert replayed[: len(compacted)] == compacted, "the next turn does not extend the compacted prompt"
    usage = anthropic_upstream.usages[-1]
    prompt = usage["input_tokens"] + usage["cache_creation_input_tokens"] + usage["cache_read_input_tokens"]
    assert usage["cache_read_input_tokens"] >= prompt // 2, f"the cache served little of the prompt: {usage}"
