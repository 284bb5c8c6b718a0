"""Anthropic's own context management through the real proxy: what the API clears or compacts on its side is not what
the proxy removes.

An agent on the official `anthropic` SDK sends `context_management` edits with their beta headers; the fake upstream
performs them as the API documents (`proxy.simulator.anthropic_context`) and reports the usage of what it processed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from anthropic import AsyncAnthropic

from proxy.simulator.anthropic_context import COMPACTION_BETA, EDITING_BETA
from proxy.simulator.anthropic_rules import prompt_segments
from proxy.simulator.anthropic_upstream import AnthropicUpstream, tool_loop_responder
from tests.e2e.messages.conftest import NON_BINDING, sdk
from tests.support.anthropic_agent import SYSTEM, TOOLS
from tests.support.proxies import LoopbackProxies

WINDOW = 16_000
"""The model's window: the proxy's trigger is at 11,200 tokens."""

KEEP = 3


@pytest.fixture
def window() -> int:
    """This module's window, for the folder's `upstream` and `proxies` fixtures."""
    return WINDOW


@dataclass
class Run:
    """What an agent run saw: each turn's response headers, and the client's whole history."""

    headers: list[dict[str, str]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def decisions(self) -> list[str]:
        return [headers.get("x-compaction", "") for headers in self.headers]


async def run_agent(
    client: AsyncAnthropic,
    turns: int,
    management: dict[str, Any],
    beta: str,
    *,
    task_words: int,
    result_words: int,
    run: Run | None = None,
) -> Run:
    """`turns` requests of a tool-calling agent asking for `management`; tasks and results of so many words.

    :param run: A run to go on with (its history), through another proxy.
    """
    run = run or Run()
    for turn in range(len(run.headers), len(run.headers) + turns):
        last = run.messages[-1] if run.messages else None
        if last is None or (last["role"] == "assistant" and last["content"][-1]["type"] == "text"):
            run.messages.append({"role": "user", "content": f"Task {turn}: " + "details " * task_words})
        raw = await client.beta.messages.with_raw_response.create(
            model=NON_BINDING,
            max_tokens=1024,
            system=SYSTEM,
            tools=TOOLS,
            messages=run.messages,
            context_management=management,
            betas=[beta],
        )
        message = await raw.parse()
        run.headers.append({key.lower(): value for key, value in raw.headers.items()})
        content = [block.model_dump(exclude_none=True) for block in message.content]
        run.messages.append({"role": "assistant", "content": content})
        calls = [block for block in content if block["type"] == "tool_use"]
        if calls:
            found = "found " * result_words
            run.messages.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": c["id"], "content": found} for c in calls],
                }
            )
    return run


def clearing(trigger: int, keep: int = KEEP) -> dict[str, Any]:
    """A `clear_tool_uses_20250919` edit."""
    return {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": trigger},
                "keep": {"type": "tool_uses", "value": keep},
            }
        ]
    }


def sent(body: dict[str, Any]) -> int:
    """The tokens of a request as sent, as the upstream counts them."""
    return sum(segment.tokens for segment in prompt_segments(body, body["messages"]))


def processed(usage: dict[str, Any]) -> int:
    """What the upstream read for one message (the top-level usage: its `message` iterations)."""
    return int(usage["input_tokens"] + usage["cache_creation_input_tokens"] + usage["cache_read_input_tokens"])


async def test_what_the_api_clears_is_not_compacted_by_the_proxy(
    upstream: AnthropicUpstream, proxies: LoopbackProxies
) -> None:
    """A long tool run whose results the API clears past 8,000 tokens: it grows past one and a half windows as sent, the
    API keeps it under the window, and the proxy forwards every request as the client sent it, restarted too (when
    it has no usage report to go by)."""
    proxy = await proxies.start()
    async with sdk(proxy) as client:
        run = await run_agent(client, 90, clearing(8_000), EDITING_BETA, task_words=80, result_words=400)
    # The proxy restarted: no usage report to go by, the conversation is counted as sent.
    async with sdk(await proxies.start()) as client:
        await run_agent(client, 3, clearing(8_000), EDITING_BETA, task_words=80, result_words=400, run=run)
    assert "compacted" not in run.decisions
    assert upstream.rejections == []
    assert all(processed(usage) < WINDOW for usage in upstream.usages)
    assert sent(upstream.requests[-1]) > 1.5 * WINDOW
    assert upstream.requests[-1]["messages"] == run.messages[:-1]  # forwarded as the client sent it
    last = run.headers[-1]
    assert int(last["x-compaction-provider-clears"]) > WINDOW
    estimate, reported = int(last["x-compaction-provider-tokens"]), processed(upstream.usages[-1])
    assert abs(estimate - reported) <= 0.1 * reported


async def test_when_the_api_clears_too_little_the_proxy_compacts_what_the_api_keeps(
    upstream: AnthropicUpstream, proxies: LoopbackProxies
) -> None:
    """Long tasks the API never clears (only tool results): the proxy compacts, the upstream accepts every request, and
    no result the API clears anyway is rewritten by the proxy."""
    proxy = await proxies.start()
    async with sdk(proxy) as client:
        run = await run_agent(client, 75, clearing(6_000), EDITING_BETA, task_words=700, result_words=400)
    assert "compacted" in run.decisions
    assert upstream.rejections == []
    assert all(processed(usage) < WINDOW for usage in upstream.usages)
    for body, headers, usage in zip(upstream.requests, run.headers, upstream.usages, strict=True):
        if headers["x-compaction"] == "compacted":
            assert _rewritten_among_cleared(body) == []
            estimate, reported = int(headers["x-compaction-provider-tokens"]), processed(usage)
            assert abs(estimate - reported) <= 0.1 * reported
            assert int(headers["x-compaction-tokens-after"]) == estimate + int(headers["x-compaction-provider-clears"])


def _rewritten_among_cleared(body: dict[str, Any]) -> list[str]:
    """The results the API clears (all but the latest `KEEP` calls') whose content the proxy changed."""
    uses = [
        block["id"]
        for m in body["messages"]
        if isinstance(m["content"], list)
        for block in m["content"]
        if block["type"] == "tool_use"
    ]
    cleared = set(uses[: len(uses) - KEEP])
    return [
        block["tool_use_id"]
        for message in body["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block["type"] == "tool_result" and block["tool_use_id"] in cleared and not _original(block["content"])
    ]


def _original(content: Any) -> bool:
    return isinstance(content, str) and set(content.split()) == {"found"}


async def test_the_apis_compaction_is_deferred_to_and_read_from_its_block() -> None:
    """Server-side compaction at 50,000 tokens under a 100,000-token window (the proxy's trigger at 70,000): the
    proxy defers, the API compacts, the client sends its whole history back, and the API reads from the compaction
    block on: the run goes past the window as sent and nothing is compacted by the proxy (restarted too) or refused."""
    window = 100_000
    management = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50_000}}]}
    responder = tool_loop_responder("search", steps=2, words=60)
    async with AnthropicUpstream(context_window=window, responder=responder) as upstream:
        proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={"claude": window})
        try:
            proxy = await proxies.start()
            async with sdk(proxy) as client:
                run = await run_agent(client, 75, management, COMPACTION_BETA, task_words=80, result_words=2_000)
            async with sdk(await proxies.start()) as client:  # restarted, as above
                await run_agent(client, 3, management, COMPACTION_BETA, task_words=80, result_words=2_000, run=run)
        finally:
            await proxies.close()
    assert set(run.decisions) == {"deferred"}
    signals = [headers["x-compaction-deferred"] for headers in run.headers]
    assert signals[0] == "context-management" and set(signals) == {"context-management", "compaction-items"}
    assert upstream.compactions >= 2
    assert upstream.rejections == []
    assert sent(upstream.requests[-1]) > window
    assert all(processed(usage) < window for usage in upstream.usages)
    kinds = [
        block["type"] for message in run.messages if message["role"] == "assistant" for block in message["content"]
    ]
    assert kinds.count("compaction") == upstream.compactions


@pytest.mark.parametrize(("trigger", "decision"), [(50_000, "deferred"), (70_000, "deferred"), (80_000, "unchanged")])
async def test_the_apis_compaction_is_deferred_to_when_it_comes_first(trigger: int, decision: str) -> None:
    """The proxy's trigger is at 70,000 tokens of a 100,000-token window: the API's compaction at or before it is
    deferred to; one after it is raced by the proxy's, as for any client."""
    window = 100_000
    management = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": trigger}}]}
    async with AnthropicUpstream(context_window=window) as upstream:
        proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={"claude": window})
        try:
            async with sdk(await proxies.start()) as client:
                run = await run_agent(client, 1, management, COMPACTION_BETA, task_words=10, result_words=10)
        finally:
            await proxies.close()
    assert run.decisions == [decision]
    assert run.headers[0].get("x-compaction-deferred") == ("context-management" if decision == "deferred" else None)
