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
from functools import partial
from typing import Any, Final

from proxy.config import Mode, Settings
from proxy.discovery.budget import ProbeBudget
from proxy.discovery.service import WindowDiscovery
from proxy.engine import (
    Anchor,
    CompactionChain,
    Decision,
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
from proxy.formats.chat_completions.request import ChatRequest
from proxy.formats.chat_completions.splice import SPLICE_FROM_BYTES, Extension, Splices, Turn
from proxy.formats.responses.request import ResponsesRequest
from proxy.formats.responses.stateful import ProviderChains
from proxy.names import shown
from proxy.pipeline.byte_bound import SIZED_BELOW_BYTES, bytes_bound
from proxy.pipeline.caller import Caller, conversation_of
from proxy.pipeline.client_compaction import DEFERRED_HEADER, deferral
from proxy.pipeline.compacting import Compacting, chain_names, report_room
from proxy.pipeline.exact_counts import ExactCounts
from proxy.pipeline.exchange import ChatOutcome, ForwardPlan, IncomingChat, Refusal
from proxy.pipeline.measured import Measured, measure
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.offload.offloading import Offloading, offload_off
from proxy.pipeline.outgoing import Outgoing
from proxy.pipeline.overflow_retry import OverflowRetry
from proxy.pipeline.prepared import RELEASE_FROM_BYTES, Prepared
from proxy.pipeline.previous_forwards import PreviousForwards
from proxy.pipeline.reports import WINDOW_SOURCE_HEADER, left_as_sent, report_headers
from proxy.pipeline.request_work import RequestWork
from proxy.pipeline.requests import InvalidChatRequest, RequestLimits, RequestOverLimit
from proxy.pipeline.rewrites import RewriteMemory, View
from proxy.pipeline.summaries import Summaries, SummaryContext
from proxy.pipeline.usage import Estimate, UsageReports
from proxy.pipeline.wire import WireRequest
from proxy.state import StateStore, open_store
from proxy.state.base import StoreEvents
from proxy.windows import ContextWindows, UnknownModels

logger = logging.getLogger("compaction_proxy.compaction")

COMPACTION_HEADER: Final = "x-compaction"


class ChatCompactionService:
    """The proxy's `ChatCompaction`: decides what the upstream receives and learns from its usage reports.

    :param settings: The proxy's settings (thresholds, strategies, windows, limits, mode, tenant key).
    :param store: Where rewrites and anchors live; the one `settings.state_url` names when None.
    :param chain: The compaction chain; the one `settings.strategies` names when None.
    :param splice_from: Recognize a conversation's next request from its bytes (see `splice`) when its body has at
        least this many bytes; None never (only to compare the shortcut with the full path).
    """

    def __init__(
        self,
        settings: Settings,
        store: StateStore | None = None,
        chain: CompactionChain | None = None,
        *,
        splice_from: int | None = SPLICE_FROM_BYTES,
    ) -> None:
        self.settings = settings
        self.mode = settings.mode
        self.store: StateStore = store or open_store(settings)
        self.chain: CompactionChain = chain or chain_by_names(
            chain_names(settings.strategies), superseded_tools=settings.superseded_tools
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
        self.provider_chains = ProviderChains(self.store, settings.provider_state, settings.compact_at)
        self.limits = RequestLimits(settings.max_messages, settings.max_content_parts)
        self.splices = Splices(self.limits, settings.prefix_memory_bytes // 2, self._failed)
        self.splice_from = splice_from
        self.work = RequestWork(self.limits, self.rewrites)
        self.previous_forwards = PreviousForwards()
        self.summaries = Summaries(settings, self.metrics) if Summarization.name in settings.strategies else None
        self.offloading = Offloading(settings, self.store, self.chain, lambda: self.metrics)
        self.outgoing = Outgoing(self.mode, self.offloading, self.work, self.previous_forwards)
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
        self.failures = OutageLog(logger, getattr(self.store, "outage_errors", ()), "The state store")
        events = getattr(self.store, "events", None)
        if isinstance(events, StoreEvents):
            events.count_rejected = lambda kind: self.metrics.state_records_rejected.labels(kind).inc()
            events.count_evicted = lambda reason: self.metrics.offload_evictions.labels(reason).inc()

    def register_metrics(self, registry: Any) -> None:
        """Put the compaction metrics on the app's registry, beside the server's."""
        self.metrics = CompactionMetrics(registry)
        self.usage.metrics = self.exact.metrics = self.retry.metrics = self.metrics
        if self.summaries is not None:
            self.summaries.metrics = self.metrics

    async def warm_up(self) -> None:
        """Load the tokenizers before the first request, off the event loop.

        Loading one takes about half a second; loaded by the first request that needs it, it would hold the loop, and
        every other request and `/healthz` with it, that long.
        """
        await asyncio.to_thread(load_shipped)

    async def aclose(self) -> None:
        """Release the state store, the summary client and the worker threads (called at app cleanup)."""
        if self.summaries is not None:
            await self.summaries.aclose()
        await self.discovery.aclose()
        await self.exact.aclose()
        self.work.close()
        await self.store.close()

    async def unready_reason(self) -> str | None:
        """Why compaction cannot work now (a state store that does not answer its ping), or None."""
        ping = getattr(self.store, "ping", None)
        return "state_store_unreachable" if ping is not None and not await ping() else None

    async def prepare(self, chat: IncomingChat) -> ForwardPlan | Refusal:
        """What to forward for this request (the original bytes on any problem of ours), or why it is refused."""
        headers = {key.lower(): value for key, value in chat.headers.items()}
        if headers.get(COMPACTION_HEADER, "").strip().lower() == "off":
            self.metrics.decided(chat.wire.name, "skipped")
            return ForwardPlan(body=chat.body, response_headers={"X-Compaction": "skipped"})
        caller = Caller.of(headers, self.settings, chat.wire.scope)
        spliced = chat.wire.scope is None and self.splice_from is not None and len(chat.body) >= self.splice_from
        splices = self.splices if spliced else None
        extension, ends = (
            await splices.recognize(caller.scope, chat.body, self.work.off_loop) if splices else (None, None)
        )
        try:
            request = extension.request if extension else await self.work.parse(chat.body, chat.wire)
        except InvalidChatRequest as invalid:
            # Not ours to judge: the provider answers it with its own error.
            self.metrics.decided(chat.wire.name, invalid.outcome)
            return ForwardPlan(body=chat.body)
        except RequestOverLimit as over:
            self.metrics.decided(chat.wire.name, "refused")
            return Refusal(400, str(over), over.code, param=chat.wire.entries)
        try:
            if isinstance(request, ResponsesRequest) and request.stateful:
                return await self._prepare_provider_state(chat, request, headers, caller)
            plan = await self._prepare(chat, request, headers, caller, extension)
        except Exception as error:
            self.failures.failed("Compaction failed; forwarding the request unchanged.", error)
            self.metrics.errors.inc()
            return ForwardPlan(
                body=chat.body, stream=request.stream, response_headers={"X-Compaction": "error"}, failed_open="compact"
            )
        self.failures.answered()
        if not isinstance(exchange := plan.context, Prepared) or not isinstance(exchange.parsed, ChatRequest):
            return plan
        if splices is not None:
            await splices.remember(
                caller.scope, chat.body, exchange.parsed, exchange.turn, self.work.off_loop, openings=ends
            )
        if len(chat.body) >= RELEASE_FROM_BYTES:
            exchange.release(chat.body)
        return plan

    async def _prepare_provider_state(
        self, chat: IncomingChat, request: ResponsesRequest, headers: Mapping[str, str], caller: Caller
    ) -> ForwardPlan:
        """A Responses request whose history the provider keeps (see `proxy.formats.responses.stateful`)."""
        model = request.model
        resolved = await self.discovery.resolve(model, caller.requested_window, caller.tenant, headers)
        window = resolved.tokens if resolved else None
        exchange = Prepared(
            caller.scope, caller.tenant, request, model, window, len(chat.body), chat.wire, provider_state=True
        )
        counter = counter_for_model(model)
        body, state = await self.provider_chains.forwarded(chat.body, request, caller.scope, window, counter)
        self.metrics.decided(chat.wire.name, "provider_state")
        observed = self.mode is Mode.OBSERVE
        return ForwardPlan(
            body=chat.body if observed else body,
            response_headers={"X-Compaction": "provider-state" if observed else state},
            stream=request.stream,
            context=exchange,
            model=shown(model),
        )

    async def _prepare(
        self,
        chat: IncomingChat,
        request: WireRequest,
        headers: Mapping[str, str],
        caller: Caller,
        extension: Extension | None,
    ) -> ForwardPlan:
        """Decide a request: its window and thresholds, its size, the replayed view, the measure, the compaction."""
        exchange = await self._exchange(chat, request, headers, caller, extension)
        thresholds = self._thresholds(exchange, headers)
        calibration = self.usage.calibration(caller.tenant, exchange.model)
        sized = self._sized_by_bytes(chat, exchange, thresholds, calibration)
        if sized is not None:
            return sized
        view = exchange.turn.view = await self.work.view(exchange)
        exchange.original = view.original_chain
        if thresholds is None:
            self.unknown_models.log(exchange.model)
            exchange.headers["X-Compaction"] = "unknown-window"
            self.metrics.decided(chat.wire.name, "unknown_window")
            return await self.outgoing.plan(chat.body, exchange, view.changed_messages, view.chain, view.held)
        measured, anchor = await self._measured(exchange, view, thresholds, calibration, headers)
        context = SummaryContext(
            caller.scope, chat.path, request, headers, view.chain, chat.wire, anchor.covered if anchor else None
        )
        exchange.offload_off = offload_off(headers)
        staging, strategies = self.offloading.for_request(
            request, exchange.offload_off or not measured.decision.compact
        )
        compacting = self.compacting if self.mode is Mode.ENFORCE else self.observing
        work = partial(self.work.run, exchange, whole=True)
        outcome = await compacting.outcome(measured, context, work, strategies)
        self._report(exchange, outcome, thresholds)
        if outcome.result is None or self.mode is Mode.OBSERVE or outcome.room is Room.OVER_WINDOW:
            return await self._left(chat, exchange, outcome, view, thresholds)
        return await self._compacted(chat, exchange, outcome, staging=staging, view=view, headers=headers)

    async def _exchange(
        self,
        chat: IncomingChat,
        request: WireRequest,
        headers: Mapping[str, str],
        caller: Caller,
        extension: Extension | None,
    ) -> Prepared:
        """What the pipeline knows of the request once its model and window are resolved."""
        model = chat.wire.model(request, chat.path)
        shipped = chat.wire.window(model, headers)
        resolved = await self.discovery.resolve(model, caller.requested_window, caller.tenant, headers, shipped=shipped)
        window = resolved.tokens if resolved else None
        size, turn = len(chat.body), Turn(extension)
        exchange = Prepared(caller.scope, caller.tenant, request, model, window, size, chat.wire, turn=turn)
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
        exact = await self.exact.anchor(model, request, view, tenant, headers, size=exchange.size, usage=anchor)
        measured = await self.work.run(
            exchange,
            lambda: measure(
                view,
                request.overhead_fields,
                counter,
                thresholds,
                anchor,
                calibration,
                known,
                exact,
                added_tokens=request.added_prompt_tokens,
            ),
        )
        exchange.headers.update(self.exact.record(measured))
        exchange.turn.counted = measured.transcript.counts()
        return measured, anchor

    async def _left(
        self, chat: IncomingChat, exchange: Prepared, outcome: Outcome, view: View, thresholds: Thresholds
    ) -> ForwardPlan:
        """A request left as it is sent: nothing to remove, observe mode, or instructions alone over the window.

        Observe mode, and instructions over the window, send the client's own bytes: nothing replayed either.
        """
        if self.mode is Mode.OBSERVE or outcome.room is Room.OVER_WINDOW:
            self.metrics.decided(chat.wire.name, "observed" if outcome.result else left_as_sent(thresholds))
            return await self.outgoing.plan(chat.body, exchange, None, view.original_chain)
        self.metrics.decided(chat.wire.name, left_as_sent(thresholds))
        return await self.outgoing.plan(chat.body, exchange, view.changed_messages, view.chain, view.held)

    async def _compacted(
        self,
        chat: IncomingChat,
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
        self.metrics.decided(chat.wire.name, "compacted")
        self.metrics.record_compaction(result.strategies, outcome.decision.estimated_tokens, outcome.tokens_after)
        exchange.turn.view = exchange.turn.counted = None
        await self.rewrites.remember(exchange.scope, view, result.plan)
        exchange.estimate = Estimate(outcome.tokens_after)
        logger.info(
            "Compacted a conversation.",
            extra={
                "model": shown(exchange.model),
                "tokens_before": outcome.decision.estimated_tokens,
                "tokens_after": outcome.tokens_after,
                "strategies": ",".join(result.strategies),
                "conversation": shown(conversation_of(headers, self.settings, chat.wire)),
                "deferred_to": exchange.headers.get(DEFERRED_HEADER),
            },
        )
        # The compacted view is what the full plan gives on the original messages: no need to apply it again.
        compacted = list(result.compacted.messages)
        scope, size = exchange.scope, exchange.size
        chain = await self.work.run(exchange, lambda: self.rewrites.compacted_chain(scope, compacted, size), whole=True)
        return await self.outgoing.plan(chat.body, exchange, compacted, chain, held_references(result.compacted.meta))

    def _thresholds(self, exchange: Prepared, headers: Mapping[str, str]) -> Thresholds | None:
        """The request's thresholds (None without a window), deferring to a client that compacts itself.

        See `proxy.pipeline.client_compaction`: a deferral is said in the response headers and counted.
        """
        request, settings = exchange.request, self.settings
        deferred, warning = deferral(settings.client_compaction, headers, request)
        if warning:
            earlier = exchange.headers.get("X-Compaction-Warning")
            exchange.headers["X-Compaction-Warning"] = f"{earlier}; {warning}" if earlier else warning
        if exchange.window is None:
            return None
        if deferred is not None:
            exchange.headers.update(deferred.headers)
            self.metrics.client_compaction.labels(deferred.signal).inc()
        reserved = request.reserved_tokens
        return Thresholds(exchange.window, settings.compact_at, settings.compact_to, reserved, deferred is not None)

    def _report(self, exchange: Prepared, outcome: Outcome, thresholds: Thresholds) -> None:
        """Tell the client (headers), the metrics and the log what was decided for this request."""
        exchange.headers.update(report_headers(outcome, thresholds, observed=self.mode is Mode.OBSERVE))
        exchange.estimate = Estimate(outcome.decision.estimated_tokens, bound=outcome.decision.bounded)
        report_room(outcome.room, self.metrics, exchange.model, thresholds.context_window)

    def _sized_by_bytes(
        self, chat: IncomingChat, exchange: Prepared, thresholds: Thresholds | None, calibration: Calibration
    ) -> ForwardPlan | None:
        """The request as it came, when its bytes show it under the trigger (see `proxy.pipeline.byte_bound`)."""
        small = chat.wire.sized_by_bytes and exchange.size < SIZED_BELOW_BYTES
        request = exchange.request
        if thresholds is None or not small or self.exact.may_ask(exchange.tenant, request) or not request.text_only:
            return None
        bound = bytes_bound(chat.body, calibration.ratio, request.added_prompt_tokens)
        if bound >= thresholds.trigger_tokens:
            return None
        exchange.headers.update(report_headers(Outcome(Decision(bound, compact=False, bounded=True)), thresholds))
        exchange.estimate = Estimate(bound, bound=True)
        self.metrics.decided(exchange.wire.name, left_as_sent(thresholds))
        return ForwardPlan(
            body=chat.body,
            response_headers=dict(exchange.headers),
            stream=exchange.request.stream,
            context=exchange,
            model=shown(exchange.model),
        )

    async def complete(self, plan: ForwardPlan, outcome: ChatOutcome) -> ForwardPlan | None:
        """Anchor the provider's usage; after a context overflow, compact and ask for one retry."""
        exchange = plan.context
        if not isinstance(exchange, Prepared):
            return None
        try:
            if 200 <= outcome.status < 300:
                if outcome.response_id is not None and isinstance(exchange.request, ResponsesRequest):
                    await self.provider_chains.learn(
                        exchange.scope, exchange.request, outcome.response_id, outcome.usage
                    )
                if exchange.provider_state:
                    return None
                counter = counter_for_model(exchange.model)
                await self.usage.learn(exchange.sent, outcome.usage, outcome.reply, counter)
                return None
            return await self.retry.after(exchange, outcome)
        except Exception as error:
            self.failures.failed("Recording the upstream's answer failed; it is relayed as it was.", error)
            self.metrics.errors.inc()
            return None

    def _failed(self) -> None:
        self.metrics.errors.inc()


def build_chat_compaction(settings: Settings) -> ChatCompactionService:
    """The compaction side of the proxy for these settings."""
    return ChatCompactionService(settings)
