"""The assistant's reply, reassembled from the deltas of a chat-completion stream.

Deltas come from the upstream and are trusted for nothing: a member of an unexpected type is skipped, never raised on.
Fragments are collected in lists and joined once at the end, so a reply streamed in a million pieces costs linear
time, not the square of its length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Call:
    """One function call being streamed: its name once known, its argument fragments so far."""

    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def add(self, function: Any) -> None:
        """Fold one `function` (or legacy `function_call`) delta in: the first name seen, every argument fragment."""
        if not isinstance(function, dict):
            return
        name = function.get("name")
        if isinstance(name, str) and not self.name:
            self.name = name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            self.arguments.append(arguments)

    def build(self) -> dict[str, str]:
        return {"name": self.name, "arguments": "".join(self.arguments)}


@dataclass
class _ToolCall:
    """One entry of `tool_calls`: id and type from the chunks that carry them, the function call."""

    id: str | None = None
    type: str = "function"
    function: _Call = field(default_factory=_Call)


class ReplyBuilder:
    """Reassembles the first choice's assistant message from stream deltas.

    Content and refusal fragments are concatenated; tool calls are keyed by their `index`, taking id, type and
    function name from the chunks that carry them and concatenating the argument fragments.
    """

    def __init__(self) -> None:
        self.seen = False
        self.role: str | None = None
        self.content: list[str] = []
        self.refusal: list[str] = []
        self.tool_calls: dict[int, _ToolCall] = {}
        self.function_call: _Call | None = None

    def add(self, delta: dict[str, Any]) -> None:
        """Fold one `choices[0].delta` in."""
        self.seen = True
        if isinstance(delta.get("role"), str):
            self.role = delta["role"]
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        if isinstance(delta.get("refusal"), str):
            self.refusal.append(delta["refusal"])
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, dict):
                self._add_tool_call(call)
        legacy = delta.get("function_call")
        if isinstance(legacy, dict):
            self.function_call = self.function_call or _Call()
            self.function_call.add(legacy)

    def add_text(self, content: str, role: str | None) -> None:
        """Fold in a delta of `content` (and `role`, when it names one) only: what `add` does with it, faster."""
        self.seen = True
        if role is not None:
            self.role = role
        self.content.append(content)

    def _add_tool_call(self, call: dict[str, Any]) -> None:
        index = call.get("index", len(self.tool_calls))
        if not isinstance(index, int):
            return
        entry = self.tool_calls.setdefault(index, _ToolCall())
        if isinstance(call.get("id"), str) and call["id"]:
            entry.id = call["id"]
        if isinstance(call.get("type"), str) and call["type"]:
            entry.type = call["type"]
        entry.function.add(call.get("function"))

    def build(self) -> dict[str, Any] | None:
        """Return `{"role": "assistant", "content": ..., "tool_calls": [...]}`, or None when no delta was seen."""
        if not self.seen:
            return None
        reply: dict[str, Any] = {
            "role": self.role or "assistant",
            "content": "".join(self.content) if self.content else None,
        }
        if self.refusal:
            reply["refusal"] = "".join(self.refusal)
        if self.tool_calls:
            reply["tool_calls"] = [
                {"id": call.id, "type": call.type, "function": call.function.build()}
                for _, call in sorted(self.tool_calls.items())
            ]
        if self.function_call is not None:
            reply["function_call"] = self.function_call.build()
        return reply
