"""Messages API conversations through the engine: every rule the API enforces holds in what would be forwarded.

Random conversations the strict fake upstream accepts (`tests.support.anthropic_conversations`: thinking signed and
bound to its prefix on the binding model, parallel calls, server tool blocks, compaction and unknown blocks, the
client's breakpoints, a turn being continued) are parsed, compacted by the engine's real strategy chains at every
target, and forwarded (`forward`). What is forwarded must be accepted by the strict upstream; keep each tool result
with its call and first in the next message; pass the continued turn's thinking byte for byte; carry no thinking
after a change on a binding model; hold at most four breakpoints; keep the system byte for byte; leave the input as
it was; and be the same bytes for the same input.
"""

from __future__ import annotations

import copy
import secrets
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from proxy.engine import ApproximateCounter, Transcript, chain_by_names
from proxy.formats.anthropic.blocks import UNIT_KEY
from proxy.formats.anthropic.forwarding import forward, forwarding
from proxy.formats.anthropic.request import MessagesRequest
from proxy.formats.anthropic.rules import breakpoints, continued_turn
from proxy.simulator.anthropic_rules import (
    AnthropicError,
    Signer,
    binds,
    check_breakpoints,
    check_pairing,
    check_thinking,
)
from tests.support.anthropic_conversations import Built, conversations, is_continued

SIGNER = Signer(secrets.token_bytes(32))
COUNTER = ApproximateCounter()
CHAINS = {
    "default": [
        "provider_compaction",
        "duplicate_results",
        "json_minify",
        "tool_result_pruning",
        "sliding_window",
        "middle_out",
    ],
    "sliding": ["sliding_window"],
    "pruning": ["tool_result_pruning", "middle_out"],
    "middle_out": ["middle_out"],
}
PROPERTIES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BETA = {"anthropic-beta": "thinking-binding-controls-2026-08-01"}


def upstream_accepts(body: dict[str, Any], headers: dict[str, str]) -> int:
    """Run the strict upstream's checks; the number of thinking blocks it dropped."""
    check_breakpoints(body)
    check_pairing(body["messages"])
    return check_thinking(body, SIGNER).dropped


def compacted(built: Built, chain: str, fraction: float) -> tuple[MessagesRequest, bytes, Any] | None:
    raw = orjson.dumps(built.body)
    request = MessagesRequest.parse(raw)
    transcript = Transcript(request.messages, COUNTER)
    result = chain_by_names(CHAINS[chain]).compact(transcript, int(transcript.total() * fraction))
    if result is None:
        return None
    before = orjson.dumps(request.body)
    forwarded = forward(request, raw, list(result.compacted.messages))
    assert orjson.dumps(request.body) == before, "the parsed request was modified"
    return request, raw, forwarded


@PROPERTIES
@given(built=conversations(SIGNER))
def test_the_generated_conversations_are_ones_the_upstream_accepts(built: Built) -> None:
    assert upstream_accepts(built.body, {}) == 0


@PROPERTIES
@given(built=conversations(SIGNER))
def test_parsing_and_mapping_back_unchanged_forwards_the_same_bytes(built: Built) -> None:
    raw = orjson.dumps(built.body)
    request = MessagesRequest.parse(raw)
    assert forward(request, raw, list(request.messages)).body is raw
    mapped = request.mapped(list(request.messages))
    assert all(one is other for one, other in zip(mapped.messages, request.conversation.messages, strict=True))


