"""Token accounting for the fake OpenAI upstream: prompt counting as OpenAI bills it, and simulated prompt caching.

This is deliberately independent of `proxy.engine`'s counters (it shares only the shipped tiktoken encodings), so
end-to-end tests compare the proxy's estimates against a second, separately written implementation of the same
published rules rather than against themselves.

Counting rules (OpenAI cookbook, "How to count tokens with tiktoken"):

- every message costs 3 tokens of chat-format overhead, plus the tokens of each of its string fields: `role`,
  the text of `content` (a string, or the `text`/`refusal` of its parts), `name` (plus 1), `tool_call_id`,
  `refusal`, and the function `name` and `arguments` of each `tool_calls` entry (and of a legacy `function_call`);
- every reply is primed with 3 more tokens;
- an image part costs 85 tokens at `detail: "low"`, or when its size cannot be read (it is not a `data:` URL
  of a PNG, GIF or JPEG); otherwise OpenAI's tile formula: fit within 2048x2048, shrink the shortest side to 768,
  then 170 tokens per 512px tile plus 85;
- audio and file parts count 0 (the fake has no way to know their length);
- the `tools` array (and the legacy `functions` array) counts as the tokens of its compact JSON serialization
  (`json.dumps(tools, separators=(",", ":"), ensure_ascii=False)`). OpenAI renders tool schemas into a hidden
  TypeScript-like preamble whose exact size is not published; the JSON size is a stable, documented stand-in.

The prompt is also rendered into a token *sequence* whose length is exactly the prompt token count: the tool
schemas first, then each message (three marker ids that are not real token ids, then its fields' tokens), then three
priming markers. Prompt caching compares these sequences, so a change anywhere in a message invalidates the cache
from that message on, as it does at OpenAI.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any

from proxy.engine.encodings import get_encoding

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3
LOW_DETAIL_IMAGE_TOKENS = 85
IMAGE_TILE_TOKENS = 170

CACHE_MIN_TOKENS = 1024
CACHE_BLOCK_TOKENS = 128
CACHE_LIFETIME = 5 * 60.0
"""Seconds an unused prefix stays cached: the short end of OpenAI's "5 to 10 minutes of inactivity"."""

# Marker ids stand for the chat template's hidden tokens. They are negative so they never equal a real token id.
_MESSAGE_MARKERS = (-1, -2, -3)
_NAME_MARKER = (-4,)
_PRIMING_MARKERS = (-5, -6, -7)
_IMAGE_MARKER_BASE = -1_000


def encoding_name_for_model(model: str) -> str:
    """Name the tiktoken encoding OpenAI uses for `model`: cl100k_base for GPT-3.5 and GPT-4 (not 4o/4.1/4.5).

    Every newer model (gpt-4o, gpt-4.1, o-series, gpt-5 and unknown names) uses o200k_base.
    """
    name = model.lower()
    if name.startswith("gpt-3.5") or name == "gpt-4" or name.startswith("gpt-4-"):
        return "cl100k_base"
    return "o200k_base"


@lru_cache(maxsize=65_536)
def encode(text: str, encoding_name: str = "o200k_base") -> tuple[int, ...]:
    """Tokenize `text` as ordinary text (special-token strings are not special), cached: conversations repeat."""
    return tuple(get_encoding(encoding_name).encode_ordinary(text))


def count_text(text: str, encoding_name: str = "o200k_base") -> int:
    """Count the tokens of one string."""
    return len(encode(text, encoding_name))


def tools_json(tools: Sequence[Any]) -> str:
    """Serialize a `tools` (or `functions`) array the way it is counted: compact JSON, non-ASCII kept."""
    return json.dumps(list(tools), separators=(",", ":"), ensure_ascii=False)


