"""Serialization, lifecycle, summarization, and interoperability with Haystack's own hook, compactors and counters."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from haystack.components.agents import Agent
from haystack.core.serialization import allow_deserialization_module
from haystack.dataclasses import ChatMessage
from haystack.hooks.compaction import CompactionHook as HaystackHook
from haystack.hooks.compaction import SlidingWindowCompactor as HaystackSlidingWindow
from haystack.hooks.compaction import SummarizationCompactor as HaystackSummarization
from haystack.token_counters import ApproximateTokenCounter as HaystackApproximate

from hooks.compaction import (
    ApproximateTokenCounter,
    ChainCompactor,
    CompactionHook,
    MiddleOutCompactor,
    SlidingWindowCompactor,
    SummarizationCompactor,
    TiktokenTokenCounter,
    ToolResultPruningCompactor,
)
from proxy.engine import COMPACTION_META_KEY
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.hooks.conftest import (
    FakeSummaryGenerator,
    RecordingCounter,
    agent_for,
    generator_for,
    long_conversation,
    state_with,
)
from tests.hooks.test_long_run import STEPS, check_run

TASK = [ChatMessage.from_user("Research alpha thoroughly.")]


def strategies_in(messages: list[ChatMessage]) -> list[str]:
    return [m.meta[COMPACTION_META_KEY]["strategy"] for m in messages if COMPACTION_META_KEY in m.meta]


# ---- serialization -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "compactor",
    [
        SlidingWindowCompactor(min_keep_steps=2, omission_note="[{num_removed} gone]"),
        ToolResultPruningCompactor(min_tokens=50, skip_meta_keys=("a", "b")),
        MiddleOutCompactor(min_keep_tokens=64),
        ChainCompactor([ToolResultPruningCompactor(), SlidingWindowCompactor(min_keep_steps=0)]),
    ],
)
@pytest.mark.parametrize("counter", [ApproximateTokenCounter(chars_per_token=3.5), TiktokenTokenCounter("cl100k_base")])
def test_hook_round_trips_with_nested_compactor_and_counter(compactor: Any, counter: Any) -> None:
    hook = CompactionHook(
        compactor=compactor, context_window=32_000, compact_at=0.8, compact_to=0.3, token_counter=counter
    )
    data = hook.to_dict()
    assert data["type"] == "hooks.compaction.hook.CompactionHook"
    assert set(data["init_parameters"]) == {"compactor", "context_window", "compact_at", "compact_to", "token_counter"}
    restored = CompactionHook.from_dict(copy.deepcopy(data))
    assert restored.to_dict() == data
    assert type(restored.compactor) is type(compactor)
    assert type(restored.token_counter) is type(counter)


def test_summarization_compactor_round_trips_its_generator(long_task_upstream: OpenAIUpstream) -> None:
    compactor = SummarizationCompactor(generator_for(long_task_upstream), approximate_summary_tokens=256)
    restored = SummarizationCompactor.from_dict(copy.deepcopy(compactor.to_dict()))
    assert restored.to_dict() == compactor.to_dict()
    assert restored.chat_generator.api_base_url == long_task_upstream.base_url + "/v1"


def test_agent_carrying_the_hook_round_trips(long_task_upstream: OpenAIUpstream) -> None:
    hook = CompactionHook(compactor=SlidingWindowCompactor(), context_window=8192, token_counter=TiktokenTokenCounter())
    agent = agent_for(long_task_upstream, hook)
    allow_deserialization_module("tests.hooks.conftest")  # the test's tool function; our hook needs no entry
    data = agent.to_dict()
    restored = Agent.from_dict(copy.deepcopy(data))
    assert restored.to_dict() == data
    (restored_hook,) = restored.hooks["before_llm"]
    assert isinstance(restored_hook, CompactionHook)
    result = restored.run(messages=TASK)
    assert check_run(long_task_upstream, result, restored_hook) >= 5


# ---- lifecycle ---------------------------------------------------------------------------------------------------


def test_lifecycle_reaches_counter_compactor_and_summary_generator() -> None:
    generator = FakeSummaryGenerator()
    counter = RecordingCounter()
    hook = CompactionHook(compactor=SummarizationCompactor(generator), context_window=4000, token_counter=counter)
    agent = Agent(chat_generator=FakeSummaryGenerator(), hooks={"before_llm": [hook]})
    agent.warm_up()
    agent.close()
    assert counter.calls == ["warm_up", "close"]
    assert generator.calls == ["warm_up", "close"]


async def test_async_lifecycle_reaches_counter_and_compactor() -> None:
    generator = FakeSummaryGenerator()
    counter = RecordingCounter()
    chain = ChainCompactor([ToolResultPruningCompactor(), SummarizationCompactor(generator)])
    hook = CompactionHook(compactor=chain, context_window=4000, token_counter=counter)
    await hook.warm_up_async()
    await hook.close_async()
    assert counter.calls == ["warm_up", "close_async"]
    assert generator.calls == ["warm_up", "close"]


# ---- summarization -----------------------------------------------------------------------------------------------


def test_summarization_sync_through_a_chat_generator() -> None:
    generator = FakeSummaryGenerator()
    messages = long_conversation(12)
    hook = CompactionHook(compactor=SummarizationCompactor(generator), context_window=6000)
    state = state_with(messages)
    hook.run(state)

    compacted = state.data["messages"]
    assert generator.calls == ["run"]
    system, user = generator.prompts[0]
    assert "Condense" in system.text
    assert user.text.startswith("<conversation_to_summarize>") and "[tool result call_1]" in user.text
    (summary,) = [m for m in compacted if COMPACTION_META_KEY in m.meta]
    assert summary.meta[COMPACTION_META_KEY]["strategy"] == "summarization"
    assert summary.text.startswith("<conversation_summary>") and generator.text in summary.text
    assert compacted[:2] == messages[:2] and compacted[2] is summary
    assert compacted[-1] is messages[-1]


async def test_summarization_async_uses_run_async() -> None:
    generator = FakeSummaryGenerator()
    hook = CompactionHook(compactor=SummarizationCompactor(generator), context_window=6000)
    state = state_with(long_conversation(12))
    await hook.run_async(state)
    assert generator.calls == ["run_async"]
    assert strategies_in(state.data["messages"]) == ["summarization"]


# ---- interop -----------------------------------------------------------------------------------------------------


def test_haystacks_compactor_and_counter_work_in_our_hook(long_task_upstream: OpenAIUpstream) -> None:
    hook = CompactionHook(compactor=HaystackSlidingWindow(), context_window=8192, token_counter=HaystackApproximate())
    result = agent_for(long_task_upstream, hook).run(messages=TASK)
    assert check_run(long_task_upstream, result, hook) >= 5
    assert strategies_in(result["messages"]) == ["sliding_window"]


def test_our_compactor_and_counter_work_in_haystacks_hook(long_task_upstream: OpenAIUpstream) -> None:
    hook = HaystackHook(compactor=SlidingWindowCompactor(), context_window=8192, token_counter=TiktokenTokenCounter())
    result = agent_for(long_task_upstream, hook).run(messages=TASK)
    assert check_run(long_task_upstream, result, hook) >= 5  # type: ignore[arg-type]
    assert strategies_in(result["messages"]) == ["sliding_window"]
    restored = HaystackHook.from_dict(hook.to_dict())
    assert isinstance(restored.compactor, SlidingWindowCompactor)
    assert isinstance(restored.token_counter, TiktokenTokenCounter)


async def test_our_summarizer_works_in_haystacks_hook_async() -> None:
    generator = FakeSummaryGenerator()
    hook = HaystackHook(compactor=SummarizationCompactor(generator), context_window=6000)
    state = state_with(long_conversation(12))
    await hook.run_async(state)
    assert generator.calls == ["run_async"]
    assert strategies_in(state.data["messages"]) == ["summarization"]


def test_each_side_folds_the_others_omission_note() -> None:
    counter = TiktokenTokenCounter()
    messages = long_conversation(30)
    ours = SlidingWindowCompactor()
    theirs = HaystackSlidingWindow()

    first = ours.compact(messages, target_tokens=9000, token_counter=counter)
    assert first is not None and strategies_in(first) == ["sliding_window"]
    grown = first + long_conversation(8, task="ignored")[2:]
    second = theirs.compact(grown, target_tokens=6000, token_counter=counter)
    assert second is not None and strategies_in(second) == ["sliding_window"], "Haystack folded our note"

    third = ours.compact(second + long_conversation(8)[2:], target_tokens=4000, token_counter=counter)
    assert third is not None and strategies_in(third) == ["sliding_window"], "we folded Haystack's note"
    assert third[1] is messages[1], "the task is still the real user message, not a note"


def test_haystacks_summary_is_not_mistaken_for_the_task() -> None:
    messages = long_conversation(12)
    summarized = HaystackSummarization(FakeSummaryGenerator()).compact(
        messages, target_tokens=5000, token_counter=HaystackApproximate()
    )
    assert summarized is not None and strategies_in(summarized) == ["summarization"]
    generator = FakeSummaryGenerator("- merged")
    again = SummarizationCompactor(generator, min_keep_steps=1).compact(
        summarized + long_conversation(6)[2:], target_tokens=1500, token_counter=TiktokenTokenCounter()
    )
    assert again is not None
    assert again[1] is messages[1], "the task is still the real user message"
    assert again[2] is summarized[2], "Haystack's summary is kept as history, ahead of the current task's steps"
    assert strategies_in(again) == ["summarization", "summarization"]


def test_deserializing_needs_no_extra_allowlist_entry() -> None:
    allow_deserialization_module("hooks.compaction")  # what importing hooks.compaction already did; idempotent
    data = CompactionHook(compactor=SlidingWindowCompactor(), context_window=1000).to_dict()
    assert isinstance(CompactionHook.from_dict(data), CompactionHook)


def test_steps_constant() -> None:
    assert STEPS >= 50
