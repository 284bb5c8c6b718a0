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
    """PassThrough that records what it was given."""

    prepared: list[IncomingRequest] = field(default_factory=list)
    outcomes: list[tuple[ForwardPlan, UpstreamOutcome]] = field(default_factory=list)

    async def prepare(self, chat: IncomingRequest) -> ForwardPlan:
        self.prepared.append(chat)
        return await super().prepare(chat)

    async def complete(self, plan: ForwardPlan, outcome: UpstreamOutcome) -> ForwardPlan | None:
        self.outcomes.append((plan, outcome))
        return None


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
