"""The one retry after a context overflow: learn the window the provider stated, compact to it, and send again.

A request refused as too long (in the provider's own error shape, see `WireFormat.overflow`) is compacted
once, to the window the error states (learned for the caller's tenant), or to the one already known when the error
states none (then the window is below what was sent). No retry follows a retry, a history the provider keeps,
observe mode, a compaction that removes nothing, or leading instructions and tools that alone exceed the window (no
compaction may touch them).
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.config import Mode, Settings
from proxy.engine import CompactionResult, Room, Thresholds, Transcript, counter_for_model, leading_room
from proxy.engine.strategies.offload import held_references
from proxy.pipeline.compacting import report_room
from proxy.pipeline.exchange import ForwardPlan, UpstreamOutcome
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.offload.offloading import Offloading
from proxy.pipeline.outgoing import Outgoing
from proxy.pipeline.prepared import Prepared
from proxy.pipeline.reports import INSTRUCTIONS_HEADER, WINDOW_SOURCE_HEADER
from proxy.pipeline.request_work import RequestWork
from proxy.pipeline.rewrites import RewriteMemory, View
from proxy.pipeline.usage import UsageReports
from proxy.windows import ContextWindows, WindowSource


@dataclass(frozen=True)
class Refused:
    """A refused request as the retry measures it: its view, counted, and the provider's scale of the counts.

    :param view: The messages as sent (the remembered rewrite replayed).
    :param transcript: `view` counted locally.
    :param overhead: The local tokens of what the request sends besides its messages.
    :param scale: Provider tokens per local token (the tenant's calibration).
    """

    view: View
    transcript: Transcript
    overhead: int
    scale: float

    def provider_tokens(self, local: int) -> int:
        """`local` tokens, with the overhead, as the provider counts them."""
        return round(self.scale * (local + self.overhead))


class OverflowRetry:
    """Compacts a request the upstream refused as too long, once, to the window it stated (or learned).

    :param settings: Thresholds and mode.
    :param windows: The window table the stated window is learned into, for the caller's tenant.
    :param usage: The calibration of local counts.
    :param offloading: The chain (offloading when the request allows it) and where offloaded results are kept.
    :param rewrites: Rewrite memory: the retry's compaction is remembered like any other.
    :param work: Parses, replays and runs CPU work for the request.
    :param outgoing: Builds what is sent.
    :param metrics: Where retries, rooms and compactions are counted.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        windows: ContextWindows,
        usage: UsageReports,
        offloading: Offloading,
        rewrites: RewriteMemory,
        work: RequestWork,
        outgoing: Outgoing,
        metrics: CompactionMetrics,
    ) -> None:
        self.settings = settings
        self.windows = windows
        self.usage = usage
        self.offloading = offloading
        self.rewrites = rewrites
        self.work = work
        self.outgoing = outgoing
        self.metrics = metrics

    async def after(self, exchange: Prepared, outcome: UpstreamOutcome) -> ForwardPlan | None:
        """The compacted retry of a request whose answer was a context overflow, or None when there is none to make."""
        overflow = exchange.wire.overflow(outcome.status, outcome.error_body)
        if overflow is None or exchange.retried or exchange.provider_state or self.settings.mode is Mode.OBSERVE:
            return None
        if exchange.parsed is None:
            exchange.parsed = await self.work.parse(exchange.raw, exchange.wire)
        refused = await self._measured(exchange)
        stated = overflow.window
        if stated is None:
            # An error that states no window (the Responses API's) still says the window is below what was sent.
            stated = refused.provider_tokens(await self.work.run(exchange, refused.transcript.total, whole=True))
        window, learned = exchange.window, False
        if self.windows.learn(exchange.model, stated, exchange.tenant):
            window, learned = stated, True
        if window is None:
            return None
        return await self._compacted(exchange, refused, window, learned=learned)

    async def _measured(self, exchange: Prepared) -> Refused:
        view = await self.work.view(exchange)
        counter = counter_for_model(exchange.model)
        scale = self.usage.calibration(exchange.tenant, exchange.model).ratio
        transcript = Transcript(view.messages, counter, view.meta, keys=view.keys)
        request = self.offloading.counted(exchange.request, exchange.wire, view.read_tool)
        overhead = counter.overhead_tokens(request.overhead_fields) + request.added_prompt_tokens
        return Refused(view, transcript, overhead, scale)

    async def _compacted(
        self, exchange: Prepared, refused: Refused, window: int, *, learned: bool
    ) -> ForwardPlan | None:
        """The retry compacted to `window`, or None when nothing may or can be removed."""
        settings, request, scale = self.settings, exchange.request, refused.scale
        thresholds = Thresholds(window, settings.compact_at, settings.compact_to, request.reserved_tokens)
        kept = refused.view.read_tool
        staging, strategies = self.offloading.for_request(request, exchange.wire, exchange.offload_off, kept=kept)
        provider_overhead = refused.provider_tokens(0)
        target = int(thresholds.target_tokens(provider_overhead) / scale)

        def room() -> Room | None:
            return leading_room(
                refused.transcript,
                target_tokens=target,
                overhead_tokens=provider_overhead,
                scale=scale,
                window=window,
            )

        over = await self.work.run(exchange, room, whole=True)
        if exchange.headers.get(INSTRUCTIONS_HEADER) != over:
            report_room(over, self.metrics, exchange.model, window)
        if over is Room.OVER_WINDOW:
            self.metrics.retries.labels("instructions_over_window").inc()
            return None
        result = await self.work.run(exchange, lambda: strategies.compact(refused.transcript, target), whole=True)
        self.metrics.retries.labels("compacted" if result else "nothing_to_remove").inc()
        if result is None:
            return None
        await self.offloading.persist(exchange.tenant, staging, result.compacted)
        held = held_references(result.compacted.meta)
        kept = kept or (bool(held) and not self.offloading.declined(request))
        await self.rewrites.remember(exchange.scope, refused.view, result.plan, read_tool=kept)
        return await self._sent(exchange, refused, result, window, over, learned=learned)

    async def _sent(
        self,
        exchange: Prepared,
        refused: Refused,
        result: CompactionResult,
        window: int,
        over: Room | None,
        *,
        learned: bool,
    ) -> ForwardPlan:
        """The retry's plan, its headers saying what was done."""
        tokens = refused.provider_tokens(result.tokens_after)
        retry = Prepared(
            exchange.scope,
            exchange.tenant,
            exchange.request,
            exchange.model,
            window,
            exchange.size,
            exchange.wire,
            retried=True,
            headers=dict(exchange.headers),
            original=exchange.original,
        )
        retry.headers.update(
            {
                "X-Compaction": "compacted-after-overflow",
                "X-Compaction-Context-Window": str(window),
                "X-Compaction-Strategies": ",".join(result.strategies),
                "X-Compaction-Tokens-After": str(tokens),
            }
        )
        if over is not None:
            retry.headers[INSTRUCTIONS_HEADER] = over.value
        if learned:
            retry.headers[WINDOW_SOURCE_HEADER] = WindowSource.LEARNED
        self.metrics.record_compaction(result.strategies, refused.provider_tokens(result.tokens_before), tokens)
        held, kept = held_references(result.compacted.meta), refused.view.read_tool
        messages = list(result.compacted.messages)
        return await self.outgoing.plan(b"", retry, messages, None, held, kept=kept, tokens=tokens)
