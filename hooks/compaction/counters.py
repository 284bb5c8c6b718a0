"""Token counters: ours implement Haystack's `TokenCounter` protocol; Haystack's are wrapped for the engine.

`TiktokenTokenCounter` and `ApproximateTokenCounter` can be passed wherever Haystack takes a `TokenCounter` (its
own `CompactionHook` and compactors included). Inside our hook they hand the engine their engine counter directly,
which counts per message, the way the provider does (chat-format framing, tool schemas, images by OpenAI's tile
formula), and remembers each message's count.

Any other Haystack `TokenCounter` (`haystack.token_counters.TiktokenCounter`, a custom one) works too: the engine
counts each message by asking that counter about the message's `ChatMessage`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from haystack.core.serialization import default_from_dict, default_to_dict
from haystack.dataclasses import ChatMessage
from haystack.token_counters import TokenCounter
from haystack.tools import ToolsType

from hooks.compaction.convert import MessageCache, from_openai, tool_specs
from proxy.engine import ApproximateCounter, TiktokenCounter
from proxy.engine import TokenCounter as EngineCounter
from proxy.engine.counting import render_tool_schemas
from proxy.engine.messages import Message, MessageKey


class _EngineBackedCounter:
    """Haystack's `TokenCounter` protocol over an engine counter; shared by our two counters."""

    engine: EngineCounter
    _cache: MessageCache | None = None

    def count(self, messages: list[ChatMessage], tools: ToolsType | None = None) -> int:
        """Return the tokens the messages, and the schemas of `tools` when given, take up in a request.

        Each message costs its chat-format framing, role, text, tool calls and media; tool schemas are rendered the
        way OpenAI presents them to the model. Message counts are remembered, so counting a conversation again costs
        only its new messages.

        :param messages: The messages to measure.
        :param tools: Tools whose schemas are sent alongside the messages; counted when given.
        :returns: The token count, or `0` when there is nothing to measure.
        """
        if not messages and not tools:
            return 0
        total = 0
        if messages:
            total = sum(self.engine.message_tokens(entry.openai) for entry in self._conversions().entries(messages))
        specs = tool_specs(tools)
        if specs:
            total += self.engine.text_tokens(render_tool_schemas(specs))
        return total

    def to_dict(self) -> dict[str, Any]:
        """Serialize the counter's settings."""
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Rebuild the counter from `to_dict` output."""
        return default_from_dict(cls, data)

    def _conversions(self) -> MessageCache:
        """The conversions `count` reuses across calls (a compactor counts the same messages many times)."""
        if self._cache is None:
            self._cache = MessageCache(max_size=4096)
        return self._cache


class TiktokenTokenCounter(_EngineBackedCounter):
    """Counts tokens with tiktoken's BPE, exactly as OpenAI's models tokenize, with no network access.

    The `o200k_base` and `cl100k_base` vocabularies ship with this package, so nothing is downloaded, not even on
    first use. Counts follow OpenAI's chat format: per-message framing, tool calls, tool schemas, and images by
    OpenAI's tile formula where their size is known. Other providers tokenize differently; anchor on their reported
    usage (the `CompactionHook` does) and the local count only covers the newest messages.

    ```python
    from haystack.dataclasses import ChatMessage
    from hooks.compaction import TiktokenTokenCounter

    counter = TiktokenTokenCounter()
    counter.count([ChatMessage.from_user("Hello, how are you?")])
    ```
    """

    def __init__(self, encoding: str = "o200k_base", cache_size: int = 200_000) -> None:
        """Initialize the counter.

        :param encoding: The tiktoken encoding: `o200k_base` (gpt-4o, gpt-4.1, gpt-5, the o-series) or
            `cl100k_base` (gpt-4, gpt-3.5).
        :param cache_size: How many per-message counts to remember (about 100 bytes each).
        :raises ValueError: If the encoding is not one this package ships.
        """
        self.encoding = encoding
        self.cache_size = cache_size
        self.engine = TiktokenCounter(encoding, cache_size=cache_size)

    def to_dict(self) -> dict[str, Any]:
        """Serialize the counter.

        :returns: A dictionary representation of the counter.
        """
        return default_to_dict(self, encoding=self.encoding, cache_size=self.cache_size)


class ApproximateTokenCounter(_EngineBackedCounter):
    """Estimates tokens from text length with a flat characters-per-token ratio; needs no tokenizer.

    The default for `CompactionHook`, as in Haystack. At 4 characters per token, English prose and code come out a
    little high and number-heavy JSON or CJK text low; the hook anchors on the provider's reported usage, so only the
    newest messages are estimated this way.
    """

    def __init__(self, chars_per_token: float = 4.0, cache_size: int = 200_000) -> None:
        """Initialize the counter.

        :param chars_per_token: How many characters count as one token.
        :param cache_size: How many per-message counts to remember (about 100 bytes each).
        :raises ValueError: If `chars_per_token` is not positive.
        """
        if chars_per_token <= 0:
            raise ValueError(f"`chars_per_token` must be greater than 0, got {chars_per_token}.")
        self.chars_per_token = chars_per_token
        self.cache_size = cache_size
        self.engine = ApproximateCounter(chars_per_token, cache_size=cache_size)

    def to_dict(self) -> dict[str, Any]:
        """Serialize the counter.

        :returns: A dictionary representation of the counter.
        """
        return default_to_dict(self, chars_per_token=self.chars_per_token, cache_size=self.cache_size)


class HaystackCounterAdapter(EngineCounter):
    """The engine's counter interface over any Haystack `TokenCounter`.

    A message dict is counted by counting its `ChatMessage`: the caller's original object when `cache` converted it,
    else one rebuilt from the dict. Text alone (for cutting a message's middle) is counted as a user message's text,
    less what an empty user message costs.

    :param counter: The Haystack counter to ask.
    :param cache: Where the hook's conversions are remembered, to find the original of a dict.
    """

    def __init__(self, counter: TokenCounter, cache: MessageCache | None = None) -> None:
        super().__init__(cache_size=0)
        self.counter = counter
        self.cache = cache
        self._empty_user: int | None = None

    @property
    def name(self) -> str:
        """`haystack:<class name>`."""
        return f"haystack:{type(self.counter).__name__}"

    def message_tokens(self, message: Message, key: MessageKey | None = None) -> int:
        """What the Haystack counter says the message's `ChatMessage` costs (`key` is not needed)."""
        original = self.cache.original(message) if self.cache is not None else None
        if original is None:
            original = from_openai(message)
        return self.counter.count(messages=[original])

    def message_upper_bound(self, message: Message, key: MessageKey | None = None) -> int:
        """The count itself: a foreign counter has no cheaper bound."""
        return self.message_tokens(message, key)

    def text_tokens(self, text: str) -> int:
        """The tokens `text` adds to a user message."""
        if self._empty_user is None:
            self._empty_user = self.counter.count(messages=[ChatMessage.from_user("")])
        return max(self.counter.count(messages=[ChatMessage.from_user(text)]) - self._empty_user, 0)

    def overhead_tokens(self, request: Mapping[str, Any] | None = None) -> int:
        """Not used for foreign counters: the hook asks the counter about its Haystack tools (`tools_tokens`)."""
        return 0

    def tools_tokens(self, tools: ToolsType | None) -> int:
        """What the Haystack counter says the tools' schemas cost."""
        return self.counter.count(messages=[], tools=tools) if tools else 0


def engine_counter(counter: TokenCounter, cache: MessageCache | None = None) -> EngineCounter:
    """The engine counter to count with for a Haystack `TokenCounter`: ours directly, any other wrapped."""
    if isinstance(counter, _EngineBackedCounter):
        return counter.engine
    return HaystackCounterAdapter(counter, cache)


def overhead_tokens(counter: EngineCounter, tools: ToolsType | None) -> int:
    """The request's non-message tokens (reply priming, tool schemas) as `counter` measures them."""
    if isinstance(counter, HaystackCounterAdapter):
        return counter.tools_tokens(tools)
    specs = tool_specs(tools)
    return counter.overhead_tokens({"tools": specs} if specs else None)
