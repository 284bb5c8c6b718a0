"""A real Agent with tools and usage runs a long task at a small window; the hook keeps it inside the window."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage

from hooks.compaction import (
    ChainCompactor,
    CompactionHook,
    MiddleOutCompactor,
    SlidingWindowCompactor,
    TiktokenTokenCounter,
    ToolResultPruningCompactor,
)
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.hooks.conftest import agent_for

STEPS = 60


def compactions(requests: list[dict[str, Any]]) -> int:
    """How many times the conversation the upstream saw shrank from one request to the next."""
    sizes = [sum(len(str(m.get("content") or "")) for m in r["messages"]) for r in requests]
    return sum(1 for before, after in itertools.pairwise(sizes) if after < before)


def assert_pairs_intact(messages: list[dict[str, Any]]) -> None:
    """Every tool message answers a call of the assistant message before its run, and every call is answered."""
    open_ids: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_ids
            open_ids.discard(message["tool_call_id"])
            continue
        assert not open_ids, f"unanswered calls {open_ids}"
        open_ids = {call["id"] for call in message.get("tool_calls") or []}
    assert not open_ids


def check_run_pairs_and_window(upstream: OpenAIUpstream, result: dict[str, Any], hook: CompactionHook) -> int:
    """Check the Agent made every step within the window, its tool pairs whole; return how many compactions it took."""
    requests = upstream.chat_requests
    assert len(requests) == STEPS + 1, "the Agent made every step and the final answer"
    assert result["last_message"].text == f"done: {STEPS} tool calls"
    assert all(usage["prompt_tokens"] <= hook.context_window for usage in upstream.usages)
    for request in requests:
        assert_pairs_intact(request["messages"])
        assert request["messages"][0]["role"] == "system"
    return compactions(requests)


def check_run(upstream: OpenAIUpstream, result: dict[str, Any], hook: CompactionHook) -> int:
    compacted = check_run_pairs_and_window(upstream, result, hook)
    for request in upstream.chat_requests:
        assert request["messages"][1] == {"role": "user", "content": "Research alpha thoroughly."}
    return compacted


def test_sliding_window_keeps_a_60_step_run_inside_an_8k_window(long_task_upstream: OpenAIUpstream) -> None:
    hook = CompactionHook(compactor=SlidingWindowCompactor(), context_window=8192, token_counter=TiktokenTokenCounter())
    agent = agent_for(long_task_upstream, hook)
    result = agent.run(messages=[ChatMessage.from_user("Research alpha thoroughly.")])

    compacted = check_run(long_task_upstream, result, hook)
    assert compacted >= 5
    notes = [m for m in result["messages"] if m.meta.get("context_compaction", {}).get("strategy") == "sliding_window"]
    assert len(notes) == 1, "one omission note at most"
    peak = max(usage["prompt_tokens"] for usage in long_task_upstream.usages)
    print(f"sliding window: {STEPS} steps, {compacted} compactions, peak prompt {peak} tokens")


def test_chain_prunes_then_slides(long_task_upstream: OpenAIUpstream) -> None:
    compactor = ChainCompactor([ToolResultPruningCompactor(), SlidingWindowCompactor(), MiddleOutCompactor()])
    hook = CompactionHook(compactor=compactor, context_window=8192)
    result = agent_for(long_task_upstream, hook).run(messages=[ChatMessage.from_user("Research alpha thoroughly.")])

    compacted = check_run(long_task_upstream, result, hook)
    assert compacted >= 5
    strategies = {
        m.meta["context_compaction"]["strategy"] for m in result["messages"] if "context_compaction" in m.meta
    }
    assert "tool_result_pruning" in strategies
    pruned = [
        m for m in result["messages"] if m.meta.get("context_compaction", {}).get("strategy") == "tool_result_pruning"
    ]
    for message in pruned:
        assert message.tool_call_result is not None
        assert message.tool_call_result.origin.tool_name == "search"
        assert message.tool_call_result.origin.id


@pytest.mark.asyncio
async def test_async_run_compacts_too(long_task_upstream: OpenAIUpstream) -> None:
    hook = CompactionHook(
        compactor=ToolResultPruningCompactor(min_tokens=100), context_window=8192, token_counter=TiktokenTokenCounter()
    )
    agent = agent_for(long_task_upstream, hook)
    result = await agent.run_async(messages=[ChatMessage.from_user("Research alpha thoroughly.")])
    # Pruning alone cannot hold 60 steps under the trigger forever, but every request must still fit and pair up.
    compacted = check_run(long_task_upstream, result, hook)
    assert compacted >= 5
