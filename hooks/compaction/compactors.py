"""Compactors over the engine's strategies, implementing Haystack's `Compactor` protocol.

Each compactor is a thin, serializable description of one engine strategy (`ToolResultPruning`, `SlidingWindow`,
`MiddleOut`) or of an ordered chain of them. Our `CompactionHook` hands them its own transcript (counts already
known) and applies the returned edit plan to the caller's messages. Inside Haystack's `CompactionHook`, or called
directly, `compact` does the same with the `TokenCounter` it is given.

Defaults are the engine's, which the proxy uses too, so hook and proxy write the same notes and placeholders.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, Self

from haystack.core.serialization import component_to_dict, default_from_dict, default_to_dict
from haystack.dataclasses import ChatMessage
from haystack.hooks.compaction.types import Compactor
from haystack.token_counters import TokenCounter
from haystack.utils.deserialization import deserialize_component_inplace

from hooks.compaction.convert import MessageCache, apply_plan
from hooks.compaction.counters import engine_counter
from proxy.engine import (
    CompactionChain,
    DuplicateResults,
    JsonMinify,
    MiddleOut,
    SlidingWindow,
    Strategy,
    SupersededResults,
    ToolResultPruning,
    Transcript,
)
from proxy.engine import TokenCounter as EngineCounter
from proxy.engine.strategies.middle_out import DEFAULT_NOTICE
from proxy.engine.strategies.sliding_window import DEFAULT_OMISSION_NOTE
from proxy.engine.strategies.tool_result_pruning import DEFAULT_PLACEHOLDER


class EngineCompactor(Compactor):
    """A `Compactor` whose work the engine does: it names the strategies, the engine plans the edit.

    Subclasses say which strategies to run (`strategies`); everything else is shared: converting the caller's
    messages once, counting each once, and building the result from the caller's own objects.
    """

    _cache: MessageCache | None = None
    _counter: tuple[TokenCounter, EngineCounter] | None = None

    @abstractmethod
    def strategies(self) -> list[Strategy]:
        """The engine strategies this compactor runs, in order, built from its current settings."""

    def chain(self) -> CompactionChain:
        """The strategies as an engine chain: each runs only while the conversation is still over the target."""
        return CompactionChain(self.strategies())

    def compact(
        self, messages: list[ChatMessage], target_tokens: int, token_counter: TokenCounter
    ) -> list[ChatMessage] | None:
        """Return a shorter replacement for `messages`, or None when there is nothing this compactor may change.

        Kept messages are the caller's own objects; only messages compaction created are new, each carrying
        `meta["context_compaction"]` with the strategy's name. `messages` itself is never changed.

        :param messages: The conversation to compact, oldest to newest.
        :param target_tokens: The size the compacted conversation should come in under.
        :param token_counter: The `TokenCounter` to measure messages with (ours is used directly, any other through
            an adapter).
        :returns: The compacted conversation, or None when it would not get smaller.
        """
        transcript = self._transcript(messages, token_counter)
        result = self.chain().compact(transcript, target_tokens)
        return None if result is None else apply_plan(result.plan, messages, self._conversions())

    async def compact_async(
        self, messages: list[ChatMessage], target_tokens: int, token_counter: TokenCounter
    ) -> list[ChatMessage] | None:
        """Asynchronously return a shorter replacement for `messages`, or None when it would not get smaller.

        :param messages: The conversation to compact, oldest to newest.
        :param target_tokens: The size the compacted conversation should come in under.
        :param token_counter: The `TokenCounter` to measure messages with.
        :returns: The compacted conversation, or None when it would not get smaller.
        """
        transcript = self._transcript(messages, token_counter)
        result = await self.chain().compact_async(transcript, target_tokens)
        return None if result is None else apply_plan(result.plan, messages, self._conversions())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Deserialize the compactor.

        :param data: A dictionary representation produced by `to_dict`.
        :returns: The deserialized compactor.
        """
        return default_from_dict(cls, data)

    def _transcript(self, messages: Sequence[ChatMessage], token_counter: TokenCounter) -> Transcript:
        cache = self._conversions()
        if self._counter is None or self._counter[0] is not token_counter:
            self._counter = (token_counter, engine_counter(token_counter, cache))
        transcript, _ = cache.transcript(messages, self._counter[1])
        return transcript

    def _conversions(self) -> MessageCache:
        if self._cache is None:
            self._cache = MessageCache()
        return self._cache


