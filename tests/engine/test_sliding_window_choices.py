"""Which turns and steps the sliding window keeps at a tight target, and how it folds an earlier note.

These pin the choices to Haystack's `SlidingWindowCompactor`, so the proxy and the hook drop what Haystack would.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.engine import COMPACTION_META_KEY, ApproximateCounter, Kept, SlidingWindow, Transcript
from proxy.engine.grouping import (
    current_step_groups,
    historical_turn_groups,
    latest_user_index,
    leading_instructions_end,
)
from tests.engine.conversations import Conversation, conversations
from tests.support.examples import examples

COUNTER = ApproximateCounter()


def _transcript(messages: list[dict[str, Any]], meta: list[dict[str, Any]] | None = None) -> Transcript:
    return Transcript(messages, COUNTER, meta or [{} for _ in messages])


def _step(call_id: str, result: str) -> list[dict[str, Any]]:
    call = {"id": call_id, "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


def test_a_tight_target_keeps_every_newest_turn_that_fits_and_the_note_comes_on_top() -> None:
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Summarize the whole changelog. " * 40},
        {"role": "assistant", "content": "Here is the changelog summary. " * 40},
        {"role": "user", "content": "Which release added streaming?"},
        {"role": "assistant", "content": "Release 1.4."},
        {"role": "user", "content": "And which one removed Python 3.8?"},
        {"role": "assistant", "content": "Release 2.0."},
    ]
    transcript = _transcript(messages)
    # Room for the instructions, the recent turn and the current task with its answer: not for the note as well.
    target = transcript.tokens_of([0, 3, 4, 5, 6])

    plan = SlidingWindow().plan(transcript, target)

    assert plan is not None
    assert [entry for entry in plan.entries if isinstance(entry, Kept)] == [Kept(i) for i in (0, 3, 4, 5, 6)]
    (note,) = plan.created()
    assert plan.entries[1] is note
    assert note.meta[COMPACTION_META_KEY]["removed_messages"] == 2


def test_an_earlier_note_after_the_task_goes_with_the_oldest_step_even_when_that_step_is_small() -> None:
    # A note an earlier compaction left right after the task's user message (written by another tool, in its own
    # words), then two small steps. Folding the note and the oldest step into one new note must still pay.
    messages = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "List the repo."},
        {"role": "user", "content": "Some steps were dropped."},
        *_step("a", "src tests docs"),
        *_step("b", "README.md"),
    ]
    meta: list[dict[str, Any]] = [{} for _ in messages]
    meta[2] = {COMPACTION_META_KEY: {"strategy": "sliding_window"}}
    transcript = _transcript(messages, meta)

    plan = SlidingWindow().plan(transcript, 1)

    assert plan is not None
    assert [entry for entry in plan.entries if isinstance(entry, Kept)] == [Kept(i) for i in (0, 1, 5, 6)]
    (note,) = plan.created()
    assert plan.entries[2] is note
    assert note.meta[COMPACTION_META_KEY]["removed_messages"] == 3
    assert transcript.edited(plan).total() < transcript.total()


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversation=conversations(), fraction=st.floats(min_value=0.0, max_value=1.0))
def test_the_kept_messages_alone_fit_the_target_whenever_the_protected_ones_do(
    conversation: Conversation, fraction: float
) -> None:
    transcript = Transcript(conversation.messages, COUNTER, conversation.meta)
    target = int(transcript.total() * fraction)

    plan = SlidingWindow(min_keep_steps=0).plan(transcript, target)

    if plan is None:
        return
    kept = [entry.index for entry in plan.entries if isinstance(entry, Kept)]
    task = latest_user_index(transcript)
    protected = [*range(leading_instructions_end(transcript)), *([task] if task is not None else [])]
    # The note is not part of the budget: only what was kept is held to the target.
    assert transcript.tokens_of(kept) <= max(target, transcript.tokens_of(protected))


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversation=conversations(), fraction=st.floats(min_value=0.0, max_value=1.0))
def test_the_newest_turn_or_step_removed_would_not_have_fit(conversation: Conversation, fraction: float) -> None:
    transcript = Transcript(conversation.messages, COUNTER, conversation.meta)
    target = int(transcript.total() * fraction)

    plan = SlidingWindow(min_keep_steps=0).plan(transcript, target)

    if plan is None:
        return
    kept = {entry.index for entry in plan.entries if isinstance(entry, Kept)}
    instructions_end = leading_instructions_end(transcript)
    task = latest_user_index(transcript)
    units = [
        *current_step_groups(transcript, instructions_end, task)[::-1],
        *historical_turn_groups(transcript, instructions_end, task)[::-1],
    ]
    removed = [unit for unit in units if not kept.issuperset(unit)]
    if removed:
        newest_removed = [index for index in removed[0] if not transcript.created_by(index, "sliding_window")]
        # Greedy, newest first, as Haystack's compactor: it stopped at a unit that did not fit beside what it kept.
        assert transcript.tokens_of(kept) + transcript.tokens_of(newest_removed) > target
