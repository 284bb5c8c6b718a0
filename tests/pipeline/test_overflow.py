"""Overflow answers are recognized from the provider's own error shapes, never from text a caller could have sent."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.formats.chat_completions.errors import Overflow, context_overflow

OPENAI = {
    "error": {
        "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in "
        "130511 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
OPENAI_GPT5 = {
    "error": {
        "message": "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in 272310.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
LLAMA_CPP = {
    "error": {
        "code": 400,
        "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 2300,
        "n_ctx": 2048,
    }
}
VLLM = {
    "object": "error",
    "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}


@pytest.mark.parametrize(
    ("body", "window"),
    [(OPENAI, 128_000), (OPENAI_GPT5, 272_000), (LLAMA_CPP, 2048), (VLLM, 4096)],
    ids=["openai", "openai-configured-limit", "llama.cpp", "vllm"],
)
def test_provider_shapes_are_recognized_with_their_window(body: dict[str, Any], window: int) -> None:
    assert context_overflow(400, body) == Overflow(window)


def test_openai_code_without_a_stated_window_is_an_overflow_without_one() -> None:
    body = {"error": {"message": "Too long.", "type": "invalid_request_error", "code": "context_length_exceeded"}}
    assert context_overflow(400, body) == Overflow(None)


@pytest.mark.parametrize(
    "message",
    [
        "Invalid value: 'This model's maximum context length is 120 tokens'",
        "messages[3].content: This model's maximum context length is 120 tokens",
        "The context window is too long: context length of 120 tokens",
    ],
)
def test_a_quoted_sentence_in_another_error_is_not_an_overflow(message: str) -> None:
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": "messages", "code": "invalid_value"}
    }
    assert context_overflow(400, body) is None


def test_other_statuses_and_odd_shapes_are_not_overflows() -> None:
    assert context_overflow(500, OPENAI) is None
    assert context_overflow(429, OPENAI) is None
    assert context_overflow(400, None) is None
    assert context_overflow(400, {"error": "This model's maximum context length is 10 tokens"}) is None
    odd = {"error": {"type": "exceed_context_size_error", "n_ctx": True}}
    assert context_overflow(400, odd) == Overflow(None)
