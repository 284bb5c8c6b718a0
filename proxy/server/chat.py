"""Chat completions: plan what goes upstream, relay the answer, report what the upstream said.

The request is read whole (bounded), the `ChatCompaction` decides what to forward, the answer is relayed as it
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
import time
import zlib
from typing import Any, Final

import aiohttp
import orjson
from aiohttp import web
from yarl import URL

from proxy.chat.exchange import ChatOutcome, ForwardPlan, IncomingChat, Refusal
from proxy.chat.off_loop import OFF_LOOP_BYTES
from proxy.failures import log_failure
from proxy.server import errors
from proxy.server.body import ClientBodyTimeout, client_chunks
from proxy.server.content_coding import ContentCodingError, inflate
from proxy.server.headers import content_encoding, upstream_request_headers
from proxy.server.keys import CHAT, METRICS, RECORD, SETTINGS, UPSTREAM
from proxy.server.logging import SERVER_LOGGER
from proxy.server.relay import finish, pump, start_response, write
from proxy.server.sse import StreamObserver
from proxy.server.upstream import UpstreamError, UpstreamTimeout

log = logging.getLogger(SERVER_LOGGER)

ERROR_BODY_LIMIT: Final = 1024 * 1024
"""An error answer is buffered (to show it to `complete()` before deciding on a retry) up to this many bytes."""

DECOMPRESSED_LIMIT: Final = 64 * 1024 * 1024
"""A compressed response is decompressed (a copy, for parsing only) up to this many bytes."""


async def read_body(request: web.Request, limit: int, pause_limit: float) -> bytes | None:
    """Read the whole request body, or return None as soon as it is known to exceed `limit` bytes.

    :raises ClientBodyTimeout: The client paused more than `pause_limit` seconds between two pieces of its body.
    """
    if request.content_length is not None and request.content_length > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in client_chunks(request, pause_limit):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _decoded(body: bytes, encoding: str) -> bytes | None:
    """Return the body without its content coding (gzip or deflate; bounded), or None when that is not possible."""
    if encoding == "identity":
        return body
    if encoding not in ("gzip", "x-gzip", "deflate"):
        return None
    for wbits in (47, -15):  # 47: gzip or zlib, detected from the header; -15: raw deflate
        try:
            decoder = zlib.decompressobj(wbits)
            data = decoder.decompress(body, DECOMPRESSED_LIMIT)
        except zlib.error:
            continue
        return None if decoder.unconsumed_tail else data
    return None


def _json(body: bytes, encoding: str) -> Any:
    data = _decoded(body, encoding)
    if data is None:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _first_message(completion: Any) -> dict[str, Any] | None:
    if not isinstance(completion, dict) or not isinstance(completion.get("choices"), list):
        return None
    for choice in completion["choices"]:
        if isinstance(choice, dict) and choice.get("index", 0) == 0 and isinstance(choice.get("message"), dict):
            message: dict[str, Any] = choice["message"]
            return message
    return None


def outcome_from_body(status: int, body: bytes | None, encoding: str) -> ChatOutcome:
    """Build the outcome of a non-streamed answer (success or error) from its complete body, if it was kept."""
    parsed = _json(body, encoding) if body is not None else None
    if not isinstance(parsed, dict):
        return ChatOutcome(status=status)
    if 200 <= status < 300:
        usage = parsed.get("usage")
        return ChatOutcome(
            status=status, usage=usage if isinstance(usage, dict) else None, reply=_first_message(parsed)
        )
    return ChatOutcome(status=status, error_body=parsed)


def _fail_open(request: web.Request, stage: str, exc: BaseException) -> None:
    """Count and log a compaction-side failure: exception type and stack only, never its message (may quote a body)."""
    request.app[METRICS].fail_open.labels(stage=stage).inc()
    request[RECORD].fail_open.append(stage)
    log_failure(log, "compaction side failed; forwarding unchanged", exc, stage=stage)


async def _prepare(request: web.Request, body: bytes) -> ForwardPlan | Refusal | None:
    """The compaction side's plan for `body`, or its refusal; None (counted, logged) when it failed."""
    try:
        plan = await request.app[CHAT].prepare(IncomingChat(body=body, headers=request.headers, path=request.path))
        if isinstance(plan, Refusal):
            return plan
        if not isinstance(plan, ForwardPlan) or not isinstance(plan.body, bytes):
            raise TypeError(f"prepare() returned {type(plan).__name__}, not a ForwardPlan with a bytes body")
    except Exception as exc:
        _fail_open(request, "prepare", exc)
        return None
    return plan


