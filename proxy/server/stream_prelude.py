"""The opening events of a Responses stream, held back until they show whether the request was refused after all.

Some models refuse an oversized Responses request only once the stream has begun: `response.created`,
`response.in_progress`, then an `error` event (or `response.failed`) saying `context_length_exceeded`. Relayed at
once, such a refusal could no longer be answered by compacting and retrying: the client would already hold the first
events. So a stream is read until its first event that is not one of those opening events, and only then relayed,
the held-back bytes first. Nothing else waits: a chat completion's first chunk, or a Responses stream's first output
event, ends the prelude at once. It is bounded by `PRELUDE_LIMIT` bytes, after which the stream is relayed as usual.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from proxy.server.sse import EventSplitter, event_data

OPENING_EVENTS: Final = frozenset({"response.created", "response.in_progress", "response.queued"})
"""Events a Responses stream opens with, before it either refuses or starts answering."""

PRELUDE_LIMIT: Final = 256 * 1024
"""The most bytes held back: opening events are a few hundred bytes each."""


@dataclass(frozen=True)
class Prelude:
    """What was read of a stream before relaying it.

    :param data: The bytes read, to relay before the rest.
    :param refusal: The error body (`{"error": {...}}`) of a stream that opened with a refusal, else None.
    """

    data: bytes
    refusal: Mapping[str, Any] | None = None


async def read_prelude(read: Callable[[], Awaitable[bytes]]) -> Prelude:
    """Read a stream's opening events (see the module docstring); `read` returns the next chunk, b"" at the end."""
    splitter = EventSplitter()
    chunks: list[bytes] = []
    size = 0
    while size < PRELUDE_LIMIT:
        chunk = await read()
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        for event in splitter.feed(chunk):
            parsed = _parsed(event)
            if parsed is None:
                continue
            kind = parsed.get("type")
            if not (isinstance(kind, str) and kind in OPENING_EVENTS):
                return Prelude(b"".join(chunks), _refusal(parsed))
    return Prelude(b"".join(chunks))


def _parsed(event: bytes) -> dict[str, Any] | None:
    data = event_data(event)
    if data is None:
        return None
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _refusal(event: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The error body an `error` or `response.failed` event carries, in the shape of an error answer's body."""
    kind = event.get("type")
    if kind == "error":
        error = event.get("error")
        return {"error": error if isinstance(error, Mapping) else event}
    if kind == "response.failed":
        response = event.get("response")
        error = response.get("error") if isinstance(response, Mapping) else None
        return {"error": error} if isinstance(error, Mapping) else None
    return None
