"""The one retry after a context overflow: learn the window the provider stated, compact to it, and send again.

`ChatCompactionService` takes this in as a mixin: the retry works with the service's window table, calibration,
offloading and rewrite memory, and with its own steps for viewing, working on and forwarding a request
(`CompactionSteps`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from proxy.config import Mode, Settings
from proxy.engine import Room, Thresholds, Transcript, counter_for_model, leading_room
from proxy.engine.messages import Message
from proxy.engine.strategies.offload import held_references
from proxy.pipeline.compacting import report_room
from proxy.pipeline.exchange import ChatOutcome, ForwardPlan
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.offload.offloading import Offloading
from proxy.pipeline.prepared import Prepared
from proxy.pipeline.reports import INSTRUCTIONS_HEADER, WINDOW_SOURCE_HEADER
from proxy.pipeline.rewrites import RewriteMemory, View
from proxy.pipeline.usage import UsageReports
from proxy.pipeline.wire import WireFormat
from proxy.windows import ContextWindows, WindowSource

T = TypeVar("T")


class CompactionSteps(Protocol):
    """What the retry uses of the service."""

    settings: Settings
    mode: Mode
    windows: ContextWindows
    usage: UsageReports
    offloading: Offloading
    rewrites: RewriteMemory
    metrics: CompactionMetrics

    async def _parse(self, raw: bytes, wire: WireFormat) -> Any: ...

    async def _view(self, exchange: Prepared) -> View: ...

    async def _work(self, exchange: Prepared, work: Callable[[], T], *, whole: bool = False) -> T: ...

    async def _forward(
        self,
        raw: bytes,
        exchange: Prepared,
        messages: list[Message] | None,
        chain: list[bytes] | None,
        held: tuple[str, ...] = (),
        *,
        tokens: int | None = None,
    ) -> ForwardPlan: ...


class OverflowRetry:
    """Compacts a request the upstream refused as too long, once, to the window it stated (or learned)."""

    async def _retry_after_overflow(
        self: CompactionSteps, exchange: Prepared, outcome: ChatOutcome
    ) -> ForwardPlan | None:
        """The compacted retry of a request whose answer was a context overflow, or None when there is none to make.

        Not after a retry, for a history the provider keeps, in observe mode, when compaction removes nothing, or
        when the leading instructions and the tools alone exceed the window (no compaction may touch them).
        """
        overflow = exchange.wire.overflow(outcome.status, outcome.error_body)
        if overflow is None or exchange.retried or exchange.provider_state or self.mode is Mode.OBSERVE:
            return None
        if exchange.parsed is None:
            exchange.parsed = await self._parse(exchange.raw, exchange.wire)
        request = exchange.request
        view = await self._view(exchange)
        counter = counter_for_model(exchange.model)
        scale = self.usage.calibration(exchange.tenant, exchange.model).ratio
        transcript = Transcript(view.messages, counter, view.meta, keys=view.keys)
        overhead = counter.overhead_tokens(request.overhead_fields) + request.added_prompt_tokens
        stated = overflow.window
        if stated is None:
            # An error that states no window (the Responses API's) still says the window is below what was sent.
            stated = round(scale * (await self._work(exchange, transcript.total, whole=True) + overhead))
        window, learned = exchange.window, False
        if self.windows.learn(exchange.model, stated, exchange.tenant):
            window, learned = stated, True
        if window is None:
            return None
        thresholds = Thresholds(window, self.settings.compact_at, self.settings.compact_to, request.reserved_tokens)
        staging, strategies = self.offloading.for_request(request, exchange.offload_off)
        target = int(thresholds.target_tokens(round(scale * overhead)) / scale)

        def room() -> Room | None:
            provider_overhead = round(scale * overhead)
            return leading_room(
                transcript, target_tokens=target, overhead_tokens=provider_overhead, scale=scale, window=window
            )

        over = await self._work(exchange, room, whole=True)
        if exchange.headers.get(INSTRUCTIONS_HEADER) != over:
            report_room(over, self.metrics, exchange.model, window)
        if over is Room.OVER_WINDOW:
            self.metrics.retries.labels("instructions_over_window").inc()
            return None
        result = await self._work(exchange, lambda: strategies.compact(transcript, target), whole=True)
        self.metrics.retries.labels("compacted" if result else "nothing_to_remove").inc()
        if result is None:
            return None
        await self.offloading.persist(exchange.tenant, staging, result.compacted)
        await self.rewrites.remember(exchange.scope, view, result.plan)
        retry = Prepared(
            exchange.scope,
            exchange.tenant,
            request,
            exchange.model,
            window,
            exchange.size,
            exchange.wire,
            retried=True,
            headers=dict(exchange.headers),
            original=exchange.original,
        )
        retry.headers.update({"X-Compaction": "compacted-after-overflow", "X-Compaction-Context-Window": str(window)})
        retry.headers["X-Compaction-Strategies"] = ",".join(result.strategies)
        if over is not None:
            retry.headers[INSTRUCTIONS_HEADER] = over.value
        if learned:
            retry.headers[WINDOW_SOURCE_HEADER] = WindowSource.LEARNED
        held = held_references(result.compacted.meta)
        tokens = round(scale * (result.tokens_after + overhead))
        retry.headers["X-Compaction-Tokens-After"] = str(tokens)
        before = round(scale * (result.tokens_before + overhead))
        self.metrics.record_compaction(result.strategies, before, tokens)
        return await self._forward(b"", retry, list(result.compacted.messages), None, held, tokens=tokens)
