"""The hook against Haystack's API and the engine's decision: parameters, validation, anchoring, identity."""

from __future__ import annotations

import inspect

import haystack.hooks.compaction as haystack_compaction
import pytest
from haystack.dataclasses import ChatMessage
from haystack.token_counters import ApproximateTokenCounter as HaystackApproximate

import hooks.compaction as ours
from hooks.compaction import (
    ApproximateTokenCounter,
    CompactionHook,
    SlidingWindowCompactor,
    TiktokenTokenCounter,
    ToolResultPruningCompactor,
)
from proxy.engine import COMPACTION_META_KEY, TiktokenCounter
from tests.hooks.conftest import SEARCH, FakeSummaryGenerator, long_conversation, state_with

# Parameters whose default is a text: ours are the engine's (the proxy's), so hook and proxy write the same words.
TEXT_DEFAULTS = {"omission_note", "placeholder", "summary_instruction"}


@pytest.mark.parametrize(
    "name", ["CompactionHook", "SlidingWindowCompactor", "ToolResultPruningCompactor", "SummarizationCompactor"]
)
def test_same_parameters_and_defaults_as_haystack(name: str) -> None:
    theirs = inspect.signature(getattr(haystack_compaction, name).__init__).parameters
    mine = inspect.signature(getattr(ours, name).__init__).parameters
    assert list(mine) == list(theirs)
    for parameter, expected in theirs.items():
        assert mine[parameter].kind == expected.kind
        if parameter not in TEXT_DEFAULTS:
            assert mine[parameter].default == expected.default, parameter


def test_compactor_protocol_is_haystacks() -> None:
    assert ours.Compactor is haystack_compaction.Compactor
    assert CompactionHook.allowed_hook_points == ("before_llm",)


def _error(factory: object, *args: object, **kwargs: object) -> str:
    with pytest.raises(ValueError) as raised:
        factory(*args, **kwargs)  # type: ignore[operator]
    return str(raised.value)


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("CompactionHook", {"context_window": 0}),
        ("CompactionHook", {"context_window": 1000, "compact_at": 0.4, "compact_to": 0.4}),
        ("CompactionHook", {"context_window": 1000, "compact_at": 1.2}),
        ("SlidingWindowCompactor", {"min_keep_steps": -1}),
        ("ToolResultPruningCompactor", {"min_keep_steps": 0}),
        ("ToolResultPruningCompactor", {"min_tokens": -1}),
        ("SummarizationCompactor", {"min_keep_steps": -1}),
        ("SummarizationCompactor", {"approximate_summary_tokens": 0}),
    ],
)
def test_same_validation_messages_as_haystack(name: str, kwargs: dict[str, object]) -> None:
    if name == "CompactionHook":
        kwargs = {"compactor": SlidingWindowCompactor(), **kwargs}
    if name == "SummarizationCompactor":
        kwargs = {"chat_generator": FakeSummaryGenerator(), **kwargs}
    assert _error(getattr(ours, name), **kwargs) == _error(getattr(haystack_compaction, name), **kwargs)
    assert _error(ApproximateTokenCounter, chars_per_token=0) == _error(HaystackApproximate, chars_per_token=0)


def test_default_counter_is_the_approximate_one() -> None:
    hook = CompactionHook(compactor=SlidingWindowCompactor(), context_window=1000)
    assert isinstance(hook.token_counter, ApproximateTokenCounter)
    assert hook.token_counter.chars_per_token == 4.0


def test_kept_messages_are_the_callers_objects_with_meta_intact() -> None:
    messages = long_conversation(12)
    hook = CompactionHook(compactor=SlidingWindowCompactor(), context_window=6000, token_counter=TiktokenTokenCounter())
    state = state_with(messages)
    hook.run(state)

    compacted = state.data["messages"]
    assert len(compacted) < len(messages)
    originals = {id(m) for m in messages}
    created = [m for m in compacted if id(m) not in originals]
    assert len(created) == 1 and created[0].meta[COMPACTION_META_KEY]["strategy"] == "sliding_window"
    for message in compacted:
        if id(message) in originals:
            assert any(message is original for original in messages)
    assert [m.meta for m in compacted if id(m) in originals][2:] == [m.meta for m in messages[-len(compacted) + 3 :]]
    assert compacted[0] is messages[0] and compacted[1] is messages[1]
    assert messages == long_conversation(12), "the caller's list is not modified"


