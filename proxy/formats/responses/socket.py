"""The Responses API's WebSocket mode: its messages, as the proxy reads and writes them (`WireFormat.socket`).

In OpenAI's WebSocket mode the client opens a socket to `/v1/responses` and starts each response with a text
message `{"type": "response.create", ...}` holding the top-level fields of a `POST /v1/responses` body (`stream` is
implicit, `background` unsupported; a `stream_id` names a lane whose responses are processed in order). The server
answers with the events a streamed response sends over SSE, one JSON text message each, ending with
`response.completed` (or `response.incomplete`, `response.failed`), or with an `error` event
(`{"type": "error", "status": 400, "error": {...}}`) when it refused the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from proxy.formats.responses.answers import FINAL_EVENTS, answer
from proxy.pipeline.exchange import Refusal, UpstreamOutcome

CREATE: Final = "response.create"
"""The client event that starts a response."""

FAILED: Final = "response.failed"
ERROR: Final = "error"

_ENDINGS: Final = tuple(f'"{name}"'.encode() for name in (*FINAL_EVENTS, FAILED, ERROR))
"""What a message that ends a response contains: looked for before parsing, so deltas are not parsed."""


class ResponsesSocket:
    """The Responses API's WebSocket mode (see `proxy.pipeline.wire.SocketMode` for what each member means)."""

    def request_of(self, message: bytes) -> tuple[str | None, bytes] | None:
        """A `response.create` message's lane and request body (every field but `type`), or None for another.

        None too for a create nested deeper than the proxy's JSON writer writes (254 levels; its parser reads more):
        the message is then forwarded untouched, as such a body is over HTTP.
        """
        event = _event(message)
        if event is None or event.get("type") != CREATE:
            return None
        try:
            body = orjson.dumps({key: value for key, value in event.items() if key != "type"})
        except orjson.JSONEncodeError:
            return None
        return _lane(event), body

    def message_of(self, body: bytes) -> bytes:
        """A `response.create` message carrying `body` (a JSON object), spliced without parsing it again."""
        return create_message(body)

    def refusal_message(self, refusal: Refusal) -> bytes:
        """The `error` event that answers a `response.create` the proxy will not forward."""
        return refusal_event(refusal)

    def ending(self, message: bytes) -> tuple[str | None, UpstreamOutcome] | None:
        """The lane and outcome of a message that ends a response, as an HTTP answer would report them, else None."""
        if not any(marker in message for marker in _ENDINGS):
            return None
        event = _event(message)
        outcome = _outcome(event) if event is not None else None
        return (_lane(event), outcome) if event is not None and outcome is not None else None


def create_message(body: bytes) -> bytes:
    """A `response.create` message carrying `body` (a JSON object), spliced without parsing it again."""
    inner = body.strip()[1:]
    separator = b"" if inner.lstrip().startswith(b"}") else b","
    return b'{"type":"' + CREATE.encode() + b'"' + separator + inner


def refusal_event(refusal: Refusal) -> bytes:
    """The `error` event that answers a `response.create` the proxy will not forward."""
    error = {"type": "invalid_request_error", "code": refusal.code, "message": refusal.message, "param": refusal.param}
    return orjson.dumps({"type": ERROR, "status": refusal.status, "error": error})


def _event(message: bytes) -> dict[str, Any] | None:
    """The JSON object a text message holds, or None."""
    try:
        event = orjson.loads(message)
    except orjson.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


def _lane(event: Mapping[str, Any]) -> str | None:
    """The lane (`stream_id`) an event belongs to; None for the socket's default one."""
    lane = event.get("stream_id")
    return lane if isinstance(lane, str) else None


def _outcome(event: Mapping[str, Any]) -> UpstreamOutcome | None:
    """What an event that ends a response reported, as an HTTP answer would; None for any other event."""
    kind = event.get("type")
    response = event.get("response")
    if kind in FINAL_EVENTS and isinstance(response, Mapping):
        usage, reply, response_id = answer(response)
        return UpstreamOutcome(200, usage, reply, response_id=response_id)
    if kind == FAILED and isinstance(response, Mapping):
        error = response.get("error")
        return UpstreamOutcome(status=500, error_body={"error": error} if isinstance(error, Mapping) else None)
    if kind == ERROR and isinstance(event.get("error"), Mapping):
        status = event.get("status")
        if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status < 600:
            status = 400
        return UpstreamOutcome(status=status, error_body={"error": event["error"]})
    return None
