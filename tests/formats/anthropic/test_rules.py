"""The Messages API's rules on hand-written conversations: each one shown refused without the rule, accepted with it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.engine import ApproximateCounter, Transcript, chain_by_names
from proxy.formats.anthropic.forwarding import forward
from proxy.formats.anthropic.request import MessagesRequest
from proxy.formats.anthropic.rules import (
    THINKING_BINDING_BETA,
    breakpoints,
    continued_turn,
    unchanged_head_end,
    with_beta,
    with_breakpoint,
    with_drop_block,
)
from proxy.simulator.anthropic_rules import AnthropicError
from proxy.simulator.anthropic_upstream import AnthropicUpstream, tool_loop_responder

BINDING = "claude-fable-5-1"
TOOLS: list[Any] = [{"name": "search", "description": "Search.", "input_schema": {"type": "object", "properties": {}}}]


def agent_history(upstream: AnthropicUpstream, model: str, turns: int, *, continued: bool) -> dict[str, Any]:
    """A conversation produced by the upstream: `turns` tool-using turns, the last one continued when asked."""
    body: dict[str, Any] = {"model": model, "max_tokens": 500, "tools": TOOLS, "system": "Be careful."}
    body["thinking"] = {"type": "adaptive"}
    messages: list[dict[str, Any]] = []
    body["messages"] = messages
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Task {turn}: " + "details " * 300})
        while True:
            reply = upstream.answer(body, {})
            messages.append({"role": "assistant", "content": reply["content"]})
            calls = [block["id"] for block in reply["content"] if block["type"] == "tool_use"]
            if not calls:
                break
            results = [{"type": "tool_result", "tool_use_id": call, "content": "found " * 300} for call in calls]
            messages.append({"role": "user", "content": results})
            if continued and turn == turns - 1:
                return body
    messages.append({"role": "user", "content": "Next."})
    return body


def compacted(body: dict[str, Any]) -> tuple[MessagesRequest, bytes, list[Any]]:
    raw = orjson.dumps(body)
    request = MessagesRequest.parse(raw)
    transcript = Transcript(request.messages, ApproximateCounter())
    result = chain_by_names(["sliding_window"]).compact(transcript, transcript.total() // 2)
    assert result is not None
    return request, raw, list(result.compacted.messages)


@pytest.mark.parametrize("continued", [False, True])
def test_thinking_after_a_compaction_is_dropped_on_a_binding_model(continued: bool) -> None:
    upstream = AnthropicUpstream(responder=tool_loop_responder("search"))
    body = agent_history(upstream, BINDING, 4, continued=continued)
    request, raw, engine = compacted(body)
    naive = request.fields_with(*_mapped(request, engine))
    with pytest.raises(AnthropicError, match="The block is bound to a different conversation"):
        upstream.answer(naive, {})
    sent = forward(request, raw, engine)
    assert sent.dropped_thinking > 0
    assert (sent.beta == THINKING_BINDING_BETA) is continued
    document = orjson.loads(sent.body)
    upstream.answer(document, {"anthropic-beta": sent.beta} if sent.beta else {})
    if continued:
        assert document["messages"][-2] == body["messages"][-2], "the continued turn was not passed byte for byte"
        assert document["thinking"] == {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}}


def test_a_non_binding_model_keeps_every_thinking_block() -> None:
    upstream = AnthropicUpstream(responder=tool_loop_responder("search"))
    body = agent_history(upstream, "claude-sonnet-4-5", 4, continued=True)
    request, raw, engine = compacted(body)
    sent = forward(request, raw, engine)
    assert sent.dropped_thinking == 0 and sent.beta is None
    upstream.answer(orjson.loads(sent.body), {})


def _mapped(request: MessagesRequest, engine: list[Any]) -> tuple[Any, list[Any]]:
    mapped = request.mapped(engine)
    return mapped.system, mapped.messages


def test_the_continued_turn_runs_back_through_its_tool_results() -> None:
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "x"}]}
    messages = [{"role": "user", "content": "go"}, use, result, use, result, use, result]
    assert continued_turn(messages) == {1, 3, 5}
    assert continued_turn([*messages, {"role": "assistant", "content": "done"}]) == set()
    mixed = {"role": "user", "content": [*result["content"], {"type": "text", "text": "and"}]}
    assert continued_turn([messages[0], use, mixed, use, result]) == {3}
    hint = {"role": "system", "content": "<total_tokens>9 tokens left</total_tokens>"}
    steered = [messages[0], use, result, hint, use, result, hint]
    assert continued_turn(steered) == {1, 4}, "Claude Code's system message after each result does not end the turn"


def test_the_proxys_breakpoint_fits_within_four_and_never_follows_a_shorter_lifetime() -> None:
    hour = {"type": "ephemeral", "ttl": "1h"}
    marked = {"type": "text", "text": "x", "cache_control": hour}
    fields: dict[str, Any] = {"system": [marked], "messages": [{"role": "user", "content": "hello"}]}
    messages = with_breakpoint(fields, 0)
    assert messages[0]["content"] == [{"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}], (
        "after an hour-long breakpoint the cheaper 5-minute one is valid"
    )
    assert fields["messages"][0] == {"role": "user", "content": "hello"}, "the input was modified"
    later = {"role": "user", "content": [{"type": "text", "text": "newest", "cache_control": hour}]}
    before_an_hour = with_breakpoint({**fields, "messages": [fields["messages"][0], later]}, 0)
    assert before_an_hour[0]["content"][0]["cache_control"] == hour, "a 5-minute breakpoint may not precede 1h"
    full = {**fields, "tools": [{"name": n, "cache_control": {"type": "ephemeral"}} for n in "abc"]}
    assert breakpoints(full) == 4 and with_breakpoint(full, 0) == full["messages"]
    thinking_only = {"messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]}]}
    assert with_breakpoint(thinking_only, 0) == thinking_only["messages"]


def test_the_unchanged_head_ends_before_the_first_message_removed_changed_or_created() -> None:
    source: list[dict[str, Any]] = [{"role": "user", "content": f"m{n}"} for n in range(5)]
    note = {"role": "user", "content": "[Earlier messages were removed.]"}
    assert unchanged_head_end([source[0], source[1], note, source[4]], [0, 1, None, 4], source) == 1
    assert unchanged_head_end([source[0], source[3], source[4]], [0, 3, 4], source) == 0, "a removal is a change"
    changed = {**source[1], "content": "shortened"}
    assert unchanged_head_end([source[0], changed, source[2]], [0, 1, 2], source) == 0
    assert unchanged_head_end([note, *source], [None, 0, 1, 2, 3, 4], source) is None, "nothing is kept at the head"
    assert unchanged_head_end(source, [0, 1, 2, 3, 4], source) is None, "nothing was rewritten"


def test_drop_block_respects_the_clients_choice_and_the_beta_header_is_added_once() -> None:
    assert with_drop_block(None) == {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}}
    own = {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "error"}}
    assert with_drop_block(own) is own
    assert with_beta(None, "b") == "b"
    assert with_beta("a, b", "b") == "a, b"
    assert with_beta("a", "b") == "a,b"
