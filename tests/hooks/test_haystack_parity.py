"""What the hook and its compactors tell the Agent and the operator, measured as Haystack's measure it.

A Haystack `TokenCounter` counts a list of messages in one call, which need not equal the sum of its counts of each
message. Where Haystack's hook uses the counter's count of a list, ours does too, so a foreign counter gives the same
numbers in both hooks.
"""

from __future__ import annotations

import logging

import pytest
from haystack.dataclasses import ChatMessage

from hooks.compaction import ApproximateTokenCounter, CompactionHook, SlidingWindowCompactor, SummarizationCompactor
from tests.hooks.conftest import FakeSummaryGenerator, RecordingCounter, long_conversation, state_with


def _last_assistant(messages: list[ChatMessage]) -> int:
    return max(index for index, message in enumerate(messages) if message.role.value == "assistant")


def test_context_tokens_after_compaction_are_the_counters_list_counts_plus_the_reported_overhead() -> None:
    counter = RecordingCounter()
    messages = long_conversation(4)
    last = _last_assistant(messages)
    assert counter.count(messages) != sum(counter.count([message]) for message in messages)
    # Five times the local count: too far off to calibrate on, so local counts are taken as they are.
    reported = 5 * counter.count(messages[: last + 1])
    estimated = reported + counter.count(messages[last + 1 :])
    hook = CompactionHook(compactor=SlidingWindowCompactor(), context_window=reported, token_counter=counter)
    state = state_with(list(messages), context_tokens=reported)

    hook.run(state)

    compacted = state.data["messages"]
    assert len(compacted) < len(messages)
    overhead = estimated - counter.count(messages)
    assert state.data["context_tokens"] == counter.count(compacted[: _last_assistant(compacted) + 1]) + overhead


def test_a_counter_that_counts_more_than_the_provider_reported_is_named_in_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counter = RecordingCounter()
    messages = long_conversation(3)
    # The provider counted the whole conversation (system prompt and tool schemas included) at half the local count.
    reported = counter.count(messages[: _last_assistant(messages) + 1]) // 2
    hook = CompactionHook(compactor=SlidingWindowCompactor(), context_window=reported, token_counter=counter)

    with caplog.at_level(logging.WARNING, logger="hooks.compaction.hook"):
        hook.run(state_with(list(messages), context_tokens=reported))

    (record,) = [record for record in caplog.records if record.name == "hooks.compaction.hook"]
    assert record.levelno == logging.WARNING
    assert "TokenCounter estimated more tokens for the messages" in record.getMessage()
    assert "RecordingCounter" in record.getMessage()


def test_a_counter_in_line_with_the_provider_raises_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    counter = RecordingCounter()
    messages = long_conversation(3)
    reported = counter.count(messages[: _last_assistant(messages) + 1]) + 50
    hook = CompactionHook(compactor=SlidingWindowCompactor(), context_window=reported, token_counter=counter)

    with caplog.at_level(logging.WARNING, logger="hooks.compaction.hook"):
        hook.run(state := state_with(list(messages), context_tokens=reported))

    assert len(state.data["messages"]) < len(messages)
    assert [record for record in caplog.records if record.name == "hooks.compaction.hook"] == []


def test_a_summary_that_does_not_shrink_the_conversation_raises_in_haystacks_words() -> None:
    compactor = SummarizationCompactor(
        chat_generator=FakeSummaryGenerator("a summary longer than what it replaces " * 200),
        approximate_summary_tokens=1,
        raise_on_failure=True,
    )
    messages = [
        ChatMessage.from_system("Be brief."),
        ChatMessage.from_user("Old question."),
        ChatMessage.from_assistant("Old answer."),
        ChatMessage.from_user("Current question."),
    ]

    with pytest.raises(RuntimeError, match="did not reduce"):
        compactor.compact(messages=messages, target_tokens=1, token_counter=ApproximateTokenCounter())
