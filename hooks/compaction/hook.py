"""`CompactionHook`: Haystack's `before_llm` compaction hook, driven by the engine the proxy uses."""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass
from typing import Any, Self

from haystack.components.agents.state.state import State
from haystack.components.agents.state.state_utils import replace_values
from haystack.components.agents.utils import _context_tokens_from_usage
from haystack.core.serialization import (
    component_to_dict,
    default_from_dict,
    default_to_dict,
    generate_qualified_class_name,
)
from haystack.dataclasses import ChatMessage
from haystack.hooks.compaction.types import Compactor
from haystack.token_counters import TokenCounter
from haystack.tools import ToolsType, flatten_tools_or_toolsets
from haystack.tracing.tracer import tracer
from haystack.utils.deserialization import deserialize_component_inplace

from hooks.compaction.compactors import EngineCompactor
from hooks.compaction.convert import MessageCache, apply_plan, last_assistant_index
from hooks.compaction.counters import (
    ApproximateTokenCounter,
    HaystackCounterAdapter,
    engine_counter,
    overhead_tokens,
)
from proxy.engine import Anchor, Calibration, CompactionResult, Decision, Thresholds, Transcript, decide

logger = logging.getLogger(__name__)

_TAG = "haystack.agent.hook.compaction"


@dataclass(frozen=True)
class _Prepared:
    """A triggered compaction: the conversation as the engine sees it, and the decision."""

    messages: list[ChatMessage]
    transcript: Transcript
    decision: Decision
    context_tokens: int
    overhead_tokens: int


