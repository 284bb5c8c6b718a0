"""Summary calls for Responses API conversations: the forwarded `input` plus one instruction, to `/v1/responses`.

As for chat completions (`proxy.pipeline.summaries`), the call repeats the conversation exactly as it was forwarded (the
same model, instructions, tools and items, its fields in the same order), so the provider's prompt cache serves all
but the instruction; tools are disabled (`tool_choice: "none"`) so the model answers in text, and nothing is stored
at the provider.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from proxy.config import Settings
from proxy.engine.messages import Message
from proxy.formats.responses.items import item_type
from proxy.formats.responses.request import ResponsesRequest
from proxy.pipeline.summary_text import IN_CONTEXT_PREAMBLE, span_text

CALL_FIELDS: Final = ("model", "instructions", "tools", "reasoning", "temperature", "top_p", "user", "metadata")
"""Fields of the conversation's own requests that a summary call keeps; the rest (streaming, storing, continuing a
stored response, output formats, tool choice) would change what comes back."""


def summary_request(
    request: ResponsesRequest,
    messages: Sequence[Message],
    indices: Sequence[int],
    *,
    sections: str,
    settings: Settings,
) -> bytes:
    """The summary call's body: the request as `messages` are forwarded, then the instruction naming the span's items.

    The fields kept are the forwarded request's own (`ResponsesRequest.fields_with`), in its order: the same
    instructions, tools (the proxy's read tool included when `request` was given it) and items.

    :param request: The request as forwarded (`proxy.pipeline.offload.tool.as_forwarded`); its units turn the engine's
        `messages` back into items.
    :param indices: The span to condense, as positions in `messages`.
    """
    items, instructions, positions = request.units.forwarded_positions(messages)
    span = [position for index in indices for position in positions[index]]
    instruction = IN_CONTEXT_PREAMBLE.format(span=span_text(span)) + sections
    fields = request.fields_with([*items, {"role": "user", "content": instruction}], instructions)
    document: dict[str, Any] = {key: value for key, value in fields.items() if key in CALL_FIELDS or key == "input"}
    if settings.summary_model:
        document["model"] = settings.summary_model
    document["store"] = False
    if document.get("tools"):
        document["tool_choice"] = "none"
    if settings.summary_max_tokens:
        document["max_output_tokens"] = settings.summary_max_tokens
    return orjson.dumps(document)


def summary_text(answer: Any) -> str | None:
    """The text of a response's assistant messages, or None when the answer is not a response."""
    output = answer.get("output") if isinstance(answer, Mapping) else None
    if not isinstance(output, list):
        return None
    texts = [
        part["text"]
        for item in output
        if isinstance(item, Mapping) and item_type(item) == "message" and isinstance(item.get("content"), list)
        for part in item["content"]
        if isinstance(part, Mapping) and part.get("type") == "output_text" and isinstance(part.get("text"), str)
    ]
    return "".join(texts)
