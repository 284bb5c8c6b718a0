"""The route of every compacted endpoint (a POST of a wire format the proxy compacts): plan, relay, report.

The request is read whole (bounded), the pipeline (`Compaction`) decides what to forward, the answer is relayed as it
arrives, and what the upstream reported (usage, the reply, errors) goes back to `complete()` so the next request
can be estimated.

Fail open everywhere: if the compaction side raises, the client's own bytes are forwarded and the answer relayed
untouched. A gzip- or deflate-encoded request body is decompressed (bounded) and handled like any other, then
forwarded uncompressed; one that cannot be decompressed is refused clearly (see `proxy.server.content_coding`). A
request over the compaction side's limits is refused with its `Refusal`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Mapping
from functools import partial

import aiohttp
import orjson
from aiohttp import web
from yarl import URL

from proxy.pipeline.exchange import ForwardPlan, Refusal, UpstreamOutcome
from proxy.pipeline.off_loop import OFF_LOOP_BYTES
from proxy.pipeline.wire import WireFormat
from proxy.server import errors
from proxy.server.body import ClientBodyTimeout, client_chunks
from proxy.server.coding_errors import ContentCodingError, UnsupportedCoding
from proxy.server.content_coding import inflate
from proxy.server.decoding import DECODABLE, Collector, DecodingObserver, outcome_from_body
from proxy.server.headers import content_encoding, upstream_request_headers, with_list_values
from proxy.server.held_stream import (
    ERROR_BODY_LIMIT,
    Held,
    end_with_error,
    hold_response,
    read_capped,
    relay_failure,
)
from proxy.server.keys import METRICS, RECORD, ROUTE, SETTINGS
from proxy.server.logging import SERVER_LOGGER
from proxy.server.offload_reads import answer_reads
from proxy.server.offload_streams import EditedStream, StreamEdits
from proxy.server.pipeline_calls import complete, prepare, prepare_count
from proxy.server.relay import (
    ClientReply,
    Transform,
    answer_whole,
    arrived_whole,
    finish,
    pump,
    relay_as_it_came,
    write,
)
from proxy.server.routing import take_route
from proxy.server.sse import StopReason, StreamObserver
from proxy.server.upstream import UpstreamError, UpstreamTimeout

log = logging.getLogger(SERVER_LOGGER)


async def read_body(request: web.Request, limit: int, pause_limit: float) -> bytes | None:
    """Read the whole request body, or return None as soon as it is known to exceed `limit` bytes.

    :raises ClientBodyTimeout: The client paused more than `pause_limit` seconds between two pieces of its body.
    """
    if request.content_length is not None and request.content_length > limit:
        return None
    if request.content.is_eof():  # the whole body arrived with the head: taken from the buffer as it is
        whole = request.content.read_nowait()
        return whole if len(whole) <= limit else None
    chunks: list[bytes] = []
    size = 0
    async for chunk in client_chunks(request, pause_limit):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def handle_compacted(
    request: web.Request, raw_path: str, wire: WireFormat, *, counting: bool = False
) -> web.StreamResponse:
    """Handle one request of a wire format the proxy compacts (see the module docstring).

    Its route is taken once its body is read (and decoded): a route may choose by the model the body names.

    :param counting: The request is for the format's prompt-counting endpoint: it is sent as the compaction side
        shapes it (`prepare_count`), and its answer relayed as it comes.
    """
    settings = request.app[SETTINGS]
    record = request[RECORD]
    try:
        body = await read_body(request, settings.max_body_bytes, settings.client_body_timeout)
    except ClientBodyTimeout:
        return errors.client_timeout(settings.client_body_timeout, wire.error_body)
    if body is None:
        record.error = "too_large"
        return errors.too_large(settings.max_body_bytes, wire.error_body)
    record.bytes_in = len(body)
    coding, undecoded = content_encoding(request.headers), None
    if coding != "identity":
        try:
            body = await _inflated(body, coding, settings.max_body_bytes, settings.max_gzip_members)
        except UnsupportedCoding as unsupported:
            undecoded = str(unsupported)
        except ContentCodingError as refused:
            record.error = refused.code
            request.app[METRICS].content_coding_refusals.labels(code=refused.code).inc()
            return refused.response(wire.error_body)
    target = await take_route(request, raw_path, None if undecoded else body, wire)
    if undecoded:
        plan = None
    else:
        plan = await prepare_count(request, body, wire) if counting else await prepare(request, body, wire)
    if isinstance(plan, Refusal):
        record.error = plan.code
        error = wire.error_body(plan.message, "invalid_request_error", plan.code, plan.param)
        return web.Response(body=error, status=plan.status, content_type="application/json")
    reply = ClientReply(request, wire)
    try:
        if plan is None:
            return await _forward_unplanned(request, target, body, undecoded=undecoded)
        if counting:
            return await _forward_unplanned(request, target, plan.body, plan.header_values)
        return await _forward_planned(request, target, plan, reply)
    except UpstreamError as exc:
        record.error = exc.kind
        failed = (
            errors.upstream_timeout(str(exc), wire.error_body)
            if isinstance(exc, UpstreamTimeout)
            else errors.upstream_unreachable(str(exc), wire.error_body)
        )
        if reply.out is None:
            return failed
        # A held stream was opened (see `proxy.server.held_stream`): the failure can only be told inside it.
        await end_with_error(request, reply, orjson.loads(failed.text or "{}")["error"])
        return reply.out


async def _inflated(body: bytes, coding: str, limit: int, max_members: int) -> bytes:
    """The body without its content coding; decompressed on a worker thread when large."""
    if len(body) < OFF_LOOP_BYTES:
        return inflate(body, coding, limit, max_members)
    return await asyncio.to_thread(inflate, body, coding, limit, max_members)


def _send(
    request: web.Request,
    target: URL,
    body: bytes,
    *,
    plain: bool = False,
    header_values: Mapping[str, str] | None = None,
    coded: bool = False,
) -> contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]:
    """Open the upstream exchange for `body`, with the client's headers and a Content-Length that fits it.

    The body is sent without a content coding (an encoded one was decompressed before) unless it is `coded`.

    :param plain: Ask for an answer without a content coding: the proxy reads it (`proxy.server.offload_reads`).
    :param header_values: Values the body needs added to list-valued headers (`ForwardPlan.header_values`).
    :param coded: The body is sent as it came, in a coding the proxy could not undo: its Content-Encoding stays.
    """
    dropped = () if coded else ("Content-Encoding",)
    headers = upstream_request_headers(request.headers, body_length=len(body), drop=dropped)
    with_list_values(headers, header_values or {})
    if plain:
        headers["Accept-Encoding"] = "identity"
    return request[ROUTE].upstream.request(request.method, target, headers, body, record=request[RECORD])


async def _forward_unplanned(
    request: web.Request,
    target: URL,
    body: bytes,
    header_values: Mapping[str, str] | None = None,
    *,
    undecoded: str | None = None,
) -> web.StreamResponse:
    """Forward `body` (the client's own, or a count as shaped) and relay the answer as it comes.

    :param header_values: Values `body` needs added to list-valued headers (`ForwardPlan.header_values`).
    :param undecoded: Why the body's coding could not be undone: it goes as it came, and the client is told it was
        not compacted (`X-Compaction: skipped` and this warning).
    """
    said = {"X-Compaction": "skipped", "X-Compaction-Warning": undecoded} if undecoded else None
    if said:
        request[RECORD].decided(said)
    async with _send(request, target, body, header_values=header_values, coded=bool(undecoded)) as response:
        return await relay_as_it_came(request, response, extra_headers=said)


async def _forward_planned(
    request: web.Request, target: URL, plan: ForwardPlan, reply: ClientReply
) -> web.StreamResponse:
    """Forward the plan's body; on a refusal let `complete()` decide on one retry with a new plan.

    A refusal is a non-2xx answer, or a stream refused after it began (see `proxy.server.held_stream`), with or
    without the read tool offered.
    """
    async with _send(
        request, target, plan.body, plain=plan.reads is not None, header_values=plan.header_values
    ) as response:
        if 200 <= response.status < 300:
            held = await _hold(request, response, plan, reply)
            refused = held.refusal is not None
            retry = await complete(request, plan, UpstreamOutcome(400, error_body=held.refusal)) if refused else None
            if retry is None:
                return await _relay_answer(request, target, response, plan, held=held, reply=reply)
        else:
            error, whole = await read_capped(request, response, ERROR_BODY_LIMIT)
            encoding = content_encoding(response.headers)
            outcome = outcome_from_body(reply.wire, response.status, error if whole else None, encoding)
            retry = await complete(request, plan, outcome)
            if retry is None:
                return await relay_as_it_came(request, response, error, extra_headers=plan.response_headers)
    record = request[RECORD]
    record.retried = True
    record.decided(retry.response_headers)
    request.app[METRICS].retries.inc()
    async with _send(
        request, target, retry.body, plain=retry.reads is not None, header_values=retry.header_values
    ) as response:
        held = await _hold(request, response, retry, reply)
        return await _relay_answer(request, target, response, retry, held=held, reply=reply)


def _hold(
    request: web.Request, response: aiohttp.ClientResponse, plan: ForwardPlan, reply: ClientReply
) -> Awaitable[Held]:
    """The answer to `plan`, held until it is decided (see `proxy.server.held_stream`)."""
    return hold_response(request, response, plan, reply, wire=reply.wire, reads=plan.reads is not None)


def _relay_answer(
    request: web.Request,
    target: URL,
    response: aiohttp.ClientResponse,
    plan: ForwardPlan,
    *,
    held: Held,
    reply: ClientReply,
) -> Awaitable[web.StreamResponse]:
    """Relay the answer to `plan`; when the proxy offered its read tool, the model's reads are answered first."""
    if plan.reads is None:
        return _relay_as_it_arrives(request, response, plan, held, reply)
    send = partial(_send, request, target, plain=True, header_values=plan.header_values)
    relay = _relay_as_it_arrives
    return answer_reads(request, response, plan, held, reply, send=send, relay=relay, complete=complete)


async def _relay_as_it_arrives(
    request: web.Request, response: aiohttp.ClientResponse, plan: ForwardPlan, held: Held, reply: ClientReply
) -> web.StreamResponse:
    """Relay a chat answer as it arrives, learning usage and reply on the way, then report it to `complete()`.

    :param held: The answer as held (see `proxy.server.held_stream`): its first bytes, already read, go first.
    :param reply: The client's response, already started when a held stream was opened early.
    """
    settings = request.app[SETTINGS]
    record = request[RECORD]
    encoding = content_encoding(response.headers)
    streamed = 200 <= response.status < 300 and response.content_type == "text/event-stream"
    if reply.out is not None and not streamed:
        error = await relay_failure(request, reply, response)
        await complete(request, plan, UpstreamOutcome(response.status, error_body=error))
        return reply.out
    head = held.head
    if not streamed:
        whole = arrived_whole(response, head)
        if whole is not None:
            return await _answer_whole(request, response, plan, whole, reply)
    observer: StreamObserver | None = None
    edited: EditedStream | None = None
    collector: Collector | None = None
    transform: Transform | None
    if streamed:
        strip = plan.strip_usage_chunk and encoding == "identity"
        observer = StreamObserver(reply.wire, strip_usage=strip)
        if encoding == "identity":
            edited = EditedStream(observer, StreamEdits(reply.wire)) if plan.reads is not None else None
            transform = edited or observer.feed
        elif encoding in DECODABLE:
            transform = DecodingObserver(observer, encoding)
        else:
            transform = None
    else:
        strip = False
        collector = Collector(settings.max_body_bytes)
        transform = collector
    out = await reply.start(response, extra_headers=plan.response_headers, drop_length=strip)
    relayed_head = transform(head) if head and transform is not None else head
    if (relayed_head and not await write(request, out, relayed_head)) or not await pump(
        request, out, response, transform
    ):
        return out
    if observer is not None:
        tail = edited.finish() if edited is not None else observer.finish()
        if tail and not await write(request, out, tail):
            return out
        if observer.stripped_chunks:
            record.stripped_usage = True
            request.app[METRICS].usage_chunks_stripped.inc(observer.stripped_chunks)
        outcome = _stream_outcome(request, response.status, observer)
    else:
        assert collector is not None
        outcome = outcome_from_body(reply.wire, response.status, collector.body(), encoding)
    await finish(request, out)
    await complete(request, plan, outcome)
    return out


async def _answer_whole(
    request: web.Request, response: aiohttp.ClientResponse, plan: ForwardPlan, body: bytes, reply: ClientReply
) -> web.StreamResponse:
    """Relay a non-streamed answer that arrived whole in one write (`answer_whole`), then report it to `complete()`.

    As when it is relayed as it arrives: kept for parsing up to `max_body_bytes`, not reported if the client went away.
    """
    out = reply.out = await answer_whole(request, response, body, extra_headers=plan.response_headers)
    if request[RECORD].answered:
        kept = body if len(body) <= request.app[SETTINGS].max_body_bytes else None
        encoding = content_encoding(response.headers)
        await complete(request, plan, outcome_from_body(reply.wire, response.status, kept, encoding))
    return out


def _stream_outcome(request: web.Request, status: int, observer: StreamObserver) -> UpstreamOutcome:
    """What a relayed stream reported; nothing when inspection stopped part-way (say why, once, to the operator)."""
    if observer.stopped is None:
        report = observer.report
        return UpstreamOutcome(status, report.usage, observer.reply, response_id=report.response_id)
    route = request[RECORD].route
    if observer.stopped is StopReason.ERROR:
        request.app[METRICS].fail_open.labels(stage="inspect").inc()
        request[RECORD].fail_open.append("inspect")
        log.error(
            "inspecting an upstream stream failed (a proxy bug): the rest was relayed unchanged and its usage is"
            " not recorded",
            extra={"fields": {"error": observer.error, "route": route}},
        )
    else:
        log.warning(
            "stopped inspecting an upstream stream (see reason): the rest was relayed unchanged and its usage is not"
            " recorded; if this repeats, check what the upstream sends",
            extra={"fields": {"reason": observer.stopped.value, "route": route}},
        )
    return UpstreamOutcome(status=status)