class CompactionHook:
    """Compacts an Agent's conversation once it fills too much of the model's context window.

    A drop-in for `haystack.hooks.compaction.CompactionHook` (same parameters, defaults and serialization), deciding
    with the same engine as the compaction proxy, so both compact the same conversation the same way. Register it on
    an `Agent` under `before_llm`:

    ```python
    from haystack.components.agents import Agent
    from haystack.components.generators.chat import OpenAIChatGenerator
    from hooks.compaction import CompactionHook, SlidingWindowCompactor

    hook = CompactionHook(compactor=SlidingWindowCompactor(), context_window=128_000, compact_at=0.7, compact_to=0.4)
    agent = Agent(chat_generator=OpenAIChatGenerator(model="gpt-4.1-mini"), tools=tools, hooks={"before_llm": [hook]})
    ```

    Size is estimated by anchoring on the `context_tokens` state key, the chat generator's own count of its last
    request and reply (system prompt, tool schemas and chat-template overhead included), plus a local count of the
    tool results appended since. Without reported usage everything is counted locally, tool schemas included. The
    compactor's target is `compact_to` of the window less that non-message overhead.

    Each `ChatMessage` is converted and counted once and remembered by identity (an Agent passes the same objects
    every step), so a call costs in proportion to the messages added since the last one. Kept messages stay the
    caller's own objects, meta intact; only messages compaction created are new.

    Any Haystack `Compactor` works; this package's compactors are planned by the engine on the hook's own view of
    the conversation, others are called with `compact(messages, target_tokens, token_counter)`.
    """

    allowed_hook_points = ("before_llm",)

    def __init__(
        self,
        compactor: Compactor,
        *,
        context_window: int,
        compact_at: float = 0.7,
        compact_to: float = 0.4,
        token_counter: TokenCounter | None = None,
    ) -> None:
        """Initialize the hook with a compactor and the window it has to fit in.

        :param compactor: The `Compactor` that rewrites the conversation: one of this package's, or any other
            implementing Haystack's protocol.
        :param context_window: The model's context window in tokens. Everything else is a fraction of this, so moving
            to a different model means changing only this number.
        :param compact_at: The fraction of the window at which compaction starts. Leave room above it for the reply
            and the tool results it triggers, which land on top of what was measured.
        :param compact_to: The fraction of the window compaction aims to bring the conversation down to. Lower means
            compacting less often but losing more each time.
        :param token_counter: The `TokenCounter` sizing what the chat generator has not reported on yet: ours
            (`ApproximateTokenCounter`, `TiktokenTokenCounter`) or any Haystack one. Defaults to
            `ApproximateTokenCounter`, which needs no extra dependency.
        :raises ValueError: If `context_window` is not positive, or the fractions are not
            `0 < compact_to < compact_at <= 1`.
        """
        self._thresholds = Thresholds(context_window=context_window, compact_at=compact_at, compact_to=compact_to)
        self.compactor = compactor
        self.context_window = context_window
        self.compact_at = compact_at
        self.compact_to = compact_to
        self.token_counter: TokenCounter = token_counter or ApproximateTokenCounter()
        self._cache = MessageCache()
        self._counter = engine_counter(self.token_counter, self._cache)
        self._overhead: tuple[tuple[int, ...], list[Any], int] | None = None
        self._estimated = 0
        # Learns how the provider's counts (`context_tokens`) compare with the counter's, as the proxy does per model.
        self._calibration = Calibration()
        # The last reported prefix and its local count: the next reported prefix usually extends it.
        self._reported: tuple[list[ChatMessage], int] = ([], 0)

    def run(self, state: State) -> None:
        """Compact `state.data["messages"]` if the conversation fills too much of the window.

        :param state: The Agent's live `State`. Read to decide whether to compact, and rewritten in place when the
            compactor returns a compacted conversation.
        :returns: None. The hook mutates `state` in place.
        """
        prepared = self._prepare(state)
        if prepared is None:
            return
        target = prepared.decision.target_tokens
        if isinstance(self.compactor, EngineCompactor):
            result = self.compactor.chain().compact(prepared.transcript, target)
            self._apply_result(state, prepared, result)
            return
        compacted = self.compactor.compact(
            messages=prepared.messages, target_tokens=target, token_counter=self.token_counter
        )
        self._apply(state, prepared, compacted, None)

    async def run_async(self, state: State) -> None:
        """Asynchronously compact `state.data["messages"]` if the conversation fills too much of the window.

        :param state: The Agent's live `State`. Read to decide whether to compact, and rewritten in place when the
            compactor returns a compacted conversation.
        :returns: None. The hook mutates `state` in place.
        """
        prepared = self._prepare(state)
        if prepared is None:
            return
        target = prepared.decision.target_tokens
        if isinstance(self.compactor, EngineCompactor):
            result = await self.compactor.chain().compact_async(prepared.transcript, target)
            self._apply_result(state, prepared, result)
            return
        compact_async = getattr(self.compactor, "compact_async", None)
        if compact_async is not None:
            compacted = await compact_async(
                messages=prepared.messages, target_tokens=target, token_counter=self.token_counter
            )
        else:
            compacted = self.compactor.compact(
                messages=prepared.messages, target_tokens=target, token_counter=self.token_counter
            )
        self._apply(state, prepared, compacted, None)

    def _prepare(self, state: State) -> _Prepared | None:
        """Estimate the request and decide; None when it is not large enough to compact."""
        messages: list[ChatMessage] = list(state.data.get("messages") or [])
        # The Agent resets `context_tokens` at the start of every run; a conversation carried over from an earlier
        # run still has the provider's count of its last call, in the usage of the reply it ends with.
        context_tokens = int(state.data.get("context_tokens") or 0) or _reported_by_last_reply(messages)
        anchor: Anchor | None = None
        overhead = 0
        if context_tokens > 0:
            # The provider counted everything through the last assistant message (its reply included); without one,
            # its count covers the whole conversation.
            last = last_assistant_index(messages)
            anchor = Anchor(tokens=context_tokens, covered=len(messages) if last < 0 else last + 1)
            self._calibrate(messages[: anchor.covered], anchor.tokens, state.data.get("tools"))
            if self._under_trigger(messages[anchor.covered :], anchor.tokens):
                self._tag(None)
                return None
        else:
            overhead = self._overhead_tokens(state.data.get("tools"))
        transcript, entries = self._cache.transcript(messages, self._counter)
        decision = decide(self._thresholds, transcript, overhead, anchor, self._calibration.ratio)
        # Remember the counts of the messages this estimate covers (only the new ones get counted), so the next
        # call's estimate is a sum of known counts.
        start = 0 if anchor is None or decision.compact else min(anchor.covered, len(messages))
        MessageCache.record_tokens(transcript, entries, range(start, len(messages)))

        self._tag(decision)
        if not decision.compact:
            return None
        overhead = decision.overhead_tokens
        if anchor is not None:
            overhead = self._reported_overhead(messages, transcript, decision)
        return _Prepared(messages, transcript, decision, context_tokens, overhead)

    def _reported_overhead(self, messages: list[ChatMessage], transcript: Transcript, decision: Decision) -> int:
        """What the provider's count holds beyond the messages, as Haystack's hook works it out (and warns about).

        The estimate less the counter's count of all the messages: tool schemas and chat-template overhead, or less
        than nothing when the counter counts more than the provider did, which the operator is told about.
        """
        message_tokens = self._list_tokens(messages, transcript, len(messages))
        if message_tokens > decision.estimated_tokens:
            logger.warning(
                "The TokenCounter estimated more tokens for the messages (%d) than the estimated total context size "
                "(%d), which anchors on the provider's own count. %s may be overestimating; a counter closer to the "
                "model's tokenizer sizes the compaction target better.",
                message_tokens,
                decision.estimated_tokens,
                type(self.token_counter).__name__,
            )
        return decision.estimated_tokens - round(decision.scale * message_tokens)

    def _list_tokens(self, messages: list[ChatMessage], transcript: Transcript, end: int) -> int:
        """The counter's count of `messages[:end]` as one list, which `transcript` (of `messages`) counted per message.

        Ours count a list as the sum of its messages, known from the transcript. A foreign counter is asked about the
        list, as Haystack's hook asks it: its count of a list need not be the sum of its counts of each message.
        """
        if isinstance(self._counter, HaystackCounterAdapter):
            return self.token_counter.count(messages=messages[:end])
        return transcript.tokens_of(range(end))

    def _calibrate(self, reported: list[ChatMessage], reported_tokens: int, tools: ToolsType | None) -> None:
        """Compare the provider's count of the reported messages with the counter's, as the proxy does."""
        previous, local = self._reported
        # The same objects in the same places: a compaction in between replaces or removes some of them.
        if not (len(previous) <= len(reported) and all(map(operator.is_, previous, reported))):
            previous, local = [], 0
        added = reported[len(previous) :]
        transcript, entries = self._cache.transcript(added, self._counter)
        MessageCache.record_tokens(transcript, entries, range(len(added)))
        local += transcript.total()
        self._reported = (reported, local)
        self._calibration.observe(local + self._overhead_tokens(tools), reported_tokens)

    def _under_trigger(self, unreported: list[ChatMessage], reported_tokens: int) -> bool:
        """Whether the provider's count plus the messages after it stays under the trigger.

        The same engine decision over just the messages the provider has not counted yet, so a step that does not
        compact costs only those, however long the conversation is.
        """
        transcript, entries = self._cache.transcript(unreported, self._counter)
        anchor = Anchor(tokens=reported_tokens, covered=0)
        decision = decide(self._thresholds, transcript, 0, anchor, self._calibration.ratio)
        MessageCache.record_tokens(transcript, entries, range(len(unreported)))
        self._estimated = decision.estimated_tokens
        return not decision.compact

    def _tag(self, decision: Decision | None) -> None:
        """Tag the current trace span the way Haystack's hook does."""
        span = tracer.current_span()
        if span is None:
            return
        estimated = self._estimated if decision is None else decision.estimated_tokens
        span.set_tags(
            tags={
                f"{_TAG}.strategy": generate_qualified_class_name(cls=type(self.compactor)),
                f"{_TAG}.estimated_context_tokens": estimated,
                f"{_TAG}.triggered": decision is not None and decision.compact,
            }
        )
        if decision is not None and decision.compact:
            span.set_tag(key=f"{_TAG}.target_tokens", value=decision.target_tokens)

    def _overhead_tokens(self, tools: ToolsType | None) -> int:
        """The tool schemas' cost, remembered for the same tools (the Agent passes the same ones every step)."""
        flat = flatten_tools_or_toolsets(tools) if tools else []
        key = tuple(id(tool) for tool in flat)
        if self._overhead is None or self._overhead[0] != key:
            # The tools are held with their ids, so an id cannot be reused while it is remembered.
            self._overhead = (key, flat, overhead_tokens(self._counter, flat))
        return self._overhead[2]

    def _apply_result(self, state: State, prepared: _Prepared, result: CompactionResult | None) -> None:
        """Write back what an engine compactor planned, applied to the caller's own messages."""
        if result is None:
            self._apply(state, prepared, None, None)
            return
        compacted = apply_plan(result.plan, prepared.messages, self._cache)
        self._apply(state, prepared, compacted, result.compacted)

    def _apply(
        self,
        state: State,
        prepared: _Prepared,
        compacted: list[ChatMessage] | None,
        transcript: Transcript | None,
    ) -> None:
        """Write a compacted conversation back into `State`, or do nothing if the compactor declined."""
        span = tracer.current_span()
        if span is not None:
            span.set_tag(key=f"{_TAG}.compacted", value=compacted is not None)
        if compacted is None:
            return
        state.set("messages", compacted, handler_override=replace_values)
        # With no reported usage, leave `context_tokens` at 0 so later steps keep counting the whole request.
        if prepared.context_tokens != 0:
            if transcript is None:
                transcript, _ = self._cache.transcript(compacted, self._counter)
            # Re-estimate what the provider's count would cover: through the last assistant message, overhead
            # included. Counting the tool results after it too would have a second hook count them twice.
            last = last_assistant_index(compacted)
            accounted = self._list_tokens(compacted, transcript, len(compacted) if last < 0 else last + 1)
            state.set("context_tokens", round(prepared.decision.scale * accounted) + prepared.overhead_tokens)
        logger.debug(
            "Compacted the Agent's conversation at step %s from %d to %d messages, targeting %d tokens.",
            state.data.get("step_count", 0),
            len(prepared.messages),
            len(compacted),
            prepared.decision.target_tokens,
        )

    def warm_up(self) -> None:
        """Warm up the token counter and the compactor, which may hold resources such as a Chat Generator."""
        for resource in (self.token_counter, self.compactor):
            if hasattr(resource, "warm_up"):
                resource.warm_up()

    async def warm_up_async(self) -> None:
        """Warm up the token counter and the compactor on the serving event loop."""
        for resource in (self.token_counter, self.compactor):
            if hasattr(resource, "warm_up_async"):
                await resource.warm_up_async()
            elif hasattr(resource, "warm_up"):
                resource.warm_up()

    def close(self) -> None:
        """Release the token counter's and the compactor's resources, and forget the remembered conversions."""
        for resource in (self.token_counter, self.compactor):
            if hasattr(resource, "close"):
                resource.close()
        self._cache.clear()

    async def close_async(self) -> None:
        """Release the token counter's and the compactor's async resources, and forget the remembered conversions."""
        for resource in (self.token_counter, self.compactor):
            if hasattr(resource, "close_async"):
                await resource.close_async()
            elif hasattr(resource, "close"):
                resource.close()
        self._cache.clear()

    def to_dict(self) -> dict[str, Any]:
        """Serialize the hook, including its compactor and token counter.

        :returns: A dictionary representation of the hook.
        """
        return default_to_dict(
            self,
            compactor=component_to_dict(obj=self.compactor, name="compactor"),
            context_window=self.context_window,
            compact_at=self.compact_at,
            compact_to=self.compact_to,
            token_counter=component_to_dict(obj=self.token_counter, name="token_counter"),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Deserialize the hook, reconstructing its compactor and token counter.

        :param data: A dictionary representation produced by `to_dict`.
        :returns: The deserialized `CompactionHook`.
        """
        init_params = data.get("init_parameters", {})
        for key in ("compactor", "token_counter"):
            if init_params.get(key) is not None:
                deserialize_component_inplace(data=init_params, key=key)
        return default_from_dict(cls, data)


def _reported_by_last_reply(messages: list[ChatMessage]) -> int:
    """The provider's prompt-plus-completion count recorded in the last assistant message's `meta["usage"]`, or 0.

    It covers the conversation through that reply, exactly as the Agent's `context_tokens` would have.
    """
    last = last_assistant_index(messages)
    usage = messages[last].meta.get("usage") if last >= 0 else None
    return _context_tokens_from_usage(usage) if isinstance(usage, dict) else 0
