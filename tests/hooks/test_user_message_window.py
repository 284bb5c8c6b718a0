"""The hook's `UserMessageWindowCompactor`: a real Agent's earlier user messages reach the model in every request."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage

from hooks.compaction import (
    ChainCompactor,
    CompactionHook,
    SlidingWindowCompactor,
    TiktokenTokenCounter,
    ToolResultPruningCompactor,
    UserMessageWindowCompactor,
)
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.hooks.conftest import agent_for
from tests.hooks.test_long_run import check_run_pairs_and_window

EARLIER = [
    ChatMessage.from_user("Research alpha thoroughly. The report needs numbered sections (code R-17)."),
    ChatMessage.from_assistant("Understood: numbered sections."),
    ChatMessage.from_user("Change of plan: cite only streaming sources (code C-3)."),
    ChatMessage.from_assistant("Noted: streaming sources only."),
]
TASK = ChatMessage.from_user("Go ahead, step by step.")


def _user_texts(request: dict[str, Any]) -> list[str]:
    return [message["content"] for message in request["messages"] if message["role"] == "user"]


@pytest.mark.parametrize(
    "compactor",
    [
        UserMessageWindowCompactor(
            user_text_share=0.3, min_keep_steps=2, omission_note="[{num_removed} and {num_removed_user}]"
        ),
        ChainCompactor([ToolResultPruningCompactor(), UserMessageWindowCompactor(), SlidingWindowCompactor()]),
    ],
)
def test_round_trips_inside_the_hook(compactor: Any) -> None:
    hook = CompactionHook(compactor=compactor, context_window=32_000, token_counter=TiktokenTokenCounter())
    data = hook.to_dict()
    restored = CompactionHook.from_dict(copy.deepcopy(data))
    assert restored.to_dict() == data
    assert type(restored.compactor) is type(compactor)


def test_bad_settings_are_refused_when_made() -> None:
    with pytest.raises(ValueError, match="user_text_share"):
        UserMessageWindowCompactor(user_text_share=2.0)


def test_the_earlier_user_messages_reach_every_request_of_a_60_step_run(long_task_upstream: OpenAIUpstream) -> None:
    hook = CompactionHook(
        compactor=UserMessageWindowCompactor(), context_window=8192, token_counter=TiktokenTokenCounter()
    )
    result = agent_for(long_task_upstream, hook).run(messages=[*EARLIER, TASK])

    compacted = check_run_pairs_and_window(long_task_upstream, result, hook)
    assert compacted >= 5
    wanted = [EARLIER[0].text, EARLIER[2].text, TASK.text]
    for request in long_task_upstream.chat_requests:
        assert [text for text in _user_texts(request) if text in wanted] == wanted
    notes = [
        m for m in result["messages"] if m.meta.get("context_compaction", {}).get("strategy") == "user_message_window"
    ]
    assert len(notes) == 1, "one omission note at most"
    assert "and 0 of the user's earlier messages" in (notes[0].text or "")


async def test_the_async_run_keeps_them_too(long_task_upstream: OpenAIUpstream) -> None:
    hook = CompactionHook(
        compactor=UserMessageWindowCompactor(), context_window=8192, token_counter=TiktokenTokenCounter()
    )
    result = await agent_for(long_task_upstream, hook).run_async(messages=[*EARLIER, TASK])

    assert check_run_pairs_and_window(long_task_upstream, result, hook) >= 5
    for request in long_task_upstream.chat_requests:
        assert EARLIER[0].text in _user_texts(request) and EARLIER[2].text in _user_texts(request)


def test_haystacks_sliding_window_drops_them_at_the_same_window(long_task_upstream: OpenAIUpstream) -> None:
    """Haystack's own compactor keeps its semantics: the whole history goes when the current task fills the target."""
    hook = CompactionHook(compactor=SlidingWindowCompactor(), context_window=8192, token_counter=TiktokenTokenCounter())
    agent_for(long_task_upstream, hook).run(messages=[*EARLIER, TASK])

    assert EARLIER[0].text not in _user_texts(long_task_upstream.chat_requests[-1])
