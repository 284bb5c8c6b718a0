"""Helpers for the server tests: the running proxy handle, a recording Compaction, raw HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.pipeline.exchange import ForwardPlan, IncomingRequest, PassThrough, UpstreamOutcome


@dataclass
class Proxy:
    """A running proxy: its app (for app keys), server and base URL."""

    app: web.Application
    server: TestServer

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    @property
    def port(self) -> int:
        assert self.server.port is not None
        return self.server.port


@dataclass
class Recording(PassThrough):
    """PassThrough that records what it was given.

    The server reports an answer's outcome after the client has the answer (the client never waits for the report),
    so a test reads outcomes through `reported()`, which waits for them, not straight from `outcomes`.
    """

    prepared: list[IncomingRequest] = field(default_factory=list)
    outcomes: list[tuple[ForwardPlan, UpstreamOutcome]] = field(default_factory=list)
    _recorded: asyncio.Condition = field(default_factory=asyncio.Condition, repr=False)

    async def prepare(self, chat: IncomingRequest) -> ForwardPlan:
        self.prepared.append(chat)
        return await super().prepare(chat)

    async def complete(self, plan: ForwardPlan, outcome: UpstreamOutcome) -> ForwardPlan | None:
        await self.record(plan, outcome)
        return None

    async def record(self, plan: ForwardPlan, outcome: UpstreamOutcome) -> None:
        """Keep one reported outcome and wake whoever waits for it."""
        async with self._recorded:
            self.outcomes.append((plan, outcome))
            self._recorded.notify_all()

    async def reported(self, count: int) -> list[UpstreamOutcome]:
        """The outcomes, once at least `count` have been reported."""
        async with self._recorded:
            await asyncio.wait_for(self._recorded.wait_for(lambda: len(self.outcomes) >= count), timeout=10)
        return [outcome for _, outcome in self.outcomes]


@dataclass
class HeldReport(Recording):
    """Records an outcome only once the test releases it, to show that the client's answer does not wait for it."""

    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def complete(self, plan: ForwardPlan, outcome: UpstreamOutcome) -> ForwardPlan | None:
        await self.release.wait()
        return await super().complete(plan, outcome)


MakeProxy = Callable[..., Awaitable[Proxy]]


async def raw_request(port: int, request: bytes) -> tuple[int, bytes, bytes]:
    """Send raw bytes on a fresh connection; return (status, head, body) of the answer (connection: close)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        data = await reader.read()
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head, body
