"""Responses API items through the engine: the pairing rules OpenAI enforces hold after any compaction.

Random agent conversations in Responses form (reasoning carried forward, parallel and interleaved function calls,
custom tool calls, built-in and unknown items, provider compaction items) are compacted by every strategy and by
the default chain at every target; what would be forwarded must pass the upstream's rules: every call answered
after it, every output after its call, every reasoning item followed by what followed it and preceding the calls of
its response, nothing reordered, the latest user message and the instructions intact.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.engine import ApproximateCounter, Transcript, chain_by_names
from proxy.engine.grouping import agent_step_groups
from proxy.engine.messages import message_key
from proxy.formats.responses.answers import answer_of
from proxy.formats.responses.items import UNIT_KEY, Units, item_type
from proxy.formats.responses.request import ResponsesRequest
from tests.support.examples import examples

COUNTER = ApproximateCounter()
CHAINS = {
    "default": ["provider_compaction", "tool_result_pruning", "sliding_window", "middle_out"],
    "sliding": ["sliding_window"],
    "pruning": ["tool_result_pruning", "middle_out"],
    "middle_out": ["middle_out"],
}


@dataclass
class Conversation:
    """Items and, per item, the response that produced it (None for what the client wrote)."""

    items: list[dict[str, Any]]
    response_of: list[int | None]


@st.composite
def conversations(draw: st.DrawFn) -> Conversation:
    items: list[dict[str, Any]] = []
    response_of: list[int | None] = []
    calls = 0
    responses = 0

    def add(item: dict[str, Any], response: int | None) -> None:
        items.append(item)
        response_of.append(response)

    if draw(st.booleans()):
        add({"role": "developer", "content": "Be brief."}, None)
    for turn in range(draw(st.integers(1, 4))):
        add({"type": "message", "role": "user", "content": f"task {turn} " + "x" * draw(st.integers(0, 300))}, None)
        for _step in range(draw(st.integers(0, 4))):
            response = responses = responses + 1
            reasoning = draw(st.booleans())
            if reasoning:
                summary = [{"type": "summary_text", "text": "thinking " * draw(st.integers(0, 20))}]
                add(
                    {"type": "reasoning", "id": f"rs_{response}", "summary": summary, "encrypted_content": "e" * 80},
                    response,
                )
            if draw(st.integers(0, 5)) == 0:
                add({"type": "web_search_call", "id": f"ws_{response}", "status": "completed"}, response)
            if draw(st.integers(0, 6)) == 0:
                add({"type": "compaction", "id": f"cmp_{response}", "encrypted_content": "c" * 120}, response)
            ids = []
            for _ in range(draw(st.integers(1, 2))):
                calls += 1
                custom = draw(st.integers(0, 4)) == 0
                kind = "custom_tool_call" if custom else "function_call"
                payload = {"input": "ls"} if custom else {"arguments": '{"path": "a"}'}
                add(
                    {"type": kind, "id": f"fc_{calls}", "call_id": f"call_{calls}", "name": "read", **payload}, response
                )
                ids.append((f"call_{calls}", "custom_tool_call_output" if custom else "function_call_output"))
            interleave = draw(st.booleans()) and len(ids) == 2
            size = draw(st.integers(0, 400))
            if interleave:
                # The second call after the first call's output: still the same response.
                first, second = items.pop(), response_of.pop()
                add({"type": ids[0][1], "call_id": ids[0][0], "output": "r" * size}, None)
                add(first, second)
                add({"type": ids[1][1], "call_id": ids[1][0], "output": "r" * size}, None)
            else:
                for call_id, kind in ids:
                    add({"type": kind, "call_id": call_id, "output": "r" * size}, None)
        responses += 1
        final = [{"type": "output_text", "text": "done " * draw(st.integers(0, 30)), "annotations": []}]
        add({"type": "message", "role": "assistant", "id": f"msg_{responses}", "content": final}, responses)
    return Conversation(items, response_of)


def assert_upstream_accepts(sent: Sequence[Mapping[str, Any]], conversation: Conversation) -> None:
    """The rules OpenAI enforces on `input`, checked on what the proxy would forward."""
    seen_calls: set[str] = set()
    answered: set[str] = set()
    for item in sent:
        kind = item_type(item)
        if kind in ("function_call", "custom_tool_call"):
            seen_calls.add(item["call_id"])
        elif kind in ("function_call_output", "custom_tool_call_output"):
            assert item["call_id"] in seen_calls, "an output without its call"
            answered.add(item["call_id"])
    assert seen_calls == answered, "a call without its output"

    originals = {id(item): position for position, item in enumerate(conversation.items)}
    positions = [originals[id(item)] for item in sent if id(item) in originals]
    assert positions == sorted(positions), "items reordered"
    present = set(positions)
    for position in present:
        item = conversation.items[position]
        response = conversation.response_of[position]
        if item_type(item) == "reasoning":
            following = position + 1
            assert following in present, "a reasoning item without the item that followed it"
        if item_type(item) in ("function_call", "custom_tool_call") and response is not None:
            reasoning = [
                index
                for index, other in enumerate(conversation.items)
                if conversation.response_of[index] == response and item_type(other) == "reasoning"
            ]
            assert all(index in present for index in reasoning), "a call without its response's reasoning"


def compacted(conversation: Conversation, chain: list[str], fraction: float) -> tuple[list[Any], Units] | None:
    units = Units.of(conversation.items, "You are an agent.")
    transcript = Transcript(units.messages, COUNTER)
    result = chain_by_names(chain).compact(transcript, int(transcript.total() * fraction))
    if result is None:
        return None
    items, instructions = units.forwarded_items(list(result.compacted.messages))
    assert instructions == "You are an agent." or "cut from the middle" in str(instructions)
    return items, units


PROPERTIES = settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("chain", CHAINS)
@PROPERTIES
@given(conversation=conversations(), fraction=st.floats(min_value=0.0, max_value=1.1))
def test_what_is_forwarded_keeps_every_pairing_rule(chain: str, conversation: Conversation, fraction: float) -> None:
    before = copy.deepcopy(conversation.items)
    result = compacted(conversation, CHAINS[chain], fraction)
    assert conversation.items == before, "the client's items were modified"
    if result is None:
        return
    sent, _units = result
    assert_upstream_accepts(sent, conversation)
    latest_user = max(i for i, item in enumerate(conversation.items) if item.get("role") == "user")
    assert any(item is conversation.items[latest_user] for item in sent), "the latest user message was lost"
    assert all(UNIT_KEY not in item for item in sent)
    orjson.dumps(sent)  # what is forwarded is plain JSON


@PROPERTIES
@given(conversation=conversations())
def test_a_reasoning_response_is_one_agent_step(conversation: Conversation) -> None:
    reasoned = {
        response
        for response, item in zip(conversation.response_of, conversation.items, strict=True)
        if item_type(item) == "reasoning"
    }
    units = Units.of(conversation.items, None)
    transcript = Transcript(units.messages, COUNTER)
    for group in agent_step_groups(transcript, 0):
        responses = {
            conversation.response_of[position]
            for index in group
            for position in units.spans[index]
            if conversation.response_of[position] in reasoned
        }
        later = agent_step_groups(transcript, group[-1] + 1)
        for other in later:
            other_responses = {
                conversation.response_of[position]
                for index in other
                for position in units.spans[index]
                if conversation.response_of[position] is not None
            }
            assert not (responses & other_responses), "one response split over two steps"


def test_items_map_to_the_engine_and_back_untouched() -> None:
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "abc"},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 42."}]},
        {"type": "mystery_item", "payload": [1, 2]},
    ]
    units = Units.of(items, "Be kind.")
    roles = [message["role"] for message in units.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert units.messages[2]["tool_calls"][0]["id"] == "c1"
    sent, instructions = units.forwarded_items(units.messages)
    assert instructions == "Be kind."
    assert all(a is b for a, b in zip(sent, items, strict=True))


def test_a_pruned_output_keeps_its_call_id_and_a_cut_message_its_other_parts() -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    items: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "input_text", "text": "look"}, image]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "long"},
    ]
    units = Units.of(items, None)
    user = units.messages[0]
    cut = {**user, "content": [{"type": "text", "text": "lo…ok"}, user["content"][1]]}
    pruned = {**units.messages[2], "content": "[removed]"}
    sent, _ = units.forwarded_items([cut, units.messages[1], pruned])
    assert sent[0]["content"] == [{"type": "input_text", "text": "lo…ok"}, image]
    assert sent[2] == {"type": "function_call_output", "call_id": "c1", "output": "[removed]"}


def test_a_response_output_is_the_message_its_items_make_on_the_next_turn() -> None:
    output = [
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "hm"}],
            "encrypted_content": "zzz",
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "c1",
            "name": "f",
            "arguments": '{"a": 1}',
            "status": "completed",
        },
    ]
    answer = answer_of(
        {"id": "resp_1", "output": output, "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}}
    )
    assert answer.usage == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    assert answer.response_id == "resp_1"
    request = ResponsesRequest.parse(
        orjson.dumps(
            {
                "model": "m",
                "input": [
                    {"role": "user", "content": "q"},
                    *output,
                    {"type": "function_call_output", "call_id": "c1", "output": "1"},
                ],
            }
        )
    )
    assert answer.reply is not None
    assert message_key(request.messages[1]) == message_key(answer.reply)
