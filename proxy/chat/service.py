"""Chat-completion compaction for the proxy: rewrite memory, usage anchors, tenants, and the engine's decision.

For every chat completion:

1. The request's messages are hashed into a chain (element i identifies messages 0..i).
2. *Rewrite memory*: the plan stored for the longest known prefix of that chain is reapplied, so the upstream sees
   exactly the rewritten prefix it saw last turn (provider prompt caches keep hitting) and the engine only has to
   look at what is new.
3. *Anchoring*: the provider's reported usage for the longest known prefix of what is now being sent, plus a local
   count of the rest, is the estimate; the engine compacts when it reaches the trigger.
4. The compaction, if any, is composed onto the reapplied plan and remembered for the whole original request.

Any internal error forwards the original request unchanged: the proxy must never fail a request that would have
succeeded without it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.chat.exchange import ChatOutcome, ForwardPlan, IncomingChat
from proxy.chat.known_prefixes import KnownPrefixes
from proxy.chat.metrics import CompactionMetrics
from proxy.chat.overflow import context_overflow
from proxy.chat.request import ChatRequest, InvalidChatRequest
from proxy.chat.summaries import Summaries, SummaryContext
from proxy.config import Mode, Settings
from proxy.engine import (
    Anchor,
    Calibration,
    CompactionChain,
    CompactionResult,
    Decision,
    EditPlan,
    Outcome,
    Summarization,
    Thresholds,
    Transcript,
    calibrated_decision,
    chain_by_names,
    counter_for_model,
    decide,
)
from proxy.engine.messages import Message, chain_keys, message_key
from proxy.engine.plan import Kept
from proxy.failures import log_failure
from proxy.state import StateStore, open_store
from proxy.windows import ContextWindows

logger = logging.getLogger("proxy.compaction")

COMPACTION_HEADER = "x-compaction"
CONTEXT_WINDOW_HEADER = "x-context-window"

_MAX_MODELS = 1024
"""Model names remembered per process (calibrations, unknown-model warnings): clients choose the names."""


@dataclass
class _Exchange:
    """What `prepare` learned about a request, handed back to `complete` through `ForwardPlan.context`."""

    tenant: bytes
    request: ChatRequest
    model: str | None
    sent_chain: list[bytes]
    estimated_tokens: int | None
    window: int | None
    retried: bool = False
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Rewritten:
    """The request as the upstream will see it before any new compaction: the remembered rewrite applied.

    :param messages: The upstream's view of the conversation.
    :param keys: The message keys of `messages`.
    :param meta: Per-message metadata (compaction markers of created messages), or None when nothing was rewritten.
    :param plan: The remembered plan extended over the whole original request (identity when none was remembered).
    :param original_chain: The chain of the original messages; its last element keys this request's rewrite.
    :param chain: The chain of `messages`, what the upstream is sent unless compaction changes it.
    """

    messages: list[Message]
    keys: list[bytes]
    meta: list[Mapping[str, Any]] | None
    plan: EditPlan
    original_chain: list[bytes]
    chain: list[bytes]

    @property
    def changed(self) -> bool:
        """Whether the upstream's view differs from what the client sent."""
        return self.meta is not None


@dataclass(frozen=True)
class _Sized:
    """A request as the engine measured it: the transcript, its thresholds, the decision and what it rests on."""

    transcript: Transcript
    thresholds: Thresholds
    decision: Decision
    overhead: int
    anchor: Anchor | None


