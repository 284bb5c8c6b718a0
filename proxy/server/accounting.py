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
from proxy.pipeline.labelled import labelled
from proxy.server.errors import internal_error, shape_of
from proxy.server.keys import METRICS, RECORD, SETTINGS
from proxy.server.logging import ACCESS_LOGGER, REQUEST_ID, SERVER_LOGGER
from proxy.server.record import RequestRecord
from proxy.server.relay import abort
from proxy.server.routes import RouteKind, route_kind
from proxy.server.tracing import trace_request

access_log = logging.getLogger(ACCESS_LOGGER)
server_log = logging.getLogger(SERVER_LOGGER)

MAX_CONVERSATION_ID = 200
"""Longest conversation id logged (characters); the rest is cut."""

CLIENT_CLOSED = 499
"""Status recorded when the client went away before any response was sent (nginx's convention)."""


def _conversation_id(request: web.Request, settings: Settings) -> str | None:
    """The conversation the request names (`conversation_of`), cut to `MAX_CONVERSATION_ID` printable characters."""
    value = conversation_of(request.headers, settings, format_of(request.method, request.path))
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
    metrics.in_flight.inc()
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
        metrics.in_flight.dec()
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
    metrics = request.app[METRICS]
    elapsed = record.elapsed()
    route = record.route
    labelled(metrics.requests, route, str(record.status)).inc()
    labelled(metrics.request_duration, route).observe(elapsed)
    if record.upstream_latency is not None:
        labelled(metrics.upstream_latency, route).observe(record.upstream_latency)
    if record.upstream is not None:
        status = str(record.upstream_status) if record.upstream_status is not None else "none"
        labelled(metrics.routed, record.upstream, route, status).inc()
    if record.compaction is not None:
        labelled(metrics.decisions, route, record.compaction).inc()
    if record.window_source is not None:
        labelled(metrics.window_sources, record.window_source).inc()
    if record.error in ("unreachable", "timeout", "broken_stream"):
        labelled(metrics.upstream_errors, record.error).inc()
    fields = {
        "method": record.method,
        "path": request.rel_url.raw_path,
        "route": route,
        "upstream": record.upstream,
        "status": record.status,
        "upstream_status": record.upstream_status,
        "latency_ms": round(elapsed * 1000, 1),
        "upstream_latency_ms": None if record.upstream_latency is None else round(record.upstream_latency * 1000, 1),
        "bytes_in": record.bytes_in,
        "bytes_out": record.bytes_out,
        "conversation_id": record.conversation_id,
        "model": record.model,
        "compaction": record.compaction,
        "tokens_before": record.tokens_before,
        "tokens_after": record.tokens_after,
        "conversation_hash": record.conversation_hash,
        "cache_misses": None if record.cache_misses is None else record.cache_misses.shown() or "none",
        "retried": record.retried or None,
        "stripped_usage": record.stripped_usage or None,
        "fail_open": ",".join(record.fail_open) or None,
        "client_disconnected": record.client_disconnected or None,
        "error": record.error,
    }
    level = logging.DEBUG if record.route == RouteKind.INTERNAL else logging.INFO
    access_log.log(
        level, "request", extra={"fields": {key: value for key, value in fields.items() if value is not None}}
    )
