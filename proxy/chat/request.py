"""A chat-completion request body, parsed once and checked just enough for compaction to reason about it.

Only what compaction relies on is checked: a JSON object with a `messages` list of objects. Anything else (unknown
fields, odd roles, odd content) is the provider's to judge: the proxy forwards it untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.engine.messages import Message


class InvalidChatRequest(ValueError):
    """The body is not a chat-completion request compaction can work on; the message says what is wrong."""


@dataclass(frozen=True)
class ChatRequest:
    """A parsed chat-completion request.

    :param body: The whole parsed body; never modified.
    :param messages: `body["messages"]`.
    """

    body: Mapping[str, Any]
    messages: list[Message]

    @property
    def model(self) -> str | None:
        """The requested model, if named."""
        model = self.body.get("model")
        return model if isinstance(model, str) else None

    @property
    def stream(self) -> bool:
        """Whether a streamed (SSE) response was asked for."""
        return self.body.get("stream") is True

    @classmethod
    def parse(cls, raw: bytes | str) -> ChatRequest:
        """Parse and check a request body.

        :raises InvalidChatRequest: If it is not JSON, not an object, or has no list of message objects.
        """
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            raise InvalidChatRequest(f"The request body is not valid JSON: {error}.") from None
        if not isinstance(body, dict):
            raise InvalidChatRequest(f"The request body must be a JSON object, got {type(body).__name__}.")
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise InvalidChatRequest("The request has no `messages` list.")
        for position, message in enumerate(messages):
            if not isinstance(message, dict):
                raise InvalidChatRequest(f"`messages[{position}]` must be an object, got {type(message).__name__}.")
        return cls(body=body, messages=messages)

    def with_messages(self, messages: list[Message]) -> bytes:
        """The request body with its messages replaced, every other field as it was."""
        return orjson.dumps({**self.body, "messages": messages})