class LosslessCompactor(EngineCompactor):
    """Removes what carries no information before anything is lost: put it first in a `ChainCompactor`.

    - Duplicates: an older tool result identical to a later one becomes a short reference to the later call.
    - JSON: tool results that are JSON lose their insignificant whitespace; they parse to exactly the same data.
    - Superseded results (near-lossless, opt-in): an older result of a tool named in `superseded_tools`, called again
      with the same arguments, becomes a reference to the newer call.

    ```python
    from hooks.compaction import ChainCompactor, CompactionHook, LosslessCompactor, SlidingWindowCompactor

    compactor = ChainCompactor([LosslessCompactor(superseded_tools=["read_file"]), SlidingWindowCompactor()])
    hook = CompactionHook(compactor=compactor, context_window=128_000)
    ```
    """

    def __init__(
        self, *, duplicates: bool = True, json_minify: bool = True, superseded_tools: Sequence[str] = ()
    ) -> None:
        """Initialize the compactor with the lossless steps it takes.

        :param duplicates: Replace older copies of a tool result with a reference to the newest copy.
        :param json_minify: Strip insignificant whitespace from JSON tool results.
        :param superseded_tools: Tools whose older results a newer call with the same arguments supersedes (idempotent
            reads such as `read_file`); empty for none.
        :raises ValueError: If every step is off.
        """
        self.duplicates = duplicates
        self.json_minify = json_minify
        self.superseded_tools = list(superseded_tools)
        if not self.strategies():
            raise ValueError(
                "`LosslessCompactor` has nothing to do: enable `duplicates` or `json_minify`, or name"
                " `superseded_tools`."
            )

    def strategies(self) -> list[Strategy]:
        """The engine's `DuplicateResults`, `SupersededResults` and `JsonMinify`, as enabled, in that order."""
        steps: list[Strategy] = [DuplicateResults()] if self.duplicates else []
        if self.superseded_tools:
            steps.append(SupersededResults(self.superseded_tools))
        if self.json_minify:
            steps.append(JsonMinify())
        return steps

    def to_dict(self) -> dict[str, Any]:
        """Serialize the compactor.

        :returns: A dictionary representation of the compactor.
        """
        return default_to_dict(
            self, duplicates=self.duplicates, json_minify=self.json_minify, superseded_tools=self.superseded_tools
        )