async def _complete(request: web.Request, plan: ForwardPlan, outcome: ChatOutcome) -> ForwardPlan | None:
    """Report the outcome; shielded, so a client leaving at that moment does not lose what the upstream reported."""

    async def report() -> ForwardPlan | None:
        try:
            retry = await request.app[CHAT].complete(plan, outcome)
            if retry is not None and (not isinstance(retry, ForwardPlan) or not isinstance(retry.body, bytes)):
                raise TypeError(f"complete() returned {type(retry).__name__}, not a ForwardPlan with a bytes body")
        except Exception as exc:
            _fail_open(request, "complete", exc)
            return None
        return retry

    return await asyncio.shield(report())


class _Collector:
    """Keeps a copy of a non-streamed body for parsing, up to a limit (beyond it, parsing is given up)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0

    def __call__(self, chunk: bytes) -> bytes:
        self.size += len(chunk)
        if self.size <= self.limit:
            self.parts.append(chunk)
        return chunk

    def body(self) -> bytes | None:
        return b"".join(self.parts) if self.size <= self.limit else None


class _DecodingObserver:
    """Feeds a decompressed copy of a compressed SSE stream to an observer; the relayed bytes stay compressed."""

    def __init__(self, observer: StreamObserver, encoding: str) -> None:
        self.observer = observer
        self.decoder = zlib.decompressobj(47 if encoding in ("gzip", "x-gzip") else 15)
        self.broken = False

    def __call__(self, chunk: bytes) -> bytes:
        if not self.broken:
            try:
                self.observer.feed(self.decoder.decompress(chunk))
            except zlib.error:
                self.broken = True
        return chunk


async def handle_chat(request: web.Request, target: URL) -> web.StreamResponse:
    """Handle one chat completion (see the module docstring)."""
    settings = request.app[SETTINGS]
    record = request[RECORD]
    try:
        body = await read_body(request, settings.max_body_bytes, settings.client_body_timeout)
    except ClientBodyTimeout:
        return errors.client_timeout(settings.client_body_timeout)
    if body is None:
        record.error = "too_large"
        return errors.too_large(settings.max_body_bytes)
    record.bytes_in = len(body)
    coding = content_encoding(request.headers)
    if coding != "identity":
        try:
            body = await _inflated(body, coding, settings.max_body_bytes)
        except ContentCodingError as refused:
            record.error = refused.code
            return refused.response()
    plan = await _prepare(request, body)
    if isinstance(plan, Refusal):
        record.error = plan.code
        return errors.error_response(
            plan.status, plan.message, type_="invalid_request_error", code=plan.code, param=plan.param
        )
    try:
        if plan is None:
            return await _forward_unplanned(request, target, body)
        return await _forward_planned(request, target, plan)
    except UpstreamError as exc:
        record.error = exc.kind
        if isinstance(exc, UpstreamTimeout):
            return errors.upstream_timeout(str(exc))
        return errors.upstream_unreachable(str(exc))


async def _inflated(body: bytes, coding: str, limit: int) -> bytes:
    """The body without its content coding; decompressed on a worker thread when large."""
    if len(body) < OFF_LOOP_BYTES:
        return inflate(body, coding, limit)
    return await asyncio.to_thread(inflate, body, coding, limit)


def _send(
    request: web.Request, target: URL, body: bytes
) -> contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]:
    """Open the upstream exchange for `body`, with the client's headers and a Content-Length that fits it.

    The body is always sent without a content coding (an encoded one was decompressed before).
    """
    headers = upstream_request_headers(request.headers, body_length=len(body), drop=("Content-Encoding",))
    return request.app[UPSTREAM].request(request.method, target, headers, body)


async def _forward_unplanned(request: web.Request, target: URL, body: bytes) -> web.StreamResponse:
    """Forward the client's body and relay the answer, with no compaction involved (fail open)."""
    record = request[RECORD]
    sent = time.perf_counter()
    async with _send(request, target, body) as response:
        record.upstream_latency = time.perf_counter() - sent
        record.upstream_status = response.status
        out = await start_response(request, response)
        if await pump(request, out, response):
            await finish(request, out)
        return out


