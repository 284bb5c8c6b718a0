"""Tool results as compaction sees them: the call each one answers, and whether it still holds the tool's output."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from proxy.engine.messages import TOOL_RESULT_ROLES, Message, is_tool_result, tool_calls_of, tool_name_of_call
from proxy.engine.transcript import Transcript

LOSSLESS = "lossless"
"""Marker detail of a result rewritten without losing anything (JSON without its whitespace): it still holds the
tool's output, so later strategies treat it as the original."""


def answered_calls(transcript: Transcript) -> dict[int, Mapping[str, Any]]:
    """For each tool result, the `tool_calls` entry it answers among the calls of the nearest assistant message before.

    One pass over the transcript: looking back from each result instead made a long run of results quadratic.
    """
    answered: dict[int, Mapping[str, Any]] = {}
    calls: dict[Hashable, Mapping[str, Any]] = {}
    for index, message in enumerate(transcript.messages):
        role = transcript.role(index)
        if role == "assistant":
            calls = {}
            for call in tool_calls_of(message):
                call_id = call.get("id")
                if isinstance(call_id, Hashable):
                    calls.setdefault(call_id, call)
        elif role in TOOL_RESULT_ROLES:
            call_id = message.get("tool_call_id")
            if isinstance(call_id, Hashable) and call_id in calls:
                answered[index] = calls[call_id]
    return answered


def holds_result(transcript: Transcript, index: int) -> bool:
    """Whether the message at `index` is a tool result that still holds what the tool returned.

    As sent, or rewritten losslessly; not a placeholder, a reference or a cut-down copy.
    """
    if not is_tool_result(transcript.messages[index]):
        return False
    marker = transcript.marker(index)
    return marker is None or marker.get(LOSSLESS) is True


def result_tool_name(message: Message, call: Mapping[str, Any] | None) -> str:
    """The name of the tool a result came from: the result's own `name`, else its call's, else "the tool"."""
    name = message.get("name")
    if isinstance(name, str) and name:
        return name
    return (tool_name_of_call(call) if call is not None else "") or "the tool"
