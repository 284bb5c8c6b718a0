"""What the user message window keeps: the user's words first, whole, cut down, or last to go, and what it says."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.engine import COMPACTION_META_KEY, ApproximateCounter, Kept, SlidingWindow, Transcript
from proxy.engine.plan import EditPlan
from proxy.engine.strategies.offload import OFFLOADED_META_KEY, MemoryOffloadStore
from proxy.engine.strategies.user_message_window import DEFAULT_OMISSION_NOTE, DEFAULT_USER_POINTER, UserMessageWindow
from tests.engine.conversations import assert_tool_pairs_intact

COUNTER = ApproximateCounter()
NOTE_TOKENS = COUNTER.message_tokens({"role": "user", "content": DEFAULT_OMISSION_NOTE})
"""About what the note takes (two digits in each count): it is counted within the target."""


def _transcript(messages: list[dict[str, Any]], meta: list[dict[str, Any]] | None = None) -> Transcript:
    return Transcript(messages, COUNTER, meta or [{} for _ in messages])


def _step(call_id: str, result: str) -> list[dict[str, Any]]:
    call = {"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


def _output(messages: list[dict[str, Any]], plan: EditPlan | None) -> list[dict[str, Any]]:
    assert plan is not None
    return [dict(message) for message in plan.apply_messages(messages)]


def _note(plan: EditPlan) -> dict[str, Any]:
    (note,) = [entry for entry in plan.created() if entry.replaces is None]
    return dict(note.meta[COMPACTION_META_KEY])


def _requirements_then_work() -> list[dict[str, Any]]:
    """The issue's shape: requirements first, a correction in the middle, long lookups and replies around them."""
    return [
        {"role": "system", "content": "You write reports."},
        {"role": "user", "content": "Use the batch pipeline. The report needs numbered sections (code R-17)."},
        *_step("a", "region table " * 400),
        {"role": "assistant", "content": "Noted, batch it is. " * 100},
        {"role": "user", "content": "Also cite the deployment region (code R-22)."},
        *_step("b", "inventory " * 400),
        {"role": "assistant", "content": "Working on it. " * 100},
        {"role": "user", "content": "Change of plan: streaming, not batch (code C-3)."},
        *_step("c", "stream stats " * 400),
        {"role": "assistant", "content": "Switching to streaming. " * 100},
        {"role": "user", "content": "Now write the report."},
        *_step("d", "final numbers " * 50),
    ]


def _eight_user_turns() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Eight equal user messages, each with a short reply, then the task: the user's eight and the conversation."""
    users = [{"role": "user", "content": f"message {n}: " + "word " * 200} for n in range(8)]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for number, user in enumerate(users):
        messages += [user, {"role": "assistant", "content": f"reply {number}"}]
    messages.append({"role": "user", "content": "And now?"})
    return users, messages


def test_every_user_message_survives_byte_for_byte_while_tool_output_and_prose_go() -> None:
    messages = _requirements_then_work()
    transcript = _transcript(messages)
    target = transcript.total() // 4

    plan = UserMessageWindow().plan(transcript, target)

    output = _output(messages, plan)
    assert [m for m in output if m["role"] == "user" and "code" in m["content"]] == [
        messages[1],
        messages[5],
        messages[9],
    ]
    assert output[-3:] == messages[-3:], "the task and its step stay"
    assert_tool_pairs_intact([m for m in output if m["role"] != "user"])
    assert plan is not None
    assert all(entry.replaces is None for entry in plan.created()), "no user message is cut when all fit"
    note = _note(plan)
    assert note["removed_user_messages"] == 0 and note["removed_messages"] > 0
    text = next(entry.message["content"] for entry in plan.created() if entry.replaces is None)
    assert "Earlier assistant and tool messages were removed" in text and "and 0 of the user's earlier" in text
    assert output.index(messages[1]) + 1 == [m["content"] for m in output].index(text), (
        "the note stands where the first removed message was: the opening request before it stays cached"
    )


