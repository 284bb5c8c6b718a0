"""Property tests of summary tiers: a conversation summarized before keeps its compacted head byte for byte."""

from __future__ import annotations

import copy

import orjson
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from proxy.engine import ApproximateCounter, CompactionChain, MiddleOut, SlidingWindow, Transcript
from proxy.engine.grouping import agent_step_groups, latest_user_index, leading_instructions_end
from proxy.engine.messages import Message
from proxy.engine.plan import Kept
from proxy.engine.strategies.sliding_window import DEFAULT_OMISSION_NOTE
from proxy.engine.strategies.summarization import Summarization, SummaryRequest, summary_plan
from proxy.engine.strategies.summary_tiers import tiered_span
from tests.engine.conversations import Conversation, assert_tool_pairs_intact, conversations
from tests.engine.test_invariants import PROPERTY_SETTINGS

COUNTER = ApproximateCounter()
SUMMARY = "## Objective\n- carry on\n## Work done\n- read the files"


class FixedSummarizer:
    """The model's side of a summary: the same short text for every span (the engine decides what is summarized)."""

    def summarize(self, request: SummaryRequest) -> str:
        return SUMMARY

    async def summarize_async(self, request: SummaryRequest) -> str:
        return SUMMARY


@st.composite
def continuations(draw: st.DrawFn, first_call: int = 1000) -> list[Message]:
    """What an agent adds after a compaction: Agent steps (tool calls and their results), maybe a new task first."""
    added: list[Message] = []
    if draw(st.booleans()):
        added.append({"role": "user", "content": "next task: " + "word " * draw(st.integers(1, 40))})
    for step in range(draw(st.integers(min_value=0, max_value=5))):
        call = f"call_{first_call + step}"
        function = {"name": "read_file", "arguments": f'{{"n": {step}}}'}
        added.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call, "type": "function", "function": function}],
            }
        )
        added.append({"role": "tool", "tool_call_id": call, "content": "line " * draw(st.integers(1, 300))})
    return added


def _chain(head_share: float) -> CompactionChain:
    summarization = Summarization(FixedSummarizer(), approximate_summary_tokens=32, head_share=head_share)
    return CompactionChain([summarization, SlidingWindow(), MiddleOut(min_keep_tokens=16)])


def _summary_indices(transcript: Transcript) -> list[int]:
    start = leading_instructions_end(transcript)
    return [index for index in range(start, len(transcript)) if transcript.created_by(index, Summarization.name)]


def _summarized_and_grown(conversation: Conversation, added: list[Message], fraction: float) -> Transcript:
    """The conversation summarized down to `fraction` of it, then grown by `added` (as it was if nothing was)."""
    transcript = Transcript(conversation.messages, COUNTER, conversation.meta)
    result = _chain(0.0).compact(transcript, int(transcript.total() * fraction))
    if result is None:
        return transcript
    forwarded = result.compacted
    meta = [*(forwarded.meta or [{} for _ in forwarded.messages]), *({} for _ in added)]
    return Transcript([*forwarded.messages, *added], COUNTER, meta)


def _bytes(messages: list[Message]) -> bytes:
    return orjson.dumps(messages)


