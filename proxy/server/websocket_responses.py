"""The Responses API's WebSocket mode: every `response.create` message goes through compaction, as a POST does.

In OpenAI's WebSocket mode the client opens a socket to `/v1/responses` and starts each response with a text
message `{"type": "response.create", ...}` holding the top-level fields of a `POST /v1/responses` body (`stream` is
implicit, `background` unsupported; a `stream_id` names a lane whose responses are processed in order). The server
answers with the events a streamed response sends over SSE, one JSON text message each, ending with
`response.completed` (or `response.incomplete`, `response.failed`), or with an `error` event
(`{"type": "error", "status": 400, "error": {...}}`) when it refused the request.

Here each `response.create` is read as the body of a Responses request (every field but `type`), planned by the
compaction side exactly as an HTTP one (`proxy.server.chat`: the same fail-open and counting), and forwarded as a
`response.create` with the plan's body; when nothing changed, the client's own message goes, byte for byte. The
events coming back are relayed untouched; the one that ends each response is read for its usage and reply, which
are reported to the compaction side as for a stream over HTTP, before the client's next `response.create` is
planned. A request over the proxy's limits is answered with an `error` event and not forwarded. Every other message
passes untouched, and so does a `response.create` whenever reading or planning it fails.

Not done inside a socket: offloading (the proxy cannot answer its read tool's calls there, so a socket's requests are
planned with `X-Compaction-Offload: off`: plain pruning), the overflow retry (the refusal reaches the client, whose
next request is estimated with what the refusal taught), and the report headers (a message has none).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy.formats.responses.answers import FINAL_EVENTS
from proxy.formats.responses.wire import RESPONSES
from proxy.pipeline.exchange import ChatOutcome, ForwardPlan, Refusal
from proxy.pipeline.off_loop import OFF_LOOP_BYTES
from proxy.pipeline.offload.offloading import OFFLOAD_HEADER
from proxy.pipeline.wire import WireFormat
from proxy.server.chat import _complete, _prepare
from proxy.server.keys import RECORD
from proxy.server.logging import ACCESS_LOGGER

access_log = logging.getLogger(ACCESS_LOGGER)

CREATE: Final = "response.create"
"""The client event that starts a response."""

FAILED: Final = "response.failed"
ERROR: Final = "error"

_ENDINGS: Final = tuple(f'"{name}"'.encode() for name in (*FINAL_EVENTS, FAILED, ERROR))
"""What a message that ends a response contains: looked for before parsing, so deltas are not parsed."""


@dataclass(frozen=True)
class Turn:
    """What to do with one client message.

    :param upstream: The message to forward upstream; None to forward nothing.
    :param client: A message to answer the client with (an `error` event), or None.
    """

    upstream: bytes | None
    client: bytes | None = None


class ResponsesTurns:
    """The compaction side's part in one Responses WebSocket (see the module docstring).

    :param request: The upgrade request: its headers (the credentials, the proxy's own controls) and path are those
        of every message on the socket.
    :param wire: The format of the requests its messages carry.
    """

    def __init__(self, request: web.Request, wire: WireFormat) -> None:
        self.request = request
        self.wire = wire
        self.headers: CIMultiDict[str] = CIMultiDict(request.headers)
        self.headers[OFFLOAD_HEADER] = "off"
        self.pending: defaultdict[str | None, deque[ForwardPlan | None]] = defaultdict(deque)
        self.reporting: asyncio.Task[None] | None = None

    async def outgoing(self, message: bytes) -> Turn:
        """Plan one client message: a `response.create` as its plan says, anything else as it came."""
        read = await asyncio.to_thread(_create, message) if len(message) >= OFF_LOOP_BYTES else _create(message)
        if read is None:
            return Turn(message)
        event, body = read
        await self.settled()  # the previous answer's usage anchors this request's estimate
        plan = await _prepare(self.request, body, self.wire, self.headers)
        if isinstance(plan, Refusal):
            self._log(None, refused=plan.code)
            return Turn(None, client=refusal_event(plan))
        usable = plan is not None and plan.reads is None and plan.body.lstrip().startswith(b"{")
        self.pending[_lane(event)].append(plan if usable else None)
        self._log(plan if usable else None)
        if plan is None or not usable or plan.body == body:
            return Turn(message)
        return Turn(create_message(plan.body))

    def incoming(self, message: bytes) -> None:
        """Read one upstream message before it is relayed; report the response it ends, if it ends one."""
        if not any(ending in message for ending in _ENDINGS):
            return
        event = _event(message)
        outcome = _outcome(event) if event is not None else None
        lane = self.pending.get(_lane(event)) if event is not None else None
        if outcome is None or not lane:
            return
        plan = lane.popleft()
        if plan is not None:
            self.reporting = asyncio.create_task(self._report(self.reporting, plan, outcome))

    async def settled(self) -> None:
        """Wait until every answer read so far has been reported."""
        if self.reporting is not None:
            await self.reporting

    async def _report(self, before: asyncio.Task[None] | None, plan: ForwardPlan, outcome: ChatOutcome) -> None:
        """Report `outcome` after the reports before it; a retry plan is not followed inside a socket."""
        if before is not None:
            await before
        await _complete(self.request, plan, outcome)

    def _log(self, plan: ForwardPlan | None, refused: str | None = None) -> None:
        """One access-log line per `response.create`: what compaction did with it (never its content)."""
        record = self.request[RECORD]
        fields = {
            "path": self.request.rel_url.raw_path,
            "message": CREATE,
            "model": record.model if plan is not None else None,
            "compaction": record.compaction if plan is not None else None,
            "tokens_before": record.tokens_before if plan is not None else None,
            "tokens_after": record.tokens_after if plan is not None else None,
            "forwarded": "unchanged" if plan is None else None,
            "error": refused,
        }
        access_log.info("websocket message", extra={"fields": {k: v for k, v in fields.items() if v is not None}})


def create_message(body: bytes) -> bytes:
    """A `response.create` message carrying `body` (a JSON object), spliced without parsing it again."""
    inner = body.strip()[1:]
    separator = b"" if inner.lstrip().startswith(b"}") else b","
    return b'{"type":"' + CREATE.encode() + b'"' + separator + inner


def refusal_event(refusal: Refusal) -> bytes:
    """The `error` event that answers a `response.create` the proxy will not forward."""
    error = {"type": "invalid_request_error", "code": refusal.code, "message": refusal.message, "param": refusal.param}
    return orjson.dumps({"type": ERROR, "status": refusal.status, "error": error})


def _create(message: bytes) -> tuple[dict[str, Any], bytes] | None:
    """A `response.create` message's event and its request body (every field but `type`), or None for another."""
    event = _event(message)
    if event is None or event.get("type") != CREATE:
        return None
    return event, orjson.dumps({key: value for key, value in event.items() if key != "type"})


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


def _outcome(event: Mapping[str, Any]) -> ChatOutcome | None:
    """What an event that ends a response reported, as an HTTP answer would; None for any other event."""
    kind = event.get("type")
    response = event.get("response")
    if kind in FINAL_EVENTS and isinstance(response, Mapping):
        usage, reply, response_id = RESPONSES.answer(response)
        return ChatOutcome(200, usage, reply, response_id=response_id)
    if kind == FAILED and isinstance(response, Mapping):
        error = response.get("error")
        return ChatOutcome(status=500, error_body={"error": error} if isinstance(error, Mapping) else None)
    if kind == ERROR and isinstance(event.get("error"), Mapping):
        status = event.get("status")
        if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status < 600:
            status = 400
        return ChatOutcome(status=status, error_body={"error": event["error"]})
    return None
