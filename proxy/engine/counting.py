"""Token counting: what a conversation costs, message by message, counted the way the provider counts it.

A request's size is the sum of its messages plus a fixed overhead (the reply priming and the tool schemas). Each
message costs the chat format's per-message overhead, its role, its text, its tool calls, and its images and files
as the provider bills them (never their base64 as text). Message counts are cached by the message's stable key, so a
conversation sent again each turn costs only its new messages.

Two counters share that structure and differ only in how they measure text: `TiktokenCounter` (exact for OpenAI
models) and `ApproximateCounter` (no dependency, characters per token).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from typing import Any

import orjson

from proxy.engine.bounded import BoundedCache
from proxy.engine.encodings import get_encoding
from proxy.engine.images import image_tokens
from proxy.engine.messages import (
    OPAQUE_PART,
    Message,
    MessageKey,
    content_parts,
    content_texts,
    message_key,
    role_of,
    tool_calls_of,
)

TOKENS_PER_MESSAGE = 3
"""The chat format's framing around every message (OpenAI's `<|start|>role ... <|end|>`)."""

TOKENS_PER_NAME = 1
"""What a message's `name` field adds besides the name's own tokens."""

TOKENS_PER_TOOL_CALL = 3
"""The framing around each tool call an assistant message makes."""

REPLY_PRIMING_TOKENS = 3
"""Every request is primed with `<|start|>assistant<|message|>` for the reply."""

DEFAULT_FILE_TOKENS = 1000
"""The charge for a `file` part (a PDF, say), whose real cost depends on pages the proxy cannot see."""

DEFAULT_AUDIO_TOKENS = 500
"""The charge for an `input_audio` part, whose real cost depends on a duration the proxy does not decode."""

_SCHEMA_CACHE_SIZE = 256
"""Distinct tool sets whose schema counts a counter remembers."""

DEFAULT_CACHE_SIZE = 200_000
"""How many message counts a counter remembers (about 100 bytes each)."""


class TokenCounter(ABC):
    """Counts messages, tool schemas and text in tokens, caching each message's count by its key.

    Subclasses say how text is measured (`text_tokens`); everything else — the message structure, images, files,
    tool schemas and the cache — is shared, so every counter counts the same things.
    """

    def __init__(self, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        """:param cache_size: How many message counts to remember; the least recently used are forgotten first."""
        self._cache: BoundedCache[MessageKey, int] = BoundedCache(cache_size)
        self._bounds: BoundedCache[MessageKey, int] = BoundedCache(cache_size)
        self._schemas: BoundedCache[str, int] = BoundedCache(_SCHEMA_CACHE_SIZE)

    @property
    @abstractmethod
    def name(self) -> str:
        """A short description of the counter, e.g. `tiktoken:o200k_base`, for logs and response headers."""

    @abstractmethod
    def text_tokens(self, text: str) -> int:
        """Tokens in a piece of text."""

    def text_upper_bound(self, text: str) -> int:
        """A cheap bound no smaller than `text_tokens(text)`. Counters that are already cheap return the count."""
        return self.text_tokens(text)

    def cut_middle(self, text: str, keep_tokens: int) -> tuple[str, str]:
        """The head and tail of `text` that together hold about `keep_tokens` tokens, split evenly.

        This default cuts by characters in proportion to the text's measured density; tokenizing counters cut at
        token boundaries instead.
        """
        total = self.text_tokens(text)
        if keep_tokens >= total:
            return text, ""
        chars_per_token = len(text) / max(total, 1)
        head_chars = int(keep_tokens // 2 * chars_per_token)
        tail_chars = int((keep_tokens - keep_tokens // 2) * chars_per_token)
        return text[:head_chars], text[len(text) - tail_chars :] if tail_chars else ""

    def message_tokens(self, message: Message, key: MessageKey | None = None) -> int:
        """Tokens one message costs in a request, cached by the message's key (pass it when already computed)."""
        key = key if key is not None else message_key(message)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        tokens = self._measure_message(message, self.text_tokens)
        self._cache.put(key, tokens)
        return tokens

    def messages_tokens(self, messages: Iterable[Message]) -> int:
        """Tokens the messages cost, without the request's fixed overhead."""
        return sum(self.message_tokens(message) for message in messages)

    def message_upper_bound(self, message: Message, key: MessageKey | None = None) -> int:
        """A bound no smaller than `message_tokens(message)`, computed without tokenizing its text.

        With the message's key the bound is remembered: a request decided by its bound is re-sent with the same
        messages turn after turn. It is always the bound, never the count even when known, so a decision does not
        depend on what this process happened to count before.
        """
        bound = self._bounds.get(key) if key is not None else None
        if bound is None:
            bound = self._measure_message(message, self.text_upper_bound)
            if key is not None:
                self._bounds.put(key, bound)
        return bound

    def overhead_tokens(self, request: Mapping[str, Any] | None = None) -> int:
        """Tokens a request costs besides its messages: the reply priming and the tool and function schemas."""
        tokens = REPLY_PRIMING_TOKENS
        if request:
            tools = request.get("tools")
            functions = request.get("functions")
            if isinstance(tools, list) and tools:
                tokens += self._schema_tokens(render_tool_schemas(tools))
            if isinstance(functions, list) and functions:
                tokens += self._schema_tokens(render_tool_schemas([{"function": spec} for spec in functions]))
        return tokens

    def _schema_tokens(self, rendered: str) -> int:
        """Tokens of rendered tool schemas, remembered: a client sends the same tools with every request."""
        tokens = self._schemas.get(rendered)
        if tokens is None:
            tokens = self.text_tokens(rendered)
            self._schemas.put(rendered, tokens)
        return tokens

    def _measure_message(self, message: Message, measure: Callable[[str], int]) -> int:
        tokens = TOKENS_PER_MESSAGE + measure(role_of(message))
        for text in content_texts(message):
            tokens += measure(text)
        tokens += _media_tokens(content_parts(message))
        name = message.get("name")
        if isinstance(name, str) and name:
            tokens += TOKENS_PER_NAME + measure(name)
        for call in tool_calls_of(message):
            tokens += TOKENS_PER_TOOL_CALL + measure(_call_text(call.get("function")))
        function_call = message.get("function_call")
        if isinstance(function_call, Mapping):
            tokens += TOKENS_PER_TOOL_CALL + measure(_call_text(function_call))
        return tokens


