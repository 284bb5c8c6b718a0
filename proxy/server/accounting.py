"""The outermost middleware: one access-log line and the metrics per request; no traceback ever reaches a client.

A handler that raises before answering gets an OpenAI-style 500. One that raises after its response was started (the
relay records the status it sent) cannot answer again: a second response would be written into the body of the
first. The client connection is cut instead, so the client sees a broken response, never a clean end.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.config import Settings
from proxy.formats import format_of
from proxy.pipeline.caller import conversation_of
from proxy.server.errors import internal_error, shape_of
from proxy.server.keys import METRICS, RECORD, SETTINGS
from proxy.server.log_formats import REQUEST_ID
from proxy.server.logging import ACCESS_LOGGER, SERVER_LOGGER, log_fields
from proxy.server.record import RequestRecord
from proxy.server.relay import abort
from proxy.server.routes import RouteKind, route_kind
from proxy.server.tracing import trace_request

access_log = logging.getLogger(ACCESS_LOGGER)
server_log = logging.getLogger(SERVER_LOGGER)

INTERNAL = RouteKind.INTERNAL.value
"""The route kind of the proxy's own endpoints, whose access lines are DEBUG (probes every few seconds)."""

MAX_CONVERSATION_ID = 200
"""Longest conversation id logged (characters); the rest is cut."""

CLIENT_CLOSED = 499
"""Status recorded when the client went away before any response was sent (nginx's convention)."""


def _conversation_id(request: web.Request, settings: Settings) -> str | None:
    """The conversation the request names (`conversation_of`), cut to `MAX_CONVERSATION_ID` printable characters."""
    headers = request.headers
    wire = format_of(request.method, request.path)
    named = wire.conversation_headers if wire is not None else ()
    if settings.conversation_header not in headers and not any(name in headers for name in named):
        return None  # most requests name none: no need to look through every header for one
    value = conversation_of(headers, settings, wire)
    if value is None:
        return None
    return "".join(char for char in value[:MAX_CONVERSATION_ID] if char.isprintable())


@web.middleware
async def accounting(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Create the request's `RequestRecord`, run the handler, then log one line and update the metrics."""
    settings = request.app[SETTINGS]
    metrics = request.app[METRICS]
    record = RequestRecord(
        method=request.method,
        route=route_kind(request.method, request.path),
        conversation_id=_conversation_id(request, settings),
    )
    request[RECORD] = record
    named = REQUEST_ID.set(record.request_id)
    metrics.in_flight.add((), 1)
    try:
        response = await handler(request)
        record.status = response.status
        record.bytes_out += _unsent_body_bytes(response)
        return response
    except web.HTTPException as exc:
        record.status = exc.status
        raise
    except asyncio.CancelledError:
        if record.status is None:
            record.status = CLIENT_CLOSED
        record.client_disconnected = not record.answered
        raise
    except Exception:
        record.error = record.error or "internal"
        if record.status is not None:
            server_log.exception(
                "unhandled error in the proxy mid-response; the client connection was cut",
                extra={"fields": {"route": record.route}},
            )
            abort(request)
            return web.Response(status=record.status)  # never sent: the connection is already closing
        server_log.exception("unhandled error in the proxy", extra={"fields": {"route": record.route}})
        record.status = 500
        response = internal_error(shape_of(request))
        record.bytes_out += _unsent_body_bytes(response)
        return response
    finally:
        metrics.in_flight.add((), -1)
        _account(request, record)
        trace_request(request, record)
        REQUEST_ID.reset(named)


def _unsent_body_bytes(response: web.StreamResponse) -> int:
    """The body of a response the proxy answers itself (an error, a probe), which aiohttp sends after the handler.

    A relayed response was written chunk by chunk, and counted as it went (`proxy.server.relay.write`).
    """
    if isinstance(response, web.Response) and not response.prepared and isinstance(response.body, bytes):
        return len(response.body)
    return 0


def _account(request: web.Request, record: RequestRecord) -> None:
    """Count the finished request in the metrics and write its access line (when that level is logged at all)."""
    elapsed = record.elapsed()
    request.app[METRICS].answered(record, elapsed)
    level = logging.DEBUG if record.route == INTERNAL else logging.INFO
    if access_log.isEnabledFor(level):
        log_fields(access_log, level, "request", record.access_fields(request.rel_url.raw_path, elapsed))
