"""The one hold on an upstream answer the proxy may still act on: retry it after an overflow, or answer its reads.

Every 2xx answer to a compacted request goes through `hold` before anything of it is relayed. It reads the answer
until its first *decisive* event and says what that event decided:

- A refusal (`Held.refusal`): the request was refused after the stream began, as some models refuse an oversized
  request (Responses: `response.created`, `response.in_progress`, then an `error` event or `response.failed`; chat:
  a `{"error": {...}}` chunk). Nothing of the answer was relayed, so the caller can still compact and retry it
  (or, after a read round, ask again without tools), whether or not the read tool was offered.
- A read round (`Held.reads`), when the read tool was offered: the answer's first call is the proxy's. It is read to
  its end (see `proxy.server.offload_reads`).
- Anything else: relay the answer, the held bytes first.

The opening events of a Responses stream decide nothing; every other event decides when the read tool was not
offered. When it was, events that decide nothing for reads (reasoning: chat's `reasoning_content` deltas, the
Responses reasoning item and its summary events) are held too, but the client is not kept waiting for them: at the
first event past the opening (the stream was not refused at its start) `opened` is awaited, which sends the client
the status line and headers. The events themselves stay held until the decision: relaying a reasoning event early
would show the client a read round's reasoning, and in a Responses stream a `response.created` and item indexes the
next round's stream would contradict. The held bytes are bounded, past which the answer is relayed: by
`OPENING_LIMIT` until the stream is past its opening, then by `limit`.

A non-streamed answer (only held with the read tool offered) is read whole, as relaying it would anyway.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import orjson
from aiohttp import web

from proxy.pipeline.exchange import ForwardPlan
from proxy.pipeline.offload.reads import NOT_HELD_HEADER, READS_HEADER
from proxy.pipeline.wire import Reads, StreamReport, WireFormat
from proxy.server.headers import content_encoding
from proxy.server.keys import ROUTE, SETTINGS
from proxy.server.relay import ClientReply, finish, write
from proxy.server.sse import EventSplitter, event_data

OPENING_LIMIT: Final = 256 * 1024
"""The most bytes of opening events held (they are a few hundred bytes each); past it the stream is relayed."""
ERROR_BODY_LIMIT: Final = 1024 * 1024
"""An error answer is buffered (to show it to `complete()` before deciding on a retry) up to this many bytes."""

READ_COUNT_HEADERS: Final = frozenset({READS_HEADER, NOT_HELD_HEADER})
"""Known only once a read round's answer has ended: never on a stream whose headers went out early."""

Read = Callable[[], Awaitable[bytes]]
"""Returns the answer's next chunk, b"" at its end."""
Opened = Callable[[], Awaitable[object]]
"""Called once a held stream is known not to be refused at its start: sends the client the status and headers."""


@dataclass
class Held:
    """An upstream answer held until it was known what to do with it (see the module docstring).

    :param head: The raw bytes read from it so far (all of them for a read round or a non-streamed answer).
    :param refusal: The error body (`{"error": {...}}`) of a stream refused after it began.
    :param reads: The reads asked for, when it is a read round.
    :param usage: Its usage, as the wire format names it (a read round's).
    :param answer: A non-streamed answer, parsed.
    :param cleaned: Read calls the model made after a client call were taken out of `answer`.
    """

    head: bytes
    refusal: Mapping[str, Any] | None = None
    reads: Reads | None = None
    usage: Mapping[str, Any] | None = None
    answer: dict[str, Any] | None = None
    cleaned: bool = False


async def hold(
    read: Read, wire: WireFormat, *, streamed: bool, offered: bool, reads: int | None, limit: int, opened: Opened
) -> Held:
    """Read a 2xx answer until it is decided (see the module docstring).

    :param streamed: It is an uncompressed event stream; other answers are held only when `offered`, and read whole
        (so that read calls can be taken out of them).
    :param offered: The read tool was offered.
    :param reads: The most distinct reads kept of this answer when the read tool was offered and it may be a read
        round (it is not the last allowed); None when it may not.
    :param limit: The most bytes held of an answer past its opening (`max_body_bytes`).
    """
    if streamed:
        return await _hold_stream(read, wire, reads=reads, limit=limit, opened=opened)
    if not offered:
        return Held(b"")
    head, whole = await _read(read, limit)
    parsed = _json(head) if whole else None
    if parsed is None:
        return Held(head)
    asked = wire.reads(parsed, reads) if reads is not None else None
    usage = parsed.get("usage")
    cleaned = asked is None and wire.without_reads(parsed)
    return Held(head, None, asked, usage if isinstance(usage, Mapping) else None, parsed, cleaned)