@pytest.mark.parametrize("chain", CHAINS)
@PROPERTIES
@given(built=conversations(SIGNER), fraction=st.floats(min_value=0.0, max_value=1.1))
def test_what_is_forwarded_keeps_every_rule_of_the_api(chain: str, built: Built, fraction: float) -> None:
    before = copy.deepcopy(built.body)
    result = compacted(built, chain, fraction)
    assert built.body == before, "the client's request was modified"
    if result is None:
        return
    _request, _raw, forwarded = result
    again = compacted(built, chain, fraction)
    assert again is not None and again[2].body == forwarded.body, "the same input forwarded differently"
    sent = orjson.loads(forwarded.body)
    assert UNIT_KEY.encode() not in forwarded.body
    assert sent.get("system") == built.body.get("system"), "the system prompt changed"
    assert breakpoints(sent) <= 4
    assert _lifetimes(sent) == sorted(_lifetimes(sent)), "a 1h breakpoint follows a 5-minute one"
    _kept_head_carries_the_clients_breakpoints(built.body["messages"], sent["messages"])
    headers = BETA if forwarded.beta else {}
    try:
        upstream_accepts(sent, headers)
    except AnthropicError as error:
        pytest.fail(f"the upstream refused what would be forwarded: {error.body['error']['message']}")
    if forwarded.beta:
        assert binds(built.model) and sent["thinking"]["block_binding"]["prefix_mismatch_behavior"] == "drop_block"
    _continued_thinking_is_byte_for_byte(built, sent)


def _continued_thinking_is_byte_for_byte(built: Built, sent: dict[str, Any]) -> None:
    """Each forwarded message of the continued turn carries the client's thinking blocks as sent, all of them."""
    if not is_continued(built.body):
        return
    original = built.body["messages"]
    turn = {original[position]["content"][-1]["id"]: original[position] for position in continued_turn(original)}
    forwarded = {
        m["content"][-1].get("id"): m for m in sent["messages"] if isinstance(m["content"], list) and m["content"]
    }
    assert original[-2]["content"][-1]["id"] in forwarded, "the continued turn was dropped"
    for call_id, message in turn.items():
        if call_id in forwarded:
            assert _thinking(forwarded[call_id]) == _thinking(message), "the continued turn's thinking changed"


def _lifetimes(body: dict[str, Any]) -> list[bool]:
    """For each breakpoint, in the order the API reads them, whether it lives 5 minutes (False: an hour)."""
    system = body.get("system")
    blocks = [*body.get("tools", ()), *(system if isinstance(system, list) else ())]
    blocks.extend(block for m in body["messages"] if isinstance(m["content"], list) for block in m["content"])
    return [block["cache_control"].get("ttl") != "1h" for block in blocks if "cache_control" in block]


def _kept_head_carries_the_clients_breakpoints(own: list[dict[str, Any]], sent: list[dict[str, Any]]) -> None:
    """The messages sent as the client sent them at the head keep its breakpoints; the proxy adds at most one there."""
    added = 0
    for mine, theirs in zip(own, sent, strict=False):
        if _unmarked(mine) != _unmarked(theirs):
            break
        if mine != theirs:
            added += 1
            assert _unmarked(mine) != mine or not isinstance(mine["content"], list), "a client's breakpoint changed"
    assert added <= 1, "the proxy marked more than one message of the kept head"


def _unmarked(message: dict[str, Any]) -> Any:
    """The message's content as text blocks without `cache_control`."""
    content = message["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    return [{key: value for key, value in block.items() if key != "cache_control"} for block in blocks]


def _thinking(message: dict[str, Any]) -> list[Any]:
    return [block for block in message["content"] if block["type"] in ("thinking", "redacted_thinking")]


@PROPERTIES
@given(built=conversations(SIGNER), fraction=st.floats(min_value=0.0, max_value=1.1))
def test_a_request_forwarded_again_with_its_own_record_sends_the_same_messages(built: Built, fraction: float) -> None:
    """What the proxy keeps of a forward (`SentBefore`) makes the same request go out the same way again, valid."""
    raw = orjson.dumps(built.body)
    request = MessagesRequest.parse(raw)
    transcript = Transcript(request.messages, COUNTER)
    result = chain_by_names(CHAINS["default"]).compact(transcript, int(transcript.total() * fraction))
    engine = list(result.compacted.messages) if result is not None else None
    first = forwarding(request, raw, engine, None)
    assume(first.replay_state is not None)
    again = forwarding(request, raw, engine, first.replay_state)
    assert orjson.loads(again.body)["messages"] == orjson.loads(first.body)["messages"]
    sent = orjson.loads(again.body)
    assert sent["thinking"]["block_binding"]["prefix_mismatch_behavior"] == "drop_block"
    assert again.header_values == BETA
    upstream_accepts(sent, dict(again.header_values))
