"""The Messages API as a `WireFormat`: streams folded event by event, read calls hidden, overflows, paths."""

from __future__ import annotations

import secrets
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.formats import format_of
from proxy.formats.anthropic.answers import error_body
from proxy.formats.anthropic.wire import MESSAGES
from proxy.pipeline.offload.tool import READ_TOOL
from proxy.pipeline.wire import Overflow, StreamReport
from proxy.simulator.anthropic_upstream import stream_events

PROPERTIES = settings(max_examples=100, deadline=None)
WORDS = st.text(alphabet="abc xyz", max_size=40)


@st.composite
def blocks(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["text", "thinking", "tool_use", "read"]))
    if kind == "text":
        return {"type": "text", "text": draw(WORDS)}
    if kind == "thinking":
        return {"type": "thinking", "thinking": draw(WORDS), "signature": secrets.token_hex(8)}
    name = READ_TOOL if kind == "read" else "search"
    arguments = {"reference": draw(WORDS)} if kind == "read" else {"q": draw(st.integers(0, 99))}
    return {"type": "tool_use", "id": f"toolu_{secrets.token_hex(6)}", "name": name, "input": arguments}


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    usage = {
        name: draw(st.integers(0, 10_000))
        for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")
    }
    content = draw(st.lists(blocks(), min_size=1, max_size=6))
    stop = "tool_use" if any(block["type"] == "tool_use" for block in content) else "end_turn"
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": content,
        "stop_reason": stop,
        "usage": usage,
    }


@PROPERTIES
@given(message=messages())
def test_a_stream_folded_event_by_event_reports_what_the_whole_message_does(message: dict[str, Any]) -> None:
    report = StreamReport()
    for _name, event in stream_events(message):
        MESSAGES.read_event(orjson.loads(orjson.dumps(event)), report)
    usage, reply, _ = MESSAGES.answer(message)
    assert report.usage == usage
    assert MESSAGES.reply_of(report) == reply


@PROPERTIES
@given(message=messages())
def test_hidden_read_calls_leave_the_client_consecutive_blocks_without_them(message: dict[str, Any]) -> None:
    hidden: set[Any] = set()
    relayed = []
    for _name, event in stream_events(message):
        if MESSAGES.hide_read(event, hidden) is not None:
            relayed.append(event)
    starts = [event for event in relayed if event["type"] == "content_block_start"]
    assert [event["index"] for event in starts] == list(range(len(starts)))
    assert all(event["content_block"].get("name") != READ_TOOL for event in starts)
    indexes = {event["index"] for event in relayed if "index" in event}
    assert indexes == set(range(len(starts)))


@PROPERTIES
@given(message=messages())
def test_a_read_round_is_decided_by_its_first_call_or_text(message: dict[str, Any]) -> None:
    decided = None
    for _name, event in stream_events(message):
        if MESSAGES.opening(event):
            continue
        decided = MESSAGES.decides_reads(event)
        if decided is not None:
            break
    content = message["content"]
    first = next((block for block in content if block["type"] != "thinking"), None)
    assert decided is (first is not None and first.get("name") == READ_TOOL)
    first_call = next((block for block in content if block["type"] == "tool_use"), None)
    asked = MESSAGES.reads(message, 8)
    assert (asked is not None) is (first_call is not None and first_call["name"] == READ_TOOL)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
EVENT_KEYS = st.sampled_from(["type", "index", "message", "usage", "delta", "content_block", "error"])


@PROPERTIES
@given(event=st.dictionaries(EVENT_KEYS, JSON | st.sampled_from(["message_start", "content_block_start", "error"])))
def test_events_of_any_shape_are_read_without_raising(event: dict[str, Any]) -> None:
    report = StreamReport()
    MESSAGES.read_event(event, report)
    MESSAGES.reply_of(report)
    MESSAGES.opening(event)
    MESSAGES.refusal(event)
    MESSAGES.decides_reads(event)
    MESSAGES.usage_holder(event)
    MESSAGES.hide_read(dict(event), set())


def test_overflows_are_read_from_the_apis_error_shape_only() -> None:
    too_long = orjson.loads(error_body("prompt is too long: 40000 tokens > 32000 maximum"))
    assert MESSAGES.overflow(400, too_long) == Overflow(32000)
    assert MESSAGES.refusal(too_long) is too_long, "an in-stream error event carries the same body"
    legacy = orjson.loads(error_body("input length and `max_tokens` exceed context limit: 190000 + 20000 > 200000"))
    assert MESSAGES.overflow(400, legacy) == Overflow(200000)
    quoted = orjson.loads(error_body("Bad tool: prompt is too long: 40000 tokens > 32000 maximum"))
    assert MESSAGES.overflow(400, quoted) is None
    assert MESSAGES.overflow(500, too_long) is None


def test_only_creating_a_message_is_compacted() -> None:
    assert format_of("POST", "/v1/messages") is MESSAGES
    assert format_of("POST", "/anthropic/v1/messages") is MESSAGES
    for path in ("/v1/messages/count_tokens", "/v1/messages/batches", "/v1/threads/t1/messages"):
        assert format_of("POST", path) is None
    assert format_of("GET", "/v1/messages") is None


def test_the_1m_beta_header_gives_its_window() -> None:
    assert MESSAGES.window("claude-sonnet-4-5", {"anthropic-beta": "context-1m-2025-08-07"}) == 1_000_000
    assert MESSAGES.window("claude-sonnet-4-5", {}) == 200_000