def test_a_later_compaction_keeps_the_prefix_through_the_note_byte_for_byte() -> None:
    messages = _requirements_then_work()
    window = UserMessageWindow()
    transcript = _transcript(messages)
    first = window.plan(transcript, transcript.total() // 4)
    assert first is not None
    compacted = transcript.edited(first)
    added = [*_step("e", "more numbers " * 300), {"role": "user", "content": "And the appendix."}]
    later = Transcript([*compacted.messages, *added], COUNTER, [*compacted.meta, *({} for _ in added)])

    second = window.plan(later, later.total() * 3 // 4)

    assert second is not None and second.removed_count() > 0
    compacted_messages = [dict(m) for m in compacted.messages]
    recompacted = _output(list(later.messages), second)
    note_at = next(i for i, m in enumerate(compacted_messages) if str(m["content"]).startswith("[Earlier assistant"))
    assert note_at >= 2
    assert recompacted[: note_at + 1] == compacted_messages[: note_at + 1], "instructions, opening and note unchanged"


def test_sliding_window_at_the_same_target_loses_the_requirements() -> None:
    """The reason for the strategy: the plain window drops the oldest turns whole, requirements with them."""
    messages = _requirements_then_work()
    transcript = _transcript(messages)
    target = transcript.total() // 4

    output = _output(messages, SlidingWindow().plan(transcript, target))

    assert messages[1] not in output and messages[5] not in output


def test_the_newest_steps_of_old_turns_are_kept_when_they_fit() -> None:
    messages = _requirements_then_work()
    transcript = _transcript(messages)
    # Room for everything but the first two turns' steps and prose, and for the note.
    dropped = transcript.tokens_of([2, 3, 4, 6, 7, 8])
    target = transcript.total() - dropped + NOTE_TOKENS

    plan = UserMessageWindow().plan(transcript, target)

    assert plan is not None
    kept = sorted(entry.index for entry in plan.entries if isinstance(entry, Kept))
    assert kept == [0, 1, 5, 9, 10, 11, 12, 13, 14, 15]
    assert _note(plan) == {
        "strategy": "user_message_window",
        "removed_messages": 6,
        "removed_user_messages": 0,
        "kept_messages": 10,
    }


def test_a_pasted_log_is_cut_middle_out_before_any_user_message_is_removed() -> None:
    log = "START of the deploy log\n" + "".join(f"line {n}: ok\n" for n in range(2000)) + "END: region eu-west-3"
    messages = [
        {"role": "system", "content": "Help with deploys."},
        {"role": "user", "content": "Keep every answer under 100 words."},
        {"role": "user", "content": log},
        {"role": "assistant", "content": "Looks fine."},
        {"role": "user", "content": "Which region?"},
    ]
    transcript = _transcript(messages)
    window = UserMessageWindow(user_text_share=0.5, min_user_message_tokens=64)
    target = 1200

    plan = window.plan(transcript, target)

    output = _output(messages, plan)
    assert output[1] == messages[1]
    cut = output[2]["content"]
    assert cut.startswith("START of the deploy log") and cut.endswith("END: region eu-west-3")
    assert "tokens were cut from the middle of this message" in cut
    # Over its share, the log takes the room nothing else needs (one short reply here), and no more.
    assert COUNTER.messages_tokens(output) <= target
    assert COUNTER.message_tokens(output[2]) > target // 2
    assert output[-1] == messages[-1]


def test_when_cutting_is_not_enough_the_middle_goes_first_and_the_opening_last() -> None:
    users, messages = _eight_user_turns()
    transcript = _transcript(messages)
    size = COUNTER.message_tokens(users[0])
    # Room for four of the eight at their full size, with no cutting allowed.
    window = UserMessageWindow(user_text_share=1.0, min_user_message_tokens=size)
    target = transcript.tokens_of([0, len(messages) - 1]) + 4 * size + NOTE_TOKENS

    plan = window.plan(transcript, target)

    output = _output(messages, plan)
    survivors = [m for m in output if m in users]
    assert survivors == [users[0], users[1], users[6], users[7]]
    assert _note(plan)["removed_user_messages"] == 4
    assert any("and 4 of the user's earlier messages" in m["content"] for m in output)


def test_an_earlier_note_is_folded_into_the_next_with_its_counts() -> None:
    messages = _requirements_then_work()
    transcript = _transcript(messages)
    window = UserMessageWindow()
    first = window.plan(transcript, transcript.total() // 2)
    assert first is not None
    compacted = transcript.edited(first)
    grown = [
        *compacted.messages,
        {"role": "assistant", "content": "More. " * 300},
        {"role": "user", "content": "Go on."},
    ]
    meta = [*compacted.meta, {}, {}]
    again = _transcript(grown, meta)

    second = window.plan(again, again.total() // 3)

    assert second is not None
    notes = [e for e in second.entries if not isinstance(e, Kept) and e.replaces is None]
    assert len(notes) == 1, "one note at most"
    kept_notes = [e for e in second.entries if isinstance(e, Kept) and again.created_by(e.index, window.name)]
    assert not kept_notes
    earlier = _note(first)["removed_messages"]
    assert _note(second)["removed_messages"] > earlier


def test_it_reaches_the_target_wherever_the_sliding_window_does() -> None:
    messages = _requirements_then_work()
    transcript = _transcript(messages)
    for target in range(0, transcript.total(), 97):
        sliding = SlidingWindow().plan(transcript, target)
        ours = UserMessageWindow().plan(transcript, target)
        if sliding is not None and transcript.edited(sliding).total() <= target:
            assert ours is not None
            assert transcript.edited(ours).total() <= target + NOTE_TOKENS


def test_the_same_input_gives_the_same_plan_and_the_input_is_untouched() -> None:
    messages = _requirements_then_work()
    frozen = repr(messages)
    plans = [UserMessageWindow().plan(_transcript(messages), 900) for _ in range(2)]
    assert plans[0] == plans[1]
    assert repr(messages) == frozen


@pytest.mark.parametrize(
    "settings",
    [{"user_text_share": -0.1}, {"user_text_share": 1.5}, {"min_keep_steps": -1}, {"opening_user_messages": -2}],
)
def test_settings_out_of_range_are_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be"):
        UserMessageWindow(**settings)


def test_with_a_store_the_messages_that_must_go_are_offloaded_behind_a_reference() -> None:
    users, messages = _eight_user_turns()
    transcript = _transcript(messages)
    size = COUNTER.message_tokens(users[0])
    store = MemoryOffloadStore()
    window = UserMessageWindow(user_text_share=1.0, min_user_message_tokens=size).offloading_to(store)
    pointer = DEFAULT_USER_POINTER.replace("{characters}", "1010").replace("{reference}", "offloaded-" + "0" * 32)
    stand_in = COUNTER.message_tokens({"role": "user", "content": pointer.replace("{preview}", "x" * 203)})
    # Room for four whole and the stand-ins of the other four.
    target = transcript.tokens_of([0, len(messages) - 1]) + 4 * size + 4 * stand_in + NOTE_TOKENS

    plan = window.plan(transcript, target)

    output = _output(messages, plan)
    assert [m for m in output if m in users] == [users[0], users[1], users[6], users[7]]
    assert plan is not None
    stand_ins = [entry for entry in plan.created() if entry.replaces is not None]
    assert [entry.replaces for entry in stand_ins] == [5, 7, 9, 11]
    for entry in stand_ins:
        (reference,) = entry.meta[OFFLOADED_META_KEY]
        assert store.get(reference) == messages[entry.replaces]["content"]
        assert f"under reference '{reference}'" in entry.message["content"]
    assert _note(plan)["removed_user_messages"] == 0

    # A later compaction takes the stand-ins for the user's (short) messages: kept, or removed, not offloaded again.
    again = transcript.edited(plan)
    later = window.plan(again, again.total() - 1)
    assert later is not None
    held = [index for index in range(len(again)) if again.meta[index].get(OFFLOADED_META_KEY)]
    assert len(held) == 4 and not [entry for entry in later.created() if entry.replaces in held]
    assert sum(Kept(index) in later.entries for index in held) == 3, "the oldest in the middle went"
