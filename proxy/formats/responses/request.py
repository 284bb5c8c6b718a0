"""A Responses API request body (`POST /v1/responses`), parsed once and checked just enough for compaction.

Only what compaction relies on is checked: a JSON object whose `input` is a string or a list of objects, within the
proxy's limits (items count as messages, content parts as content parts). Anything else is the provider's to judge:
the proxy forwards it untouched. A request continuing a conversation the provider keeps (`previous_response_id` or
`conversation`) is parsed too, but its history is not in the body: see `stateful`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from proxy.engine.json_bytes import json_bytes
from proxy.engine.messages import Message, is_checkpoint
from proxy.formats.responses.items import Item, Units
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
class ResponsesRequest(BodyFields, MappedMessages):
    """A parsed Responses API request.

    :param body: The whole parsed body; never modified.
    :param units: Its `instructions` and `input` as the engine's messages (a string `input` is one user message).
    """

    body: Mapping[str, Any]
    units: Units

    @property
    def messages(self) -> list[Message]:
        """The engine's messages: the instructions, then one per unit of `input`."""
        return self.units.messages

    @property
    def stateful(self) -> bool:
        """Whether the history lives at the provider (`previous_response_id` or `conversation`), out of reach."""
        return self.body.get("previous_response_id") is not None or self.body.get("conversation") is not None

    @property
    def provider_chain(self) -> str | None:
        """What names the history the provider keeps: `previous_response_id`, else the `conversation`'s id."""
        previous = self.body.get("previous_response_id")
        if isinstance(previous, str):
            return "response:" + previous
        conversation = self.body.get("conversation")
        if isinstance(conversation, dict):
            conversation = conversation.get("id")
        return "conversation:" + conversation if isinstance(conversation, str) else None

    @property
    def manages_context(self) -> bool:
        """Whether the client set context management of its own (`context_management`, `truncation: auto`)."""
        return bool(self.body.get("context_management")) or self.body.get("truncation") == "auto"

    @property
    def provider_edits(self) -> None:
        """None: the proxy estimates no edits of this API's own (its `context_management` is a deferral)."""
        return None

    @property
    def compaction_signal(self) -> str | None:
        """`compaction-items` when the input holds the provider's compaction items, else `context-management`.

        The second when it manages its context itself (see `manages_context`).
        """
        if any(is_checkpoint(message) for message in self.messages):
            return "compaction-items"
        return "context-management" if self.manages_context else None

    @property
    def reserved_tokens(self) -> int:
        """The tokens the request reserves for its reply: `max_output_tokens`."""
        return reserved(self.body, "max_output_tokens")

    @property
    def added_prompt_tokens(self) -> int:
        """None: the tools are all the provider adds, and the engine counts them."""
        return 0

    @cached_property
    def overhead_fields(self) -> Mapping[str, Any]:
        """The fields the engine counts besides the messages, in Chat Completions terms: the tools."""
        tools = self.body.get("tools")
        if not isinstance(tools, list):
            return {}
        return {"tools": [_chat_tool(tool) for tool in tools]}

    @classmethod
    def parse(cls, raw: bytes | str, limits: RequestLimits | None = None) -> ResponsesRequest:
        """Parse and check a request body.

        :raises InvalidRequest: If it is not JSON, not an object, or its `input` is neither text nor items.
        :raises RequestOverLimit: If it holds more items or content parts than `limits` allow.
        """
        body = json_object(raw)
        given = body.get("input")
        if isinstance(given, str):
            items: list[Item] = [{"role": "user", "content": given}]
        elif isinstance(given, list):
            items = given
        elif given is None:
            items = []
        else:
            raise InvalidRequest("The request's `input` must be a string or a list of items.")
        checked_objects(items, "input", limits)
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise InvalidRequest("The request's `instructions` must be a string.")
        return cls(body, Units.of(items, instructions))

    def forwarded(self, raw: bytes, messages: list[Message] | None, previous: Any = None) -> Forwarding:
        """The body to send: `raw` when `messages` is None (unchanged), else the request with those messages.

        :param previous: Unused: nothing of a previous request changes how this format forwards the next.
        """
        if messages is None:
            return Forwarding(raw)
        return Forwarding(json_bytes(self.fields_with(*self.units.forwarded_items(messages))))

    def fields_with(self, items: list[Item], instructions: str | None) -> dict[str, Any]:
        """The request's fields, in their order, with these `input` items and `instructions` (its own when None).

        What is forwarded, and what a summary call repeats before its instruction (`proxy.formats.responses.summary`).
        """
        fields = {**self.body, "input": items}
        if instructions is not None:
            fields["instructions"] = instructions
        return fields


def _chat_tool(tool: Any) -> Any:
    """A Responses tool in Chat Completions form for counting: a function's fields under `function`."""
    if isinstance(tool, Mapping) and tool.get("type") == "function":
        return {"type": "function", "function": {key: value for key, value in tool.items() if key != "type"}}
    return tool
