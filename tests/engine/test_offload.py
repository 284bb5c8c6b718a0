"""The offload strategy: results move to a store and leave a reference that can be read back and that lasts."""

from __future__ import annotations

import copy
import logging
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.engine import (
    COMPACTION_META_KEY,
    ApproximateCounter,
    CompactionChain,
    MemoryOffloadStore,
    MiddleOut,
    SlidingWindow,
    Strategy,
    ToolResultOffload,
    ToolResultPruning,
    Transcript,
)
from proxy.engine.strategies.offload import (
    OFFLOADED_META_KEY,
    StagingOffloadStore,
    content_reference,
    offloaded_references,
)
from tests.engine.conversations import Conversation, assert_tool_pairs_intact, conversations
from tests.support.examples import examples

COUNTER = ApproximateCounter()
PROPERTY_SETTINGS = settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])


class FailingStore:
    """A store whose every write fails, as a full disk or an unreachable Redis would."""

    def put(self, content: str) -> str:
        raise OSError("no space left on device")

    def get(self, reference: str) -> str | None:
        return None


def _chain(store: MemoryOffloadStore | FailingStore, *, then: bool = True) -> list[Strategy]:
    offload: list[Strategy] = [ToolResultOffload(store, min_tokens=20)]
    rest: list[Strategy] = [ToolResultPruning(min_tokens=20), SlidingWindow(), MiddleOut()]
    return offload + rest if then else offload


