"""OpenAI's error shape, shared by chat completions and the Responses API: overflows recognized, errors built.

A provider's "context length exceeded" answer, and the window it states, are recognized from its shape only.

What is learned here changes how later requests are compacted, so it is read only from what the provider itself
puts in an error, never from free text a caller could have placed there (error messages often quote the request):

- OpenAI: `code: context_length_exceeded`; the window from the message's opening sentence ("This model's maximum
  context length is N tokens." or "Input tokens exceed the configured limit of N tokens.").
- llama.cpp's server: `type: exceed_context_size_error`, the window as the integer `n_ctx`.
- vLLM and servers copying OpenAI's wording without its code: a message that *opens* with "This model's maximum
  context length is N tokens", in a 400 answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import orjson

from proxy.pipeline.wire import Overflow

_OPENING_SENTENCES: Final = (
    re.compile(r"This model's maximum context length is (\d{1,9}) tokens\b"),
    re.compile(r"Input tokens exceed the configured limit of (\d{1,9}) tokens\b"),
)
"""The sentences a provider opens its overflow message with; matched at the start of the message only."""

OPENAI_CODE: Final = "context_length_exceeded"
LLAMA_CPP_TYPE: Final = "exceed_context_size_error"


def context_overflow(status: int, error_body: Mapping[str, Any] | None) -> Overflow | None:
    """The overflow an error answer reports, or None when it is some other error (or not one we can trust)."""
    if status not in (400, 413, 422) or not isinstance(error_body, Mapping):
        return None
    error = error_body.get("error", error_body)
    if not isinstance(error, Mapping):
        return None
    message = error.get("message")
    stated = _opening_window(message) if isinstance(message, str) else None
    if error.get("type") == LLAMA_CPP_TYPE:
        n_ctx = error.get("n_ctx")
        return Overflow(n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0 else None)
    if error.get("code") == OPENAI_CODE:
        return Overflow(stated)
    if stated is not None and status == 400:
        return Overflow(stated)
    return None


def _opening_window(message: str) -> int | None:
    """The window stated by the message's opening sentence, or None."""
    for sentence in _OPENING_SENTENCES:
        match = sentence.match(message)
        if match:
            return int(match.group(1))
    return None


def error_body(message: str, kind: str, code: str, param: str | None) -> bytes:
    """An OpenAI-style error body: `{"error": {"message", "type", "param", "code"}}`."""
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})
