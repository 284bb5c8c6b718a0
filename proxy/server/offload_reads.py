"""The server side of reads: the model's calls to the proxy's read tool are answered here and never reach the client.

For a forwarded request that carries the read tool (`ForwardPlan.reads`), each upstream answer is held by the one
hold every answer goes through (`proxy.server.held_stream`), which says whether it is a read round:

- Not a read round: the answer is relayed at once, held bytes first, as any other answer (`relay`).
- A read round: it is read to its end, the reads are answered from the state store under the caller's tenant,
  and the upstream is asked again with the calls and their results appended (`ReadBack.next_round`, which keeps
  every round within the request's bounds). At most `ReadBack.rounds` rounds; the request after the last asks for
  an answer without tools. When the upstream refuses a request with what was read (what was offloaded may not fit
  the window again), with an error status or inside its stream, the request before it is sent once more without
  tools: the model answers from what it had, and the client never gets an error the read caused.

The client then receives the final answer with the usage of every upstream call made for it added up. A
non-streamed answer says in `X-Compaction-Reads` (`-Not-Held`) how many reads were answered with the held text (or
found nothing); a stream's headers went out before any read (see `proxy.server.held_stream`), so it does not. What
anchors the next request's estimate is the first call's usage: that call is the one that sent what the
conversation's next request starts with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.pipeline.exchange import ForwardPlan, UpstreamOutcome
from proxy.pipeline.offload.reads import ReadBack, Round
from proxy.pipeline.offload.rounds import summed, without_tools
from proxy.server.decoding import outcome_from_body
from proxy.server.held_stream import Held, hold_response, refused, relay_failure
from proxy.server.offload_streams import EditedStream, StreamEdits
from proxy.server.pipeline_calls import count_usage
from proxy.server.relay import ClientReply, finish, pump, write
from proxy.server.sse import StreamObserver

Send = Callable[[bytes], contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]]
Relay = Callable[[web.Request, aiohttp.ClientResponse, ForwardPlan, Held, ClientReply], Awaitable[web.StreamResponse]]
Complete = Callable[[web.Request, ForwardPlan, UpstreamOutcome], Awaitable[object]]


async def answer_reads(
    request: web.Request,
    response: aiohttp.ClientResponse,
    plan: ForwardPlan,
    held: Held,
    reply: ClientReply,
    *,
    send: Send,
    relay: Relay,
    complete: Complete,
) -> web.StreamResponse:
    """Relay the final answer to a request carrying the read tool, answering its read rounds on the way.

    :param held: The first answer (`response`), held.
    """
    back: ReadBack = plan.reads
    body, usages = plan.body, []
    async with contextlib.AsyncExitStack() as later:

        async def ask(asked: bytes, *, final: bool) -> tuple[aiohttp.ClientResponse, Held]:
            answer = await later.enter_async_context(send(asked))
            return answer, await hold_response(request, answer, plan, reply, wire=back.wire, reads=not final)

        while held.reads is not None:
            usages.append(held.usage or {})
            last = len(usages) >= back.rounds
            asked = await back.next_round(body, held.reads, last=last)
            response, held = await ask(asked.body, final=last or asked.final)
            if not refused(response, held):
                back.took(asked)
            elif not asked.final:
                # Too large with what was read (or refused): the model answers from what it had before the read.
                asked = Round(without_tools(body, back.wire), final=True)
                response, held = await ask(asked.body, final=True)
            body = asked.body
        if not usages and not held.cleaned:
            return await relay(request, response, plan, held, reply)
        out, sent = await _relay_final(request, response, plan, held, reply, usages=usages)
    if not usages:
        await complete(request, plan, outcome_from_body(back.wire, response.status, sent, "identity"))
        return out
    first = usages[0]
    for round_usage in [*usages[1:], held.usage or {}]:  # the first round's is counted with the outcome below
        count_usage(request, back.wire.usage_in_chat_terms(round_usage))
    await complete(request, plan, UpstreamOutcome(200, back.wire.usage_in_chat_terms(first)))
    return out


async def _relay_final(
    request: web.Request,
    response: aiohttp.ClientResponse,
    plan: ForwardPlan,
    held: Held,
    reply: ClientReply,
    *,
    usages: list[Mapping[str, Any]],
) -> tuple[web.StreamResponse, bytes]:
    """Relay the answer after read rounds (or without its read calls), its usage summed over every call.

    :returns: The client's response, and the non-streamed answer sent (empty for any other).
    """
    back: ReadBack = plan.reads
    answered = 200 <= response.status < 300 and held.refusal is None
    streamed = answered and response.content_type == "text/event-stream"
    if reply.out is not None and not streamed and held.refusal is None:
        await relay_failure(request, reply, response)
        return reply.out, b""
    headers = {**plan.response_headers, **back.report()}
    out = await reply.start(response, extra_headers=headers, drop_length=True)
    if answered and held.answer is not None:
        sent = _with_usage(held.answer, usages)
        if await write(request, out, sent):
            await finish(request, out)
        return out, sent
    if streamed:
        observer = StreamObserver(back.wire, strip_usage=plan.strip_usage_chunk)
        edited = EditedStream(observer, StreamEdits(back.wire, usages))
        await _relay_stream(request, out, response, held.head, edited)
    elif await write(request, out, held.head) and await pump(request, out, response):
        await finish(request, out)
    return out, b""


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
