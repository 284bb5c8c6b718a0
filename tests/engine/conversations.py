"""Hypothesis strategies for random agent conversations: turns, parallel tool calls, notes of earlier compactions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from proxy.engine import COMPACTION_META_KEY

WORDS = ["alpha", "beta", "gamma", "delta", "file.py", "error:", "42", "the", "result", "über", "数据", "\n"]


@dataclass
class Conversation:
    messages: list[dict[str, Any]]
    meta: list[dict[str, Any]]


def _text(draw: st.DrawFn, max_words: int) -> str:
    count = draw(st.integers(min_value=0, max_value=max_words))
    seed = draw(st.integers(min_value=0, max_value=len(WORDS) - 1))
    return " ".join(WORDS[(seed + i * 7) % len(WORDS)] for i in range(count))


CLIENT_CONTEXTS = [
    "<environment_context>\n  <cwd>/repo</cwd>\n  <shell>bash</shell>\n</environment_context>",
    "<user_instructions>\nAlways run the tests.\n</user_instructions>",
    "# AGENTS.md instructions for /repo\n\n<INSTRUCTIONS>\nUse ruff.\n</INSTRUCTIONS>",
]
"""What Codex CLI states up front in user messages of its own, before the first real prompt."""


def _leading_block(draw: st.DrawFn, instruction_words: int, client_context: bool) -> list[dict[str, Any]]:
    """The leading instructions, with Codex-like stated context among them when `client_context` (parts or text)."""
    block: list[dict[str, Any]] = [
        {"role": role, "content": "You are helpful. " + _text(draw, instruction_words)}
        for role in draw(st.lists(st.sampled_from(["system", "developer"]), max_size=2))
    ]
    if client_context:
        for opening in draw(st.lists(st.sampled_from(CLIENT_CONTEXTS), max_size=2)):
            text = opening + _text(draw, instruction_words // 4)
            content: Any = [{"type": "text", "text": text}] if draw(st.booleans()) else text
            block.insert(draw(st.integers(min_value=0, max_value=len(block))), {"role": "user", "content": content})
    return block


@st.composite
def conversations(
    draw: st.DrawFn,
    max_turns: int = 6,
    max_steps: int = 4,
    *,
    instruction_words: int = 60,
    client_context: bool = False,
    checkpoints: bool = False,
    pasted_words: int = 0,
) -> Conversation:
    """A random agent conversation.

    :param instruction_words: The most words of each leading system or developer message.
    :param client_context: Put Codex-like stated context (environment, AGENTS.md) among the leading instructions.
    :param checkpoints: Let some model replies carry a provider compaction checkpoint.
    :param pasted_words: The most words of a log or document the user pastes into some of their messages.
    """
    messages: list[dict[str, Any]] = []
    meta: list[dict[str, Any]] = []

    def add(message: dict[str, Any], marker: dict[str, Any] | None = None) -> None:
        messages.append(message)
        meta.append({COMPACTION_META_KEY: marker} if marker else {})

    for message in _leading_block(draw, instruction_words, client_context):
        add(message)
    if draw(st.booleans()):
        add(
            {"role": "user", "content": "[3 earlier messages were removed.]"},
            {"strategy": "sliding_window", "removed_messages": 3},
        )
    if draw(st.booleans()):
        add(
            {"role": "user", "content": "<conversation_summary>\n" + _text(draw, 40) + "\n</conversation_summary>"},
            {"strategy": "summarization", "summarized_messages": 4},
        )
    call_number = 0
    turns = draw(st.integers(min_value=0, max_value=max_turns))
    for turn in range(turns):
        pasted = _text(draw, pasted_words) if pasted_words and draw(st.booleans()) else ""
        add({"role": "user", "content": f"task {turn}: " + _text(draw, 80) + pasted})
        for _step in range(draw(st.integers(min_value=0, max_value=max_steps))):
            parallel = draw(st.integers(min_value=1, max_value=3))
            calls = []
            for _ in range(parallel):
                call_number += 1
                calls.append(
                    {
                        "id": f"call_{call_number}",
                        "type": "function",
                        "function": {"name": f"tool_{call_number % 3}", "arguments": f'{{"n": {call_number}}}'},
                    }
                )
            add({"role": "assistant", "content": None, "tool_calls": calls})
            for call in calls:
                pruned = draw(st.integers(min_value=0, max_value=9)) == 0
                add(
                    {"role": "tool", "tool_call_id": call["id"], "content": _text(draw, 400)},
                    {"strategy": "tool_result_pruning", "original_tokens": 500} if pruned else None,
                )
        if turn < turns - 1 or draw(st.booleans()):
            add({"role": "assistant", "content": _text(draw, 60)})
        if checkpoints and draw(st.integers(min_value=0, max_value=3)) == 0:
            checkpoint = {"type": "opaque", "tokens": 30, "checkpoint": True, "data": f"compaction {turn}"}
            add({"role": "assistant", "content": [checkpoint]})
    return Conversation(messages, meta)


def assert_tool_pairs_intact(messages: list[dict[str, Any]]) -> None:
    """Every tool result answers a call of the assistant message just before its block, and every call is answered."""
    index = 0
    while index < len(messages):
        message = messages[index]
        assert message["role"] != "tool", f"tool result at {index} without its call"
        index += 1
        if message["role"] == "assistant" and message.get("tool_calls"):
            expected = {call["id"] for call in message["tool_calls"]}
            answered = set()
            while index < len(messages) and messages[index]["role"] == "tool":
                assert messages[index]["tool_call_id"] in expected, f"tool result at {index} answers no call"
                answered.add(messages[index]["tool_call_id"])
                index += 1
            assert answered == expected, f"calls {expected - answered} have no result"
