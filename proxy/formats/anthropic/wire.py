"""Anthropic's Messages API as a `WireFormat`: the one object the pipeline and the server ask about this format.

A stream opens with `message_start` (and may `ping` at any time); a request refused after the stream began gets an
`error` event (`{"type": "error", "error": {...}}`), whose data is also the API's error body, so an overflow reads
the same from it as from a 400. Usage comes from `message_start` and the cumulative `message_delta` (`StreamAnswer`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import orjson

from proxy.engine.messages import Message
from proxy.formats.anthropic import answers, summary
from proxy.formats.anthropic import reads as read_calls
from proxy.formats.anthropic.count_tokens import CountedPrompts, CountTokensCounting
from proxy.formats.anthropic.request import MessagesRequest
from proxy.formats.anthropic.tokens import window_for
from proxy.pipeline.capabilities import ByteSplicing, ExactCounting, PromptCounting, ProviderHistory
from proxy.pipeline.requests import RequestLimits
from proxy.pipeline.wire import Overflow, SocketMode, StreamReport

PATH: Final = re.compile(r"^(?:/[^/]+)*/v1/messages/?$")
"""`/v1/messages` (creating a message), with any base-path prefix; not `/v1/messages/count_tokens` nor the batches
API, which are only forwarded."""

OPENING_EVENTS: Final = frozenset({"message_start", "ping"})
"""Events a stream opens with, before it either refuses or starts answering."""

SESSION_HEADER: Final = "x-claude-code-session-id"
"""The header Claude Code names its session with: one conversation."""


class Messages:
    """Anthropic's Messages API (see `proxy.pipeline.wire.WireFormat` for what each member means)."""

    name: str = "messages"
    entries: str = "messages"
    scope: str | None = "messages"
    """Its rewrites stand for blocks, which a chat completion's messages are not: state of its own."""
    read_tool: Mapping[str, Any] = summary.READ_TOOL_DEFINITION
    conversation_headers: tuple[str, ...] = (SESSION_HEADER,)
    call_headers: tuple[str, ...] = ("anthropic-version", "anthropic-beta")
    api: str = "anthropic"
    api_headers: tuple[str, ...] = ("anthropic-version",)
    """Every call of the API carries it (its SDKs and Claude Code send it on `count_tokens`, batches, models)."""
    sized_by_bytes: bool = True
    """Text blocks and tool calls are plain JSON; any other block (thinking, an image, a document) is an engine part
    `proxy.pipeline.byte_bound` does not bound, and the tool-use system prompt is `added_prompt_tokens`."""
    socket: SocketMode | None = None
    splicing: ByteSplicing | None = None
    provider_history: ProviderHistory | None = None
    exact_counting: ExactCounting | None = CountTokensCounting()
    """`count_tokens` (`proxy.formats.anthropic.count_tokens`), asked only when `count_probes` names it."""
    prompt_counting: PromptCounting | None = CountedPrompts()
    """`count_tokens` asked by the client: sent as the matching request is forwarded."""

    reads = staticmethod(read_calls.reads)
    stream_reads = staticmethod(read_calls.stream_reads)
    decides_reads = staticmethod(read_calls.decides_reads)
    without_reads = staticmethod(read_calls.without_reads)
    hide_read = staticmethod(read_calls.hide_read)
    asked_again = staticmethod(read_calls.asked_again)
    summary_call = staticmethod(summary.summary_request)
    summary_text = staticmethod(summary.summary_text)
    usage_in_chat_terms = staticmethod(answers.chat_usage)

    def serves(self, path: str) -> bool:
        """`PATH`."""
        return PATH.match(path) is not None

    def recognizes(self, body: Mapping[str, Any]) -> bool:
        """A body with `messages` and a field only the Messages API has (`system`, `thinking`)."""
        return isinstance(body.get("messages"), list) and ("system" in body or "thinking" in body)

    def parse(self, raw: bytes, limits: RequestLimits | None) -> MessagesRequest:
        """See `MessagesRequest.parse`."""
        return MessagesRequest.parse(raw, limits)

    def model(self, request: MessagesRequest, path: str) -> str | None:
        """The body's `model`."""
        return request.model

    def window(self, model: str | None, headers: Mapping[str, str]) -> int | None:
        """The Claude model's window, 1M tokens where the request's `anthropic-beta` opts into it (`window_for`)."""
        return window_for(model, headers)

    def asks_usage(self, request: MessagesRequest) -> bool:
        """A stream always reports its usage (`message_start`, `message_delta`)."""
        return False

    def answer(self, answer: Mapping[str, Any]) -> tuple[dict[str, Any] | None, Message | None, str | None]:
        """A message's usage (chat terms) and content as the engine's assistant message; no id to continue from."""
        read = answers.answer_of(answer)
        return read.usage, read.reply, None

    def read_event(self, event: Mapping[str, Any], report: StreamReport) -> None:
        """Fold an event into the stream's `StreamAnswer` (kept as `report.reply`) and its usage."""
        if not isinstance(report.reply, answers.StreamAnswer):
            report.reply = answers.StreamAnswer()
        stream = report.reply
        stream.feed(event)
        if stream.usage and event.get("type") in ("message_start", "message_delta"):
            report.usage = answers.chat_usage(stream.usage)
            report.native_usage = dict(stream.usage)

    def skim_event(self, data: bytes, report: StreamReport) -> bool:
        """A text or thinking delta, read from its bytes (`answers.skim_event`)."""
        return answers.skim_event(data, report)

    def reply_of(self, report: StreamReport) -> Message | None:
        """The assistant message the stream's blocks amount to so far."""
        return report.reply.answer().reply if isinstance(report.reply, answers.StreamAnswer) else None

    def opening(self, event: Mapping[str, Any]) -> bool:
        """`message_start` and `ping` decide nothing."""
        kind = event.get("type")
        return isinstance(kind, str) and kind in OPENING_EVENTS

    def refusal(self, event: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """An `error` event: its data is the API's error body."""
        return event if event.get("type") == "error" and isinstance(event.get("error"), Mapping) else None

    def error_event(self, error: Mapping[str, Any]) -> bytes:
        """An `error` event carrying `error`."""
        return b"event: error\ndata: " + orjson.dumps({"type": "error", "error": error}) + b"\n\n"

    def usage_holder(self, event: Mapping[str, Any]) -> dict[str, Any] | None:
        """The message of `message_start`, a `message_delta`, or a whole message, when it holds a usage."""
        owner = event.get("message") if event.get("type") == "message_start" else event
        return owner if isinstance(owner, dict) and isinstance(owner.get("usage"), Mapping) else None

    def overflow(self, status: int, error_body: Mapping[str, Any] | None) -> Overflow | None:
        """The API's two overflow texts ("prompt is too long: N tokens > M maximum"; see `answers.overflow`)."""
        found = answers.overflow(status, error_body)
        return Overflow(found.window) if found is not None else None

    def error_body(self, message: str, kind: str, code: str, param: str | None) -> bytes:
        """The API's error shape, `{"type": "error", "error": {"type", "message"}}` (it has no code nor param).

        The type is the API's documented one for `kind` and `code` (`answers.error_body`).
        """
        return answers.error_body(message, kind, code)

    def call_credential(self, key: str) -> Mapping[str, str]:
        """`x-api-key`: the API answers a key sent as `Authorization: Bearer` with a 401 `authentication_error`."""
        return {"x-api-key": key}

    def answer_without_tools(self, fields: dict[str, Any]) -> None:
        """`tool_choice: {"type": "none"}`."""
        fields["tool_choice"] = summary.NO_TOOLS


MESSAGES: Final = Messages()
