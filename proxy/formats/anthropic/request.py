"""A Messages API request body (`POST /v1/messages`), parsed once and checked just enough for compaction.

Only what compaction relies on is checked: a JSON object whose `messages` is a list of objects and whose `system`, if
any, is a string or a list of blocks, within the proxy's limits (messages count as messages, content blocks as content
parts). Anything else is the API's to judge: the proxy forwards it untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from proxy.engine.messages import Message, is_checkpoint
from proxy.engine.provider_edits import ProviderEdits
from proxy.formats.anthropic.blocks import Conversation, Mapped
from proxy.formats.anthropic.context_edits import provider_edits
from proxy.formats.anthropic.forwarding import forwarding
from proxy.formats.anthropic.tokens import chat_tools, tool_prompt_tokens
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
class MessagesRequest(BodyFields, MappedMessages):
    """A parsed Messages API request.

    What it says of its blocks (`text_only`, `last_message`, `compaction_signal`) is read from the engine's messages
    they map onto (`conversation`): every request that reaches a decision maps them anyway (the ledger keys a small
    one's messages, the full path views a large one's), once.

    :param body: The whole parsed body; never modified.
    """

    body: Mapping[str, Any]
    conversation_tools: Any = None
    """The client's own `tools`, as parsed (the body's differ once the read tool is added)."""
    mapped_conversation: Conversation | None = field(default=None, compare=False, repr=False)
    """`conversation` once mapped: a copy with other `tools` (`dataclasses.replace`, the read tool added) keeps it."""

    @property
    def conversation(self) -> Conversation:
        """Its `system` and `messages` as the engine's messages, mapped on first use.

        A copy of the request with the read tool added maps to the same engine messages, objects and all: forwarding
        tells what compaction changed by them, so a fresh mapping would have every message look changed (and the
        proxy's cache breakpoint go on the last).
        """
        mapped = self.mapped_conversation
        system, messages = self.body.get("system"), self.body["messages"]
        if mapped is None or mapped.system is not system or mapped.messages is not messages:
            mapped = Conversation.of(system, messages)
            object.__setattr__(self, "mapped_conversation", mapped)
        return mapped

    @property
    def messages(self) -> list[Message]:
        """The engine's messages: the system, then the units of `messages`."""
        return self.conversation.engine

    @property
    def manages_context(self) -> bool:
        """Whether the client set the API's own context management (`context_management`: clearing, compaction)."""
        return bool(self.body.get("context_management"))

    @cached_property
    def provider_edits(self) -> ProviderEdits | None:
        """The edits its `context_management` asks the API to make (`proxy.formats.anthropic.context_edits`)."""
        return provider_edits(self.body)

    @property
    def reserved_tokens(self) -> int:
        """The tokens the request reserves for its reply: `max_tokens`."""
        return reserved(self.body, "max_tokens")

    @cached_property
    def overhead_fields(self) -> Mapping[str, Any]:
        """The fields the engine counts besides the messages, in Chat Completions terms: the tools."""
        tools = chat_tools(self.body.get("tools"))
        return {"tools": tools} if tools else {}

    @property
    def tool_prompt_tokens(self) -> int:
        """Tokens the API's tool-use system prompt adds, which the engine's overhead does not count."""
        return tool_prompt_tokens(self.body)

    @property
    def added_prompt_tokens(self) -> int:
        """The tool-use system prompt (`tool_prompt_tokens`)."""
        return self.tool_prompt_tokens

    @property
    def compaction_signal(self) -> str | None:
        """What says the client compacts itself: `compaction` blocks (`compaction-items`), `context_management`.

        `compaction` blocks are found as the checkpoints they map onto.

        `context_management` only when the proxy does not understand its edits: edits it understands are estimated
        (`provider_edits`), and their compaction deferred to by its trigger (`proxy.pipeline.client_compaction`).
        None when neither.
        """
        if any(is_checkpoint(message) for message in self.messages):
            return "compaction-items"
        return "context-management" if self.manages_context and self.provider_edits is None else None

    def forwarded(self, raw: bytes, messages: list[Message] | None, previous: Any = None) -> Forwarding:
        """What to send (`forwarding.forwarding`): `raw` when `messages` is None and the tools are the client's.

        The read tool added after the client's tools (`proxy.pipeline.offload.tool.with_read_tool`) changes what
        every thinking block was bound to, so the request is forwarded through the API's rules then too.
        """
        return forwarding(self, raw, messages, previous)

    @classmethod
    def parse(cls, raw: bytes | str, limits: RequestLimits | None = None) -> MessagesRequest:
        """Parse and check a request body.

        :raises InvalidRequest: If it is not JSON, not an object, has no list of message objects, or its `system`
            is neither text nor a list of blocks.
        :raises RequestOverLimit: If it holds more messages or content blocks than `limits` allow.
        """
        body = json_object(raw)
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise InvalidRequest("The request has no `messages` list.")
        checked_objects(messages, "messages", limits)
        system = body.get("system")
        if system is not None and not isinstance(system, (str, list)):
            raise InvalidRequest("The request's `system` must be a string or a list of text blocks.")
        return cls(body, body.get("tools"))

    def mapped(self, engine: Sequence[Message]) -> Mapped:
        """The `system` and `messages` for the engine's messages, with where each came from and went."""
        return self.conversation.forwarded(engine)

    def unchanged(self, system: Any, messages: Sequence[Mapping[str, Any]]) -> bool:
        """Whether `system` and `messages` are this request's own, object for object."""
        own = self.conversation.messages
        return (
            system is self.conversation.system
            and len(messages) == len(own)
            and all(message is original for message, original in zip(messages, own, strict=True))
        )

    def fields_with(self, system: Any, messages: Sequence[Mapping[str, Any]], **fields: Any) -> dict[str, Any]:
        """The request's fields, in their order, with this `system`, these `messages` and `fields` set.

        What is forwarded, and what a summary call repeats before its instruction (`proxy.formats.anthropic.summary`).
        """
        document = {**self.body, "messages": list(messages), **fields}
        if system is not None:
            document["system"] = system
        return document