class ChatCompactionService:
    """The proxy's `ChatCompaction`: decides what the upstream receives and learns from its usage reports.

    :param settings: The proxy's settings (thresholds, strategies, windows, mode, tenant key).
    :param store: Where rewrites and anchors live; the one `settings.state_url` names when None.
    :param chain: The compaction chain; the one `settings.strategies` names when None.
    """

    def __init__(
        self, settings: Settings, store: StateStore | None = None, chain: CompactionChain | None = None
    ) -> None:
        self.settings = settings
        self.mode = settings.mode
        self.store: StateStore = store or open_store(settings)
        self.chain: CompactionChain = chain or chain_by_names(_chain_names(settings.strategies))
        self.windows = ContextWindows(settings.context_windows, settings.default_context_window)
        self.calibrations: dict[str, Calibration] = {}
        self.prefixes = KnownPrefixes()
        self.view_prefixes = KnownPrefixes()
        self.metrics = CompactionMetrics()
        self.summaries = Summaries(settings, self.metrics) if Summarization.name in settings.strategies else None
        self._unknown_models_logged: set[str] = set()

    def register_metrics(self, registry: Any) -> None:
        """Put the compaction metrics on the app's registry, beside the server's."""
        self.metrics = CompactionMetrics(registry)
        if self.summaries is not None:
            self.summaries.metrics = self.metrics

    async def aclose(self) -> None:
        """Release the state store and the summary client (called at app cleanup)."""
        if self.summaries is not None:
            await self.summaries.aclose()
        await self.store.close()

    async def prepare(self, chat: IncomingChat) -> ForwardPlan:
        """What to forward for this request; the original bytes on any problem of ours."""
        headers = {key.lower(): value for key, value in chat.headers.items()}
        if headers.get(COMPACTION_HEADER, "").strip().lower() == "off":
            self.metrics.requests.labels("skipped").inc()
            return ForwardPlan(body=chat.body, response_headers={"X-Compaction": "skipped"})
        try:
            request = ChatRequest.parse(chat.body)
        except InvalidChatRequest:
            # Not ours to judge: the provider answers it with its own error.
            self.metrics.requests.labels("unparsed").inc()
            return ForwardPlan(body=chat.body)
        try:
            return await self._prepare(chat, request, headers)
        except Exception as error:
            log_failure(logger, "Compaction failed; forwarding the request unchanged.", error)
            self.metrics.errors.inc()
            return ForwardPlan(body=chat.body, stream=request.stream, response_headers={"X-Compaction": "error"})

    async def _prepare(self, chat: IncomingChat, request: ChatRequest, headers: Mapping[str, str]) -> ForwardPlan:
        tenant = self._tenant(headers)
        model = request.model or _deployment_name(chat.path)
        window = self.windows.resolve(model, _int_header(headers.get(CONTEXT_WINDOW_HEADER)))
        exchange = _Exchange(tenant, request, model, [], None, window)
        view = await self._rewritten(tenant, request.messages)
        if window is None:
            self._log_unknown_model(model)
            exchange.headers["X-Compaction"] = "unknown-window"
            self.metrics.requests.labels("unknown_window").inc()
            return self._forward(chat.body, request, exchange, view.messages, view.chain, changed=view.changed)

        counter = counter_for_model(model)
        thresholds = Thresholds(window, self.settings.compact_at, self.settings.compact_to)
        anchor = await self._anchor(tenant, view.chain)
        transcript = Transcript(view.messages, counter, view.meta, keys=view.keys)
        overhead = counter.overhead_tokens(request.body)
        decision = calibrated_decision(transcript, thresholds, overhead, anchor, calibration=self._calibration(model))
        sized = _Sized(transcript, thresholds, decision, overhead, anchor)
        outcome = await self._compaction(sized, SummaryContext(tenant, chat.path, request.body, headers, view.chain))
        exchange.headers.update(_report(outcome, window))
        exchange.estimated_tokens = None if outcome.decision.bounded else outcome.decision.estimated_tokens
        result = outcome.result
        if self.mode is Mode.OBSERVE:
            self.metrics.requests.labels("observed" if result else "unchanged").inc()
            return self._forward(chat.body, request, exchange, request.messages, view.original_chain, changed=False)
        if result is None:
            self.metrics.requests.labels("unchanged").inc()
            return self._forward(chat.body, request, exchange, view.messages, view.chain, changed=view.changed)

        self.metrics.record_compaction(result.strategies, outcome.decision.estimated_tokens, outcome.tokens_after)
        await self._remember(tenant, view, result.plan)
        exchange.estimated_tokens = outcome.tokens_after
        logger.info(
            "Compacted a conversation.",
            extra={
                "model": model,
                "tokens_before": outcome.decision.estimated_tokens,
                "tokens_after": outcome.tokens_after,
                "strategies": ",".join(result.strategies),
                "conversation": headers.get(self.settings.conversation_header.lower()),
            },
        )
        # The compacted view is what the full plan gives on the original messages: no need to apply it again.
        compacted = list(result.compacted.messages)
        # Remembered as the view the next turn will extend, so its keys are not hashed again.
        _keys, chain = self.view_prefixes.keys(tenant, compacted)
        return self._forward(chat.body, request, exchange, compacted, chain, changed=True)

    async def _compaction(self, sized: _Sized, context: SummaryContext) -> Outcome:
        """Compact when the decision says so: a summary first when one is configured, then the chain.

        Below the trigger, a conversation past `precompact_at` has the summary its next compaction needs started in
        the background, so it is ready when the trigger is reached.
        """
        transcript, decision = sized.transcript, sized.decision
        summaries = self.summaries if self.mode is Mode.ENFORCE else None
        if not decision.compact:
            if summaries is not None:
                self._summarize_ahead(summaries, sized, context)
            return Outcome(decision)
        summary = await summaries.plan(context, transcript, decision.target_tokens) if summaries else None
        if summary is None:
            return Outcome(decision, self.chain.compact(transcript, decision.target_tokens))
        summarized = transcript.edited(summary)
        rest = self.chain.compact(summarized, decision.target_tokens)
        result = CompactionResult(
            plan=summary if rest is None else summary.then(rest.plan),
            compacted=summarized if rest is None else rest.compacted,
            tokens_before=transcript.total(),
            tokens_after=summarized.total() if rest is None else rest.tokens_after,
            strategies=(Summarization.name, *(rest.strategies if rest else ())),
        )
        return Outcome(decision, result)

    def _summarize_ahead(self, summaries: Summaries, sized: _Sized, context: SummaryContext) -> None:
        """Start the next compaction's summary once the conversation passes `precompact_at` of the window."""
        thresholds = sized.thresholds
        ahead = Thresholds(thresholds.context_window, self.settings.summary_start_at, thresholds.compact_to)
        if sized.decision.estimated_tokens < ahead.trigger_tokens:
            return
        early = decide(ahead, sized.transcript, sized.overhead, sized.anchor, sized.decision.scale)
        if early.compact:
            summaries.start(context, sized.transcript, early.target_tokens)

    async def _rewritten(self, tenant: bytes, original: list[Message]) -> _Rewritten:
        """The original messages with the rewrite remembered for their longest known prefix reapplied."""
        original_keys, original_chain = self.prefixes.keys(tenant, original)
        found = await self.store.latest_rewrite(tenant, original_chain) if self.settings.rewrite_memory else None
        if found is None:
            return _Rewritten(
                original, original_keys, None, EditPlan.identity(len(original)), original_chain, original_chain
            )
        stored_at, stored = found
        plan = stored.extended(len(original))
        if stored_at + 1 < len(original):
            # Store it at this request's head, so the next turn finds it in a step or two.
            await self.store.save_rewrite(tenant, original_chain[-1], plan)
        meta: list[Mapping[str, Any]] = [{} if isinstance(entry, Kept) else entry.meta for entry in plan.entries]
        messages = plan.apply_messages(original)
        # The rewritten view repeats turn after turn too, so its keys come from the remembered prefix as well.
        view_keys, view_chain = self.view_prefixes.keys(tenant, messages)
        return _Rewritten(messages, view_keys, meta, plan, original_chain, view_chain)

    async def _remember(self, tenant: bytes, view: _Rewritten, compaction: EditPlan) -> None:
        """Compose a new compaction onto the reapplied rewrite and store it for the whole original request."""
        if view.original_chain and self.settings.rewrite_memory:
            await self.store.save_rewrite(tenant, view.original_chain[-1], view.plan.then(compaction))

    async def _anchor(self, tenant: bytes, sent_chain: list[bytes]) -> Anchor | None:
        found = await self.store.latest_anchor(tenant, sent_chain)
        return Anchor(tokens=found[1], covered=found[0] + 1) if found else None

    def _forward(
        self,
        raw: bytes,
        request: ChatRequest,
        exchange: _Exchange,
        messages: list[Message],
        chain: list[bytes] | None,
        *,
        changed: bool,
    ) -> ForwardPlan:
        """The plan forwarding `messages` (the original bytes when unchanged), asking a stream for its usage.

        :param chain: The chain of `messages` when already known; computed here otherwise.
        """
        exchange.sent_chain = chain if chain is not None else chain_keys([message_key(m) for m in messages])
        body = request.with_messages(messages) if changed else raw
        strip_usage = False
        if request.stream and self.mode is Mode.ENFORCE and not _asks_for_usage(request.body):
            body = _with_usage_requested(body, request.body, changed)
            strip_usage = True
        return ForwardPlan(
            body=body,
            response_headers=dict(exchange.headers) or {"X-Compaction": "unchanged"},
            stream=request.stream,
            strip_usage_chunk=strip_usage,
            context=exchange,
        )

    async def complete(self, plan: ForwardPlan, outcome: ChatOutcome) -> ForwardPlan | None:
        """Anchor the provider's usage; after a context overflow, compact and ask for one retry."""
        exchange = plan.context
        if not isinstance(exchange, _Exchange):
            return None
        try:
            if 200 <= outcome.status < 300:
                await self._learn_usage(exchange, outcome)
                return None
            return await self._retry_after_overflow(exchange, outcome)
        except Exception as error:
            log_failure(logger, "Recording the upstream's answer failed; it is relayed as it was.", error)
            self.metrics.errors.inc()
            return None

    async def _learn_usage(self, exchange: _Exchange, outcome: ChatOutcome) -> None:
        usage = outcome.usage
        if not usage or not exchange.sent_chain:
            return
        prompt = usage.get("prompt_tokens")
        if not isinstance(prompt, int) or prompt <= 0:
            return
        await self.store.save_anchor(exchange.tenant, exchange.sent_chain[-1], prompt)
        total = usage.get("total_tokens")
        if outcome.reply is not None and isinstance(total, int) and total >= prompt:
            reply_chain = chain_keys([message_key(outcome.reply)], start=exchange.sent_chain[-1])[-1]
            await self.store.save_anchor(exchange.tenant, reply_chain, total)
        if exchange.estimated_tokens is not None:
            self.metrics.estimate_error.observe((exchange.estimated_tokens - prompt) / prompt)

    async def _retry_after_overflow(self, exchange: _Exchange, outcome: ChatOutcome) -> ForwardPlan | None:
        overflow = context_overflow(outcome.status, outcome.error_body)
        if overflow is None or exchange.retried or self.mode is Mode.OBSERVE:
            return None
        if overflow.window:
            self.windows.learn(exchange.model, overflow.window)
        window = overflow.window or exchange.window
        if window is None:
            return None
        request = exchange.request
        view = await self._rewritten(exchange.tenant, request.messages)
        counter = counter_for_model(exchange.model)
        thresholds = Thresholds(window, self.settings.compact_at, self.settings.compact_to)
        scale = self._calibration(exchange.model).ratio
        target = int(thresholds.target_tokens(round(scale * counter.overhead_tokens(request.body))) / scale)
        result = self.chain.compact(Transcript(view.messages, counter, view.meta, keys=view.keys), target)
        self.metrics.retries.labels("compacted" if result else "nothing_to_remove").inc()
        if result is None:
            return None
        await self._remember(exchange.tenant, view, result.plan)
        retry = _Exchange(
            exchange.tenant, request, exchange.model, [], None, window, retried=True, headers=dict(exchange.headers)
        )
        retry.headers.update({"X-Compaction": "compacted-after-overflow", "X-Compaction-Context-Window": str(window)})
        retry.headers["X-Compaction-Strategies"] = ",".join(result.strategies)
        return self._forward(b"", request, retry, list(result.compacted.messages), None, changed=True)

    def _calibration(self, model: str | None) -> Calibration:
        """The calibration of local counts against the provider's for `model`, learned across conversations."""
        name = model or ""
        calibration = self.calibrations.get(name)
        if calibration is None:
            calibration = Calibration()
            if len(self.calibrations) < _MAX_MODELS:
                self.calibrations[name] = calibration
        return calibration

    def _tenant(self, headers: Mapping[str, str]) -> bytes:
        """A keyed hash of all the caller's credential headers: state is scoped by it and no key is ever stored."""
        return bytes.fromhex(self.settings.tenant_of(headers))

    def _log_unknown_model(self, model: str | None) -> None:
        name = model or "(no model)"
        if name not in self._unknown_models_logged and len(self._unknown_models_logged) < _MAX_MODELS:
            self._unknown_models_logged.add(name)
            logger.warning(
                "No context window is known for model %r: its requests are forwarded uncompacted. Set "
                "context_windows in the config, default_context_window, or send X-Context-Window.",
                name,
            )