def test_pruned_tool_result_still_answers_its_call() -> None:
    messages = long_conversation(10)
    messages[3] = ChatMessage.from_tool("x " * 400, origin=messages[2].tool_calls[0], error=True, meta={"keep": 1})
    hook = CompactionHook(compactor=ToolResultPruningCompactor(), context_window=6000)
    state = state_with(messages)
    hook.run(state)

    pruned = state.data["messages"][3]
    assert pruned is not messages[3]
    assert pruned.tool_call_result.origin == messages[2].tool_calls[0]
    assert pruned.tool_call_result.error is True
    assert pruned.meta["keep"] == 1
    assert pruned.meta[COMPACTION_META_KEY]["strategy"] == "tool_result_pruning"
    assert "search" in pruned.tool_call_result.result


def test_anchor_is_the_providers_count_plus_the_tool_results_after_the_last_reply() -> None:
    counter = TiktokenTokenCounter()
    messages = long_conversation(3)
    last = max(i for i, m in enumerate(messages) if m.role.value == "assistant")
    trailing = counter.count(messages[last + 1 :])
    # A provider that counts exactly as we do (reply priming included): calibration stays at 1, so the estimate is
    # the provider's count plus the local count of the tool results after the last reply.
    reported = counter.count(messages[: last + 1]) + 3
    window = reported + trailing  # compact_at=1.0: the trigger is the window itself

    def hook() -> CompactionHook:
        return CompactionHook(
            compactor=SlidingWindowCompactor(), context_window=window, compact_at=1.0, token_counter=counter
        )

    below = state_with(messages, context_tokens=reported - 1)
    hook().run(below)
    assert below.data["messages"] is messages or below.data["messages"] == messages

    at = state_with(list(messages), context_tokens=reported)
    hook().run(at)
    assert len(at.data["messages"]) < len(messages)
    # The new count covers the compacted conversation through its last assistant message, plus the overhead the
    # provider's count implied.
    overhead = reported + trailing - counter.count(messages)
    compacted = at.data["messages"]
    last = max(i for i, m in enumerate(compacted) if m.role.value == "assistant")
    assert at.data["context_tokens"] == counter.count(compacted[: last + 1]) + overhead


def test_without_usage_tool_schemas_count_towards_the_trigger() -> None:
    counter = TiktokenTokenCounter()
    messages = long_conversation(3)
    engine = TiktokenCounter()
    schemas = engine.overhead_tokens({"tools": [{"type": "function", "function": SEARCH.tool_spec}]})
    total = counter.count(messages) + schemas
    window = int(total / 0.7) + 1  # the estimate is just under the trigger with the tools ...

    hook = CompactionHook(compactor=SlidingWindowCompactor(), context_window=window, token_counter=counter)
    state = state_with(messages, tools=[SEARCH])
    hook.run(state)
    assert state.data["messages"] == messages
    assert state.data["context_tokens"] == 0

    hook = CompactionHook(compactor=SlidingWindowCompactor(), context_window=window - 2, token_counter=counter)
    state = state_with(messages, tools=[SEARCH])  # ... and over it with a slightly smaller window
    hook.run(state)
    assert len(state.data["messages"]) < len(messages)
    assert state.data["context_tokens"] == 0, "no usage stays no usage"

    # Without the tools the same window does not trigger: the schemas made the difference.
    state = state_with(messages)
    hook.run(state)
    assert state.data["messages"] == messages


def test_conversion_is_remembered_across_calls() -> None:
    messages = long_conversation(5)
    hook = CompactionHook(compactor=SlidingWindowCompactor(), context_window=1_000_000)
    hook.run(state_with(messages))
    cached = len(hook._cache)
    assert cached == len(messages)
    messages.append(ChatMessage.from_assistant("thinking"))
    hook.run(state_with(messages))
    assert len(hook._cache) == cached + 1


def test_a_new_agent_run_anchors_on_the_usage_of_the_last_reply() -> None:
    # The Agent resets `context_tokens` at the start of each run; the carried-over history still holds the provider's
    # count of its last call in the usage of the reply it ends with.
    counter = TiktokenTokenCounter()
    messages = long_conversation(3)
    messages.append(
        ChatMessage.from_assistant("Done.", meta={"usage": {"prompt_tokens": 9000, "completion_tokens": 5}})
    )
    messages.append(ChatMessage.from_user("And now beta."))
    assert counter.count(messages) < 7000  # locally under the trigger; the provider counted 9,005

    hook = CompactionHook(compactor=SlidingWindowCompactor(), context_window=10_000, token_counter=counter)
    state = state_with(list(messages), context_tokens=0)
    hook.run(state)
    assert len(state.data["messages"]) < len(messages)