class ToolResultPruningCompactor(EngineCompactor):
    """Replaces the content of older tool results with a short placeholder, keeping the conversation's shape intact.

    Tool output usually dominates a long Agent run, and most of it stops mattering once the model has acted on it.
    Results are rewritten in place, oldest first, until the conversation reaches the target: every tool call keeps its
    result (still answering the same `ToolCall`, error flag kept), so the model sees what it ran and can run it again.

    ```python
    from hooks.compaction import CompactionHook, ToolResultPruningCompactor

    hook = CompactionHook(compactor=ToolResultPruningCompactor(), context_window=128_000)
    ```
    """

    def __init__(
        self,
        *,
        min_keep_steps: int = 1,
        min_tokens: int = 200,
        placeholder: str = DEFAULT_PLACEHOLDER,
        skip_meta_keys: tuple[str, ...] = ("tool_result_offloaded",),
    ) -> None:
        """Initialize the compactor with the rules deciding which results it prunes.

        :param min_keep_steps: How many of the newest tool-calling Agent steps keep their results untouched, even when
            they exceed the target. At least 1: the latest results are what the model is about to act on.
        :param min_tokens: Only results larger than this many tokens are pruned; small ones cost little to keep and
            are often the ones worth keeping.
        :param placeholder: The text left in place of a pruned result. `{tool_name}` is replaced by the name of the
            tool that produced it.
        :param skip_meta_keys: Results whose `meta` holds any of these keys are left alone. The default covers results
            a `ToolResultOffloadHook` already replaced with a reference the model needs to read them back.
        :raises ValueError: If `min_keep_steps` is less than 1 or `min_tokens` is negative.
        """
        self.min_keep_steps = min_keep_steps
        self.min_tokens = min_tokens
        self.placeholder = placeholder
        # A tuple, so a round trip through `to_dict` (which has to emit a list) restores the same type.
        self.skip_meta_keys = tuple(skip_meta_keys)
        self.strategies()

    def strategies(self) -> list[Strategy]:
        """The engine's `ToolResultPruning` with these settings."""
        return [
            ToolResultPruning(
                min_keep_steps=self.min_keep_steps,
                min_tokens=self.min_tokens,
                placeholder=self.placeholder,
                skip_meta_keys=self.skip_meta_keys,
            )
        ]

    def to_dict(self) -> dict[str, Any]:
        """Serialize the compactor.

        :returns: A dictionary representation of the compactor.
        """
        return default_to_dict(
            self,
            min_keep_steps=self.min_keep_steps,
            min_tokens=self.min_tokens,
            placeholder=self.placeholder,
            skip_meta_keys=list(self.skip_meta_keys),
        )


class SlidingWindowCompactor(EngineCompactor):
    """Keeps the Agent's instructions, current task, and as much complete recent conversation as the target allows.

    Leading system messages and the latest user message are always kept. Older history goes first, a whole turn at a
    time; if the current task alone is over the target, its oldest Agent steps follow (an assistant message with all
    its tool results, so a call never loses its results), always keeping the newest `min_keep_steps`. One omission
    note stands where the messages were removed; a later compaction folds it into its own, so there is never more
    than one.

    ```python
    from hooks.compaction import CompactionHook, SlidingWindowCompactor

    hook = CompactionHook(compactor=SlidingWindowCompactor(), context_window=128_000)
    ```
    """

    def __init__(self, *, min_keep_steps: int = 1, omission_note: str | None = DEFAULT_OMISSION_NOTE) -> None:
        """Initialize the compactor.

        :param min_keep_steps: The fewest complete recent Agent steps kept even when they exceed the target. `0`
            allows all of the current task's steps to be removed when none fit.
        :param omission_note: The user message left in place of what was removed, or None to remove silently.
            `{num_removed}` is replaced by the number of messages removed.
        :raises ValueError: If `min_keep_steps` is negative.
        """
        self.min_keep_steps = min_keep_steps
        self.omission_note = omission_note
        self.strategies()

    def strategies(self) -> list[Strategy]:
        """The engine's `SlidingWindow` with these settings."""
        return [SlidingWindow(min_keep_steps=self.min_keep_steps, omission_note=self.omission_note)]

    def to_dict(self) -> dict[str, Any]:
        """Serialize the compactor.

        :returns: A dictionary representation of the compactor.
        """
        return default_to_dict(self, min_keep_steps=self.min_keep_steps, omission_note=self.omission_note)


