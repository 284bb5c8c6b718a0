"""A chat-completion request body (`POST /v1/chat/completions`), parsed once and checked just enough for compaction.

A JSON object with a `messages` list of objects, within the proxy's limits (see `proxy.pipeline.requests`); the
Azure-style deployment path names the model when the body does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.engine.messages import Message
from proxy.pipeline.requests import (
    BodyFields,
    InvalidRequest,
    MappedMessages,
    RequestLimits,
    checked_objects,
    json_object,
    reserved,
)
from proxy.pipeline.wire import Forwarding


@dataclass(frozen=True)
class ChatRequest(BodyFields, MappedMessages):
    """A parsed chat-completion request.

    :param body: The whole parsed body; never modified.
    :param messages: `body["messages"]`.
    """

    body: Mapping[str, Any]
    messages: list[Message]

    @property
    def reserved_tokens(self) -> int:
        """The tokens the request reserves for its reply: `max_completion_tokens`, or the older `max_tokens`."""
        return reserved(self.body, "max_completion_tokens", "max_tokens")

    @property
    def added_prompt_tokens(self) -> int:
        """None: the tools are all the provider adds, and the engine counts them."""
        return 0

    @property
    def overhead_fields(self) -> Mapping[str, Any]:
        """The fields the engine counts besides the messages (the tools): the body itself."""
        return self.body

    @classmethod
    def parse(cls, raw: bytes | str, limits: RequestLimits | None = None) -> ChatRequest:
        """Parse and check a request body.

        :raises InvalidRequest: If it is not JSON, not an object, or has no list of message objects.
        :raises RequestOverLimit: If it holds more messages or content parts than `limits` allow.
        """
        body = json_object(raw)
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise InvalidRequest("The request has no `messages` list.")
        checked_objects(messages, "messages", limits)
        return cls(body=body, messages=messages)

    @property
    def provider_edits(self) -> None:
        """None: the proxy estimates no edits of this API's own (its `context_management` is a deferral)."""
        return None

    @property
    def compaction_signal(self) -> str | None:
        """`context-management` when the request carries `context_management` of its own."""
        return "context-management" if "context_management" in self.body else None

    def with_messages(self, messages: list[Message]) -> bytes:
        """The request body with its messages replaced, every other field as it was."""
        return orjson.dumps({**self.body, "messages": messages})

    def forwarded(self, raw: bytes, messages: list[Message] | None, previous: Any = None) -> Forwarding:
        """The body to send: `raw` when `messages` is None (unchanged), else the request with those messages.

        :param previous: Unused: nothing of a previous request changes how this format forwards the next.
        """
        return Forwarding(raw if messages is None else self.with_messages(messages))


def deployment_name(path: str) -> str | None:
    """The deployment in an Azure-style path `/openai/deployments/{name}/chat/completions`."""
    parts = path.strip("/").split("/")
    if "deployments" in parts:
        position = parts.index("deployments") + 1
        return parts[position] if position < len(parts) else None
    return None
