"""`LosslessCompactor` in the Haystack hook: duplicates and JSON whitespace go first, on the caller's messages."""

from __future__ import annotations

import json

import pytest
from haystack.dataclasses import ChatMessage
from haystack.dataclasses import ToolCall as HaystackToolCall

from hooks.compaction import (
    ChainCompactor,
    CompactionHook,
    LosslessCompactor,
    SlidingWindowCompactor,
    TiktokenTokenCounter,
    ToolResultPruningCompactor,
)
from proxy.engine import COMPACTION_META_KEY
from proxy.engine.strategies.references import REFERS_TO
from tests.hooks.conftest import state_with

LISTING = json.dumps([{"id": i, "path": f"src/module_{i}.py", "lines": i * 10} for i in range(60)], indent=2)


def steps(start: int, count: int, tool: str = "list_files") -> list[ChatMessage]:
    """`count` Agent steps each calling `tool` with the same arguments and getting the same pretty-printed listing."""
    messages = []
    for number in range(start, start + count):
        call = HaystackToolCall(id=f"call_{number}", tool_name=tool, arguments={"dir": "src"})
        messages.append(ChatMessage.from_assistant(tool_calls=[call]))
        messages.append(ChatMessage.from_tool(LISTING, origin=call, meta={"step": number}))
    return messages


def hook(window: int) -> CompactionHook:
    compactor = ChainCompactor([LosslessCompactor(), ToolResultPruningCompactor(), SlidingWindowCompactor()])
    return CompactionHook(compactor=compactor, context_window=window, token_counter=TiktokenTokenCounter())


def test_older_copies_become_references_and_json_is_minified_on_the_callers_messages() -> None:
    messages = [ChatMessage.from_system("You list files."), ChatMessage.from_user("Map the repository."), *steps(1, 3)]
    size = TiktokenTokenCounter().count(messages)
    state = state_with(messages)
    hook(int(size * 0.7)).run(state)  # a target of 28% of the conversation: more than the duplicates alone free

    compacted = state.data["messages"]
    assert len(compacted) == len(messages), "nothing was removed, only replaced"
    assert compacted[:3] == messages[:3] and compacted[2] is messages[2]
    first, second, last = compacted[3], compacted[5], compacted[7]
    for reference in (first, second):
        assert reference.tool_call_result.result.startswith("[Same result as the later call `list_files` (call_3)")
        assert reference.meta[COMPACTION_META_KEY][REFERS_TO] == "call_3"
    assert first.tool_call_result.origin == messages[2].tool_calls[0], "the reference still answers its own call"
    assert first.meta["step"] == 1, "the replaced message's meta is kept"
    assert json.loads(last.tool_call_result.result) == json.loads(LISTING)
    assert len(last.tool_call_result.result) < len(LISTING)
    assert last.meta == {"step": 3, COMPACTION_META_KEY: {"strategy": "json_minify", "lossless": True}}


def test_a_later_step_moves_the_references_on_to_the_newest_copy() -> None:
    opening = [ChatMessage.from_system("You list files."), ChatMessage.from_user("Map the repository.")]
    size = TiktokenTokenCounter().count([*opening, *steps(1, 2)])
    window = int(size / 0.75)
    state = state_with([*opening, *steps(1, 2)])
    hook(window).run(state)
    state.data["messages"] = [*state.data["messages"], *steps(3, 1)]
    hook(window).run(state)

    results = [message for message in state.data["messages"] if message.tool_call_result is not None]
    assert [message.meta[COMPACTION_META_KEY].get(REFERS_TO) for message in results[:2]] == ["call_3", "call_3"]
    assert json.loads(results[2].tool_call_result.result) == json.loads(LISTING)


def test_round_trips_and_refuses_to_do_nothing() -> None:
    compactor = LosslessCompactor(json_minify=False, superseded_tools=["read_file"])
    restored = LosslessCompactor.from_dict(compactor.to_dict())
    assert (restored.duplicates, restored.json_minify, restored.superseded_tools) == (True, False, ["read_file"])
    assert [strategy.name for strategy in restored.strategies()] == ["duplicate_results", "superseded_results"]
    restored_hook = CompactionHook.from_dict(hook(1000).to_dict())
    assert isinstance(restored_hook.compactor, ChainCompactor)
    assert isinstance(restored_hook.compactor.compactors[0], LosslessCompactor)
    with pytest.raises(ValueError, match="nothing to do"):
        LosslessCompactor(duplicates=False, json_minify=False)
