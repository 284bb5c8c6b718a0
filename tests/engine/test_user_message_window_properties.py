"""Properties of the user message window over random conversations, alone and in the proxy's default chain."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.engine import DEFAULT_CHAIN, ApproximateCounter, CompactionChain, Kept, Transcript, chain_by_names
from proxy.engine.grouping import current_step_groups, flatten, latest_user_index, leading_instructions_end
from proxy.engine.plan import COMPACTION_META_KEY, EditPlan
from proxy.engine.strategies.offload import MemoryOffloadStore
from proxy.engine.strategies.user_message_window import (
    NUM_REMOVED_PLACEHOLDER,
    NUM_REMOVED_USER_PLACEHOLDER,
    UserMessageWindow,
)
from tests.engine.conversations import Conversation, assert_tool_pairs_intact, conversations
from tests.support.examples import examples

COUNTER = ApproximateCounter()
PROPERTY_SETTINGS = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
CHAINS = {
    "alone": lambda: CompactionChain([UserMessageWindow()]),
    "default_chain": lambda: chain_by_names(DEFAULT_CHAIN),
    "offloading": lambda: CompactionChain([UserMessageWindow().offloading_to(MemoryOffloadStore())]),
}
CONVERSATIONS = conversations(max_turns=8, pasted_words=600)
NAME = UserMessageWindow.name


def _user_words(transcript: Transcript) -> list[int]:
    """The user's messages before the current task, as the client sent them or as a compaction cut them."""
    task = latest_user_index(transcript)
    start = leading_instructions_end(transcript)
    return [
        index
        for index in range(start, start if task is None else task)
        if transcript.role(index) == "user" and _as_written_or_cut(transcript.marker(index))
    ]


def _as_written_or_cut(marker: Mapping[str, Any] | None) -> bool:
    return marker is None or (marker.get("strategy") in (NAME, "middle_out") and "removed_tokens" in marker)


def _user_room(transcript: Transcript, target: int, window: UserMessageWindow) -> int:
    """What the policy lets the user's earlier messages take at `target` (see `UserMessageWindow`)."""
    task = latest_user_index(transcript)
    end = leading_instructions_end(transcript)
    steps = current_step_groups(transcript, end, task)
    newest = flatten(steps[max(len(steps) - window.min_keep_steps, 0) :])
    note = {"role": "user", "content": window.omission_note.replace("{", "").replace("}", "") + "0" * 12}
    protected = transcript.tokens_of([*range(end), *([] if task is None else [task])])
    budget = target - protected - COUNTER.message_tokens(note) - transcript.tokens_of(newest)
    return min(int(window.user_text_share * target), budget)


def _notes(transcript: Transcript, plan: EditPlan, strategies: tuple[str, ...] = (NAME, "sliding_window")) -> int:
    """How many omission notes of `strategies` the compacted conversation holds, new or kept."""
    created = [entry for entry in plan.created() if entry.strategy in strategies and entry.replaces is None]
    kept = [
        entry
        for entry in plan.entries
        if isinstance(entry, Kept)
        and transcript.role(entry.index) == "user"
        and any(transcript.created_by(entry.index, name) for name in strategies)
        and "removed_tokens" not in (transcript.marker(entry.index) or {})
    ]
    return len(created) + len(kept)


@pytest.mark.parametrize("chain", CHAINS)
@PROPERTY_SETTINGS
@given(conversation=CONVERSATIONS, fraction=st.floats(min_value=0.0, max_value=1.1))
def test_user_messages_within_the_budget_survive_byte_for_byte(
    chain: str, conversation: Conversation, fraction: float
) -> None:
    transcript = Transcript(conversation.messages, COUNTER, conversation.meta)
    target = int(transcript.total() * fraction)
    result = CHAINS[chain]().compact(transcript, target)
    users = _user_words(transcript)
    if result is None or transcript.tokens_of(users) > _user_room(transcript, target, UserMessageWindow()):
        return
    output = result.plan.apply_messages(conversation.messages)
    for index in users:
        assert Kept(index) in result.plan.entries
        assert any(message is conversation.messages[index] for message in output)


@pytest.mark.parametrize("chain", CHAINS)
@PROPERTY_SETTINGS
@given(conversation=CONVERSATIONS, fraction=st.floats(min_value=0.0, max_value=1.1))
def test_invariants_hold(chain: str, conversation: Conversation, fraction: float) -> None:
    before = copy.deepcopy((conversation.messages, conversation.meta))
    transcript = Transcript(conversation.messages, COUNTER, conversation.meta)
    result = CHAINS[chain]().compact(transcript, int(transcript.total() * fraction))
    assert (conversation.messages, conversation.meta) == before, "the input was changed"
    if result is None:
        return
    plan = result.plan
    assert_tool_pairs_intact(plan.apply_messages(conversation.messages))
    for index in range(leading_instructions_end(transcript)):
        assert plan.entries[index] == Kept(index)
    task = latest_user_index(transcript)
    assert task is None or Kept(task) in plan.entries
    assert result.tokens_after < result.tokens_before
    assert _notes(transcript, plan) <= 1, "more than one omission note"