@PROPERTY_SETTINGS
@given(
    conversation=conversations(),
    added=continuations(),
    fraction=st.floats(min_value=0.05, max_value=1.0),
    head_share=st.floats(min_value=0.05, max_value=1.0),
    min_keep_steps=st.integers(min_value=0, max_value=2),
)
def test_a_tiered_span_leaves_the_head_the_latest_task_and_the_newest_steps(
    conversation: Conversation, added: list[Message], fraction: float, head_share: float, min_keep_steps: int
) -> None:
    transcript = _summarized_and_grown(conversation, added, fraction)
    target = int(transcript.total() * fraction)
    summaries = _summary_indices(transcript)
    span = tiered_span(
        transcript, summaries, target, head_share=head_share, min_keep_steps=min_keep_steps, summary_tokens=32
    )
    event(f"tiered span: {span is not None}")
    if span is None:
        return
    assert summaries, "a conversation never summarized has no head to keep"
    assert span == sorted(set(span))
    head_end = min(span)
    assert head_end > summaries[-1], "the head runs through the newest summary"
    task = latest_user_index(transcript)
    assert task not in span
    task_in_head = task is not None and summaries[-1] < task < head_end
    assert transcript.prefix_tokens(head_end) - (transcript.tokens(task) if task_in_head else 0) <= head_share * target
    # The newest steps of the current task (min_keep_steps counts the task's own steps, as the other spans do).
    steps = agent_step_groups(transcript, max(summaries[-1], -1 if task is None else task) + 1)
    newest = {index for group in steps[-min_keep_steps:] for index in group} if min_keep_steps else set()
    assert not newest & set(span), "the newest Agent steps stay as they are"
    plan = summary_plan(transcript, span, SUMMARY)
    if plan is None:
        return
    output = plan.apply_messages(transcript.messages)
    assert_tool_pairs_intact(output)
    assert plan.entries[:head_end] == tuple(Kept(index) for index in range(head_end))


@PROPERTY_SETTINGS
@given(
    conversation=conversations(),
    added=continuations(),
    fraction=st.floats(min_value=0.05, max_value=0.9),
    head_share=st.floats(min_value=0.0, max_value=1.0),
)
def test_compacting_again_keeps_the_compacted_head_or_merges_under_the_target(
    conversation: Conversation, added: list[Message], fraction: float, head_share: float
) -> None:
    chain = _chain(head_share)
    first = Transcript(conversation.messages, COUNTER, conversation.meta)
    target = int(first.total() * fraction)
    compacted = chain.compact(first, target)
    if compacted is None:
        return
    forwarded = compacted.compacted
    summaries = _summary_indices(forwarded)
    event(f"first compaction summarized: {bool(summaries)}")
    if not summaries:
        return
    head = forwarded.messages[: summaries[-1] + 1]
    meta = [*(forwarded.meta or [{} for _ in forwarded.messages]), *({} for _ in added)]
    grown = Transcript([*forwarded.messages, *added], COUNTER, meta)
    before = copy.deepcopy(grown.messages)

    result = chain.compact(grown, target)

    assert grown.messages == before, "the input was changed"
    if result is None:
        return
    again = chain.compact(Transcript(before, COUNTER, meta), target)
    assert again is not None and again.plan == result.plan, "the same input gave another output"
    output = result.plan.apply_messages(grown.messages)
    assert_tool_pairs_intact(output)
    end = leading_instructions_end(grown)
    assert result.plan.entries[:end] == tuple(Kept(index) for index in range(end))
    task = latest_user_index(grown)
    assert task is None or Kept(task) in result.plan.entries
    kept_head = _bytes(output[: len(head)]) == _bytes(head)
    event(f"compacted again, head kept: {kept_head}")
    if kept_head:
        return
    # The head was given up: only when keeping it could not reach the target (the tiers were merged, or what the
    # summary after it left still had to be cut), and the result is under the target whenever what must stay allows.
    span = tiered_span(grown, summaries, target, head_share=head_share, min_keep_steps=1, summary_tokens=32)
    step = None if span is None else summary_plan(grown, span, SUMMARY)
    assert step is None or grown.edited(step).total() > target, "a summary after the head was enough, yet it went"
    note = DEFAULT_OMISSION_NOTE.replace("{num_removed}", str(len(grown)))
    protected = grown.tokens_of(range(end)) + (grown.tokens(task) if task is not None else 0)
    newest = agent_step_groups(grown, end)[-1:]
    floor = protected + sum(grown.tokens_of(group) for group in newest) + COUNTER.message_tokens(head[-1])
    assert result.tokens_after <= max(target, floor) + COUNTER.message_tokens({"role": "user", "content": note})


def test_head_share_is_a_share_of_the_target() -> None:
    with pytest.raises(ValueError, match="head_share"):
        Summarization(FixedSummarizer(), head_share=1.5)
