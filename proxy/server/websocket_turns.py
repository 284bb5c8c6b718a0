"""Requests that come as WebSocket messages (a format's socket mode) go through compaction, as a POST does.

Each message that starts a request (`SocketMode.request_of`; the Responses API's `response.create`) is planned by the
compaction side exactly as an HTTP request (`proxy.server.pipeline_calls`: the same fail-open and counting), and
forwarded as the message its format makes of the plan's body; when nothing changed, the client's own message goes, byte
for byte. The messages coming back are relayed untouched; the one that ends each answer is read for its usage and reply,
which are reported to the compaction side as for a stream over HTTP, before the client's next request is planned. An
ending without a lane while none waits on the default one (an upstream `error` event without `stream_id`) ends the
oldest request waiting on any lane, unreported (the proxy cannot tell whose it is): every ending releases at most one
request and every request is released by one ending, so what the socket keeps is bounded by the requests the upstream
has yet to answer. A request over the proxy's limits is
answered with the format's refusal message and not forwarded. Every other message passes untouched, and so does a
request message whenever reading or planning it fails.

Not done inside a socket: offloading (the proxy cannot answer its read tool's calls there, so a socket's requests are
planned with `X-Compaction-Offload: off`: plain pruning), the overflow retry (the refusal reaches the client, whose
next request is estimated with what the refusal taught), and the report headers (a message has none).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from itertools import count

from aiohttp import web
from multidict import CIMultiDict

from proxy.pipeline.exchange import ForwardPlan, Refusal, UpstreamOutcome
from proxy.pipeline.off_loop import OFF_LOOP_BYTES
from proxy.pipeline.offload.offloading import OFFLOAD_HEADER
from proxy.pipeline.wire import WireFormat
from proxy.server.keys import RECORD
from proxy.server.logging import ACCESS_LOGGER
from proxy.server.pipeline_calls import complete, prepare

access_log = logging.getLogger(ACCESS_LOGGER)


@dataclass(frozen=True)
class Turn:
    """What to do with one client message.

    :param upstream: The message to forward upstream; None to forward nothing.
    :param client: A message to answer the client with (an `error` event), or None.
    """

    upstream: bytes | None
    client: bytes | None = None


class SocketTurns:
    """The compaction side's part in one WebSocket whose messages carry a format's requests (module docstring).

    :param request: The upgrade request: its headers (the credentials, the proxy's own controls) and path are those
        of every message on the socket.
    :param wire: The format of the requests its messages carry (one with a `socket` mode).
    """

    def __init__(self, request: web.Request, wire: WireFormat) -> None:
        assert wire.socket is not None
        self.request = request
        self.wire = wire
        self.socket = wire.socket
        self.headers: CIMultiDict[str] = CIMultiDict(request.headers)
        self.headers[OFFLOAD_HEADER] = "off"
        self.pending: dict[str | None, deque[tuple[int, ForwardPlan | None]]] = {}
        """The requests waiting for their answer, by lane, each with its place in the order they were sent."""
        self.sent = count()
        self.reporting: asyncio.Task[None] | None = None

    async def outgoing(self, message: bytes) -> Turn:
        """Plan one client message: a request as its plan says, anything else as it came."""
        request_of = self.socket.request_of
        read = await asyncio.to_thread(request_of, message) if len(message) >= OFF_LOOP_BYTES else request_of(message)
        if read is None:
            return Turn(message)
        lane, body = read
        await self.settled()  # the previous answer's usage anchors this request's estimate
        plan = await prepare(self.request, body, self.wire, self.headers)
        if isinstance(plan, Refusal):
            self._log(None, refused=plan.code)
            return Turn(None, client=self.socket.refusal_message(plan))
        usable = plan is not None and plan.reads is None and plan.body.lstrip().startswith(b"{")
        self.pending.setdefault(lane, deque()).append((next(self.sent), plan if usable else None))
        self._log(plan if usable else None)
        if plan is None or not usable or plan.body == body:
            return Turn(message)
        return Turn(self.socket.message_of(plan.body))

    def incoming(self, message: bytes) -> None:
        """Read one upstream message before it is relayed; report the answer it ends, if it ends one."""
        ending = self.socket.ending(message)
        if ending is None or not self.pending:
            return
        lane, outcome = ending
        ours = lane in self.pending
        if not ours and lane is not None:
            return  # a lane with nothing waiting: its request was released by an ending without a lane
        if not ours:  # an ending without a lane, none waiting on the default one: the oldest request is over
            lane = min(self.pending, key=lambda waiting: self.pending[waiting][0][0])
        queue = self.pending[lane]
        _, plan = queue.popleft()
        if not queue:
            del self.pending[lane]
        if plan is not None and ours:
            self.reporting = asyncio.create_task(self._report(self.reporting, plan, outcome))

    async def settled(self) -> None:
        """Wait until every answer read so far has been reported."""
        if self.reporting is not None:
            await self.reporting

    async def _report(self, before: asyncio.Task[None] | None, plan: ForwardPlan, outcome: UpstreamOutcome) -> None:
        """Report `outcome` after the reports before it; a retry plan is not followed inside a socket."""
        if before is not None:
            await before
        await complete(self.request, plan, outcome)

    def _log(self, plan: ForwardPlan | None, refused: str | None = None) -> None:
        """One access-log line per request message: what compaction did with it (never its content)."""
        record = self.request[RECORD]
        fields = {
            "path": self.request.rel_url.raw_path,
            "message": "request",
            "model": record.model if plan is not None else None,
            "compaction": record.compaction if plan is not None else None,
            "tokens_before": record.tokens_before if plan is not None else None,
            "tokens_after": record.tokens_after if plan is not None else None,
            "conversation_hash": record.conversation_hash if plan is not None else None,
            "forwarded": "unchanged" if plan is None else None,
            "error": refused,
        }
        access_log.info("websocket message", extra={"fields": {k: v for k, v in fields.items() if v is not None}})