@pytest.mark.parametrize("chain", CHAINS)
@PROPERTY_SETTINGS
@given(conversation=CONVERSATIONS, fraction=st.floats(min_value=0.0, max_value=1.1))
def test_the_same_input_gives_the_same_output(chain: str, conversation: Conversation, fraction: float) -> None:
    first_transcript = Transcript(conversation.messages, COUNTER, conversation.meta)
    target = int(first_transcript.total() * fraction)
    first = CHAINS[chain]().compact(first_transcript, target)
    # A fresh counter and copies, so nothing cached or shared can make the second run agree.
    again = Transcript(copy.deepcopy(conversation.messages), ApproximateCounter(), copy.deepcopy(conversation.meta))
    second = CHAINS[chain]().compact(again, target)
    assert (first is None) == (second is None)
    if first is not None and second is not None:
        assert first.plan == second.plan
        assert orjson.dumps(first.plan.apply_messages(conversation.messages)) == orjson.dumps(
            second.plan.apply_messages(again.messages)
        )


@PROPERTY_SETTINGS
@given(conversation=CONVERSATIONS, fraction=st.floats(min_value=0.0, max_value=1.0), keep=st.integers(0, 2))
def test_reaches_the_target_whenever_the_protected_messages_and_newest_steps_allow(
    conversation: Conversation, fraction: float, keep: int
) -> None:
    transcript = Transcript(conversation.messages, COUNTER, conversation.meta)
    window = UserMessageWindow(min_keep_steps=keep)
    target = int(transcript.total() * fraction)
    if _user_room(transcript, target, window) < 0 and window.user_text_share * target >= 0:
        # The instructions, the task, its newest steps and the note alone are over the target.
        return
    plan = window.plan(transcript, target)
    size = transcript.edited(plan).total() if plan is not None else transcript.total()
    assert size <= target


@PROPERTY_SETTINGS
@given(conversation=CONVERSATIONS, fraction=st.floats(min_value=0.2, max_value=0.9))
def test_a_later_compaction_of_the_grown_conversation_keeps_one_note_and_the_users_words(
    conversation: Conversation, fraction: float
) -> None:
    window = UserMessageWindow()
    transcript = Transcript(conversation.messages, COUNTER, conversation.meta)
    first = window.plan(transcript, int(transcript.total() * fraction))
    if first is None:
        return
    compacted = transcript.edited(first)
    grown = [
        *compacted.messages,
        {"role": "assistant", "content": "More work. " * 200},
        {"role": "user", "content": "next task"},
    ]
    later = Transcript(grown, COUNTER, [*compacted.meta, {}, {}])
    target = int(later.total() * fraction)
    second = window.plan(later, target)
    if second is None:
        return
    assert _notes(later, second, (NAME,)) <= 1
    note = next(entry for entry in second.created() if entry.replaces is None)
    fixed_start = window.omission_note.split(NUM_REMOVED_PLACEHOLDER)[0].split(NUM_REMOVED_USER_PLACEHOLDER)[0]
    assert note.message["content"].startswith(fixed_start)
    users = _user_words(later)
    if later.tokens_of(users) <= _user_room(later, target, window):
        assert all(Kept(index) in second.entries for index in users)


def _offloads(plan: EditPlan | None) -> bool:
    """Whether `plan` offloads a user message behind a stand-in."""
    return plan is not None and any(
        entry.strategy == NAME and entry.meta[COMPACTION_META_KEY].get("offloaded") is True for entry in plan.created()
    )


@PROPERTY_SETTINGS
@given(
    conversation=CONVERSATIONS,
    fraction=st.floats(min_value=0.0, max_value=1.1),
    reserved=st.integers(min_value=1, max_value=400),
)
def test_the_read_tools_tokens_are_reserved_only_when_a_user_message_is_offloaded(
    conversation: Conversation, fraction: float, reserved: int
) -> None:
    transcript = Transcript(conversation.messages, COUNTER, conversation.meta)
    target = int(transcript.total() * fraction)
    plain = UserMessageWindow().offloading_to(MemoryOffloadStore()).plan(transcript, target)
    reserving = UserMessageWindow().offloading_to(MemoryOffloadStore(), reserved_tokens=reserved)
    plan = reserving.plan(transcript, target)
    if not _offloads(plain):
        assert plan == plain, "a compaction that offloads no user message decides as if nothing were reserved"
        return
    assert plan == UserMessageWindow().offloading_to(MemoryOffloadStore()).plan(transcript, target - reserved)
    if _user_room(transcript, target - reserved, reserving) >= 0 and plan is not None:
        assert transcript.edited(plan).total() <= target - reserved
