"""What a chat completion's answer reports, whole or streamed: usage, the reply, and a refusal inside a stream.

A whole answer holds its usage and `choices[0].message`; a stream (with `stream_options.include_usage`) reports its
usage in its last chunk and the reply as deltas of `choices[0]`, reassembled by `ReplyBuilder`. A chunk that is an
error body (`{"error": {...}}`) refuses the request after the stream began, as some servers do. Nothing the upstream
sends is trusted: members of unexpected types are skipped, never raised on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import orjson

from proxy.engine.messages import Message
from proxy.formats.chat_completions.reply import ReplyBuilder
from proxy.formats.event_bytes import STRING, TEXT, members_but, read_text
from proxy.pipeline.wire import StreamReport


def choices_of(chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The well-formed entries of a completion's (or chunk's) `choices`: none when it is not a list."""
    choices = chunk.get("choices")
    return [choice for choice in choices if isinstance(choice, dict)] if isinstance(choices, list) else []


def first_message(completion: Mapping[str, Any]) -> dict[str, Any] | None:
    """The message of a completion's first choice (index 0), if it has one."""
    for choice in choices_of(completion):
        if choice.get("index", 0) == 0 and isinstance(choice.get("message"), dict):
            message: dict[str, Any] = choice["message"]
            return message
    return None


def answer(completion: Mapping[str, Any]) -> tuple[dict[str, Any] | None, Message | None, str | None]:
    """A whole completion's usage, its first choice's message; a completion is never continued by id."""
    usage = completion.get("usage")
    return (usage if isinstance(usage, dict) else None), first_message(completion), None


def read_event(chunk: Mapping[str, Any], report: StreamReport) -> None:
    """Fold a stream chunk in: its usage, and the first choice's delta into the reply."""
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        report.usage = report.native_usage = usage
    for choice in choices_of(chunk):
        if choice.get("index", 0) == 0 and isinstance(choice.get("delta"), dict):
            if report.reply is None:
                report.reply = ReplyBuilder()
            report.reply.add(choice["delta"])


_TEXT_CHUNK: Final = re.compile(
    rb"\{(?:" + members_but("choices", "usage") + rb",)*"
    rb'"choices":\[\{"index":0,"delta":\{(?:"role":(' + STRING + rb"),)?" + rb'"content":' + TEXT + rb"\}"
    rb"(?:," + members_but("index", "delta") + rb")*\}\]"
    rb"(?:," + members_but("choices", "usage") + rb")*\}"
)
"""A chunk whose only delta is text (and perhaps its role) for the first choice, and which reports no usage."""


def skim_event(data: bytes, report: StreamReport) -> bool:
    """Fold in a text chunk (`_TEXT_CHUNK`) from its bytes, as `read_event` would; False for any other chunk."""
    read = read_text(report, _TEXT_CHUNK, 2, data)
    if read is None:
        return False
    text, found = read
    if report.reply is None:
        report.reply = ReplyBuilder()
    report.reply.add_text(text, found.group(1)[1:-1].decode() if found.group(1) is not None else None)
    return True


def reply_of(report: StreamReport) -> Message | None:
    """The assistant message the stream's deltas amount to."""
    return report.reply.build() if isinstance(report.reply, ReplyBuilder) else None


def refusal(chunk: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The error body of a chunk that is one, or of an `error` event (a refusal after the stream began), else None."""
    kind, error = chunk.get("type"), chunk.get("error")
    if kind == "error":
        return {"error": error if isinstance(error, Mapping) else chunk}
    return {"error": error} if kind is None and isinstance(error, Mapping) else None


def error_event(error: Mapping[str, Any]) -> bytes:
    """A chunk carrying `error`, as servers that refuse inside a stream send it."""
    return b"data: " + orjson.dumps({"error": error}) + b"\n\n"
