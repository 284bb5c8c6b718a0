"""The conversation pipeline: the decision for each compacted request, and what is learned from its answer.

For every request of a wire format the proxy compacts (the format is asked for everything format-specific, see
`proxy.pipeline.wire`):

1. The body is parsed and checked against the proxy's limits (`RequestWork`, off the event loop when large).
2. Its window is resolved, and its thresholds (deferring to a client that compacts itself); a small request its
   bytes show under the trigger goes as it came.
3. *Rewrite memory* (`rewrites`) replays the plan stored for the longest known prefix of the conversation.
4. *Anchoring* (`usage`): the provider's count for the longest known prefix of what is now being sent, plus a local
   count of the rest, is the estimate; the engine compacts when it reaches the trigger (`compacting`, with summaries
   and offloading).
5. The compaction, if any, is composed onto the replayed plan, remembered for the whole original request, and sent
   (`Outgoing`).
6. When the upstream answers, a plausible usage report anchors the next request; a context overflow it reports in
   its own error shape teaches the caller's tenant the window, and the request is compacted and retried once
   (`OverflowRetry`).

All state is scoped by the caller's tenant (a keyed hash of its credentials), and state made under a per-request
window override only by requests with the same override. Any internal error forwards the original request
unchanged: the proxy must never fail a request that would have succeeded without it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from functools import lru_cache, partial
from typing import Any, Final, Literal

from proxy.config import Mode, Settings
from proxy.discovery.budget import ProbeBudget
from proxy.discovery.service import WindowDiscovery
from proxy.engine import (
    Anchor,
    CompactionChain,
    Outcome,
    Room,
    Summarization,
    Thresholds,
    chain_by_names,
    counter_for_model,
)
from proxy.engine.calibration import Calibration
from proxy.engine.encodings import load_shipped
from proxy.engine.strategies.offload import StagingOffloadStore, held_references
from proxy.failures import OutageLog
from proxy.names import shown
from proxy.pipeline.byte_bound import SIZED_BELOW_BYTES, bytes_bound
from proxy.pipeline.caller import Caller, conversation_of
from proxy.pipeline.capabilities import CountQuestion
from proxy.pipeline.client_compaction import DEFERRED_HEADER, deferral
from proxy.pipeline.compacting import Compacting, chain_names, report_room
from proxy.pipeline.exact_counts import ExactCounts
from proxy.pipeline.exchange import ForwardPlan, IncomingRequest, Refusal, UpstreamOutcome
from proxy.pipeline.kept_history import KeptHistories
from proxy.pipeline.ledger import Clock, Ledger
from proxy.pipeline.ledger_entries import close_entry, open_entry, retried_entry
from proxy.pipeline.measured import Measured, measure
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.offload.offloading import Offloading, offload_off
from proxy.pipeline.outgoing import Outgoing
from proxy.pipeline.overflow_retry import OverflowRetry
from proxy.pipeline.prepared import Prepared
from proxy.pipeline.previous_forwards import PreviousForwards
from proxy.pipeline.prompt_counts import PromptCounts
from proxy.pipeline.provider_edits import forwarded_view, provider_headers, with_provider_edits
from proxy.pipeline.reports import WINDOW_SOURCE_HEADER, estimate_headers, left_as_sent, report_headers
from proxy.pipeline.request_work import RequestWork
from proxy.pipeline.requests import InvalidRequest, RequestLimits, RequestOverLimit
from proxy.pipeline.rewrites import RewriteMemory, View
from proxy.pipeline.splicing import Splicing
from proxy.pipeline.summaries import Summaries, SummaryContext
from proxy.pipeline.turn import Continuation, Turn
from proxy.pipeline.usage import Estimate, UsageReports
from proxy.pipeline.wire import WireRequest
from proxy.state import StateStore, open_store
from proxy.state.base import StoreEvents
from proxy.windows import ContextWindows, UnknownModels

logger = logging.getLogger("compaction_proxy.compaction")

thresholds_of = lru_cache(maxsize=1024)(Thresholds)
"""`Thresholds(...)` made once for the values of many requests (a window, the settings' fractions, a reservation)."""

COMPACTION_HEADER: Final = "x-compaction"


class CompactionPipeline:
    """The proxy's `Compaction`: decides every compacted request, of any wire format, and learns from the answers.

    :param settings: The proxy's settings (thresholds, strategies, windows, limits, mode, tenant key).
    :param store: Where rewrites and anchors live; the one `settings.state_url` names when None.
    :param chain: The compaction chain; the one `settings.strategies` names when None.
    :param splice_from: Recognize a conversation's next request from its bytes, where its format can
        (`ByteSplicing`), when its body has at least this many bytes: `"format"` as many as the format says, None
        never (only to compare the shortcut with the full path).
    :param ledger: Where each answered request is recorded (`proxy.pipeline.ledger`); a new one when None.
    """

    def __init__(
        self,
        settings: Settings,
        store: StateStore | None = None,
        chain: CompactionChain | None = None,
        *,
        splice_from: int | Literal["format"] | None = "format",
        ledger: Ledger | None = None,
    ) -> None:
        self.settings = settings
        self.mode = settings.mode
        self.store: StateStore = store or open_store(settings)
        self.chain: CompactionChain = chain or chain_by_names(
            chain_names(settings.strategies),
            superseded_tools=settings.superseded_tools,
            user_text_share=settings.user_text_share,
        )
        self.windows = ContextWindows(settings.context_windows, settings.default_context_window)
        probes = ProbeBudget.of(settings, lambda kind, bound: self.metrics.probe_runs_refused.labels(kind, bound).inc())
        self.discovery = WindowDiscovery(settings, self.windows, probes)
        self.metrics = CompactionMetrics()
        self.exact = ExactCounts(settings, self.metrics, probes)
        self.rewrites = RewriteMemory(
            self.store, enabled=settings.rewrite_memory, memory_bytes=settings.prefix_memory_bytes // 2
        )
        self.usage = UsageReports(self.store, self.windows, self.metrics)
        self.histories = KeptHistories(settings, self.store, self.discovery, lambda: self.metrics)
        self.limits = RequestLimits(settings.max_messages, settings.max_content_parts)
        self.work = RequestWork(self.limits, self.rewrites)
        splice_bytes = settings.prefix_memory_bytes // 2
        self.splicing = Splicing(self.limits, splice_bytes, self._failed, splice_from, self.work.off_loop)
        self.previous_forwards = PreviousForwards(memory_bytes=settings.forwarded_memory_bytes)
        self.summaries = Summaries(settings, self.metrics) if Summarization.name in settings.strategies else None
        self.offloading = Offloading(settings, self.store, self.chain, lambda: self.metrics)
        self.outgoing = Outgoing(self.mode, self.offloading, self.work, self.previous_forwards)
        self.counts = PromptCounts(settings, self.work, self.offloading, self.previous_forwards)
        self.retry = OverflowRetry(
            settings,
            windows=self.windows,
            usage=self.usage,
            offloading=self.offloading,
            rewrites=self.rewrites,
            work=self.work,
            outgoing=self.outgoing,
            metrics=self.metrics,
        )
        self.compacting = Compacting(self.summaries, settings.summary_start_at)
        self.observing = Compacting(None, settings.summary_start_at)
        """Observe mode decides as enforce does, but writes no summary."""
        self.unknown_models = UnknownModels()
        self.ledger = ledger or Ledger()
        self.failures = OutageLog(logger, getattr(self.store, "outage_errors", ()), "The state store")
        events = getattr(self.store, "events", None)
        if isinstance(events, StoreEvents):
            events.count_rejected = lambda kind: self.metrics.state_records_rejected.labels(kind).inc()
            events.count_evicted = lambda reason: self.metrics.offload_evictions.labels(reason).inc()

    def register_metrics(self, registry: Any) -> None:
        """Put the compaction metrics on the app's registry, beside the server's."""
        self.use_metrics(CompactionMetrics(registry))

    def use_metrics(self, metrics: CompactionMetrics) -> None:
        """Count into `metrics` (on the app's registry; shared by the pipelines of several routes)."""
        self.metrics = metrics
        self.usage.metrics = self.exact.metrics = self.retry.metrics = self.metrics
        if self.summaries is not None:
            self.summaries.metrics = self.metrics

    def use_clock(self, clock: Clock) -> None:
        """Time the ledger's records by `clock` (a test's fake clock, shared with its fake upstream's prompt cache)."""
        self.ledger.clock = clock

    async def warm_up(self) -> None:
        """Load the tokenizers before the first request, off the event loop.

        Loading one takes about half a second; loaded by the first request that needs it, it would hold the loop, and
        every other request and `/healthz` with it, that long.
        """
        await asyncio.to_thread(load_shipped)

    async def aclose(self) -> None:
        """Release the state store, the summary client and the worker threads (called at app cleanup)."""
        await self.release()
        await self.store.close()

    async def release(self) -> None:
        """Release what is the pipeline's own: the summary and probe clients and the worker threads, not the store."""
        if self.summaries is not None:
            await self.summaries.aclose()
        await self.discovery.aclose()
        await self.exact.aclose()
        self.work.close()

    async def unready_reason(self) -> str | None:
        """Why compaction cannot work now (a state store that does not answer its ping), or None."""
        ping = getattr(self.store, "ping", None)
        return "state_store_unreachable" if ping is not None and not await ping() else None

    async def prepare(self, incoming: IncomingRequest) -> ForwardPlan | Refusal:
        """What to forward for this request (the original bytes on any problem of ours), or why it is refused.

        Every plan says the conversation the request names (`ForwardPlan.conversation`), read here once.
        """
        headers = {key.lower(): value for key, value in incoming.headers.items()}
        conversation = conversation_of(headers, self.settings, incoming.wire, lowered=True)
        if headers.get(COMPACTION_HEADER, "").strip().lower() == "off":
            self.metrics.decided(incoming.wire.name, "skipped")
            return ForwardPlan(incoming.body, {"X-Compaction": "skipped"}, conversation=conversation)
        caller = Caller.of(headers, self.settings, incoming.wire.scope)
        recognized = await self.splicing.recognize(incoming, caller.scope)
        extension = recognized.extension
        try:
            request = extension.request if extension else await self.work.parse(incoming.body, incoming.wire)
        except InvalidRequest as invalid:
            # Not ours to judge: the provider answers it with its own error.
            self.metrics.decided(incoming.wire.name, invalid.outcome)
            return ForwardPlan(body=incoming.body, conversation=conversation)
        except RequestOverLimit as over:
            self.metrics.decided(incoming.wire.name, "refused")
            return Refusal(400, str(over), over.code, param=incoming.wire.entries)
        try:
            if self.histories.continues(incoming.wire, request):
                plan = await self.histories.prepare(incoming, request, headers, caller)
                plan.conversation = conversation
                open_entry(self.ledger, plan, incoming, caller)
                return plan
            plan = await self._prepare(incoming, request, headers, caller, extension)
            plan.conversation = conversation
            open_entry(self.ledger, plan, incoming, caller)
        except Exception as error:
            self.failures.failed("Compaction failed; forwarding the request unchanged.", error)
            self.metrics.errors.inc()
            error_headers = {"X-Compaction": "error"}
            return ForwardPlan(
                incoming.body, error_headers, request.stream, failed_open="compact", conversation=conversation
            )
        self.failures.answered()
        await self.splicing.remember(incoming, plan, caller.scope, recognized)
        return plan

    async def _prepare(
        self,
        incoming: IncomingRequest,
        request: WireRequest,
        headers: Mapping[str, str],
        caller: Caller,
        extension: Continuation | None,
    ) -> ForwardPlan:
        """Decide a request: its window and thresholds, its size, the replayed view, the measure, the compaction."""
        exchange = await self._exchange(incoming, request, headers, caller, extension)
        thresholds = self._thresholds(exchange, headers)
        sized = self._sized_by_bytes(incoming, exchange, thresholds)
        if sized is not None:
            return sized
        view = exchange.turn.view = await self.work.view(exchange)
        exchange.original = view.original_chain
        if thresholds is None:
            self.unknown_models.log(exchange.model)
            exchange.headers["X-Compaction"] = "unknown-window"
            self.metrics.decided(incoming.wire.name, "unknown_window")
            return await self._replayed(incoming, exchange, view)
        calibration = self.usage.calibration(caller.tenant, exchange.model)
        measured, anchor = await self._measured(exchange, view, thresholds, calibration, headers)
        covered = anchor.covered if anchor else None
        context = SummaryContext(
            caller.scope, incoming.path, request, headers, view.chain, incoming.wire, covered, view.read_tool
        )
        exchange.offload_off = offload_off(headers)
        staging, strategies = self.offloading.for_request(
            request, incoming.wire, exchange.offload_off or not measured.decision.compact, kept=view.read_tool
        )
        compacting = self.compacting if self.mode is Mode.ENFORCE else self.observing
        work = partial(self.work.run, exchange, whole=True)
        outcome = await compacting.outcome(measured, context, work, strategies)
        self._report(exchange, outcome, thresholds)
        compacts = self.mode is Mode.ENFORCE and outcome.room is not Room.OVER_WINDOW and outcome.result is not None
        provider = forwarded_view(measured, outcome, request.provider_edits, compacted=compacts)
        exchange.headers.update(provider_headers(provider, compacted=compacts))
        if outcome.result is None or self.mode is Mode.OBSERVE or outcome.room is Room.OVER_WINDOW:
            return await self._left(incoming, exchange, outcome, view, thresholds)
        return await self._compacted(incoming, exchange, outcome, staging=staging, view=view, headers=headers)

    async def _exchange(
        self,
        incoming: IncomingRequest,
        request: WireRequest,
        headers: Mapping[str, str],
        caller: Caller,
        extension: Continuation | None,
    ) -> Prepared:
        """What the pipeline knows of the request once its model and window are resolved."""
        model = incoming.wire.model(request, incoming.path)
        shipped = incoming.wire.window(model, headers)
        resolved = await self.discovery.resolve(model, caller.requested_window, caller.tenant, headers, shipped=shipped)
        window = resolved.tokens if resolved else None
        size, turn = len(incoming.body), Turn(extension)
        exchange = Prepared(caller.scope, caller.tenant, request, model, window, size, incoming.wire, turn=turn)
        exchange.provider_edited = request.provider_edits is not None
        if caller.warning:
            exchange.headers["X-Compaction-Warning"] = caller.warning
        if resolved:
            exchange.headers[WINDOW_SOURCE_HEADER] = resolved.source
        return exchange

    async def _measured(
        self,
        exchange: Prepared,
        view: View,
        thresholds: Thresholds,
        calibration: Calibration,
        headers: Mapping[str, str],
    ) -> tuple[Measured, Anchor | None]:
        """The request counted and decided on, and the usage anchor it rests on (see `proxy.pipeline.measured`)."""
        request, tenant, model = exchange.request, exchange.tenant, exchange.model
        counter = counter_for_model(model)
        anchor = await exchange.turn.anchored(self.usage, exchange.scope, view.chain)
        known = exchange.turn.counted
        question = CountQuestion(model, request, view, tenant, headers, exchange.size, anchor)
        exact = await self.exact.anchor(exchange.wire, question)
        counted = self.offloading.counted(request, exchange.wire, view.read_tool)
        overhead, added = counted.overhead_fields, counted.added_prompt_tokens

        def measured_view() -> Measured:
            made = measure(view, overhead, counter, thresholds, anchor, calibration, known, exact, added_tokens=added)
            return with_provider_edits(made, request.provider_edits)

        measured = await self.work.run(exchange, measured_view)
        exchange.headers.update(self.exact.record(measured))
        exchange.turn.counted = measured.transcript.counts()
        return measured, anchor

    async def _left(
        self, incoming: IncomingRequest, exchange: Prepared, outcome: Outcome, view: View, thresholds: Thresholds
    ) -> ForwardPlan:
        """A request left as it is sent: nothing to remove, observe mode, or instructions alone over the window.

        Observe mode, and instructions over the window, send the client's own bytes: nothing replayed either.
        """
        if self.mode is Mode.OBSERVE or outcome.room is Room.OVER_WINDOW:
            self.metrics.decided(incoming.wire.name, "observed" if outcome.result else left_as_sent(thresholds))
            return await self.outgoing.plan(incoming.body, exchange, None, view.original_chain)
        self.metrics.decided(incoming.wire.name, left_as_sent(thresholds))
        return await self._replayed(incoming, exchange, view)

    async def _replayed(self, incoming: IncomingRequest, exchange: Prepared, view: View) -> ForwardPlan:
        """The plan sending the replayed view, with the read tool its conversation holds or keeps."""
        messages, held = view.changed_messages, view.held
        return await self.outgoing.plan(incoming.body, exchange, messages, view.chain, held, kept=view.read_tool)

    async def _compacted(
        self,
        incoming: IncomingRequest,
        exchange: Prepared,
        outcome: Outcome,
        *,
        staging: StagingOffloadStore | None,
        view: View,
        headers: Mapping[str, str],
    ) -> ForwardPlan:
        """Keep what was offloaded, remember the compaction, say so, and send the compacted messages."""
        result = outcome.result
        assert result is not None  # the outcome of a compaction
        await self.offloading.persist(exchange.tenant, staging, result.compacted)
        held = held_references(result.compacted.meta)
        kept = view.read_tool or (bool(held) and not self.offloading.declined(exchange.request))
        self.metrics.decided(incoming.wire.name, "compacted")
        self.metrics.record_compaction(result.strategies, outcome.decision.estimated_tokens, outcome.tokens_after)
        exchange.turn.view = exchange.turn.counted = None
        await self.rewrites.remember(exchange.scope, view, result.plan, read_tool=kept)
        exchange.estimate = Estimate(outcome.tokens_after)
        logger.info(
            "Compacted a conversation.",
            extra={
                "model": shown(exchange.model),
                "tokens_before": outcome.decision.estimated_tokens,
                "tokens_after": outcome.tokens_after,
                "strategies": ",".join(result.strategies),
                "conversation": shown(conversation_of(headers, self.settings, incoming.wire, lowered=True)),
                "deferred_to": exchange.headers.get(DEFERRED_HEADER),
            },
        )
        # The compacted view is what the full plan gives on the original messages: no need to apply it again.
        compacted = list(result.compacted.messages)
        scope, size = exchange.scope, exchange.size
        chain = await self.work.run(exchange, lambda: self.rewrites.compacted_chain(scope, compacted, size), whole=True)
        return await self.outgoing.plan(incoming.body, exchange, compacted, chain, held, kept=view.read_tool)

    def _thresholds(self, exchange: Prepared, headers: Mapping[str, str]) -> Thresholds | None:
        """The request's thresholds (None without a window), deferring to a client that compacts itself.

        See `proxy.pipeline.client_compaction`: a deferral is said in the response headers and counted.
        """
        request, settings, window = exchange.request, self.settings, exchange.window
        thresholds = None
        if window is not None:
            thresholds = thresholds_of(window, settings.compact_at, settings.compact_to, request.reserved_tokens)
        trigger = thresholds.trigger_tokens if thresholds is not None else None
        deferred, warning = deferral(settings.client_compaction, headers, request, trigger)
        if warning:
            earlier = exchange.headers.get("X-Compaction-Warning")
            exchange.headers["X-Compaction-Warning"] = f"{earlier}; {warning}" if earlier else warning
        if thresholds is None or deferred is None:
            return thresholds
        exchange.headers.update(deferred.headers)
        self.metrics.client_compaction.labels(deferred.signal).inc()
        return thresholds_of(window, settings.compact_at, settings.compact_to, request.reserved_tokens, True)

    def _report(self, exchange: Prepared, outcome: Outcome, thresholds: Thresholds) -> None:
        """Tell the client (headers), the metrics and the log what was decided for this request."""
        exchange.headers.update(report_headers(outcome, thresholds, observed=self.mode is Mode.OBSERVE))
        exchange.estimate = Estimate(outcome.decision.estimated_tokens, bound=outcome.decision.bounded)
        report_room(outcome.room, self.metrics, exchange.model, thresholds.context_window)

    def _sized_by_bytes(
        self, incoming: IncomingRequest, exchange: Prepared, thresholds: Thresholds | None
    ) -> ForwardPlan | None:
        """The request as it came, when its bytes show it under the trigger (see `proxy.pipeline.byte_bound`)."""
        if thresholds is None or not incoming.wire.sized_by_bytes or exchange.size >= SIZED_BELOW_BYTES:
            return None
        request = exchange.request
        if self.exact.may_ask(incoming.wire, exchange.tenant) or not request.text_only:
            return None
        ratio = self.usage.calibration(exchange.tenant, exchange.model).ratio
        bound = bytes_bound(incoming.body, ratio, request.added_prompt_tokens)
        if bound >= thresholds.trigger_tokens:
            return None
        decided = left_as_sent(thresholds)
        exchange.headers.update(estimate_headers(decided, thresholds, bound, bounded=True))
        exchange.estimate = Estimate(bound, bound=True)
        self.metrics.decided(exchange.wire.name, decided)
        headers, model = dict(exchange.headers), shown(exchange.model)
        return ForwardPlan(incoming.body, headers, request.stream, context=exchange, model=model)

    async def prepare_count(self, incoming: IncomingRequest) -> ForwardPlan | None:
        """What to send for a request to the format's prompt-counting endpoint (`PromptCounts`); None: as it came."""
        return await self.counts.plan(incoming)

    async def complete(self, plan: ForwardPlan, outcome: UpstreamOutcome) -> ForwardPlan | None:
        """Anchor the provider's usage; after a context overflow, compact and ask for one retry."""
        exchange = plan.context
        if not isinstance(exchange, Prepared):
            return None
        try:
            if 200 <= outcome.status < 300:
                await self.histories.learn(exchange, outcome)
                close_entry(self.ledger, self.metrics, plan, outcome.usage)
                if exchange.provider_state or exchange.provider_edited:
                    return None
                await self.usage.learn(exchange, outcome.usage, outcome.reply)
                return None
            retry = await self.retry.after(exchange, outcome)
            retried_entry(self.ledger, retry, exchange)
            return retry
        except Exception as error:
            self.failures.failed("Recording the upstream's answer failed; it is relayed as it was.", error)
            self.metrics.errors.inc()
            return None

    def _failed(self) -> None:
        self.metrics.errors.inc()
