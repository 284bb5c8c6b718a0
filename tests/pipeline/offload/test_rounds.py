"""Read rounds and stream edits as pure functions: usage sums, the request asking again, streams relayed intact."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from proxy.formats import FORMATS
from proxy.formats.chat_completions.reads import message_reads
from proxy.formats.chat_completions.wire import CHAT_COMPLETIONS
from proxy.pipeline.offload.rounds import asked_again, summed
from proxy.pipeline.offload.tool import READ_TOOL
from proxy.pipeline.wire import WireFormat
from proxy.server.offload_streams import StreamEdits

counts = st.integers(min_value=0, max_value=10**9)
usages = st.lists(
    st.fixed_dictionaries(
        {"prompt_tokens": counts, "completion_tokens": counts},
        optional={"prompt_tokens_details": st.fixed_dictionaries({"cached_tokens": counts})},
    ),
    min_size=1,
    max_size=6,
)


@given(usages)
def test_usage_is_summed_field_by_field(reports: list[dict[str, Any]]) -> None:
    total = summed(reports)
    assert total["prompt_tokens"] == sum(report["prompt_tokens"] for report in reports)
    assert total["completion_tokens"] == sum(report["completion_tokens"] for report in reports)
    cached = [
        report["prompt_tokens_details"]["cached_tokens"] for report in reports if "prompt_tokens_details" in report
    ]
    assert total.get("prompt_tokens_details", {}).get("cached_tokens", 0) == sum(cached)


def _call(call_id: str, name: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": '{"reference": "x"}'}}


@given(st.lists(st.sampled_from(["client", "read"]), min_size=1, max_size=5), st.text(max_size=20))
def test_asking_again_extends_what_was_forwarded(names: list[str], text: str) -> None:
    calls = [_call(f"c{k}", READ_TOOL if name == "read" else "fetch") for k, name in enumerate(names)]
    forwarded = {"model": "m", "messages": [{"role": "user", "content": text}], "tools": []}
    reads = message_reads({"role": "assistant", "content": None, "tool_calls": calls}, limit=8)
    if names[0] != "read":
        assert reads is None
        return
    assert reads is not None
    results = [f"result {k}" for k in range(len(reads.calls))]
    again = orjson.loads(asked_again(orjson.dumps(forwarded), CHAT_COMPLETIONS, reads, results, last=False))
    assert again["messages"][:1] == forwarded["messages"]
    appended = again["messages"][1]["tool_calls"]
    assert [call["id"] for call in appended] == [call["id"] for call in calls if call["function"]["name"] == READ_TOOL]
    assert [message["tool_call_id"] for message in again["messages"][2:]] == [call["id"] for call in appended]
    assert "tool_choice" not in again


def _stream(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"


def _relayed(edits: StreamEdits, body: bytes, cuts: list[int]) -> bytes:
    pieces = [body[start:end] for start, end in zip([0, *sorted(cuts)], [*sorted(cuts), len(body)], strict=True)]
    return b"".join(edits(piece) for piece in pieces) + edits.flush()


def _delta(delta: dict[str, Any]) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


PLAIN = _stream(_delta({"role": "assistant", "content": ""}), _delta({"content": "hello"}), _delta({"content": "!"}))
MIXED = _stream(
    _delta({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "fetch", "arguments": ""}}]}),
    _delta({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
    _delta({"tool_calls": [{"index": 1, "id": "b", "function": {"name": READ_TOOL, "arguments": ""}}]}),
    _delta({"tool_calls": [{"index": 1, "function": {"arguments": '{"reference": "x"}'}}]}),
)


@given(st.lists(st.integers(min_value=0, max_value=len(PLAIN)), max_size=8))
def test_a_stream_without_reads_is_relayed_byte_for_byte(cuts: list[int]) -> None:
    assert _relayed(StreamEdits(CHAT_COMPLETIONS), PLAIN, cuts) == PLAIN


@given(st.lists(st.integers(min_value=0, max_value=len(MIXED)), max_size=8))
def test_reads_after_a_client_call_are_taken_out_however_the_stream_is_cut(cuts: list[int]) -> None:
    relayed = _relayed(StreamEdits(CHAT_COMPLETIONS), MIXED, cuts)
    assert READ_TOOL.encode() not in relayed and b'"reference"' not in relayed
    assert relayed.count(b'"index":0') == 6  # the four chunks' choice, and the client call's two deltas


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=12,
)
hostile_events = st.fixed_dictionaries(
    {},
    optional={
        "type": st.one_of(st.sampled_from(["response.output_item.added", "response.completed", "error"]), json_values),
        "choices": st.one_of(
            st.lists(st.fixed_dictionaries({}, optional={"delta": json_values, "index": json_values}), max_size=2),
            json_values,
        ),
        "item": st.one_of(st.just({"type": "function_call", "name": READ_TOOL}), json_values),
        "output_index": json_values,
        "response": json_values,
        "usage": json_values,
    },
)


@given(events=st.lists(hostile_events, max_size=6), api=st.sampled_from(FORMATS))
def test_whatever_an_upstream_streams_deciding_and_editing_never_raise(
    events: list[dict[str, Any]], api: WireFormat
) -> None:
    """A hostile or broken upstream's events are decided on or relayed, never an exception in the relay."""
    edits = StreamEdits(api, [{"prompt_tokens": 1}])
    for event in events:
        api.decides_reads(event)
        edits(b"data: " + orjson.dumps(event) + b"\n\n")
    api.without_reads({"choices": events, "output": events, "tools": events})
