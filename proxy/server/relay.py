"""Relaying an upstream response to the client as it arrives: status, end-to-end headers, raw body bytes."""

from __future__ import annotations

import logging
from collections.abc import Callable

import aiohttp
from aiohttp import web

from proxy.pipeline.wire import WireFormat
from proxy.server.headers import client_response_headers
from proxy.server.keys import RECORD, ROUTE
from proxy.server.logging import SERVER_LOGGER
from proxy.server.upstream import UpstreamError

log = logging.getLogger(SERVER_LOGGER)

Transform = Callable[[bytes], bytes]
"""Takes a chunk from the upstream, returns the bytes to relay for it (the same bytes unless editing)."""


def arrived_whole(response: aiohttp.ClientResponse, head: bytes = b"") -> bytes | None:
    """The answer's whole body when all of it has arrived (its `Content-Length`), else None (nothing read then).

    Most non-streamed answers come in one piece: their body is in the client's buffer by the time the head is parsed.
    Relayed with `answer_whole`, the client gets such an answer in one write instead of a head, a body and an end.

    :param head: What was read of the body already (by a hold, say): the rest is taken from the buffer after it.
    """
    length = response.content_length
    content = response.content
    if length is None or not content.is_eof() or content.exception() is not None or content.total_bytes != length:
        return None
    return head + content.read_nowait() if head else content.read_nowait()


async def answer_whole(
    request: web.Request,
    response: aiohttp.ClientResponse,
    body: bytes,
    *,
    extra_headers: dict[str, str] | None = None,
) -> web.StreamResponse:
    """Relay an answer whose whole `body` was read (`arrived_whole`): its status, headers and body in one write.

    The client gets what `start_response`, `write` and `finish` would have sent it, recorded the same way.
    """
    headers = client_response_headers(response.headers, extra=extra_headers)
    out = web.Response(body=body, status=response.status, reason=response.reason, headers=headers)
    await out.prepare(request)  # a `web.Response` sends its head with its body, at the end
    record = request[RECORD]
    record.status = response.status
    if await finish(request, out):
        record.bytes_out += len(body)
    return out


async def relay_as_it_came(
    request: web.Request,
    response: aiohttp.ClientResponse,
    head: bytes = b"",
    *,
    extra_headers: dict[str, str] | None = None,
) -> web.StreamResponse:
    """Relay the answer unchanged: in one write when it arrived whole with its head, else as it arrives.

    :param head: The body's first bytes, when they were read already: they go first.
    """
    whole = arrived_whole(response, head)
    if whole is not None:
        return await answer_whole(request, response, whole, extra_headers=extra_headers)
    out = await start_response(request, response, extra_headers=extra_headers)
    if (not head or await write(request, out, head)) and await pump(request, out, response):
        await finish(request, out)
    return out


async def start_response(
    request: web.Request,
    response: aiohttp.ClientResponse,
    *,
    extra_headers: dict[str, str] | None = None,
    drop_length: bool = False,
) -> web.StreamResponse:
    """Send the client the upstream's status line and headers (minus hop-by-hop, plus `extra_headers`).

    Records the status: from then on the request's response is under way (see `proxy.server.accounting`).
    """
    out = web.StreamResponse(
        status=response.status,
        reason=response.reason,
        headers=client_response_headers(response.headers, extra=extra_headers, drop_length=drop_length),
    )
    await out.prepare(request)
    request[RECORD].status = response.status
    return out


class ClientReply:
    """The response to the client, started at most once: early by a held stream, else when the answer is relayed.

    See `proxy.server.held_stream` for when a stream's status and headers go out before its answer is decided.

    :param wire: The request's wire format: what an error told inside the stream looks like.
    """

    def __init__(self, request: web.Request, wire: WireFormat) -> None:
        self.request = request
        self.wire = wire
        self.out: web.StreamResponse | None = None

    async def start(
        self,
        response: aiohttp.ClientResponse,
        *,
        extra_headers: dict[str, str] | None = None,
        drop_length: bool = False,
    ) -> web.StreamResponse:
        """The client's response: started with `response`'s status and headers unless it was already."""
        if self.out is None:
            self.out = await start_response(
                self.request, response, extra_headers=extra_headers, drop_length=drop_length
            )
        return self.out


async def write(request: web.Request, out: web.StreamResponse, data: bytes) -> bool:
    """Write bytes to the client; False (and recorded) when the client has gone away."""
    record = request[RECORD]
    try:
        await out.write(data)
    except ConnectionError:
        record.client_disconnected = True
        return False
    record.bytes_out += len(data)
    return True


def abort(request: web.Request) -> None:
    """Cut the client connection: a relayed body broke off mid-way, and a clean end would pass it off as whole."""
    transport = request.transport
    if transport is not None:
        transport.abort()


async def pump(
    request: web.Request,
    out: web.StreamResponse,
    response: aiohttp.ClientResponse,
    transform: Transform | None = None,
) -> bool:
    """Copy the upstream body to the client chunk by chunk, never holding more than one chunk.

    A streamed answer passes here once per event: a chunk costs its read, its transform and its write, no more.

    :returns: True when the whole body was relayed; False when the client went away (the upstream response is then
        closed by its context manager) or the upstream broke off (the client connection is then aborted).
    """
    upstream = request[ROUTE].upstream
    record = request[RECORD]
    while True:
        try:
            chunk = await upstream.read_chunk(response)
        except UpstreamError as exc:
            record.error = "broken_stream" if exc.kind == "unreachable" else exc.kind
            log.warning(
                "upstream response broke off mid-body",
                extra={"fields": {"error": str(exc), "route": record.route}},
            )
            abort(request)
            return False
        if not chunk:
            return True
        data = transform(chunk) if transform is not None else chunk
        if data and not await write(request, out, data):
            return False


async def finish(request: web.Request, out: web.StreamResponse) -> bool:
    """End the response (terminating chunk); False when the client has gone away."""
    try:
        await out.write_eof()
    except ConnectionError:
        request[RECORD].client_disconnected = True
        return False
    request[RECORD].answered = True
    return True
