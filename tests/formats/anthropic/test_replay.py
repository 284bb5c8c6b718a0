"""A long agent conversation through the format's functions and the engine, replayed turn after turn as the proxy
replays its rewrites, against the strict upstream: on a binding and a non-binding model, with thinking and tool use.

Each turn the client sends its whole history (its own breakpoint moved to the newest message, as Claude Code does).
The remembered plan is extended over what was appended and, when the estimate passes the trigger, compacted further
(between turns, or in the middle of a tool-use turn, where the continued turn's thinking needs `drop_block`);
`forward` maps it back with the previous forwarded messages as the baseline. No request may be refused, the thinking
the model produced after a compaction must come back to it, and the replayed prefix must be read from the cache.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.engine import ApproximateCounter, Transcript, chain_by_names
from proxy.engine.plan import EditPlan
from proxy.formats.anthropic.forwarding import forward
from proxy.formats.anthropic.request import MessagesRequest
from proxy.formats.anthropic.rules import continued_turn
from proxy.simulator.anthropic_upstream import AnthropicUpstream, tool_loop_responder

WINDOW = 6000
COUNTER = ApproximateCounter()
CHAIN = chain_by_names(["tool_result_pruning", "sliding_window"])
TOOLS: list[Any] = [{"name": "search", "description": "Search.", "input_schema": {"type": "object", "properties": {}}}]


def with_breakpoint_last(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The client's messages with its own breakpoint on the newest message only (moved there every turn)."""
    *head, last = messages
    content = last["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    blocks[-1] = {**blocks[-1], "cache_control": {"type": "ephemeral"}}
    return [*head, {**last, "content": blocks}]


class Proxy:
    """The pipeline's part in this test: rewrite memory (one plan), the trigger, and `forward`."""

    def __init__(self, *, mid_turn: bool) -> None:
        self.mid_turn = mid_turn
        self.plan: EditPlan | None = None
        self.sent: list[Any] = []
        self.client_length = 0
        self.dropped: list[int] = []
        self.drop_block = False

    def forwarded(self, body: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        raw = orjson.dumps(body)
        request = MessagesRequest.parse(raw)
        engine = request.messages
        plan = self.plan.extended(len(engine)) if self.plan is not None else EditPlan.identity(len(engine))
        view = Transcript(plan.apply_messages(engine), COUNTER)
        if view.total() > 0.7 * WINDOW and bool(continued_turn(request.conversation.messages)) is self.mid_turn:
            result = CHAIN.compact(view, int(0.4 * WINDOW))
            plan = plan.then(result.plan) if result is not None else plan
        self.plan = None if plan.is_identity else plan
        tail = request.conversation.messages[self.client_length :]
        baseline = [*self.sent, *tail] if self.sent else None
        sent = forward(request, raw, plan.apply_messages(engine), baseline=baseline, kept_drop_block=self.drop_block)
        self.drop_block = self.drop_block or sent.beta is not None
        self.sent = orjson.loads(sent.body)["messages"]
        self.client_length = len(body["messages"])
        self.dropped.append(sent.dropped_thinking)
        return sent.body, {"anthropic-beta": sent.beta} if sent.beta else {}


@pytest.mark.parametrize("mid_turn", [False, True], ids=["between-turns", "mid-turn"])
@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "claude-fable-5-1"])
async def test_a_long_conversation_replays_without_a_refusal_and_reads_its_prefix_from_the_cache(
    model: str, mid_turn: bool
) -> None:
    upstream = AnthropicUpstream(context_window=WINDOW, responder=tool_loop_responder("search", steps=2, words=60))
    proxy = Proxy(mid_turn=mid_turn)
    system = [{"type": "text", "text": "You are a careful agent. " * 60, "cache_control": {"type": "ephemeral"}}]
    messages: list[dict[str, Any]] = []
    prompt = cached = 0
    thinking_back = 0
    for turn in range(60):
        last = messages[-1] if messages else None
        if last is None or (last["role"] == "assistant" and last["content"][-1]["type"] == "text"):
            messages.append({"role": "user", "content": f"Task {turn}: " + "details " * 80})
        body = {"model": model, "max_tokens": 500, "system": system, "tools": TOOLS, "thinking": {"type": "adaptive"}}
        body["messages"] = with_breakpoint_last(messages)
        sent, headers = proxy.forwarded(body)
        document = orjson.loads(sent)
        thinking_back += sum(
            1
            for m in document["messages"][2:]
            if m["role"] == "assistant"
            for b in m["content"]
            if b["type"] == "thinking"
        )
        reply = upstream.answer(document, headers)
        usage = reply["usage"]
        prompt += usage["input_tokens"] + usage["cache_creation_input_tokens"] + usage["cache_read_input_tokens"]
        cached += usage["cache_read_input_tokens"]
        messages.append({"role": "assistant", "content": reply["content"]})
        calls = [block for block in reply["content"] if block["type"] == "tool_use"]
        if calls:
            results = [{"type": "tool_result", "tool_use_id": c["id"], "content": "found " * 150} for c in calls]
            messages.append({"role": "user", "content": results})
    assert proxy.plan is not None, "the conversation never needed compacting: the test proves nothing"
    assert thinking_back > 0, "no thinking produced after a compaction came back to the model"
    assert cached / prompt >= 0.8, f"only {cached / prompt:.0%} of the prompt was read from the cache"
