"""The fake upstream's WebSockets: the Responses API's WebSocket mode on `/v1/responses`, and an echo.

WebSocket mode as OpenAI documents it (the "WebSocket mode" guide and the `websocket-events` reference):

- The client sends `response.create` text messages: `type`, the top-level fields of a create request, and the
  WebSocket-only `stream_id` (a lane, echoed on every event of its responses) and `generate` (`false` prepares the
  request's state: a response with no output, which the next request continues with `previous_response_id`).
  `stream` is implicit (accepted and ignored); `background` is not supported over WebSocket.
- The server answers with the events a streamed response sends (`proxy.simulator.responses_stream`), one JSON text
  message each, in order, one response at a time; a refused request gets one `error` event,
  `{"type": "error", "status": 400, "error": {...}}` with the error body HTTP would send, and the socket stays open.
- `previous_response_id` may name the socket's most recent response even with `store: false` (its
  connection-local cache); any other must be stored, else `previous_response_not_found`.
- A message that is not a JSON `response.create` gets an `error` event.

Each create is recorded in `upstream.requests` as an HTTP one is (method `WEBSOCKET`, the socket's path and headers,
the body without the WebSocket-only fields), so `responses_requests` lists it.

The echo (`/echo/...` upgraded) sends every text and binary message back as it came, answers pings (aiohttp does),
closes with code N and reason R when sent the text `close N R`, and sends N bytes when sent `send N`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import WSMsgType, web
from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy

from proxy.simulator.openai_common import OpenAIError
from proxy.simulator.openai_tokens import encoding_name_for_model
from proxy.simulator.responses_server import ResponsesService
from proxy.simulator.responses_stream import response_events

__all__ = ["ECHO_PROTOCOL", "SocketRecord", "echo_socket", "is_upgrade", "recorded_fields", "responses_socket"]

WEBSOCKET_ONLY: Final = ("stream_id", "generate", "client_metadata")
"""Fields of `response.create` that are not part of `POST /v1/responses`: the documented `stream_id` and `generate`,
and `client_metadata` (Codex CLI's trace context, which OpenAI's socket accepts; not in the public reference)."""

ECHO_PROTOCOL: Final = "echo.v1"
"""The subprotocol the echo socket speaks."""

SocketRecord = Callable[[web.Request, bytes, dict[str, Any]], None]
"""Records one create message: the upgrade request, the message, the create body."""


def is_upgrade(request: web.Request) -> bool:
    """Whether `request` asks for a WebSocket."""
    return request.headers.get("Upgrade", "").lower() == "websocket"


async def responses_socket(
    request: web.Request,
    service: ResponsesService,
    record: SocketRecord,
    usages: list[dict[str, Any]],
    tokens_per_delta: int,
) -> web.WebSocketResponse:
    """Serve one Responses WebSocket until the client closes it (see the module docstring)."""
    socket = web.WebSocketResponse(max_msg_size=0)
    await socket.prepare(request)
    session = _Session(request, service, record, usages, tokens_per_delta)
    async for message in socket:
        if message.type is not WSMsgType.TEXT:
            continue
        try:
            event = json.loads(message.data)
        except ValueError:
            event = None
        lane = event.get("stream_id") if isinstance(event, dict) else None
        try:
            events = session.answer(event)
        except OpenAIError as error:
            events = [{"type": "error", "status": error.status, **error.body}]
        for sent in events:
            await socket.send_str(json.dumps({**sent, "stream_id": lane} if lane else sent, separators=(",", ":")))
    return socket


@dataclass
class _Session:
    """One socket's state: its connection-local cache of the most recent response."""

    request: web.Request
    service: ResponsesService
    record: SocketRecord
    usages: list[dict[str, Any]]
    tokens_per_delta: int
    cache: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def answer(self, event: Any) -> list[dict[str, Any]]:
        """The events answering one client message."""
        if not isinstance(event, dict) or event.get("type") != "response.create":
            kind = event.get("type") if isinstance(event, dict) else None
            raise OpenAIError(f"Invalid event type {kind!r}: a client sends 'response.create'.", param="type")
        body = {key: value for key, value in event.items() if key not in ("type", *WEBSOCKET_ONLY)}
        self.record(self.request, json.dumps(event).encode(), body)
        if body.get("background"):
            raise OpenAIError("background is not supported over WebSocket.", param="background")
        body.pop("stream", None)
        response_id = self.service.new_response_id()
        generate = event.get("generate") is not False
        response = self.service.create(body, response_id, {}, socket=self.cache, generate=generate)
        self.usages.append(response["usage"])
        return response_events(response, encoding_name_for_model(str(body["model"])), self.tokens_per_delta)


async def echo_socket(request: web.Request, closed: Callable[[int | None], None]) -> web.WebSocketResponse:
    """Echo every message back; `close N R` closes with code N and reason R, `send N` sends N bytes.

    Offers the subprotocol `echo.v1`.

    :param closed: Called with the socket's close code once it is closed (the client's, or the one sent).
    """
    socket = web.WebSocketResponse(max_msg_size=0, protocols=(ECHO_PROTOCOL,))
    await socket.prepare(request)
    async for message in socket:
        if message.type is WSMsgType.TEXT and message.data.startswith("close "):
            _, code, reason = message.data.split(" ", 2)
            await socket.close(code=int(code), message=reason.encode())
        elif message.type is WSMsgType.TEXT and message.data.startswith("send "):
            await socket.send_bytes(b"x" * int(message.data.split(" ")[1]))
        elif message.type is WSMsgType.TEXT:
            await socket.send_str(message.data)
        elif message.type is WSMsgType.BINARY:
            await socket.send_bytes(message.data)
    closed(socket.close_code)
    return socket


def recorded_fields(request: web.Request, message: bytes, body: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a `RecordedRequest` for one create message on `request`'s socket."""
    return {
        "method": "WEBSOCKET",
        "path": request.path,
        "raw_path": request.rel_url.raw_path,
        "query_string": request.query_string,
        "query": MultiDictProxy(MultiDict(request.query)),
        "headers": CIMultiDictProxy(CIMultiDict(request.headers)),
        "body": message,
        "json": dict(body),
    }