def _steps(*results: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "go"}]
    for number, result in enumerate(results):
        call = {"id": f"c{number}", "type": "function", "function": {"name": "search", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{number}", "content": result})
    return messages


def _offloaded_in(messages: list[Any], meta: list[Any]) -> list[tuple[str, str]]:
    """(reference, stand-in text) for every offloaded result in a compacted conversation."""
    return [
        (reference, message["content"])
        for message, marks in zip(messages, meta, strict=True)
        for reference in offloaded_references(marks)
    ]


@PROPERTY_SETTINGS
@given(conversation=conversations(), fraction=st.floats(min_value=0.0, max_value=1.0))
def test_every_reference_reads_back_the_original_and_pairs_stay_whole(
    conversation: Conversation, fraction: float
) -> None:
    store = MemoryOffloadStore()
    transcript = Transcript(conversation.messages, COUNTER, conversation.meta)
    result = CompactionChain(_chain(store)).compact(transcript, int(transcript.total() * fraction))
    if result is None:
        return
    output = result.plan.apply_messages(conversation.messages)
    assert_tool_pairs_intact(output)
    originals = {entry.replaces: entry for entry in result.plan.created() if entry.replaces is not None}
    for entry in result.plan.created():
        for reference in offloaded_references(entry.meta):
            assert reference in entry.message["content"]
            assert entry.replaces is not None and originals[entry.replaces] is entry
            assert store.get(reference) == conversation.messages[entry.replaces]["content"]


@PROPERTY_SETTINGS
@given(conversation=conversations(), first=st.floats(0.3, 1.0), second=st.floats(0.0, 1.0))
def test_a_reference_survives_later_compactions_or_goes_with_its_whole_step(
    conversation: Conversation, first: float, second: float
) -> None:
    store = MemoryOffloadStore()
    transcript = Transcript(conversation.messages, COUNTER, conversation.meta)
    earlier = CompactionChain(_chain(store, then=False)).compact(transcript, int(transcript.total() * first))
    if earlier is None:
        return
    offloaded = _offloaded_in(list(earlier.compacted.messages), list(earlier.compacted.meta))
    later = CompactionChain(_chain(store)).compact(earlier.compacted, int(earlier.compacted.total() * second))
    if later is None:
        return
    after = later.compacted
    surviving_calls = {message.get("tool_call_id") for message in after.messages}
    for reference, text in offloaded:
        call_id = next(m["tool_call_id"] for m in earlier.compacted.messages if m.get("content") == text)
        if call_id not in surviving_calls:
            continue  # its step was dropped whole
        position = next(i for i, m in enumerate(after.messages) if m.get("tool_call_id") == call_id)
        assert reference in after.messages[position]["content"], "a later compaction lost the reference"
        assert reference in offloaded_references(after.meta[position])


@PROPERTY_SETTINGS
@given(conversation=conversations(), fraction=st.floats(min_value=0.0, max_value=1.0))
def test_replays_are_byte_identical_and_the_input_is_untouched(conversation: Conversation, fraction: float) -> None:
    before = copy.deepcopy(conversation.messages)
    runs = []
    for _ in range(2):
        transcript = Transcript(conversation.messages, COUNTER, conversation.meta)
        result = CompactionChain(_chain(MemoryOffloadStore())).compact(transcript, int(transcript.total() * fraction))
        runs.append(None if result is None else orjson.dumps(result.plan.apply_messages(conversation.messages)))
    assert runs[0] == runs[1]
    assert conversation.messages == before


@PROPERTY_SETTINGS
@given(conversation=conversations(), fraction=st.floats(min_value=0.0, max_value=1.0))
def test_a_failed_write_keeps_every_result(conversation: Conversation, fraction: float) -> None:
    transcript = Transcript(conversation.messages, COUNTER, conversation.meta)
    assert ToolResultOffload(FailingStore(), min_tokens=0).plan(transcript, int(transcript.total() * fraction)) is None


def test_the_stand_in_says_where_the_content_went_and_shows_its_start() -> None:
    store = MemoryOffloadStore()
    messages = _steps("a" * 400, "newest")
    result = ToolResultOffload(store, min_tokens=0, preview_chars=5).plan(Transcript(messages, COUNTER), 1)

    assert result is not None
    (entry,) = result.created()
    reference = content_reference("a" * 400)
    assert entry.replaces == 3
    assert entry.message == {
        "role": "tool",
        "tool_call_id": "c0",
        "content": f"Tool result offloaded to text (400 characters) at '{reference}'. Preview: aaaaa...",
    }
    assert entry.meta[OFFLOADED_META_KEY] == [reference]
    assert entry.meta[COMPACTION_META_KEY]["strategy"] == "tool_result_offloading"
    assert store.get(reference) == "a" * 400


def test_the_newest_step_small_and_rewritten_results_stay() -> None:
    messages = _steps("small", "b" * 400, "c" * 400, "d" * 400, "newest " * 100)
    meta: list[dict[str, Any]] = [{} for _ in messages]
    meta[7] = {COMPACTION_META_KEY: {"strategy": "other"}}
    meta[9] = {OFFLOADED_META_KEY: ["elsewhere"]}
    store = MemoryOffloadStore()
    result = ToolResultOffload(store, min_tokens=20).plan(Transcript(messages, COUNTER, meta), 1)

    assert result is not None
    assert [entry.replaces for entry in result.created()] == [5]
    assert len(store) == 1


def test_identical_results_share_one_reference_and_one_stored_copy() -> None:
    store = MemoryOffloadStore()
    result = ToolResultOffload(store, min_tokens=0).plan(
        Transcript(_steps("same " * 80, "same " * 80, "x"), COUNTER), 1
    )

    assert result is not None
    references = {reference for entry in result.created() for reference in offloaded_references(entry.meta)}
    assert len(references) == 1
    assert len(store) == 1


def test_content_that_is_not_all_text_stays() -> None:
    messages = _steps("x", "newest")
    messages[3] = {**messages[3], "content": [{"type": "text", "text": "t" * 400}, {"type": "image_url"}]}
    assert ToolResultOffload(MemoryOffloadStore(), min_tokens=0).plan(Transcript(messages, COUNTER), 1) is None


def test_a_failed_write_is_logged_without_the_content(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        plan = ToolResultOffload(FailingStore(), min_tokens=0).plan(Transcript(_steps("secret " * 80, "n"), COUNTER), 1)

    assert plan is None
    assert "stays in the conversation" in caplog.text
    assert "OSError" in caplog.text
    assert "secret" not in caplog.text


def test_the_offload_goes_before_pruning_so_nothing_is_forgotten() -> None:
    store = MemoryOffloadStore()
    messages = _steps(*(f"result {n} " * 100 for n in range(4)))
    result = CompactionChain(_chain(store)).compact(Transcript(messages, COUNTER), 200)

    assert result is not None
    assert result.strategies[0] == "tool_result_offloading"
    assert "tool_result_pruning" not in result.strategies


@pytest.mark.asyncio
async def test_plan_async_plans_the_same() -> None:
    messages = _steps("a" * 400, "b" * 400, "newest")
    sync = ToolResultOffload(MemoryOffloadStore(), min_tokens=0).plan(Transcript(messages, COUNTER), 1)
    asynchronous = await ToolResultOffload(MemoryOffloadStore(), min_tokens=0).plan_async(
        Transcript(messages, COUNTER), 1
    )
    assert sync == asynchronous


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_keep_steps": 0}, "`min_keep_steps` must be at least 1"),
        ({"min_tokens": -1}, "`min_tokens` must be at least 0"),
        ({"preview_chars": -1}, "`preview_chars` must be at least 0"),
    ],
)
def test_settings_are_checked(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ToolResultOffload(MemoryOffloadStore(), **kwargs)


def test_the_memory_store_is_bounded_in_bytes_and_forgets_the_least_recently_used() -> None:
    store = MemoryOffloadStore(max_bytes=10)
    first, second = store.put("aaaa"), store.put("bbbb")
    assert store.get(first) == "aaaa"  # now the most recently used
    third = store.put("cccc")

    assert store.get(second) is None
    assert (store.get(first), store.get(third)) == ("aaaa", "cccc")
    assert store.bytes_held == 8
    assert store.put("aaaa") == first and store.bytes_held == 8
    with pytest.raises(ValueError, match="does not fit"):
        store.put("x" * 11)


def test_a_staging_store_holds_what_planning_wrote_for_the_caller_to_persist() -> None:
    staging = StagingOffloadStore()
    messages = _steps("first " * 80, "second " * 80, "first " * 80, "newest")
    result = ToolResultOffload(staging, min_tokens=0).plan(Transcript(messages, COUNTER), 1)

    assert result is not None
    pending = staging.pending()
    assert list(pending) == [content_reference("first " * 80), content_reference("second " * 80)]
    for entry in result.created():
        (reference,) = offloaded_references(entry.meta)
        assert pending[reference] == messages[entry.replaces or 0]["content"] == staging.get(reference)