def prompt_token_sequence(request: Mapping[str, Any], encoding_name: str | None = None) -> list[int]:
    """Render a chat-completion request's prompt into the token sequence the fake counts and caches.

    `len(prompt_token_sequence(request))` is the request's `prompt_tokens`.
    """
    enc = encoding_name or encoding_name_for_model(str(request.get("model") or ""))
    sequence: list[int] = []
    for key in ("tools", "functions"):
        schemas = request.get(key)
        if isinstance(schemas, list) and schemas:
            sequence.extend(encode(tools_json(schemas), enc))
    for message in request.get("messages") or ():
        if isinstance(message, Mapping):
            sequence.extend(_message_tokens(message, enc))
    sequence.extend(_PRIMING_MARKERS)
    return sequence


def count_prompt_tokens(request: Mapping[str, Any], encoding_name: str | None = None) -> int:
    """Count a chat-completion request's prompt tokens with the rules in this module's docstring."""
    return len(prompt_token_sequence(request, encoding_name))


def count_message_tokens(message: Mapping[str, Any], encoding_name: str = "o200k_base") -> int:
    """Count one message: its 3 overhead tokens plus its fields, without the reply priming."""
    return len(_message_tokens(message, encoding_name))


def count_completion_tokens(content: str | None, tool_calls: Sequence[tuple[str, str]], encoding_name: str) -> int:
    """Count a reply: its text plus each tool call's function name and arguments."""
    total = count_text(content, encoding_name) if content else 0
    for name, arguments in tool_calls:
        total += count_text(name, encoding_name) + count_text(arguments, encoding_name)
    return total


def _message_tokens(message: Mapping[str, Any], enc: str) -> list[int]:
    tokens = list(_MESSAGE_MARKERS)
    for text in _plain_string_fields(message):
        tokens.extend(encode(text, enc))
    name = message.get("name")
    if isinstance(name, str):
        tokens.extend(encode(name, enc))
        tokens.extend(_NAME_MARKER)
    tokens.extend(_content_tokens(message.get("content"), enc))
    for call in _function_calls(message):
        for field in ("name", "arguments"):
            value = call.get(field)
            if isinstance(value, str):
                tokens.extend(encode(value, enc))
    return tokens


def _plain_string_fields(message: Mapping[str, Any]) -> Iterator[str]:
    for key in ("role", "tool_call_id", "refusal"):
        value = message.get(key)
        if isinstance(value, str):
            yield value


def _function_calls(message: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for call in message.get("tool_calls") or ():
        if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
            yield call["function"]
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):
        yield legacy


def _content_tokens(content: Any, enc: str) -> list[int]:
    if isinstance(content, str):
        return list(encode(content, enc))
    tokens: list[int] = []
    if not isinstance(content, list):
        return tokens
    for part in content:
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            tokens.extend(encode(part["text"], enc))
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            tokens.extend(encode(part["refusal"], enc))
        elif kind == "image_url" and isinstance(part.get("image_url"), Mapping):
            tokens.extend(_image_marker_tokens(part["image_url"]))
    return tokens


def _image_marker_tokens(image_url: Mapping[str, Any]) -> list[int]:
    return image_marker_tokens(str(image_url.get("url") or ""), str(image_url.get("detail") or "auto"))


def image_marker_tokens(url: str, detail: str = "auto") -> list[int]:
    """Stand-in tokens for an image: as many as it costs, all one id derived from the image, so caching sees it."""
    digest = int.from_bytes(hashlib.sha256(url.encode()).digest()[:4], "big")
    return [_IMAGE_MARKER_BASE - digest] * image_tokens(url, detail)


def image_tokens(url: str, detail: str = "auto") -> int:
    """Count an image part: 85 at low detail or of unknown size, else OpenAI's 512px tile formula."""
    if detail == "low":
        return LOW_DETAIL_IMAGE_TOKENS
    size = image_size_from_data_url(url)
    if size is None:
        return LOW_DETAIL_IMAGE_TOKENS
    width, height = size
    return LOW_DETAIL_IMAGE_TOKENS + IMAGE_TILE_TOKENS * _tile_count(width, height)


