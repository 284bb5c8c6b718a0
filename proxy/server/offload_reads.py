"""The server side of reads: the model's calls to the proxy's read tool are answered here and never reach the client.

For a forwarded request that carries the read tool (`ForwardPlan.reads`), each upstream answer is held only as long
as it takes to tell whether it is a read round (`rounds.stream_decision`; a non-streamed answer is read whole, as
relaying it would anyway):

- Not a read round: the answer is relayed at once, held bytes first, as any other answer (`relay`).
- A read round: it is read to its end, the reads are answered from the state store under the caller's tenant,
  and the upstream is asked again with the calls and their results appended (`ReadBack.next_round`, which keeps
  every round within the request's bounds). At most `ReadBack.rounds` rounds; the request after the last asks for
  an answer without tools. When the upstream refuses a request with what was read (what was offloaded may not fit
  the window again), the request before it is sent once more without tools: the model answers from what it had,
  and the client never gets an error the read caused.

The client then receives the final answer with the usage of every upstream call made for it added up, and
`X-Compaction-Reads` (`-Not-Held`) saying how many reads were answered with the held text (or found nothing).
What anchors the next request's estimate is the first call's usage: that call is the one that sent what the
conversation's next request starts with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.chat.exchange import Api, ChatOutcome, ForwardPlan
from proxy.offload.reads import ReadBack, Round
from proxy.offload.rounds import (
    Reads,
    chat_reads,
    choices_of,
    responses_reads,
    stream_decision,
    summed,
    without_reads,
    without_tools,
)
from proxy.responses.answers import FINAL_EVENTS, chat_usage
from proxy.server.decoding import outcome_from_body
from proxy.server.headers import content_encoding
from proxy.server.keys import SETTINGS, UPSTREAM
from proxy.server.offload_streams import EditedStream, StreamEdits
from proxy.server.relay import finish, pump, start_response, write
from proxy.server.reply import ReplyBuilder
from proxy.server.sse import EventSplitter, StreamObserver, event_data

Send = Callable[[bytes], contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]]
Relay = Callable[[web.Request, aiohttp.ClientResponse, ForwardPlan, bytes], Awaitable[web.StreamResponse]]
Complete = Callable[[web.Request, ForwardPlan, ChatOutcome], Awaitable[object]]


@dataclass
class Held:
    """An upstream answer held until it was known whether it is a read round.

    :param head: The raw bytes read from it so far (all of them for a read round or a non-streamed answer).
    :param reads: The reads asked for, when it is a read round.
    :param usage: Its usage, as the wire format names it.
    :param answer: A non-streamed answer, parsed.
    :param cleaned: Read calls the model made after a client call were taken out of `answer`.
    """

    head: bytes
    reads: Reads | None = None
    usage: Mapping[str, Any] | None = None
    answer: dict[str, Any] | None = None
    cleaned: bool = False


async def answer_reads(
    request: web.Request,
    response: aiohttp.ClientResponse,
    plan: ForwardPlan,
    *,
    send: Send,
    relay: Relay,
    complete: Complete,
) -> web.StreamResponse:
    """Relay the final answer to a request carrying the read tool, answering its read rounds on the way."""
    back: ReadBack = plan.reads
    body, usages, sent, final = plan.body, [], b"", False
    async with contextlib.AsyncExitStack() as later:
        for round_ in range(back.rounds + 1):
            held = await _hold(request, response, back, final=final or round_ == back.rounds)
            if held.reads is None:
                break
            usages.append(held.usage or {})
            asked = await back.next_round(body, held.reads, last=round_ + 1 == back.rounds)
            response = await later.enter_async_context(send(asked.body))
            if 200 <= response.status < 300:
                back.took(asked)
            elif not asked.final:
                # Too large with what was read (or refused): the model answers from what it had before the read.
                asked = Round(without_tools(body), final=True)
                response = await later.enter_async_context(send(asked.body))
            if not 200 <= response.status < 300:
                held = Held(b"")
                break
            body, final = asked.body, final or asked.final
        if not usages and not held.cleaned:
            return await relay(request, response, plan, held.head)
        headers = {**plan.response_headers, **back.report()}
        out = await start_response(request, response, extra_headers=headers, drop_length=True)
        answered = 200 <= response.status < 300
        if answered and held.answer is not None:
            sent = _with_usage(held.answer, usages)
            await write(request, out, sent)
            await finish(request, out)
        elif answered and response.content_type == "text/event-stream":
            edited = EditedStream(StreamObserver(strip_usage=plan.strip_usage_chunk), StreamEdits(back.api, usages))
            await _relay_stream(request, out, response, held.head, edited)
        elif await write(request, out, held.head) and await pump(request, out, response):
            await finish(request, out)
    if not usages:
        await complete(request, plan, outcome_from_body(response.status, sent, "identity"))
        return out
    first = usages[0]
    await complete(request, plan, ChatOutcome(200, chat_usage(first) if back.api is Api.RESPONSES else first))
    return out


async def _hold(request: web.Request, response: aiohttp.ClientResponse, back: ReadBack, *, final: bool) -> Held:
    """Read the answer until it is decided (see the module docstring); `final` answers are never read rounds."""
    if not 200 <= response.status < 300 or content_encoding(response.headers) != "identity":
        return Held(b"")
    api, limit = back.api, back.limits.per_answer
    if response.content_type == "text/event-stream":
        return await _hold_stream(request, response, api, limit, final=final)
    head, whole = await _read(request, response, request.app[SETTINGS].max_body_bytes)
    parsed = _json(head) if whole else None
    if parsed is None:
        return Held(head)
    reads = None if final else _reads(parsed, api, limit)
    usage = parsed.get("usage")
    cleaned = reads is None and without_reads(parsed, api)
    return Held(head, reads, usage if isinstance(usage, Mapping) else None, parsed, cleaned)


def _reads(answer: Mapping[str, Any], api: Api, limit: int) -> Reads | None:
    """The reads a whole answer (a completion, or a response object) asks for, at most `limit`."""
    if api is Api.RESPONSES:
        output = answer.get("output")
        return (
            responses_reads([item for item in output if isinstance(item, Mapping)], limit)
            if isinstance(output, list)
            else None
        )
    choices = answer.get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], Mapping) else {}
    message = first.get("message")
    return chat_reads(message if isinstance(message, Mapping) else None, limit)


async def _read(request: web.Request, response: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """The body read until its end or past `limit` bytes, and whether it is whole (the rest is relayed after it)."""
    parts: list[bytes] = []
    size = 0
    while chunk := await request.app[UPSTREAM].read_chunk(response):
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(parts), False
    return b"".join(parts), True


async def _hold_stream(
    request: web.Request, response: aiohttp.ClientResponse, api: Api, reads: int, *, final: bool
) -> Held:
    """Hold a stream until its first decisive event; read a read round to its end (keeping at most `reads`)."""
    limit = request.app[SETTINGS].max_body_bytes
    splitter, raw, size = EventSplitter(), bytearray(), 0
    reply, usage, output, decided = ReplyBuilder(), None, None, None
    while chunk := await request.app[UPSTREAM].read_chunk(response):
        raw += chunk
        size += len(chunk)
        for event in splitter.feed(chunk):
            parsed = _json(event_data(event) or b"")
            if parsed is None:
                continue
            if decided is None:
                decided = False if final else stream_decision(parsed, api)
                if decided is False:
                    return Held(bytes(raw))
            usage, output = _collect(parsed, api, reply, usage, output)
        if size > limit:
            return Held(bytes(raw))
    if not decided:
        return Held(bytes(raw))
    asked = responses_reads(output or [], reads) if api is Api.RESPONSES else chat_reads(reply.build(), reads)
    return Held(bytes(raw), asked, usage)


def _collect(
    chunk: dict[str, Any], api: Api, reply: ReplyBuilder, usage: Any, output: Any
) -> tuple[Mapping[str, Any] | None, list[Mapping[str, Any]] | None]:
    """Fold one event of a read round into what it reports: the reply (chat), output items (Responses), usage."""
    if api is Api.RESPONSES:
        response, kind = chunk.get("response"), chunk.get("type")
        if isinstance(kind, str) and kind in FINAL_EVENTS and isinstance(response, Mapping):
            items = response.get("output")
            output = [item for item in items if isinstance(item, Mapping)] if isinstance(items, list) else []
            usage = response.get("usage") if isinstance(response.get("usage"), Mapping) else usage
        return usage, output
    if isinstance(chunk.get("usage"), Mapping):
        usage = chunk["usage"]
    for choice in choices_of(chunk):
        if choice.get("index", 0) == 0 and isinstance(choice.get("delta"), dict):
            reply.add(choice["delta"])
    return usage, output


def _json(data: bytes) -> dict[str, Any] | None:
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _with_usage(answer: dict[str, Any], earlier: list[Mapping[str, Any]]) -> bytes:
    """A non-streamed final answer with the usage of every call made for it."""
    usage = answer.get("usage")
    if isinstance(usage, Mapping):
        answer["usage"] = summed([*earlier, usage])
    return orjson.dumps(answer)


async def _relay_stream(
    request: web.Request, out: web.StreamResponse, response: aiohttp.ClientResponse, head: bytes, edited: EditedStream
) -> None:
    """Relay the final stream, from what was held, with its usage summed."""
    if not await write(request, out, edited(head)) or not await pump(request, out, response, edited):
        return
    if await write(request, out, edited.finish()):
        await finish(request, out)
