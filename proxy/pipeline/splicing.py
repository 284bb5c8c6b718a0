"""The pipeline's side of byte splicing: a request recognized from its bytes, and remembered for the next one.

Where a format can (`WireFormat.splicing`, see `proxy.pipeline.capabilities.ByteSplicing`), a large request is
first looked for among the conversations' last requests: found, only what it added is parsed and worked on (see
`proxy.pipeline.turn`). Every decided request of such a format is remembered for its conversation's next one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from proxy.pipeline.capabilities import SpliceMemory
from proxy.pipeline.exchange import ForwardPlan, IncomingRequest
from proxy.pipeline.off_loop import OffLoop
from proxy.pipeline.per_format import PerFormat
from proxy.pipeline.prepared import RELEASE_FROM_BYTES, Prepared
from proxy.pipeline.requests import RequestLimits
from proxy.pipeline.turn import Continuation


@dataclass(frozen=True)
class Recognized:
    """What splicing made of a request's bytes before it was parsed.

    :param memory: The format's memory of recent requests, when the request was looked for in it.
    :param extension: The request as a remembered one plus new messages, when it is one.
    :param openings: What the memory found in the bytes and reuses to remember them.
    """

    memory: SpliceMemory | None = None
    extension: Continuation | None = None
    openings: Any = None


NOT_LOOKED_UP: Final = Recognized()
"""What splicing made of a request it did not look for (a `Recognized` is never changed: one serves them all)."""


class Splicing:
    """Recognizes requests from their bytes and remembers them, per format that splices.

    :param limits: The proxy's limits (a continuation over them is left to the full path).
    :param max_bytes: What each format's memory may cost.
    :param on_failure: Counts an error of the shortcut (it fails open).
    :param splice_from: Look a request up when its body has at least this many bytes: `"format"` as many as the
        format says (`ByteSplicing.from_bytes`), None never.
    :param off_loop: Runs the work of large bodies off the event loop.
    """

    def __init__(
        self,
        limits: RequestLimits,
        max_bytes: int,
        on_failure: Callable[[], None],
        splice_from: int | Literal["format"] | None,
        off_loop: OffLoop,
    ) -> None:
        self.splice_from = splice_from
        self.off_loop = off_loop
        self.memories: PerFormat[SpliceMemory] = PerFormat(
            lambda wire: wire.splicing.memory(limits, max_bytes, on_failure) if wire.splicing is not None else None
        )

    async def recognize(self, incoming: IncomingRequest, scope: bytes) -> Recognized:
        """The request as a remembered one plus new messages, when its format splices and its bytes say so."""
        splicing = incoming.wire.splicing
        if splicing is None or self.splice_from is None:
            return NOT_LOOKED_UP
        start = splicing.from_bytes if self.splice_from == "format" else self.splice_from
        memory = self.memories.of(incoming.wire) if len(incoming.body) >= start else None
        if memory is None:
            return NOT_LOOKED_UP
        extension, openings = await memory.recognize(scope, incoming.body, self.off_loop)
        return Recognized(memory, extension, openings)

    async def remember(
        self, incoming: IncomingRequest, plan: ForwardPlan, scope: bytes, recognized: Recognized
    ) -> None:
        """Remember a decided request of a splicing format for its conversation's next one; let go of it if large.

        Only these requests are let go of (`Prepared.release`): the other formats' are read again when their answer
        comes (`KeptHistories.learn`).
        """
        exchange = plan.context
        if incoming.wire.splicing is None or not isinstance(exchange, Prepared) or exchange.parsed is None:
            return
        if recognized.memory is not None:
            await recognized.memory.remember(
                scope, incoming.body, exchange.parsed, exchange.turn, self.off_loop, openings=recognized.openings
            )
        if len(incoming.body) >= RELEASE_FROM_BYTES:
            exchange.release(incoming.body)
