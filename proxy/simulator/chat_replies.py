"""What the simulated model answers on chat completions: replies, and the responders that choose them.

A `Responder` maps the parsed request body to a `Reply` (text, tool calls, or both). `tool_loop_responder` is the
agent loop every demo and most tests drive: tool calls after each user message, then a text answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.simulator.openai_common import tool_call_id

__all__ = ["Reply", "Responder", "ToolCall", "default_responder", "fixed_responder", "tool_loop_responder"]


@dataclass(frozen=True)
class ToolCall:
    """One function call the fake model makes: `arguments` is the JSON text, as OpenAI returns it."""

    id: str
    name: str
    arguments: str = "{}"


@dataclass(frozen=True)
class Reply:
    """What the fake model answers: text, tool calls, or both (tool calls make finish_reason "tool_calls")."""

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()


Responder = Callable[[dict[str, Any]], Reply]
"""Maps the parsed chat-completion request body to the reply. Must be deterministic for tests to be."""


def default_responder(request: dict[str, Any]) -> Reply:
    """Answer with a short text that depends on the request: "ok <n> messages"."""
    return Reply(content=f"ok {len(request['messages'])} messages")


def fixed_responder(text: str) -> Responder:
    """Always answer with `text`."""

    def respond(request: dict[str, Any]) -> Reply:
        return Reply(content=text)

    return respond


def tool_loop_responder(
    tool_name: str = "run",
    steps: int = 3,
    *,
    parallel: int = 1,
    arguments: Callable[[int, int], Mapping[str, Any]] | None = None,
    final_text: str | None = None,
) -> Responder:
    """Drive an agent loop: answer a user message with tool calls, each round of tool results with more, then text.

    After the latest user message the fake model makes `steps` assistant turns, each with `parallel` calls of
    `tool_name` (so `steps * parallel` calls in all), then answers `final_text` (default "done: <n> tool calls").
    Arguments default to `{"step": s, "call": k}`; pass `arguments(step, k)` for bigger ones. Call ids are unique
    within a conversation and derived only from the conversation, so a replayed request gets the same ids.
    """

    def respond(request: dict[str, Any]) -> Reply:
        messages: list[dict[str, Any]] = request["messages"]
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        made = sum(1 for m in messages[last_user + 1 :] if m.get("role") == "assistant" and m.get("tool_calls"))
        last_role = messages[-1].get("role")
        if made >= steps or last_role not in ("user", "tool"):
            return Reply(content=final_text if final_text is not None else f"done: {made * parallel} tool calls")
        step = made + 1
        turn = sum(1 for m in messages if m.get("role") == "user")
        anchor = _text_of(messages[last_user]) if last_user >= 0 else ""
        calls = tuple(
            ToolCall(
                id=tool_call_id(turn, anchor, step, k),
                name=tool_name,
                arguments=json.dumps(dict(arguments(step, k)) if arguments else {"step": step, "call": k}),
            )
            for k in range(parallel)
        )
        return Reply(tool_calls=calls)

    return respond


def _text_of(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""
