"""Summary calls and the proxy's read tool in the Messages API's shape.

As for the other formats (`proxy.pipeline.summaries`, `proxy.formats.responses.summary`), a summary call repeats the
conversation exactly as it was forwarded (the same model, system, tools, thinking settings and messages, its fields
in the same order) so the prompt cache serves all but the instruction, which comes as one more user message. Tools
are disabled (`tool_choice: {"type": "none"}`) so the model answers in text, and the answer is not streamed. A
request with thinking keeps it: changing the thinking settings would miss the cache of every message. On a model
that binds thinking to its prefix, the call sends no thinking blocks: the turn it ends with is the instruction, not
a continued tool-use turn, so none is required, and each one would be checked against a prefix the proxy rewrote.

The read tool is an Anthropic tool definition (`READ_TOOL_DEFINITION`) added after the client's tools; the model
calls it as a `tool_use` block whose `input` names the reference, and the proxy answers with a `tool_result` block
(`read_result`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from proxy.config import Settings
from proxy.engine.messages import Message
from proxy.formats.anthropic.blocks import block_type, content_blocks
from proxy.formats.anthropic.request import MessagesRequest
from proxy.formats.anthropic.rules import binds_prefix, without_thinking
from proxy.pipeline.offload.tool import READ_TOOL, READ_TOOL_DECLARATION
from proxy.pipeline.summary_text import IN_CONTEXT_PREAMBLE, span_text

CALL_FIELDS: Final = (
    "model",
    "max_tokens",
    "system",
    "tools",
    "thinking",
    "temperature",
    "top_p",
    "top_k",
    "metadata",
    "messages",
)
"""Fields of the conversation's own requests that a summary call keeps; the rest (streaming, tool choice, stop
sequences, output formats, context management) would change what comes back."""

NO_TOOLS: Final = {"type": "none"}

READ_TOOL_DEFINITION: Final = {
    "name": READ_TOOL,
    "description": READ_TOOL_DECLARATION["description"],
    "input_schema": READ_TOOL_DECLARATION["parameters"],
}
"""The proxy's read tool as an Anthropic tool: the same name, description and schema as in the other formats."""


def summary_request(
    request: MessagesRequest,
    messages: Sequence[Message],
    indices: Sequence[int],
    *,
    sections: str,
    settings: Settings,
) -> bytes:
    """The summary call's body: the request as `messages` are forwarded, then the instruction naming the span.

    :param request: The request as forwarded (with the read tool when it was given it); its conversation turns the
        engine's `messages` back into the Messages API's.
    :param indices: The span to condense, as positions in `messages` (engine messages).
    """
    mapped = request.mapped(messages)
    span = sorted({position for index in indices if (position := mapped.positions[index]) is not None})
    instruction = IN_CONTEXT_PREAMBLE.format(span=span_text(span)) + sections
    asked = [*mapped.messages, {"role": "user", "content": instruction}]
    if binds_prefix(request.model):
        asked = [kept for message in asked if (kept := without_thinking(message)) is not None]
    fields = request.fields_with(mapped.system, asked)
    document: dict[str, Any] = {key: value for key, value in fields.items() if key in CALL_FIELDS}
    if settings.summary_model:
        document["model"] = settings.summary_model
    if settings.summary_max_tokens:
        document["max_tokens"] = settings.summary_max_tokens
    if document.get("tools"):
        document["tool_choice"] = NO_TOOLS
    return orjson.dumps(document)


def summary_text(answer: Any) -> str | None:
    """The text of a message's text blocks, or None when the answer is not a message."""
    if not isinstance(answer, Mapping) or answer.get("type") != "message":
        return None
    return "".join(
        block["text"]
        for block in content_blocks(answer)
        if block_type(block) == "text" and isinstance(block.get("text"), str)
    )


def with_read_tool(request: MessagesRequest) -> MessagesRequest:
    """The request with the read tool after its own tools (its other fields, and its messages, as they were)."""
    tools: Any = request.body.get("tools")
    body = {**request.body, "tools": [*(tools if isinstance(tools, list) else []), READ_TOOL_DEFINITION]}
    return dataclasses.replace(request, body=body)


def read_calls(reply: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The read tool's calls in an assistant message: each `tool_use` block's id and `input`."""
    return [
        (block["id"], block.get("input"))
        for block in content_blocks(reply)
        if block_type(block) == "tool_use" and block.get("name") == READ_TOOL and isinstance(block.get("id"), str)
    ]


def read_result(call_id: str, text: str, *, error: bool = False) -> dict[str, Any]:
    """The `tool_result` block answering one read call with the offloaded text (or why it cannot be read)."""
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id, "content": text}
    if error:
        block["is_error"] = True
    return block