async def _forward_planned(request: web.Request, target: URL, plan: ForwardPlan) -> web.StreamResponse:
    """Forward the plan's body; on a non-2xx answer let `complete()` decide on one retry with a new plan."""
    record = request[RECORD]
    sent = time.perf_counter()
    async with _send(request, target, plan.body) as response:
        record.upstream_latency = time.perf_counter() - sent
        record.upstream_status = response.status
        if 200 <= response.status < 300:
            return await _relay_chat(request, response, plan)
        error, whole = await _read_capped(request, response, ERROR_BODY_LIMIT)
        encoding = content_encoding(response.headers)
        outcome = outcome_from_body(response.status, error if whole else None, encoding)
        retry = await _complete(request, plan, outcome)
        if retry is None:
            return await _relay_buffered(request, response, plan, error)
    record.retried = True
    request.app[METRICS].retries.inc()
    sent = time.perf_counter()
    async with _send(request, target, retry.body) as response:
        record.upstream_latency = time.perf_counter() - sent
        record.upstream_status = response.status
        return await _relay_chat(request, response, retry)


async def _read_capped(request: web.Request, response: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """Read up to `limit` bytes of the body; return them and whether that was the whole body."""
    upstream = request.app[UPSTREAM]
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await upstream.read_chunk(response)
        if not chunk:
            return b"".join(parts), True
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts), False


async def _relay_buffered(
    request: web.Request, response: aiohttp.ClientResponse, plan: ForwardPlan, head: bytes
) -> web.StreamResponse:
    """Relay an answer whose first bytes were already read: those, then whatever is left."""
    out = await start_response(request, response, extra_headers=plan.response_headers)
    if await write(request, out, head) and await pump(request, out, response):
        await finish(request, out)
    return out


async def _relay_chat(request: web.Request, response: aiohttp.ClientResponse, plan: ForwardPlan) -> web.StreamResponse:
    """Relay a chat answer as it arrives, learning usage and reply on the way, then report it to `complete()`."""
    settings = request.app[SETTINGS]
    record = request[RECORD]
    encoding = content_encoding(response.headers)
    streamed = 200 <= response.status < 300 and response.content_type == "text/event-stream"
    observer: StreamObserver | None = None
    collector: _Collector | None = None
    transform: Any
    if streamed:
        strip = plan.strip_usage_chunk and encoding == "identity"
        observer = StreamObserver(strip_usage=strip)
        if encoding == "identity":
            transform = observer.feed
        elif encoding in ("gzip", "x-gzip", "deflate"):
            transform = _DecodingObserver(observer, encoding)
        else:
            transform = None
    else:
        strip = False
        collector = _Collector(settings.max_body_bytes)
        transform = collector
    out = await start_response(request, response, extra_headers=plan.response_headers, drop_length=strip)
    if not await pump(request, out, response, transform):
        return out
    if observer is not None:
        tail = observer.finish()
        if tail and not await write(request, out, tail):
            return out
        if observer.stripped_chunks:
            record.stripped_usage = True
            request.app[METRICS].usage_chunks_stripped.inc(observer.stripped_chunks)
        outcome = ChatOutcome(status=response.status, usage=observer.usage, reply=observer.reply.build())
    else:
        assert collector is not None
        outcome = outcome_from_body(response.status, collector.body(), encoding)
    await finish(request, out)
    await _complete(request, plan, outcome)
    return out
