"""The proxy's cache breakpoint at the end of the head a compaction keeps, through the proxy and the `anthropic` SDK.

Anthropic writes a cache entry only for the prefix ending at a breakpoint and looks for hits only at the request's
breakpoints and about 20 blocks before each (`proxy.formats.anthropic.rules`). A client whose breakpoints sit on its
system prompt and its newest message (Claude Code, `tests.support.anthropic_agent`) never writes its opening, which
lies far before its newest message once a compaction rewrote the middle: without a breakpoint of the proxy's own
there, every compaction sends the opening uncached. The breakpoint is added only to requests the proxy rewrites, only
while the request holds fewer than four, never changing the client's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from proxy.simulator.anthropic_rules import prompt_segments
from proxy.simulator.anthropic_upstream import AnthropicUpstream
from tests.e2e.messages.conftest import NON_BINDING, sdk
from tests.support.anthropic_agent import SYSTEM, TOOLS, run_agent, task_text
from tests.support.proxies import LoopbackProxies

WINDOW = 12_000
"""Small enough that the agent's tasks (about 1,100 tokens each) bring several compactions within 60 turns."""

OPENING = "The specification: " + "every module keeps its rules in its docstring. " * 160
"""The user's opening message: about 1,500 tokens, over the cache's 1,024-token minimum with the tools and system."""


def opening_task(turn: int) -> str:
    """The opening specification on the first turn, the agent's usual tasks after."""
    return OPENING if turn == 0 else task_text(turn)


def marks(body: Mapping[str, Any]) -> Iterator[Any]:
    """Every `cache_control` in a request, in the order the API reads them."""
    for tool in body.get("tools") or ():
        yield tool.get("cache_control")
    for block in body.get("system") or ():
        yield block.get("cache_control")
    for message in body["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else ():
            yield block.get("cache_control")


async def test_each_compaction_after_the_first_reads_the_kept_opening_from_the_cache(
    upstream: AnthropicUpstream,
) -> None:
    upstream.context_window = WINDOW
    proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={"claude": WINDOW})
    try:
        proxy = await proxies.start()
        async with sdk(proxy) as client:
            run = await run_agent(client, NON_BINDING, 60, lambda turn: turn % 2 == 1, task=opening_task)
    finally:
        await proxies.close()

    compactions = [turn for turn, decision in enumerate(run.decisions) if decision == "compacted"]
    assert len(compactions) >= 3, f"too few compactions to prove anything: {run.decisions}"
    head = sum(segment.tokens for segment in prompt_segments(upstream.requests[0], upstream.requests[0]["messages"]))
    for turn in compactions[1:]:
        read = upstream.usages[turn]["cache_read_input_tokens"]
        assert read >= head, f"compaction at turn {turn} read {read} tokens from the cache, not the {head} of its head"
    assert upstream.rejections == []
    assert all(sum(mark is not None for mark in marks(body)) <= 4 for body in upstream.requests)


async def test_a_request_holding_four_breakpoints_gets_none_of_the_proxys(
    upstream: AnthropicUpstream, proxies: LoopbackProxies
) -> None:
    upstream.context_window = WINDOW
    hour = {"type": "ephemeral", "ttl": "1h"}
    system = [{**SYSTEM[0], "cache_control": hour}, {"type": "text", "text": "Be brief.", "cache_control": hour}]
    tools = [{**TOOLS[0], "cache_control": hour}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": OPENING}]
    for turn in range(1, 12):
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "Done. " * 300}]})
        messages.append({"role": "user", "content": task_text(turn) * 2})
    messages[-1] = {
        "role": "user",
        "content": [{"type": "text", "text": "Go on.", "cache_control": {"type": "ephemeral"}}],
    }
    body = {"model": NON_BINDING, "max_tokens": 1024, "system": system, "tools": tools, "messages": messages}
    proxy = await proxies.start(context_windows={"claude": WINDOW})
    async with sdk(proxy) as client:
        raw = await client.messages.with_raw_response.create(**body)
    assert raw.headers["x-compaction"] == "compacted"
    sent = upstream.requests[-1]
    assert [mark for mark in marks(sent) if mark is not None] == [hour, hour, hour, {"type": "ephemeral"}]
    assert sent["messages"][-1]["content"] == messages[-1]["content"], "the client's newest breakpoint moved"


async def test_a_request_the_proxy_does_not_rewrite_goes_byte_for_byte(
    upstream: AnthropicUpstream, proxies: LoopbackProxies
) -> None:
    proxy = await proxies.start()
    messages = [
        {"role": "user", "content": [{"type": "text", "text": OPENING, "cache_control": {"type": "ephemeral"}}]}
    ]
    body = {"model": NON_BINDING, "max_tokens": 1024, "system": SYSTEM, "tools": TOOLS, "messages": messages}
    async with sdk(upstream) as direct, sdk(proxy) as client:
        await direct.messages.create(**body)
        raw = await client.messages.with_raw_response.create(**body)
    assert raw.headers["x-compaction"] == "unchanged"
    going_direct, through_the_proxy = upstream.bodies
    assert through_the_proxy == going_direct, "an untouched request was not forwarded as the client sent it"