async def _hold_stream(read: Read, wire: WireFormat, *, reads: int | None, limit: int, opened: Opened) -> Held:
    """Hold a stream until its first decisive event; read a read round to its end."""
    splitter, raw, report = EventSplitter(), bytearray(), StreamReport()
    decided, started = None, False
    while chunk := await read():
        raw += chunk
        for event in splitter.feed(chunk):
            parsed = _json(event_data(event) or b"")
            if parsed is None:
                continue
            if decided is None:
                if wire.opening(parsed):
                    continue
                refusal = wire.refusal(parsed)
                if refusal is not None or reads is None:
                    return Held(bytes(raw), refusal)
                if not started:
                    started = True
                    await opened()
                decided = wire.decides_reads(parsed)
                if decided is False:
                    return Held(bytes(raw))
            wire.read_event(parsed, report)
        if len(raw) > (limit if started else min(limit, OPENING_LIMIT)):
            return Held(bytes(raw))
    if not decided or reads is None:
        return Held(bytes(raw))
    return Held(bytes(raw), None, wire.stream_reads(report, reads), report.native_usage)


async def _read(read: Read, limit: int) -> tuple[bytes, bool]:
    """The body read until its end or past `limit` bytes, and whether it is whole (the rest is relayed after it)."""
    parts: list[bytes] = []
    size = 0
    while chunk := await read():
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(parts), False
    return b"".join(parts), True


def _json(data: bytes) -> dict[str, Any] | None:
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


async def hold_response(
    request: web.Request,
    response: aiohttp.ClientResponse,
    plan: ForwardPlan,
    reply: ClientReply,
    *,
    wire: WireFormat,
    reads: bool,
) -> Held:
    """Hold the upstream's answer to `plan` (see `hold`); nothing for an error status or a compressed answer.

    :param reply: Started with the plan's headers when a held stream is opened early; `X-Compaction-Reads` and
        `-Not-Held` are left out of them then, since no read is answered yet (known only once the stream has ended).
    :param wire: The answer's wire format.
    :param reads: The answer may be a read round.
    """
    streamed = response.content_type == "text/event-stream"
    if not (streamed or plan.reads is not None) or not 200 <= response.status < 300:
        return Held(b"")  # `hold` holds nothing of it
    if content_encoding(response.headers) != "identity":
        return Held(b"")
    early = {name: value for name, value in plan.response_headers.items() if name not in READ_COUNT_HEADERS}
    upstream = request[ROUTE].upstream
    return await hold(
        lambda: upstream.read_chunk(response),
        wire,
        streamed=streamed,
        offered=plan.reads is not None,
        reads=plan.reads.limits.per_answer if reads and plan.reads is not None else None,
        limit=request.app[SETTINGS].max_body_bytes,
        opened=lambda: reply.start(response, extra_headers=early, drop_length=True),
    )


def refused(response: aiohttp.ClientResponse, held: Held) -> bool:
    """Whether the upstream refused the request: an error status, or a stream refused after it began."""
    return not 200 <= response.status < 300 or held.refusal is not None


async def relay_failure(
    request: web.Request, reply: ClientReply, response: aiohttp.ClientResponse
) -> Mapping[str, Any]:
    """End the client's stream, already opened, with an error event for an upstream answer that is not a stream.

    The client holds a 200 and the plan's headers (see `hold`); what the upstream answered then (an error status,
    say, to a request asked again) can only reach it inside the stream, as an in-stream refusal would have.

    :returns: The error body told.
    """
    body, whole = await read_capped(request, response, ERROR_BODY_LIMIT)
    parsed = _json(body) if whole else None
    error = parsed.get("error") if parsed is not None else None
    if not isinstance(error, Mapping):
        message = f"The upstream answered with status {response.status} after the stream had begun."
        error = {"message": message, "type": "upstream_error", "param": None, "code": "upstream_error"}
    await end_with_error(request, reply, error)
    return {"error": error}


async def end_with_error(request: web.Request, reply: ClientReply, error: Mapping[str, Any]) -> None:
    """Write `error` as the opened stream's last event and end it."""
    assert reply.out is not None
    if await write(request, reply.out, reply.wire.error_event(error)):
        await finish(request, reply.out)


async def read_capped(request: web.Request, response: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """Read up to `limit` bytes of the body; return them and whether that was the whole body."""
    upstream = request[ROUTE].upstream
    return await _read(lambda: upstream.read_chunk(response), limit)
