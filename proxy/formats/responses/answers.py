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

import orjson

from proxy.engine.messages import Message
from proxy.formats.responses.items import model_message
from proxy.pipeline.wire import StreamReport

FINAL_EVENTS: Final = frozenset({"response.completed", "response.incomplete"})
"""Stream events that carry the finished response, usage included."""

OPENING_EVENTS: Final = frozenset({"response.created", "response.in_progress", "response.queued"})
"""Events a stream opens with, before it either refuses or starts answering."""


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


def answer(response: Mapping[str, Any]) -> tuple[dict[str, Any] | None, Message | None, str | None]:
    """A whole response's usage (chat terms), its output as the engine's assistant message, and its id."""
    read = answer_of(response)
    return read.usage, read.reply, read.response_id


def read_event(event: Mapping[str, Any], report: StreamReport) -> None:
    """Fold a stream event in: only the final event (`response.completed`) reports, carrying the whole response."""
    kind, response = event.get("type"), event.get("response")
    if isinstance(kind, str) and kind in FINAL_EVENTS and isinstance(response, Mapping):
        report.final = response
        report.usage, report.reply, report.response_id = answer(response)
        usage = response.get("usage")
        report.native_usage = usage if isinstance(usage, Mapping) else None


_FINAL_NAME: Final = b"complete"
"""Bytes both final types' names hold (`FINAL_EVENTS`): an event `read_event` reads holds them, or an escape."""


def skim_event(data: bytes, report: StreamReport) -> bool:
    """Take an event that is not a final one, told from its bytes; `read_event` skips it too.

    An event is taken when it holds neither `_FINAL_NAME` nor a unicode escape (where a name could hide), nor `usage`,
    which no skimmed event may have (`WireFormat.skim_event`). The events that tell the text
    (`response.output_text.delta`, ...) are skipped: the final event carries the whole response, reply and usage
    alike. Each is looked for by `bytes.find`, several times faster than `in`.
    """
    return data.find(_FINAL_NAME) < 0 and data.find(b"\\u") < 0 and data.find(b"usage") < 0


def reply_of(report: StreamReport) -> Message | None:
    """The assistant message the final response's output amounts to."""
    return report.reply if isinstance(report.reply, dict) else None


def opening(event: Mapping[str, Any]) -> bool:
    """Whether the event is one a stream opens with (`response.created`, ...): it decides nothing."""
    kind = event.get("type")
    return isinstance(kind, str) and kind in OPENING_EVENTS


def refusal(event: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The error body an `error` event or a `response.failed` carries, else None."""
    kind = event.get("type")
    if kind == "error":
        error = event.get("error")
        return {"error": error if isinstance(error, Mapping) else event}
    if kind == "response.failed":
        response = event.get("response")
        error = response.get("error") if isinstance(response, Mapping) else None
        return {"error": error} if isinstance(error, Mapping) else None
    return None


def error_event(error: Mapping[str, Any]) -> bytes:
    """An `error` event carrying `error`."""
    return b"event: error\ndata: " + orjson.dumps({"type": "error", "error": error}) + b"\n\n"


def usage_holder(event: Mapping[str, Any]) -> dict[str, Any] | None:
    """The response object of a final event (or a whole response) when it holds a usage."""
    kind = event.get("type")
    owner = event.get("response") if isinstance(kind, str) and kind in FINAL_EVENTS else event
    return owner if isinstance(owner, dict) and isinstance(owner.get("usage"), Mapping) else None
