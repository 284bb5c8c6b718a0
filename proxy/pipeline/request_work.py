"""The CPU work of one request, sized by what it adds: parsing, replaying rewrite memory, anything proportional.

Work proportional to a large body runs off the event loop (`OffLoop`); a request recognized as a known one plus a
few new messages (`Turn`) is charged only for those. The pipeline's steps and the overflow retry share this one
object, so a step never needs to know which of them asked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from proxy.engine.messages import Message
from proxy.pipeline.off_loop import OffLoop
from proxy.pipeline.prepared import Prepared
from proxy.pipeline.requests import RequestLimits
from proxy.pipeline.rewrites import RewriteMemory, View
from proxy.pipeline.wire import WireFormat, WireRequest

T = TypeVar("T")


class RequestWork:
    """Parses, replays and runs CPU work for requests, off the event loop when they are large.

    :param limits: The proxy's limits every parse checks.
    :param rewrites: Rewrite memory, replayed onto each request's messages.
    """

    def __init__(self, limits: RequestLimits, rewrites: RewriteMemory) -> None:
        self.limits = limits
        self.rewrites = rewrites
        self.off_loop = OffLoop()

    async def parse(self, raw: bytes, wire: WireFormat) -> WireRequest:
        """`raw` parsed as a request of `wire` (see `WireFormat.parse` for what it raises)."""
        if self.off_loop.inline(len(raw)):  # most requests: parsed right here, without making the work a function
            return wire.parse(raw, self.limits)
        return await self.off_loop.run(len(raw), lambda: wire.parse(raw, self.limits))

    async def run(self, exchange: Prepared, work: Callable[[], T], *, whole: bool = False) -> T:
        """CPU work for this request: off the event loop when it is large.

        :param whole: The work is proportional to the whole request, not only to what it added to a known one.
        """
        return await self.off_loop.run(exchange.size if whole else exchange.turn.new_bytes(exchange.size), work)

    async def view(self, exchange: Prepared) -> View:
        """The request's messages with the remembered rewrite replayed (see `RewriteMemory` and `Turn.replayed`)."""
        messages, size = exchange.request.messages, exchange.size
        return await exchange.turn.replayed(self.rewrites, exchange.scope, messages, size, self.off_loop)

    async def originals(self, exchange: Prepared) -> list[Message]:
        """The request's messages as the client sent them, parsed again when they were `release`d."""
        request = exchange.parsed if exchange.parsed is not None else await self.parse(exchange.raw, exchange.wire)
        return request.messages

    def close(self) -> None:
        """Stop the worker threads."""
        self.off_loop.close()