def _tile_count(width: int, height: int) -> int:
    if max(width, height) > 2048:
        scale = 2048 / max(width, height)
        width, height = int(width * scale), int(height * scale)
    if min(width, height) > 768:
        scale = 768 / min(width, height)
        width, height = int(width * scale), int(height * scale)
    return math.ceil(width / 512) * math.ceil(height / 512)


def image_size_from_data_url(url: str) -> tuple[int, int] | None:
    """Read (width, height) from a base64 `data:` URL holding a PNG, GIF or JPEG; None for anything else."""
    if not url.startswith("data:") or ";base64," not in url:
        return None
    try:
        data = base64.b64decode(url.split(";base64,", 1)[1], validate=False)
    except (binascii.Error, ValueError):
        return None
    return _png_size(data) or _gif_size(data) or _jpeg_size(data)


def _png_size(data: bytes) -> tuple[int, int] | None:
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return int(width), int(height)
    return None


def _gif_size(data: bytes) -> tuple[int, int] | None:
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        width, height = struct.unpack("<HH", data[6:10])
        return int(width), int(height)
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """Walk the JPEG segments to the first start-of-frame marker, which holds the image size."""
    if not data.startswith(b"\xff\xd8"):
        return None
    offset = 2
    while offset + 9 <= len(data):
        if data[offset] != 0xFF:
            return None
        marker = data[offset + 1]
        length = int.from_bytes(data[offset + 2 : offset + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[offset + 5 : offset + 9])
            return int(width), int(height)
        offset += 2 + length
    return None


class PromptCache:
    """Simulated OpenAI prompt caching: the longest token prefix shared with an earlier prompt, in 128-token blocks.

    Each remembered prompt is stored as a chain of block digests (digest of block k covers blocks 0..k), so a lookup
    is one pass over the new prompt and memory is bounded by `max_blocks` (least recently used blocks are dropped).
    Prompts are scoped by model, as OpenAI scopes its cache. A block unused for longer than `lifetime` seconds of
    `clock` is gone, as OpenAI forgets a prefix after minutes of inactivity; a test passes a fake clock (shared with
    the proxy's ledger) and advances it instead of waiting.
    """

    def __init__(
        self,
        max_blocks: int = 200_000,
        *,
        lifetime: float | None = CACHE_LIFETIME,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._blocks: OrderedDict[bytes, float] = OrderedDict()
        self._max_blocks = max_blocks
        self.lifetime = lifetime
        self.clock = clock

    def cached_tokens(self, model: str, tokens: Sequence[int]) -> int:
        """Return how many leading tokens of `tokens` were cached, then remember `tokens` for later prompts.

        The answer is the longest common prefix with any earlier prompt still cached, rounded down to a multiple of
        128, and 0 when it is under 1024 tokens.
        """
        hits, now = 0, self.clock()
        for digest in _block_digests(model, tokens):
            used = self._blocks.get(digest)
            if used is None or (self.lifetime is not None and now - used > self.lifetime):
                break
            hits += 1
        self._remember(model, tokens, now)
        cached = hits * CACHE_BLOCK_TOKENS
        return cached if cached >= CACHE_MIN_TOKENS else 0

    def clear(self) -> None:
        """Forget every prompt."""
        self._blocks.clear()

    def _remember(self, model: str, tokens: Sequence[int], now: float) -> None:
        for digest in _block_digests(model, tokens):
            self._blocks[digest] = now
            self._blocks.move_to_end(digest)
        while len(self._blocks) > self._max_blocks:
            self._blocks.popitem(last=False)


def _block_digests(model: str, tokens: Sequence[int]) -> Iterator[bytes]:
    """Yield the chained digest of every complete 128-token block of `tokens`."""
    previous = hashlib.blake2b(model.encode(), digest_size=16).digest()
    for start in range(0, len(tokens) - CACHE_BLOCK_TOKENS + 1, CACHE_BLOCK_TOKENS):
        block = struct.pack(f"<{CACHE_BLOCK_TOKENS}q", *tokens[start : start + CACHE_BLOCK_TOKENS])
        previous = hashlib.blake2b(previous + block, digest_size=16).digest()
        yield previous
