"""Chat-completion compaction for the proxy: the decision for each request, and what is learned from its answer.

For every chat completion:

1. The body is parsed and checked against the proxy's limits; large bodies are worked on off the event loop.
2. *Rewrite memory* (`rewrites`) replays the plan stored for the longest known prefix of the conversation.
3. *Anchoring* (`usage`): the provider's count for the longest known prefix of what is now being sent, plus a local
   count of the rest, is the estimate; the engine compacts when it reaches the trigger.
4. The compaction, if any, is composed onto the replayed plan and remembered for the whole original request.
5. When the upstream answers, a plausible usage report anchors the next request; a context overflow it reports in
   its own error shape teaches the caller's tenant the window, and the request is compacted and retried once
   (`proxy.pipeline.overflow_retry`).

All state is scoped by the caller's tenant (a keyed hash of its credentials), and state made under a per-request
window override only by requests with the same override. Any internal error forwards the original request
unchanged: the proxy must never fail a request that would have succeeded without it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from proxy.config import Mode, Settings
from proxy.discovery.budget import ProbeBudget
from proxy.discovery.service import WindowDiscovery
from proxy.engine import (
    CompactionChain,
    Decision,
    Outcome,
    Room,
    Summarization,
    Thresholds,
    chain_by_names,
    counter_for_model,
)
from proxy.engine.encodings import load_shipped
from proxy.engine.messages import Message, chain_keys, message_key
from proxy.engine.strategies.offload import held_references
from proxy.failures import OutageLog
from proxy.formats.chat_completions.request import ChatRequest
from proxy.formats.chat_completions.splice import SPLICE_FROM_BYTES, Extension, Forwarded, Splices, Turn, forward
from proxy.formats.responses.request import ResponsesRequest
from proxy.formats.responses.stateful import ProviderChains
from proxy.names import shown
from proxy.pipeline.byte_bound import SIZED_BELOW_BYTES, byte_bound
from proxy.pipeline.caller import Caller, conversation_of
from proxy.pipeline.client_compaction import DEFERRED_HEADER, deferral
from proxy.pipeline.compacting import Compacting, chain_names, report_room
from proxy.pipeline.exact_counts import ExactCounts
from proxy.pipeline.exchange import ChatOutcome, ForwardPlan, IncomingChat, Refusal
from proxy.pipeline.measured import measure
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.off_loop import OffLoop
from proxy.pipeline.offload.offloading import Offloading, offload_off
from proxy.pipeline.overflow_retry import OverflowRetry
from proxy.pipeline.prepared import RELEASE_FROM_BYTES, Prepared
from proxy.pipeline.previous_forwards import PreviousForwards
from proxy.pipeline.reports import WINDOW_SOURCE_HEADER, left_as_sent, report_headers
from proxy.pipeline.requests import InvalidChatRequest, RequestLimits, RequestOverLimit
from proxy.pipeline.rewrites import RewriteMemory, View
from proxy.pipeline.summaries import Summaries, SummaryContext
from proxy.pipeline.usage import Estimate, UsageReports
from proxy.pipeline.wire import Forwarding, WireFormat
from proxy.state import StateStore, open_store
from proxy.state.base import StoreEvents
from proxy.windows import ContextWindows, UnknownModels

logger = logging.getLogger("compaction_proxy.compaction")

COMPACTION_HEADER: Final = "x-compaction"

T = TypeVar("T")


class ChatCompactionService(OverflowRetry):
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
        self.off_loop = OffLoop()
        self.previous_forwards = PreviousForwards()
        self.summaries = Summaries(settings, self.metrics) if Summarization.name in settings.strategies else None
        self.offloading = Offloading(settings, self.store, self.chain, lambda: self.metrics)
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
        self.usage.metrics = self.exact.metrics = self.metrics
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
        self.off_loop.close()
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
        extension, ends = await splices.recognize(caller.scope, chat.body, self.off_loop) if splices else (None, None)
        try:
            request = extension.request if extension else await self._parse(chat.body, chat.wire)
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
                caller.scope, chat.body, exchange.parsed, exchange.turn, self.off_loop, openings=ends
            )
        if len(chat.body) >= RELEASE_FROM_BYTES:
            exchange.release(chat.body)
        return plan

    async def _parse(self, raw: bytes, wire: WireFormat) -> Any:
        return await self.off_loop.run(len(raw), lambda: wire.parse(raw, self.limits))

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
        request: ChatRequest | ResponsesRequest,
        headers: Mapping[str, str],
        caller: Caller,
        extension: Extension | None,
    ) -> ForwardPlan:
        tenant, scope = caller.tenant, caller.scope
        model = chat.wire.model(request, chat.path)
        shipped = chat.wire.window(model, headers)
        resolved = await self.discovery.resolve(model, caller.requested_window, tenant, headers, shipped=shipped)
        window = resolved.tokens if resolved else None
        exchange = Prepared(scope, tenant, request, model, window, len(chat.body), chat.wire, turn=Turn(extension))
        if caller.warning:
            exchange.headers["X-Compaction-Warning"] = caller.warning
        if resolved:
            exchange.headers[WINDOW_SOURCE_HEADER] = resolved.source
        calibration = self.usage.calibration(tenant, model)
        thresholds = self._thresholds(exchange, headers)
        sized = chat.wire.sized_by_bytes and exchange.size < SIZED_BELOW_BYTES and not self.exact.may_ask(tenant)
        if thresholds is not None and sized:
            bound = byte_bound(chat.body, request.messages, calibration.ratio)
            if bound is not None and bound < thresholds.trigger_tokens:
                return self._sized_by_bytes(chat.body, exchange, bound, thresholds)
        view = exchange.turn.view = await self._view(exchange)
        exchange.original = view.original_chain
        if thresholds is None:
            self.unknown_models.log(model)
            exchange.headers["X-Compaction"] = "unknown-window"
            self.metrics.decided(chat.wire.name, "unknown_window")
            return await self._forward(
                chat.body, exchange, view.messages if view.changed else None, view.chain, view.held
            )

        counter = counter_for_model(model)
        anchor = await exchange.turn.anchored(self.usage, scope, view.chain)
        known = exchange.turn.counted
        exact = await self.exact.anchor(model, request, view, tenant, headers, size=exchange.size, usage=anchor)
        measured = await self._work(
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
        context = SummaryContext(scope, chat.path, request, headers, view.chain, chat.wire)
        compacting = self.compacting if self.mode is Mode.ENFORCE else self.observing
        exchange.offload_off = offload_off(headers)
        staging, strategies = self.offloading.for_request(
            request, exchange.offload_off or not measured.decision.compact
        )
        outcome = await compacting.outcome(measured, context, lambda w: self._work(exchange, w, whole=True), strategies)
        self._report(exchange, outcome, thresholds)
        result = outcome.result
        if self.mode is Mode.OBSERVE or outcome.room is Room.OVER_WINDOW:
            self.metrics.decided(chat.wire.name, "observed" if result else left_as_sent(thresholds))
            return await self._forward(chat.body, exchange, None, view.original_chain)
        if result is None:
            self.metrics.decided(chat.wire.name, left_as_sent(thresholds))
            return await self._forward(
                chat.body, exchange, view.messages if view.changed else None, view.chain, view.held
            )

        await self.offloading.persist(tenant, staging, result.compacted)
        self.metrics.decided(chat.wire.name, "compacted")
        self.metrics.record_compaction(result.strategies, outcome.decision.estimated_tokens, outcome.tokens_after)
        exchange.turn.view = exchange.turn.counted = None
        await self.rewrites.remember(scope, view, result.plan)
        exchange.estimate = Estimate(outcome.tokens_after)
        logger.info(
            "Compacted a conversation.",
            extra={
                "model": shown(model),
                "tokens_before": outcome.decision.estimated_tokens,
                "tokens_after": outcome.tokens_after,
                "strategies": ",".join(result.strategies),
                "conversation": shown(conversation_of(headers, self.settings, chat.wire)),
                "deferred_to": exchange.headers.get(DEFERRED_HEADER),
            },
        )
        # The compacted view is what the full plan gives on the original messages: no need to apply it again.
        compacted = list(result.compacted.messages)
        chain = await self._work(
            exchange, lambda: self.rewrites.compacted_chain(scope, compacted, exchange.size), whole=True
        )
        return await self._forward(chat.body, exchange, compacted, chain, held_references(result.compacted.meta))

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

    def _sized_by_bytes(self, raw: bytes, exchange: Prepared, bound: int, thresholds: Thresholds) -> ForwardPlan:
        """Forward a request its bytes show to be under the trigger as it came (see `proxy.pipeline.byte_bound`)."""
        exchange.headers.update(report_headers(Outcome(Decision(bound, compact=False, bounded=True)), thresholds))
        exchange.estimate = Estimate(bound, bound=True)
        self.metrics.decided(exchange.wire.name, left_as_sent(thresholds))
        return ForwardPlan(
            body=raw,
            response_headers=dict(exchange.headers),
            stream=exchange.request.stream,
            context=exchange,
            model=shown(exchange.model),
        )

    async def _view(self, exchange: Prepared) -> View:
        """The request's messages with the remembered rewrite replayed (see `RewriteMemory` and `Turn.replayed`)."""
        messages, size = exchange.request.messages, exchange.size
        return await exchange.turn.replayed(self.rewrites, exchange.scope, messages, size, self.off_loop)

    async def _forward(
        self,
        raw: bytes,
        exchange: Prepared,
        messages: list[Message] | None,
        chain: list[bytes] | None,
        held: tuple[str, ...] = (),
        *,
        tokens: int | None = None,
    ) -> ForwardPlan:
        """The plan forwarding `messages` (the original bytes when None), asking a stream for its usage.

        :param chain: The chain of what is sent, when already known; computed here otherwise.
        :param held: The references of the offloaded results `messages` hold: when any, the read tool is offered.
        :param tokens: The estimated prompt tokens of `messages`, when the exchange has no estimate of its own.
        """
        offered = held if messages else ()
        if exchange.estimate is not None:
            tokens = exchange.estimate.tokens
        sized = (exchange.window, tokens)
        request, reads = await self.offloading.offer(
            exchange.request,
            exchange.wire,
            exchange.tenant,
            offered,
            exchange.headers,
            sized=sized,
            originals=lambda: self._originals(exchange),
        )
        ask_usage = self.mode is Mode.ENFORCE and exchange.wire.asks_usage(request)

        # What the conversation's previous request was forwarded as counts only for messages the proxy rewrites.
        previous = self.previous_forwards.find(exchange.scope, exchange.original) if messages is not None else None

        def build() -> tuple[Forwarding, Forwarded | None, list[bytes]]:
            sent = request.messages if messages is None else messages
            sent_chain = chain if chain is not None else chain_keys([message_key(message) for message in sent])
            if isinstance(request, ChatRequest):
                body, spliced = forward(exchange.turn.extension, raw, request, messages, ask_usage=ask_usage)
                return Forwarding(body), spliced, sent_chain
            return request.forwarded(raw, messages, previous), None, sent_chain

        whole = messages is not None and not exchange.turn.splices(messages)
        forwarded, exchange.turn.forwarded, exchange.chain = await self._work(exchange, build, whole=whole)
        self.previous_forwards.remember(exchange.scope, exchange.original, forwarded.replay_state)
        return ForwardPlan(
            body=forwarded.body,
            header_values=dict(forwarded.header_values),
            response_headers=dict(exchange.headers) or {"X-Compaction": "unchanged"},
            stream=request.stream,
            strip_usage_chunk=ask_usage,
            context=exchange,
            reads=reads,
            model=shown(exchange.model),
        )

    async def _originals(self, exchange: Prepared) -> list[Message]:
        """The request's messages as the client sent them, parsed again when they were `release`d."""
        request = exchange.parsed if exchange.parsed is not None else await self._parse(exchange.raw, exchange.wire)
        return request.messages

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
            return await self._retry_after_overflow(exchange, outcome)
        except Exception as error:
            self.failures.failed("Recording the upstream's answer failed; it is relayed as it was.", error)
            self.metrics.errors.inc()
            return None

    async def _work(self, exchange: Prepared, work: Callable[[], T], *, whole: bool = False) -> T:
        """CPU work for this request: off the event loop when it is large.

        :param whole: The work is proportional to the whole request, not only to what it added to a known one.
        """
        return await self.off_loop.run(exchange.size if whole else exchange.turn.new_bytes(exchange.size), work)

    def _failed(self) -> None:
        self.metrics.errors.inc()


def build_chat_compaction(settings: Settings) -> ChatCompactionService:
    """The compaction side of the proxy for these settings."""
    return ChatCompactionService(settings)
