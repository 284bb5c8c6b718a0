"""The Responses API as a `WireFormat`: the one object the pipeline and the server ask about this format."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from proxy.formats.chat_completions import errors
from proxy.formats.responses import answers, summary
from proxy.formats.responses import reads as read_calls
from proxy.formats.responses.exact_counts import InputTokensCounting
from proxy.formats.responses.request import ResponsesRequest
from proxy.formats.responses.socket import ResponsesSocket
from proxy.formats.responses.stateful import ResponsesHistory
from proxy.pipeline.capabilities import ByteSplicing, ExactCounting, PromptCounting, ProviderHistory
from proxy.pipeline.requests import RequestLimits
from proxy.pipeline.wire import SocketMode, bearer_credential

PATH: Final = re.compile(r"^(?:/[^/]+)*/responses/?$")
"""`/v1/responses` (creating a response), with any base-path prefix (`/openai/v1/responses`); not its sub-resources
(`/v1/responses/{id}`, `/v1/responses/compact`, `/v1/responses/input_tokens`), which are only forwarded."""


class Responses:
    """OpenAI's Responses API (see `proxy.pipeline.wire.WireFormat` for what each member means)."""

    name: str = "responses"
    entries: str = "input"
    scope: str | None = "responses"
    """Its rewrites stand for items, which a chat completion's messages are not: state of its own."""
    read_tool: Mapping[str, Any] = read_calls.READ_TOOL
    conversation_headers: tuple[str, ...] = ()
    call_headers: tuple[str, ...] = ()
    api: str = "openai"
    api_headers: tuple[str, ...] = ()
    sized_by_bytes: bool = False
    socket: SocketMode | None = ResponsesSocket()
    splicing: ByteSplicing | None = None
    provider_history: ProviderHistory | None = ResponsesHistory()
    exact_counting: ExactCounting | None = InputTokensCounting()
    prompt_counting: PromptCounting | None = None

    answer = staticmethod(answers.answer)
    read_event = staticmethod(answers.read_event)
    skim_event = staticmethod(answers.skim_event)
    reply_of = staticmethod(answers.reply_of)
    opening = staticmethod(answers.opening)
    refusal = staticmethod(answers.refusal)
    error_event = staticmethod(answers.error_event)
    usage_holder = staticmethod(answers.usage_holder)
    usage_in_chat_terms = staticmethod(answers.chat_usage)
    reads = staticmethod(read_calls.reads)
    stream_reads = staticmethod(read_calls.stream_reads)
    decides_reads = staticmethod(read_calls.decides_reads)
    without_reads = staticmethod(read_calls.without_reads)
    hide_read = staticmethod(read_calls.hide_read)
    asked_again = staticmethod(read_calls.asked_again)
    summary_call = staticmethod(summary.summary_request)
    summary_text = staticmethod(summary.summary_text)
    overflow = staticmethod(errors.context_overflow)
    error_body = staticmethod(errors.error_body)
    call_credential = staticmethod(bearer_credential)

    def serves(self, path: str) -> bool:
        """`PATH`."""
        return PATH.match(path) is not None

    def recognizes(self, body: Mapping[str, Any]) -> bool:
        """A body with `input` and no `messages`."""
        return "input" in body and "messages" not in body

    def model(self, request: ResponsesRequest, path: str) -> str | None:
        """The body's `model`."""
        return request.model

    def window(self, model: str | None, headers: Mapping[str, str]) -> int | None:
        """None: the shipped table knows the windows of the models this format serves."""
        return None

    def asks_usage(self, request: ResponsesRequest) -> bool:
        """A stream's final event carries the whole response, its usage included."""
        return False

    def parse(self, raw: bytes, limits: RequestLimits | None) -> ResponsesRequest:
        """See `ResponsesRequest.parse`."""
        return ResponsesRequest.parse(raw, limits)

    def answer_without_tools(self, fields: dict[str, Any]) -> None:
        """`tool_choice: "none"`."""
        fields["tool_choice"] = "none"


RESPONSES: Final = Responses()
