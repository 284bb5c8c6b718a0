"""Property-based tests of the invariants every compaction plan keeps."""

from __future__ import annotations

import copy

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.engine import (
    ApproximateCounter,
    CompactionChain,
    DuplicateResults,
    JsonMinify,
    Kept,
    MiddleOut,
    SlidingWindow,
    Strategy,
    SupersededResults,
    TiktokenCounter,
    ToolResultPruning,
    Transcript,
)
from proxy.engine.grouping import latest_user_index, leading_instructions_end
from proxy.engine.strategies.sliding_window import DEFAULT_OMISSION_NOTE
from tests.engine.conversations import Conversation, assert_tool_pairs_intact, conversations
from tests.support.examples import examples

STRATEGIES: dict[str, list[Strategy]] = {
    "pruning": [ToolResultPruning(min_tokens=20)],
    "sliding": [SlidingWindow()],
    "sliding_no_min": [SlidingWindow(min_keep_steps=0)],
    "middle_out": [MiddleOut(min_keep_tokens=16)],
    "chain": [ToolResultPruning(min_tokens=20), SlidingWindow(), MiddleOut(min_keep_tokens=16)],
    "lossless_first": [
        DuplicateResults(),
        SupersededResults(["tool_0"]),
        JsonMinify(),
        ToolResultPruning(min_tokens=20),
        SlidingWindow(),
        MiddleOut(min_keep_tokens=16),
    ],
}

COUNTER = ApproximateCounter()
PROPERTY_SETTINGS = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _run(conversation: Conversation, strategies: list[Strategy], target_fraction: float):
    transcript = Transcript(conversation.messages, COUNTER, conversation.meta)
    target = int(transcript.total() * target_fraction)
    return transcript, target, CompactionChain(strategies).compact(transcript, target)


@pytest.mark.parametrize("name", STRATEGIES)
@PROPERTY_SETTINGS
@given(conversation=conversations(), fraction=st.floats(min_value=0.0, max_value=1.2))
def test_protected_messages_survive_and_pairs_stay_whole(
    name: str, conversation: Conversation, fraction: float
) -> None:
    transcript, _target, result = _run(conversation, STRATEGIES[name], fraction)
    if result is None:
        return
    plan = result.plan
    output = plan.apply_messages(conversation.messages)
    assert_tool_pairs_intact(output)

    for index in range(leading_instructions_end(transcript)):
        assert plan.entries[index] == Kept(index), f"instruction {index} was changed or removed"
    task = latest_user_index(transcript)
    if task is not None:
        assert Kept(task) in plan.entries, "the latest user message was changed or removed"
    assert result.tokens_after < result.tokens_before
    notes = [entry for entry in plan.created() if entry.strategy == "sliding_window"]
    earlier_notes_kept = [
        entry
        for entry in plan.entries
        if isinstance(entry, Kept) and transcript.created_by(entry.index, "sliding_window")
    ]
    assert len(notes) + len(earlier_notes_kept) <= 1, "more than one omission note"


@pytest.mark.parametrize("name", STRATEGIES)
@PROPERTY_SETTINGS
@given(conversation=conversations(), fraction=st.floats(min_value=0.0, max_value=1.2))
def test_input_untouched_and_output_deterministic(name: str, conversation: Conversation, fraction: float) -> None:
    before = copy.deepcopy((conversation.messages, conversation.meta))
    _transcript, _target, first = _run(conversation, STRATEGIES[name], fraction)
    assert (conversation.messages, conversation.meta) == before
    # A fresh counter, so nothing cached can make the second run differ.
    transcript = Transcript(
        copy.deepcopy(conversation.messages), ApproximateCounter(), copy.deepcopy(conversation.meta)
    )
    second = CompactionChain(STRATEGIES[name]).compact(transcript, _target)
    assert (first is None) == (second is None)
    if first is not None and second is not None:
        assert orjson.dumps(first.plan.apply_messages(conversation.messages)) == orjson.dumps(
            second.plan.apply_messages(transcript.messages)
        )


@PROPERTY_SETTINGS
@given(conversation=conversations(), fraction=st.floats(min_value=0.0, max_value=1.0))
def test_reaches_target_whenever_the_protected_messages_allow(conversation: Conversation, fraction: float) -> None:
    transcript = Transcript(conversation.messages, COUNTER, conversation.meta)
    chain = CompactionChain(
        [ToolResultPruning(min_tokens=0), SlidingWindow(min_keep_steps=0), MiddleOut(min_keep_tokens=0)]
    )
    task = latest_user_index(transcript)
    # The leading block and the latest user message stay whole; every other message that must stay can be cut down
    # to its framing and the cut notice (~40 tokens).
    protected = transcript.tokens_of(range(leading_instructions_end(transcript)))
    floor = protected + (transcript.tokens(task) if task is not None else 0) + 60
    target = max(int(transcript.total() * fraction), floor)
    result = chain.compact(transcript, target)
    size = result.tokens_after if result is not None else transcript.total()
    # The omission note comes on top of the target, as in Haystack's sliding window: the messages it keeps fit.
    note = DEFAULT_OMISSION_NOTE.replace("{num_removed}", str(len(transcript)))
    assert size <= target + COUNTER.message_tokens({"role": "user", "content": note})


def test_tiktoken_counter_keeps_the_same_invariants() -> None:
    counter = TiktokenCounter()

    @settings(max_examples=examples(40), deadline=None)
    @given(conversation=conversations(), fraction=st.floats(min_value=0.0, max_value=1.0))
    def check(conversation: Conversation, fraction: float) -> None:
        transcript = Transcript(conversation.messages, counter, conversation.meta)
        result = CompactionChain(STRATEGIES["chain"]).compact(transcript, int(transcript.total() * fraction))
        if result is not None:
            assert_tool_pairs_intact(result.plan.apply_messages(conversation.messages))
            assert result.compacted.total() == counter.messages_tokens(result.compacted.messages)

    check()


@PROPERTY_SETTINGS
@given(conversation=conversations())
def test_pruned_results_name_the_tool_their_call_ran(conversation: Conversation) -> None:
    """Each placeholder names the function of the call its result answers, found in one pass over the run."""
    transcript = Transcript(conversation.messages, COUNTER, conversation.meta)
    plan = ToolResultPruning(min_tokens=20, placeholder="rerun {tool_name}").plan(transcript, 0)
    if plan is None:
        return
    names = {
        call["id"]: call["function"]["name"]
        for message in conversation.messages
        for call in message.get("tool_calls") or ()
    }
    for entry in plan.created():
        assert entry.message["content"] == f"rerun {names[entry.message['tool_call_id']]}"