class TiktokenCounter(TokenCounter):
    """Counts with tiktoken's BPE, exactly as OpenAI's models tokenize; the encodings ship with the package.

    UTF-8 byte length bounds a text's BPE token count from above (every token is at least one byte), which lets the
    trigger skip tokenizing requests that are clearly under it.
    """

    def __init__(self, encoding: str = "o200k_base", cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        """:param encoding: `o200k_base` (gpt-4o, gpt-4.1, gpt-5, o-series) or `cl100k_base` (gpt-4, gpt-3.5)."""
        super().__init__(cache_size=cache_size)
        self.encoding = encoding
        self._encoder = get_encoding(encoding)

    @property
    def name(self) -> str:
        """`tiktoken:<encoding>`."""
        return f"tiktoken:{self.encoding}"

    def text_tokens(self, text: str) -> int:
        """Tokens in `text`; special-token strings such as `<|endoftext|>` count as ordinary text."""
        if not text:
            return 0
        return len(self._encoder.encode_ordinary(text))

    def text_upper_bound(self, text: str) -> int:
        """The UTF-8 byte length of `text`."""
        return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))

    def cut_middle(self, text: str, keep_tokens: int) -> tuple[str, str]:
        """The head and tail of `text` holding `keep_tokens` tokens between them, cut at token boundaries."""
        tokens = self._encoder.encode_ordinary(text)
        if keep_tokens >= len(tokens):
            return text, ""
        head = keep_tokens // 2
        tail = keep_tokens - head
        return self._encoder.decode(tokens[:head]), self._encoder.decode(tokens[len(tokens) - tail :]) if tail else ""


