"""Summary calls for chat completions: the forwarded `messages` plus one instruction, to `/v1/chat/completions`.

The call repeats the conversation exactly as it was forwarded (the same model, tools and messages, its fields in
the same order), so the provider's prompt cache serves all but the instruction; tools are disabled
(`tool_choice: "none"`) so a model with tools still answers in text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import orjson

from proxy.config import Settings
from proxy.engine.messages import Message
from proxy.formats.chat_completions.body import forwarded_fields
from proxy.formats.chat_completions.request import ChatRequest
from proxy.pipeline.summary_text import IN_CONTEXT_PREAMBLE, span_text

CALL_FIELDS: Final = ("model", "tools", "functions", "temperature", "top_p", "seed", "user", "metadata")
"""Fields of the conversation's own requests that a summary call keeps; the rest (streaming, output formats, tool
choice) would change what comes back."""


def summary_request(
    request: ChatRequest,
    messages: Sequence[Message],
    indices: Sequence[int],
    *,
    sections: str,
    settings: Settings,
) -> bytes:
    """The summary call's body: the conversation as forwarded, then one instruction naming the span to condense.

    The fields kept are those the forwarded body is made of (`forwarded_fields`), in its order, with the messages
    serialized from the very objects that were forwarded and the same tools (the proxy's read tool included when
    `request` was given it), so the provider's prompt cache serves all but the instruction.

    :param request: The request as forwarded (`proxy.pipeline.offload.tool.as_forwarded`).
    """
    instruction = IN_CONTEXT_PREAMBLE.format(span=span_text(indices)) + sections
    fields = forwarded_fields(request, [*messages, {"role": "user", "content": instruction}], ask_usage=False)
    document = {key: value for key, value in fields.items() if key in CALL_FIELDS or key == "messages"}
    if settings.summary_model:
        document["model"] = settings.summary_model
    if document.get("tools"):
        document["tool_choice"] = "none"
    if settings.summary_max_tokens:
        document["max_completion_tokens"] = settings.summary_max_tokens
    return orjson.dumps(document)


def summary_text(answer: Any) -> str | None:
    """The content of the completion's first message.

    :raises KeyError, IndexError, TypeError: The answer is not a completion (the caller counts it as malformed).
    """
    text = answer["choices"][0]["message"]["content"]
    return text if isinstance(text, str) else None
