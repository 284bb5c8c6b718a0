"""What a Responses API answer reports, in the terms the rest of the proxy uses for chat completions.

The usage of a response (`input_tokens`, `output_tokens`, their details) is renamed to a completion's
(`prompt_tokens`, `completion_tokens`, ...), and its output items become the one assistant message the engine sees
them as on the next turn (`model_message`), so anchoring and calibration work unchanged. A streamed response reports
both in its last event, `response.completed` (or `response.incomplete`), which carries the whole response.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from proxy.engine.messages import Message
from proxy.formats.responses.items import model_message

FINAL_EVENTS: Final = frozenset({"response.completed", "response.incomplete"})
"""Stream events that carry the finished response, usage included."""


@dataclass(frozen=True)
class Answer:
    """What one response reported.

    :param usage: Its usage, renamed to a chat completion's fields; None when it reported none.
    :param reply: Its output items as one assistant message; None when it had none.
    :param response_id: Its id, which a later request names as `previous_response_id`.
    """

    usage: dict[str, Any] | None
    reply: Message | None
    response_id: str | None


def answer_of(response: Mapping[str, Any]) -> Answer:
    """Read a response object (a non-streamed answer's body, or a final event's `response`)."""
    usage = response.get("usage")
    output = response.get("output")
    items = [item for item in output if isinstance(item, Mapping)] if isinstance(output, list) else []
    response_id = response.get("id")
    return Answer(
        usage=chat_usage(usage) if isinstance(usage, Mapping) else None,
        reply=model_message(items) if items else None,
        response_id=response_id if isinstance(response_id, str) else None,
    )


def chat_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses usage object with a chat completion's field names (only the fields that are there)."""
    renamed: dict[str, Any] = {}
    for ours, theirs in (
        ("prompt_tokens", "input_tokens"),
        ("completion_tokens", "output_tokens"),
        ("total_tokens", "total_tokens"),
        ("prompt_tokens_details", "input_tokens_details"),
        ("completion_tokens_details", "output_tokens_details"),
    ):
        if theirs in usage:
            renamed[ours] = usage[theirs]
    return renamed