class MiddleOutCompactor(EngineCompactor):
    """The last resort: cuts the middle out of the largest messages, keeping each one's head and tail, until it fits.

    Other compactors remove whole turns and steps but never the instructions, the latest user message or the newest
    steps. When those alone exceed the target (one enormous tool result, a pasted log), this cuts the middle of the
    largest message other than the leading instructions and the latest user message (which stay byte for byte) and
    says in it how much was removed. A cut tool result stays
    a tool result answering the same call. Put it last in a `ChainCompactor`.
    """

    def __init__(self, *, min_keep_tokens: int = 256, notice: str = DEFAULT_NOTICE) -> None:
        """Initialize the compactor.

        :param min_keep_tokens: The fewest tokens of a cut message's text to keep, half at each end.
        :param notice: The text put where the middle was; `{removed_tokens}` is replaced by how many tokens went.
        :raises ValueError: If `min_keep_tokens` is negative.
        """
        self.min_keep_tokens = min_keep_tokens
        self.notice = notice
        self.strategies()

    def strategies(self) -> list[Strategy]:
        """The engine's `MiddleOut` with these settings."""
        return [MiddleOut(min_keep_tokens=self.min_keep_tokens, notice=self.notice)]

    def to_dict(self) -> dict[str, Any]:
        """Serialize the compactor.

        :returns: A dictionary representation of the compactor.
        """
        return default_to_dict(self, min_keep_tokens=self.min_keep_tokens, notice=self.notice)


class ChainCompactor(EngineCompactor):
    """Runs compactors in order, each on the previous one's result, until the conversation fits the target.

    The proxy's default is `ChainCompactor([LosslessCompactor(), ToolResultPruningCompactor(),
    SlidingWindowCompactor(), MiddleOutCompactor()])`: remove duplicates and JSON whitespace first (nothing is lost),
    then prune old tool output (cheap, keeps the shape), then drop whole old turns and steps, then cut the middle out
    of one oversized message so a request that can fit always does.
    """

    def __init__(self, compactors: Sequence[EngineCompactor]) -> None:
        """Initialize the chain.

        :param compactors: The compactors to run, in order. Each must be one of this package's compactors, since the
            chain runs their engine strategies over one shared view of the conversation.
        :raises ValueError: If `compactors` is empty or holds a compactor that is not engine-backed.
        """
        if not compactors:
            raise ValueError("`compactors` must hold at least one compactor.")
        for compactor in compactors:
            if not isinstance(compactor, EngineCompactor):
                raise ValueError(
                    f"`ChainCompactor` chains this package's compactors only, got {type(compactor).__name__}."
                )
        self.compactors = list(compactors)

    def strategies(self) -> list[Strategy]:
        """Every chained compactor's strategies, in order."""
        return [strategy for compactor in self.compactors for strategy in compactor.strategies()]

    def warm_up(self) -> None:
        """Warm up every chained compactor that holds resources."""
        for compactor in self.compactors:
            if hasattr(compactor, "warm_up"):
                compactor.warm_up()

    async def warm_up_async(self) -> None:
        """Warm up every chained compactor on the serving event loop."""
        for compactor in self.compactors:
            if hasattr(compactor, "warm_up_async"):
                await compactor.warm_up_async()
            elif hasattr(compactor, "warm_up"):
                compactor.warm_up()

    def close(self) -> None:
        """Release every chained compactor's resources."""
        for compactor in self.compactors:
            if hasattr(compactor, "close"):
                compactor.close()

    async def close_async(self) -> None:
        """Release every chained compactor's async resources."""
        for compactor in self.compactors:
            if hasattr(compactor, "close_async"):
                await compactor.close_async()
            elif hasattr(compactor, "close"):
                compactor.close()

    def to_dict(self) -> dict[str, Any]:
        """Serialize the chain and every compactor in it.

        :returns: A dictionary representation of the chain.
        """
        return default_to_dict(
            self, compactors=[component_to_dict(obj=compactor, name="compactor") for compactor in self.compactors]
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Deserialize the chain, reconstructing each compactor.

        :param data: A dictionary representation produced by `to_dict`.
        :returns: The deserialized chain.
        """
        init_params = data.get("init_parameters", {})
        compactors = []
        for serialized in init_params.get("compactors") or []:
            holder = {"compactor": serialized}
            deserialize_component_inplace(holder, key="compactor")
            compactors.append(holder["compactor"])
        init_params["compactors"] = compactors
        return default_from_dict(cls, data)
