"""Messages and blocks onto the engine and back: what each block becomes, and what a rewrite gives back."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.config import Settings
from proxy.engine.messages import CHECKPOINT, CONTINUES_STEP, is_checkpoint
from proxy.engine.plan import COMPACTION_META_KEY, Created, EditPlan, Kept
from proxy.formats.anthropic.request import MessagesRequest
from proxy.formats.anthropic.summary import (
    READ_TOOL_DEFINITION,
    read_calls,
    read_result,
    summary_request,
    summary_text,
    with_read_tool,
)
from proxy.pipeline.offload.tool import READ_TOOL
from proxy.pipeline.requests import InvalidRequest, RequestLimits, RequestOverLimit

USE: dict[str, Any] = {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a"}}
BODY: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 100,
    "stream": True,
    "system": [{"type": "text", "text": "Rules."}],
    "tools": [{"name": "read", "input_schema": {"type": "object"}}],
    "thinking": {"type": "enabled", "budget_tokens": 50},
    "messages": [
        {"role": "user", "content": "Start."},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}, USE]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "r" * 400, "is_error": False},
                {"type": "text", "text": "Also this."},
            ],
        },
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t2", "name": "read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "s"}]},
        {"role": "system", "content": "Reminder."},
        {"role": "assistant", "content": [{"type": "compaction", "content": "Summary."}, {"type": "mystery", "x": 1}]},
        {"role": "user", "content": "Go on."},
    ],
}


def parsed() -> MessagesRequest:
    return MessagesRequest.parse(orjson.dumps(BODY))


def test_each_message_maps_onto_the_engines_units() -> None:
    engine = parsed().messages
    assert [m["role"] for m in engine] == [
        "system", "user", "assistant", "tool", "user", "assistant", "tool", "system", "assistant", "user",
    ]  # fmt: skip
    assert (
        engine[2]["content"][0]["type"] == "opaque"
        and engine[2]["tool_calls"][0]["function"]["arguments"] == '{"path":"a"}'
    )
    assert CONTINUES_STEP not in engine[5], "the user wrote besides the results: a new turn"
    results_only = {
        **BODY,
        "messages": [
            *BODY["messages"][:2],
            BODY["messages"][4] | {"content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}]},
            *BODY["messages"][3:5],
        ],
    }
    continued = MessagesRequest.parse(orjson.dumps(results_only)).messages
    assert continued[4].get(CONTINUES_STEP) is True, "a response after results only carries on the turn that thought"
    assert is_checkpoint(engine[8]) and engine[8]["content"][0][CHECKPOINT] is True
    assert engine[8]["content"][1]["type"] == "item", "an unknown block is counted as its JSON"


def test_a_rewrite_maps_back_with_results_first_and_the_rest_untouched() -> None:
    request = parsed()
    engine = request.messages
    pruned = Created({**engine[3], "content": "[pruned]"}, {COMPACTION_META_KEY: {"strategy": "test"}}, replaces=3)
    note = Created({"role": "user", "content": "[note]"}, {COMPACTION_META_KEY: {"strategy": "test"}})
    plan = EditPlan(
        len(engine), (*(Kept(i) for i in range(3)), pruned, note, *(Kept(i) for i in range(4, len(engine))))
    )
    mapped = request.mapped(plan.apply(engine, lambda created, _original: created.message))
    source = request.conversation.messages
    assert mapped.messages[0] is source[0] and mapped.messages[1] is source[1]
    assert mapped.messages[2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "[pruned]", "is_error": False}],
    }
    assert mapped.messages[3] == {"role": "user", "content": "[note]"}
    assert mapped.messages[4] == {"role": "user", "content": [{"type": "text", "text": "Also this."}]}
    assert all(one is other for one, other in zip(mapped.messages[5:], source[3:], strict=True))
    assert mapped.origins == [0, 1, 2, None, 2, 3, 4, 5, 6, 7]
    assert mapped.system is request.conversation.system


def test_what_is_not_a_messages_request_is_refused_and_limits_hold() -> None:
    with pytest.raises(InvalidRequest):
        MessagesRequest.parse(b'{"messages": {}}')
    with pytest.raises(InvalidRequest):
        MessagesRequest.parse(b'{"messages": [], "system": 3}')
    with pytest.raises(RequestOverLimit):
        MessagesRequest.parse(orjson.dumps(BODY), RequestLimits(max_messages=3, max_content_parts=100))
    request = parsed()
    assert (request.model, request.stream, request.reserved_tokens) == ("claude-sonnet-4-5", True, 100)


def test_the_summary_call_repeats_the_forwarded_request_then_asks() -> None:
    request = with_read_tool(parsed())
    engine = request.messages
    body = orjson.loads(summary_request(request, engine, [1, 2, 3], sections="Write it.", settings=Settings()))
    assert list(body) == ["model", "max_tokens", "system", "tools", "thinking", "messages", "tool_choice"]
    assert body["tools"][-1] == READ_TOOL_DEFINITION and body["tool_choice"] == {"type": "none"}
    assert body["messages"][:-1] == BODY["messages"]
    assert body["messages"][-1]["role"] == "user" and "Messages 1-3 " in body["messages"][-1]["content"]
    assert "stream" not in body
    answer = {"type": "message", "content": [{"type": "thinking", "thinking": "t"}, {"type": "text", "text": "Sum."}]}
    assert summary_text(answer) == "Sum." and summary_text({"error": {}}) is None


def test_the_read_tool_in_messages_shape() -> None:
    reply = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "c1", "name": READ_TOOL, "input": {"reference": "r"}}, USE],
    }
    assert read_calls(reply) == [("c1", {"reference": "r"})]
    assert read_result("c1", "text") == {"type": "tool_result", "tool_use_id": "c1", "content": "text"}
    assert read_result("c1", "gone", error=True)["is_error"] is True
    assert READ_TOOL_DEFINITION["input_schema"]["required"] == ["reference"]
