"""A served chat completion, rendered as OpenAI renders it: one JSON object, or `chat.completion.chunk` events.

`Completion` holds the reply and its usage (`completion_usage`, with `cached_tokens` as the prompt cache found
them); `to_json` is the non-streamed body and `stream_chunks` the streamed one, split at token boundaries.
`truncate_reply` applies `max_completion_tokens` as OpenAI does (the text cut, `finish_reason: "length"`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.engine.encodings import get_encoding
from proxy.simulator.chat_replies import Reply, ToolCall
from proxy.simulator.openai_common import split_into_token_pieces
from proxy.simulator.openai_tokens import encode

__all__ = ["SSE_DONE", "Completion", "completion_usage", "sse_body", "sse_event", "stream_chunks", "truncate_reply"]

SYSTEM_FINGERPRINT = "fp_fakeupstrm"


@dataclass(frozen=True)
class Completion:
    """A served completion, from which both the JSON response and the SSE chunks are rendered."""

    id: str
    created: int
    model: str
    reply: Reply
    finish_reason: str
    usage: dict[str, Any]

    def header(self, obj: str) -> dict[str, Any]:
        """The fields every body and chunk of the completion starts with; `obj` is its `object`."""
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "service_tier": "default",
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }

    def to_json(self) -> dict[str, Any]:
        """The non-streamed `chat.completion` body."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": self.reply.content,
            "refusal": None,
            "annotations": [],
        }
        if self.reply.tool_calls:
            message["tool_calls"] = [_tool_call_json(call) for call in self.reply.tool_calls]
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish_reason}
        return {**self.header("chat.completion"), "choices": [choice], "usage": self.usage}


def _tool_call_json(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def completion_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """A chat completion's `usage`, with the cached share of the prompt in `prompt_tokens_details`."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def truncate_reply(reply: Reply, limit: int | None, encoding_name: str) -> tuple[Reply, str]:
    """Apply max_completion_tokens to the text like OpenAI does: cut it and report finish_reason "length"."""
    finish_reason = "tool_calls" if reply.tool_calls else "stop"
    if not limit or not reply.content:
        return reply, finish_reason
    tokens = encode(reply.content, encoding_name)
    if len(tokens) <= limit:
        return reply, finish_reason
    text = get_encoding(encoding_name).decode(list(tokens[:limit]))
    return Reply(content=text, tool_calls=reply.tool_calls), "length"


def stream_chunks(
    completion: Completion, *, include_usage: bool, encoding_name: str, tokens_per_chunk: int = 1
) -> Iterator[dict[str, Any]]:
    """Yield the `chat.completion.chunk` objects OpenAI streams for `completion`, in order."""
    header = completion.header("chat.completion.chunk")

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        body = {**header, "choices": [choice]}
        if include_usage:
            body["usage"] = None
        return body

    reply = completion.reply
    yield chunk({"role": "assistant", "content": "" if reply.content is not None else None, "refusal": None})
    for piece in split_into_token_pieces(reply.content or "", encoding_name, tokens_per_chunk):
        yield chunk({"content": piece})
    for index, call in enumerate(reply.tool_calls):
        opening = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        yield chunk({"tool_calls": [opening]})
        for fragment in split_into_token_pieces(call.arguments, encoding_name, max(tokens_per_chunk, 2)):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
    yield chunk({}, completion.finish_reason)
    if include_usage:
        yield {**header, "choices": [], "usage": completion.usage}


SSE_DONE = b"data: [DONE]\n\n"


def sse_event(chunk: Mapping[str, Any]) -> bytes:
    """One SSE event as OpenAI frames it: `data: <compact JSON>` and a blank line."""
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def sse_body(chunks: Iterable[Mapping[str, Any]]) -> bytes:
    """The whole SSE body for `chunks`, `[DONE]` included, exactly as `_stream` sends it."""
    return b"".join(sse_event(chunk) for chunk in chunks) + SSE_DONE