def _chain_names(strategies: list[str]) -> list[str]:
    """The strategies the chain runs: summarization is the proxy's own step before it, middle-out the fallback."""
    names = [name for name in strategies if name != Summarization.name]
    return names or ["middle_out"]


def build_chat_compaction(settings: Settings) -> ChatCompactionService:
    """The compaction side of the proxy for these settings."""
    return ChatCompactionService(settings)


def _report(outcome: Outcome, window: int) -> dict[str, str]:
    """Response headers telling the client what was decided."""
    decision = outcome.decision
    headers = {
        "X-Compaction": "compacted" if outcome.result else "unchanged",
        "X-Compaction-Context-Window": str(window),
        "X-Compaction-Tokens-Before": str(decision.estimated_tokens),
    }
    if decision.bounded:
        headers["X-Compaction-Tokens-Before"] = f"<={decision.estimated_tokens}"
    if outcome.result:
        headers["X-Compaction-Tokens-After"] = str(outcome.tokens_after)
        headers["X-Compaction-Strategies"] = ",".join(outcome.result.strategies)
    return headers


def _deployment_name(path: str) -> str | None:
    """The deployment in an Azure-style path `/openai/deployments/{name}/chat/completions`."""
    parts = path.strip("/").split("/")
    if "deployments" in parts:
        position = parts.index("deployments") + 1
        return parts[position] if position < len(parts) else None
    return None


def _int_header(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _asks_for_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True


def _with_usage_requested(body: bytes, parsed: Mapping[str, Any], changed: bool) -> bytes:
    """The body with `stream_options.include_usage` set, splicing it into the original bytes when possible."""
    if not changed and "stream_options" not in parsed:
        stripped = body.rstrip()
        if stripped.endswith(b"}"):
            return stripped[:-1] + b',"stream_options":{"include_usage":true}}'
    document = orjson.loads(body)
    options = document.get("stream_options")
    document["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return orjson.dumps(document)