class ApproximateCounter(TokenCounter):
    """Estimates tokens from text length with a flat characters-per-token ratio; needs no tokenizer.

    Measured against o200k_base at the default 4 characters per token (`tests/engine/test_counting.py`): English
    prose and Python source come out 6-9% high; number-heavy JSON about 45% low, and CJK text lower still, where a
    character is often a token of its own. Use it where a tokenizer is unavailable, and let provider usage anchor
    the estimate.
    """

    def __init__(self, chars_per_token: float = 4.0, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        """:param chars_per_token: How many characters count as one token.

        :raises ValueError: If `chars_per_token` is not positive.
        """
        if chars_per_token <= 0:
            raise ValueError(f"`chars_per_token` must be greater than 0, got {chars_per_token}.")
        super().__init__(cache_size=cache_size)
        self.chars_per_token = chars_per_token

    @property
    def name(self) -> str:
        """`approximate:<chars_per_token>`."""
        return f"approximate:{self.chars_per_token:g}"

    def text_tokens(self, text: str) -> int:
        """`len(text) / chars_per_token`, rounded up."""
        return math.ceil(len(text) / self.chars_per_token)


def _call_text(function: Any) -> str:
    if not isinstance(function, Mapping):
        return ""
    name = function.get("name")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = "" if arguments is None else orjson.dumps(arguments).decode()
    return (name if isinstance(name, str) else "") + arguments


def _media_tokens(parts: Sequence[Mapping[str, Any]]) -> int:
    tokens = 0
    for part in parts:
        kind = part.get("type")
        if kind == "image_url":
            image = part.get("image_url")
            if isinstance(image, Mapping):
                url = image.get("url")
                detail = image.get("detail")
                tokens += image_tokens(url if isinstance(url, str) else "", detail if isinstance(detail, str) else None)
            elif isinstance(image, str):
                tokens += image_tokens(image)
        elif kind == "input_audio":
            tokens += DEFAULT_AUDIO_TOKENS
        elif kind == "file":
            tokens += DEFAULT_FILE_TOKENS
        elif kind == OPAQUE_PART:
            counted = part.get("tokens")
            if isinstance(counted, int) and not isinstance(counted, bool) and counted > 0:
                tokens += counted
    return tokens


def render_tool_schemas(tools: Sequence[Any]) -> str:
    """Tool schemas as the model reads them: a TypeScript-like `namespace functions` block.

    OpenAI renders function tools into the prompt in this form, so counting it approximates what the tools cost far
    better than counting their JSON.
    """
    lines = ["# Tools", "", "## functions", "", "namespace functions {", ""]
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping):
            lines.append(orjson.dumps(tool).decode() if tool is not None else "")
            continue
        description = function.get("description")
        if isinstance(description, str) and description:
            lines.extend(f"// {line}" for line in description.splitlines())
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        name = function.get("name")
        if isinstance(properties, Mapping) and properties:
            lines.append(f"type {name} = (_: {{")
            lines.extend(_render_properties(properties, parameters))
            lines.append("}) => any;")
        else:
            lines.append(f"type {name} = () => any;")
        lines.append("")
    lines.append("} // namespace functions")
    return "\n".join(lines)


def _render_properties(properties: Mapping[str, Any], parameters: Any) -> list[str]:
    required = parameters.get("required") if isinstance(parameters, Mapping) else None
    required_names = set(required) if isinstance(required, list) else set()
    lines: list[str] = []
    for name, schema in properties.items():
        if isinstance(schema, Mapping):
            description = schema.get("description")
            if isinstance(description, str) and description:
                lines.extend(f"// {line}" for line in description.splitlines())
        optional = "" if name in required_names else "?"
        lines.append(f"{name}{optional}: {_render_type(schema)},")
    return lines


def _render_type(schema: Any) -> str:
    if not isinstance(schema, Mapping):
        return "any"
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return " | ".join(orjson.dumps(value).decode() for value in enum)
    kind = schema.get("type")
    if kind == "array":
        return f"{_render_type(schema.get('items'))}[]"
    if kind == "object":
        properties = schema.get("properties")
        if isinstance(properties, Mapping) and properties:
            return "{\n" + "\n".join(_render_properties(properties, schema)) + "\n}"
        return "object"
    if kind == "integer":
        return "number"
    if isinstance(kind, str):
        return kind
    return "any"


def counter_for_model(model: str | None) -> TiktokenCounter:
    """The process-wide tiktoken counter for the model's encoding, so every request shares one count cache."""
    return _shared_tiktoken_counter(encoding_for_model(model))


@cache
def _shared_tiktoken_counter(encoding: str) -> TiktokenCounter:
    return TiktokenCounter(encoding)


def encoding_for_model(model: str | None) -> str:
    """The tiktoken encoding for a model name: cl100k_base for gpt-4 and gpt-3.5, o200k_base otherwise.

    o200k_base covers gpt-4o, gpt-4.1, gpt-5 and the o-series, and is the default for models tiktoken does not know,
    since most current models' tokenizers are closer to it.
    """
    name = (model or "").lower().rsplit("/", 1)[-1]
    if name.startswith(("gpt-4o", "gpt-4.1", "gpt-4.5")):
        return "o200k_base"
    if name.startswith(("gpt-4", "gpt-3.5", "gpt-35")):
        return "cl100k_base"
    return "o200k_base"
