"""The catch-all route: everything that is not a chat completion is forwarded as-is, streamed both ways."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web
from yarl import URL

from proxy.formats import counting_format, format_of
from proxy.server import errors
from proxy.server.body import CLIENT_TIMEOUT, client_chunks
from proxy.server.compacted_route import handle_compacted
from proxy.server.headers import upstream_request_headers
from proxy.server.keys import RECORD, ROUTE, SETTINGS
from proxy.server.record import RequestRecord
from proxy.server.relay import relay_as_it_came
from proxy.server.routes import is_websocket_upgrade, safe_raw_path, socket_format
from proxy.server.routing import take_route
from proxy.server.upstream import UpstreamError, UpstreamTimeout
from proxy.server.websocket import tunnel


class _BodyTooLarge(Exception):
    """The client's streamed body passed `max_body_bytes`."""


async def _client_body(
    request: web.Request, limit: int, pause_limit: float, record: RequestRecord
) -> AsyncIterator[bytes]:
    """Yield the client's body as it arrives, counting it and stopping at `limit` or when it stalls."""
    async for chunk in client_chunks(request, pause_limit):
        record.bytes_in += len(chunk)
        if record.bytes_in > limit:
            raise _BodyTooLarge
        yield chunk


def upstream_error_response(request: web.Request, exc: UpstreamError) -> web.Response:
    """Record a transport failure before any response was sent, and answer 502 or 504 in the API's error shape."""
    request[RECORD].error = exc.kind
    if isinstance(exc, UpstreamTimeout):
        return errors.upstream_timeout(str(exc), errors.shape_of(request))
    return errors.upstream_unreachable(str(exc), errors.shape_of(request))


async def proxy_request(request: web.Request) -> web.StreamResponse:
    """Handle any request: refuse unsafe paths, tunnel upgrades, hand what compaction sees to `handle_compacted`."""
    raw_path = safe_raw_path(request.rel_url.raw_path)
    if raw_path is None:
        request[RECORD].error = "bad_path"
        return errors.bad_path(errors.shape_of(request))
    wire = format_of(request.method, request.path)
    if wire is not None:
        return await handle_compacted(request, raw_path, wire)
    counted = counting_format(request.method, request.path)
    if counted is not None:
        return await handle_compacted(request, raw_path, counted, counting=True)
    target = await take_route(request, raw_path)
    if is_websocket_upgrade(request.method, request.headers.get("Upgrade")):
        try:
            return await tunnel(request, target, socket_format(request.path))
        except UpstreamError as exc:
            return upstream_error_response(request, exc)
    return await forward(request, target)


async def forward(request: web.Request, target: URL) -> web.StreamResponse:
    """Forward the request unchanged to `target` and relay the answer unchanged.

    A body that arrived whole with the request's head is sent as it is; one still arriving is streamed through.
    """
    settings = request.app[SETTINGS]
    record = request[RECORD]
    limit = settings.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        return _too_large(request, limit)
    body: bytes | AsyncIterator[bytes] | None = None
    if request.body_exists:
        body = request.content.read_nowait() if request.content.is_eof() else None
        if body:
            record.bytes_in = len(body)
            if record.bytes_in > limit:
                return _too_large(request, limit)
        else:
            body = _client_body(request, limit, settings.client_body_timeout, record)
    try:
        async with request[ROUTE].upstream.request(
            request.method, target, upstream_request_headers(request.headers), body, record=record
        ) as response:
            refused = _body_refused(request, limit)
            if refused is not None:
                return refused
            return await relay_as_it_came(request, response)
    except UpstreamError as exc:
        refused = _body_refused(request, limit)
        return refused if refused is not None else upstream_error_response(request, exc)


def _body_refused(request: web.Request, limit: int) -> web.Response | None:
    """The answer to a streamed body that stalled or outgrew `limit` while it was sent; None when it did neither."""
    if request[RECORD].error == CLIENT_TIMEOUT:
        return errors.client_timeout(request.app[SETTINGS].client_body_timeout, errors.shape_of(request))
    if request[RECORD].bytes_in > limit:
        return _too_large(request, limit)
    return None


def _too_large(request: web.Request, limit: int) -> web.Response:
    """Record and answer a body over `limit` bytes."""
    request[RECORD].error = "too_large"
    return errors.too_large(limit, errors.shape_of(request))
