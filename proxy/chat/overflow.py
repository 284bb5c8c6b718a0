"""Recognizing a provider's "context length exceeded" answer, and the window it states.

OpenAI answers 400 with `code: context_length_exceeded` and "This model's maximum context length is N tokens";
vLLM and most OpenAI-compatible servers reuse that sentence; llama.cpp's server answers with
`type: exceed_context_size_error` and the window as `n_ctx`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_STATED_WINDOW = re.compile(
    r"(?:maximum context length|context length|context window|context size)(?: is| of)?\s+(\d[\d,]*)\s*tokens?",
    re.IGNORECASE,
)
_OVERFLOW_WORDS = ("context_length_exceeded", "exceed_context_size", "context length", "context window", "too long")


@dataclass(frozen=True)
class Overflow:
    """A context overflow, with the window the provider stated (None when it stated none)."""

    window: int | None


def context_overflow(status: int, error_body: Mapping[str, Any] | None) -> Overflow | None:
    """The overflow an error answer reports, or None when it is some other error."""
    if status not in (400, 413, 422) or not error_body:
        return None
    error = error_body.get("error", error_body)
    if not isinstance(error, Mapping):
        error = {"message": str(error)}
    message = str(error.get("message") or "")
    tags = " ".join(str(error.get(key) or "") for key in ("code", "type")).lower()
    if not any(word in tags or word in message.lower() for word in _OVERFLOW_WORDS):
        return None
    window = error.get("n_ctx")
    if isinstance(window, int) and window > 0:
        return Overflow(window)
    match = _STATED_WINDOW.search(message)
    return Overflow(int(match.group(1).replace(",", "")) if match else None)
