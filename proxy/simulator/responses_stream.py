"""The Server-Sent Events a streamed Responses API answer is made of, in OpenAI's order, framed as OpenAI frames them.

Each event is `event: <type>` and `data: <compact JSON>` with a `sequence_number` counting from 0; there is no
`[DONE]` line. For a response the sequence is:

1. `response.created`, `response.in_progress` (the response with status "in_progress", empty output, no usage);
2. per output item, `response.output_item.added` (the item in progress: empty text, summary or arguments), then
   - reasoning: per summary part, `response.reasoning_summary_part.added`, `response.reasoning_summary_text.delta`
     (several), `response.reasoning_summary_text.done`, `response.reasoning_summary_part.done`;
   - message: `response.content_part.added`, `response.output_text.delta` (several), `response.output_text.done`,
     `response.content_part.done`;
   - function call: `response.function_call_arguments.delta` (several), `response.function_call_arguments.done`;
   - compaction: nothing between (its content is opaque);

   then `response.output_item.done` with the whole item;
3. `response.completed` with the whole response and its usage (or `response.incomplete` for an incomplete one).

A request refused after the stream began (the fake does so for an overflow when asked to, as OpenAI does for some
models) is `response.created`, `response.in_progress`, then one `error` event carrying OpenAI's error object.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from proxy.simulator.openai_common import split_into_token_pieces

__all__ = ["error_events", "response_events", "sse_frame"]


def sse_frame(event: Mapping[str, Any]) -> bytes:
    """One event as OpenAI sends it: its type on an `event:` line, then its compact JSON on a `data:` line."""
    data = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


def response_events(response: Mapping[str, Any], encoding_name: str, tokens_per_delta: int = 1) -> list[dict[str, Any]]:
    """Every event of a streamed `response` (a finished response object), numbered."""
    opening = {**response, "status": "in_progress", "output": [], "usage": None, "completed_at": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": opening},
        {"type": "response.in_progress", "response": opening},
    ]
    for index, item in enumerate(response["output"]):
        events.extend(_item_events(index, item, encoding_name, tokens_per_delta))
    closing = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    events.append({"type": closing, "response": dict(response)})
    return _numbered(events)


def error_events(response: Mapping[str, Any], error: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The events of a request refused once streaming began: created, in progress, then `error` with `error`."""
    opening = {**response, "status": "in_progress", "output": [], "usage": None, "completed_at": None}
    events = [
        {"type": "response.created", "response": opening},
        {"type": "response.in_progress", "response": opening},
        {"type": "error", "error": dict(error)},
    ]
    return _numbered(events)


def _numbered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": event["type"], "sequence_number": n, **event} for n, event in enumerate(events)]


def _item_events(index: int, item: Mapping[str, Any], encoding_name: str, per_delta: int) -> Iterator[dict[str, Any]]:
    kind = item["type"]
    where = {"item_id": item["id"], "output_index": index}
    yield {"type": "response.output_item.added", "output_index": index, "item": _in_progress(item)}
    if kind == "reasoning":
        for k, part in enumerate(item["summary"]):
            at = {**where, "summary_index": k}
            yield {"type": "response.reasoning_summary_part.added", **at, "part": {**part, "text": ""}}
            for piece in split_into_token_pieces(part["text"], encoding_name, per_delta):
                yield {"type": "response.reasoning_summary_text.delta", **at, "delta": piece}
            yield {"type": "response.reasoning_summary_text.done", **at, "text": part["text"]}
            yield {"type": "response.reasoning_summary_part.done", **at, "part": dict(part)}
    elif kind == "message":
        for k, part in enumerate(item["content"]):
            at = {**where, "content_index": k}
            yield {"type": "response.content_part.added", **at, "part": {**part, "text": ""}}
            for piece in split_into_token_pieces(part["text"], encoding_name, per_delta):
                yield {"type": "response.output_text.delta", **at, "delta": piece, "logprobs": []}
            yield {"type": "response.output_text.done", **at, "text": part["text"], "logprobs": []}
            yield {"type": "response.content_part.done", **at, "part": dict(part)}
    elif kind == "function_call":
        for piece in split_into_token_pieces(item["arguments"], encoding_name, max(per_delta, 2)):
            yield {"type": "response.function_call_arguments.delta", **where, "delta": piece}
        yield {"type": "response.function_call_arguments.done", **where, "arguments": item["arguments"]}
    yield {"type": "response.output_item.done", "output_index": index, "item": dict(item)}


def _in_progress(item: Mapping[str, Any]) -> dict[str, Any]:
    """The item as `response.output_item.added` shows it: nothing generated yet."""
    kind = item["type"]
    if kind == "message":
        return {**item, "status": "in_progress", "content": []}
    if kind == "function_call":
        return {**item, "status": "in_progress", "arguments": ""}
    if kind == "reasoning":
        return {key: value for key, value in item.items() if key != "encrypted_content"} | {"summary": []}
    return dict(item)
