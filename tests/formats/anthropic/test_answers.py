"""Usage, replies and overflow errors read from Messages API answers, as the fake upstream (and Anthropic) sends."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.formats.anthropic.answers import StreamAnswer, answer_of, chat_usage, error_body, overflow
from proxy.simulator.anthropic_rules import AnthropicError
from proxy.simulator.anthropic_upstream import AnthropicUpstream, stream_events, tool_loop_responder

BODY: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 100,
    "thinking": {"type": "enabled", "budget_tokens": 50},
    "tools": [{"name": "search", "input_schema": {"type": "object"}}],
    "messages": [{"role": "user", "content": "Find it."}],
}


def test_the_prompt_is_all_the_input_the_model_read() -> None:
    usage = {
        "input_tokens": 10,
        "cache_creation_input_tokens": 200,
        "cache_read_input_tokens": 3000,
        "output_tokens": 7,
    }
    assert chat_usage(usage) == {
        "prompt_tokens": 3210,
        "completion_tokens": 7,
        "total_tokens": 3217,
        "prompt_tokens_details": {"cached_tokens": 3000, "cache_write_tokens": 200},
    }
    assert chat_usage({"input_tokens": 5, "output_tokens": 1, "cache_read_input_tokens": None})["prompt_tokens"] == 5


def test_a_json_answer_and_its_stream_read_the_same() -> None:
    upstream = AnthropicUpstream(responder=tool_loop_responder("search"))
    message = upstream.answer(dict(BODY), {})
    whole = answer_of(message)
    streamed = StreamAnswer()
    for _name, event in stream_events(message):
        streamed.feed(orjson.loads(orjson.dumps(event)))
    assert streamed.answer() == whole
    assert whole.usage is not None and whole.usage["completion_tokens"] == message["usage"]["output_tokens"]
    assert whole.reply is not None and whole.reply["tool_calls"][0]["function"]["name"] == "search"
    assert whole.reply["content"][0]["type"] == "opaque"  # the thinking, counted and never edited


def test_the_stream_usage_is_the_last_cumulative_count() -> None:
    streamed = StreamAnswer()
    start = {"usage": {"input_tokens": 12, "cache_read_input_tokens": 100, "output_tokens": 1}}
    streamed.feed({"type": "message_start", "message": start})
    streamed.feed({"type": "ping"})
    streamed.feed({"type": "message_delta", "usage": {"output_tokens": 5}})
    streamed.feed({"type": "message_delta", "usage": {"output_tokens": 9}})
    assert streamed.answer().usage == chat_usage(
        {"input_tokens": 12, "cache_read_input_tokens": 100, "output_tokens": 9}
    )


@pytest.mark.parametrize(
    ("model", "words", "window", "prompt_at_least"),
    [("claude-sonnet-4-5", 9000, 8000, 8001), ("claude-3-5-haiku-20241022", 7000, 8000, 7000)],
)
def test_overflow_texts_teach_the_window(model: str, words: int, window: int, prompt_at_least: int) -> None:
    upstream = AnthropicUpstream(context_window=window)
    body = {**BODY, "model": model, "max_tokens": 2000, "messages": [{"role": "user", "content": "word " * words}]}
    with pytest.raises(AnthropicError) as caught:
        upstream.answer(body, {})
    found = overflow(400, caught.value.body)
    assert found is not None and found.window == window and found.prompt >= prompt_at_least


def test_only_the_apis_own_overflow_shape_teaches_a_window() -> None:
    quoted = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "Bad: prompt is too long: 5 tokens > 1 maximum"},
    }
    assert overflow(400, quoted) is None
    wrong_type = {
        "type": "error",
        "error": {"type": "api_error", "message": "prompt is too long: 5 tokens > 1 maximum"},
    }
    assert overflow(400, wrong_type) is None
    assert overflow(500, orjson.loads(error_body("prompt is too long: 5 tokens > 1 maximum"))) is None
    assert overflow(400, orjson.loads(error_body("prompt is too long: 5 tokens > 1 maximum"))) is not None
