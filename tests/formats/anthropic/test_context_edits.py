"""The proxy's estimate of what Anthropic's tool-result clearing leaves agrees with what the strict fake performs.

Over random tool runs (several tools, results of any size, calls with arguments) and random `clear_tool_uses_20250919`
edits (a token or tool-use trigger, `keep`, `clear_at_least`, `exclude_tools`, `clear_tool_inputs` as a bool or a
list), the estimate after the edits (`proxy.engine.provider_edits`, from the format's translation) never exceeds the
estimate before, and equals what the fake reports processing (`proxy.simulator.anthropic_context`, an independent
implementation) within the tokenizer slack: the two count the same conversation with different tokenizers, so a
threshold between their two counts (the trigger, `clear_at_least`) is where they may decide differently, and such
examples are left out. At any calibration the edits only remove, and only from the messages they change. The format
reads edits it does not understand as none, and the fake refuses malformed ones.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from proxy.engine import Transcript, counter_for_model, estimate_tokens
from proxy.engine.provider_edits import provider_view
from proxy.formats.anthropic.request import MessagesRequest
from proxy.simulator.anthropic_context import EDITING_BETA, check_edits, manage
from proxy.simulator.anthropic_rules import AnthropicError, prompt_segments
from tests.support.examples import examples

MODEL = "claude-sonnet-4-5"
TOOL_NAMES = ("search", "read", "edit")
TOOLS = [{"name": name, "description": f"The {name} tool.", "input_schema": {"type": "object"}} for name in TOOL_NAMES]
HEADERS = {"anthropic-beta": EDITING_BETA}
SLACK = 0.08
"""How far apart the proxy's and the fake's counts of the same text may be, relatively (cl100k against o200k, with
each side's own message overheads)."""


@st.composite
def tool_runs(draw: st.DrawFn) -> dict[str, Any]:
    """A Messages request of tasks, each calling tools whose results are of any size, ending on results or a task."""
    messages: list[dict[str, Any]] = []
    for task in range(draw(st.integers(1, 8))):
        messages.append({"role": "user", "content": f"Task {task}: " + "details " * draw(st.integers(0, 200))})
        for step in range(draw(st.integers(0, 3))):
            ids = [f"toolu_{task}_{step}_{call}" for call in range(draw(st.integers(1, 2)))]
            calls = [
                {
                    "type": "tool_use",
                    "id": i,
                    "name": draw(st.sampled_from(TOOL_NAMES)),
                    "input": {"q": "x" * draw(st.integers(0, 300))},
                }
                for i in ids
            ]
            messages.append({"role": "assistant", "content": calls})
            results = [
                {"type": "tool_result", "tool_use_id": i, "content": "found " * draw(st.integers(0, 1500))} for i in ids
            ]
            messages.append({"role": "user", "content": results})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Done {task}."}]})
    messages.append({"role": "user", "content": "Go on."})
    return {"model": MODEL, "max_tokens": 1024, "system": "You are an agent.", "tools": TOOLS, "messages": messages}


names = st.lists(st.sampled_from(TOOL_NAMES), max_size=2, unique=True)
edits = st.fixed_dictionaries(
    {"type": st.just("clear_tool_uses_20250919")},
    optional={
        "trigger": st.one_of(
            st.builds(lambda v: {"type": "input_tokens", "value": v}, st.integers(0, 6_000)),
            st.builds(lambda v: {"type": "tool_uses", "value": v}, st.integers(0, 20)),
        ),
        "keep": st.builds(lambda v: {"type": "tool_uses", "value": v}, st.integers(0, 6)),
        "clear_at_least": st.builds(lambda v: {"type": "input_tokens", "value": v}, st.integers(0, 5_000)),
        "exclude_tools": names,
        "clear_tool_inputs": st.booleans() | names,
    },
)


def fake_tokens(body: dict[str, Any], messages: list[dict[str, Any]]) -> int:
    """What the fake upstream counts for `body` with these messages."""
    return sum(segment.tokens for segment in prompt_segments(body, messages))


def near(a: int, b: int, threshold: int) -> bool:
    """Whether `threshold` lies within the slack of counts `a` and `b` (their decisions there may differ)."""
    low, high = min(a, b) * (1 - SLACK), max(a, b) * (1 + SLACK)
    return low - 32 <= threshold <= high + 32


@settings(max_examples=examples(150))
@given(tool_runs(), edits.map(lambda edit: [edit]))
def test_the_estimate_after_the_apis_clearing_is_what_the_api_processes(body: dict[str, Any], asked: list[Any]) -> None:
    """One clearing edit, as the API documents it (how two clearing edits of one request compose is not documented:
    whether the second clears the inputs of tool uses whose results the first cleared is the fake's guess)."""
    body = {**body, "context_management": {"edits": asked}}
    request = MessagesRequest.parse(orjson.dumps(body))
    translated = request.provider_edits
    assert translated is not None and len(translated.clearings) == len(asked)
    transcript = Transcript(request.messages, counter_for_model(MODEL))
    overhead = transcript.counter.overhead_tokens(request.overhead_fields) + request.added_prompt_tokens
    before = estimate_tokens(transcript, overhead)
    view = provider_view(transcript, translated, before, 1.0)
    assert view.estimated_tokens <= before
    assert view.estimated_tokens == before - view.cleared_tokens

    sent = fake_tokens(body, body["messages"])
    managed = manage(body["messages"], check_edits(body, HEADERS), lambda messages: fake_tokens(body, messages))
    processed = fake_tokens(body, managed.messages)
    assume(not any(near(before, sent, edit.get("trigger", {}).get("value", 100_000)) for edit in asked))
    cleared = sent - processed
    minimums = [edit.get("clear_at_least", {}).get("value", 0) for edit in asked]
    assume(not any(near(view.cleared_tokens, cleared, minimum) for minimum in minimums if minimum > 0))
    event("the API cleared" if managed.applied else "the API cleared nothing")
    assert abs(view.estimated_tokens - processed) <= SLACK * max(view.estimated_tokens, processed) + 32


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"type": "clear_tool_uses_20250919", "keep": {"type": "input_tokens", "value": 3}}, "keep.type"),
        ({"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": -1}}, "trigger.value"),
        ({"type": "clear_tool_uses_20250919", "exclude_tools": "search"}, "exclude_tools"),
        ({"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 1_000}}, "trigger.value"),
        ({"type": "clear_thinking_20251015"}, "requires `thinking`"),
        ({"type": "clear_everything"}, "does not match"),
    ],
)
def test_a_malformed_edit_is_refused_by_the_fake_and_not_estimated_by_the_proxy(edit: Any, message: str) -> None:
    body = {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    body["context_management"] = {"edits": [edit]}
    headers = {"anthropic-beta": "context-management-2025-06-27,compact-2026-01-12"}
    with pytest.raises(AnthropicError) as refused:
        check_edits(body, headers)
    assert refused.value.status == 400 and message in refused.value.body["error"]["message"]
    estimated = MessagesRequest.parse(orjson.dumps(body)).provider_edits
    known = edit["type"] in ("compact_20260112", "clear_thinking_20251015")
    assert (estimated is not None) == known  # the format reads the types it knows, the API judges their values


def test_an_edit_without_its_beta_header_is_refused() -> None:
    body = {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    body["context_management"] = {"edits": [{"type": "compact_20260112"}]}
    with pytest.raises(AnthropicError, match="compact-2026-01-12"):
        check_edits(body, HEADERS)


@settings(max_examples=examples(100))
@given(tool_runs(), st.lists(edits, min_size=1, max_size=2), st.floats(0.5, 2.0))
def test_the_estimate_after_the_edits_never_exceeds_the_one_before_at_any_calibration(
    body: dict[str, Any], asked: list[Any], scale: float
) -> None:
    """Whatever the calibrated ratio of the provider's tokens to the proxy's, the edits only ever remove."""
    request = MessagesRequest.parse(orjson.dumps({**body, "context_management": {"edits": asked}}))
    assert request.provider_edits is not None
    transcript = Transcript(request.messages, counter_for_model(MODEL))
    before = estimate_tokens(transcript, 0, scale=scale)
    view = provider_view(transcript, request.provider_edits, before, scale)
    assert 0 <= view.cleared_tokens <= before - round(scale * sum(view.transcript.tokens(i) for i in view.cleared))
    assert view.estimated_tokens == before - view.cleared_tokens <= before
    assert all(view.transcript.tokens(i) < transcript.tokens(i) for i in view.cleared)
