"""Chat completions as a `WireFormat`: the one object the pipeline and the server ask about this format."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from proxy.formats.chat_completions import answers, errors, summary
from proxy.formats.chat_completions import reads as read_calls
from proxy.formats.chat_completions.body import asks_for_usage
from proxy.formats.chat_completions.exact_counts import TemplateCounting
from proxy.formats.chat_completions.request import ChatRequest, deployment_name
from proxy.formats.chat_completions.splice import ChatSplicing
from proxy.pipeline.capabilities import ByteSplicing, ExactCounting, PromptCounting, ProviderHistory
from proxy.pipeline.requests import RequestLimits
from proxy.pipeline.wire import SocketMode, bearer_credential

PATH: Final = re.compile(r"^(?:/[^/]+)*/chat/completions/?$")
"""`/v1/chat/completions`, with any base-path prefix (`/openai/v1/...`, `/api/v1/...`) or the Azure form
`/openai/deployments/{name}/chat/completions`."""


class ChatCompletions:
    """OpenAI's Chat Completions API (see `proxy.pipeline.wire.WireFormat` for what each member means)."""

    name: str = "chat_completions"
    entries: str = "messages"
    scope: str | None = None
    """State made before formats had scopes of their own is chat completions': they keep the tenant's plain scope."""
    read_tool: Mapping[str, Any] = read_calls.READ_TOOL
    conversation_headers: tuple[str, ...] = ()
    call_headers: tuple[str, ...] = ()
    api: str = "openai"
    api_headers: tuple[str, ...] = ()
    sized_by_bytes: bool = True
    socket: SocketMode | None = None
    splicing: ByteSplicing | None = ChatSplicing()
    provider_history: ProviderHistory | None = None
    exact_counting: ExactCounting | None = TemplateCounting()
    prompt_counting: PromptCounting | None = None

    answer = staticmethod(answers.answer)
    read_event = staticmethod(answers.read_event)
    skim_event = staticmethod(answers.skim_event)
    reply_of = staticmethod(answers.reply_of)
    refusal = staticmethod(answers.refusal)
    error_event = staticmethod(answers.error_event)
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
        """A body with `messages`."""
        return "messages" in body

    def model(self, request: ChatRequest, path: str) -> str | None:
        """The body's `model`, else the Azure deployment its path names."""
        return request.model or deployment_name(path)

    def window(self, model: str | None, headers: Mapping[str, str]) -> int | None:
        """None: the shipped table knows the windows of the models this format serves."""
        return None

    def asks_usage(self, request: ChatRequest) -> bool:
        """A stream reports its usage only under `stream_options.include_usage`."""
        return request.stream and not asks_for_usage(request.body)

    def parse(self, raw: bytes, limits: RequestLimits | None) -> ChatRequest:
        """See `ChatRequest.parse`."""
        return ChatRequest.parse(raw, limits)

    def opening(self, event: Mapping[str, Any]) -> bool:
        """A chat stream has no opening events: its first chunk already answers."""
        return False

    def usage_holder(self, event: Mapping[str, Any]) -> dict[str, Any] | None:
        """A chunk, or a whole completion, holds its usage itself."""
        return event if isinstance(event, dict) and isinstance(event.get("usage"), Mapping) else None

    def answer_without_tools(self, fields: dict[str, Any]) -> None:
        """`tool_choice: "none"`."""
        fields["tool_choice"] = "none"

    def usage_in_chat_terms(self, usage: Mapping[str, Any]) -> dict[str, Any]:
        """Already in them."""
        return dict(usage)


CHAT_COMPLETIONS: Final = ChatCompletions()
