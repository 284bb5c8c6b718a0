"""What Claude reads that the engine cannot count by itself, and how large a Claude model's window is.

- **Images** cost about `width * height / 750` tokens (Anthropic's published formula), after the API scales an image
  down to fit `MAX_IMAGE_EDGE` px on its long side and `MAX_IMAGE_PIXELS` in all. The size is read from the header of
  a base64 image; an image given by URL or file id costs `UNKNOWN_IMAGE_TOKENS`, the most an image can cost.
- **Documents** are counted conservatively: a text document by its characters (3 a token), a PDF by its pages when
  they can be counted (each page is read as text and as an image: `PDF_PAGE_TOKENS`), else by its size; one given by
  URL or file id as `UNKNOWN_DOCUMENT_TOKENS`.
- **Tools** are read by the model as their JSON schemas after a tool-use system prompt (`tool_prompt_tokens`): the
  engine counts them rendered as Chat Completions functions (`chat_tools`), their JSON when they are server tools.
- **Exact counts**: `POST /v1/messages/count_tokens` counts a request for free (rate-limited); `count_tokens_body` is
  the body it takes for a request: its counted fields only.
- **Windows**: the shipped table (`proxy.windows`) holds each Claude family's window; a model that offers the 1M-token
  context beta has it when the request's `anthropic-beta` header names `CONTEXT_1M_BETA` (`window_for`).
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, Final

import orjson

from proxy.engine.images import data_url_image_size
from proxy.windows import MAX_CACHED_NAME, table_window

TOKEN_PIXELS: Final = 750
"""Pixels per token of an image, by Anthropic's formula `tokens = width * height / 750`."""

MAX_IMAGE_EDGE: Final = 1568
"""The long side the API scales a larger image down to, in pixels."""

MAX_IMAGE_PIXELS: Final = 784 * 1568
"""The most pixels an image keeps after the API scales it: the largest size in Anthropic's table of images that are
not resized (784 x 1568, about 1.2 megapixels; 1092 x 1092 fits too)."""

UNKNOWN_IMAGE_TOKENS: Final = math.ceil(MAX_IMAGE_PIXELS / TOKEN_PIXELS)
"""The charge for an image whose size cannot be read: the most any image costs (1,640 tokens)."""

PDF_PAGE_TOKENS: Final = 3000 + UNKNOWN_IMAGE_TOKENS
"""A PDF page: up to about 3,000 tokens of extracted text plus the page as an image."""

PDF_BYTES_PER_TOKEN: Final = 16
"""Bytes of a PDF counted as one token when its pages cannot be counted (a text page is a few kilobytes)."""

UNKNOWN_DOCUMENT_TOKENS: Final = 20 * PDF_PAGE_TOKENS
"""The charge for a document the proxy cannot see (given by URL or file id): twenty pages."""

DOCUMENT_CHARS_PER_TOKEN: Final = 3
"""Characters of a text document counted as one token (over-counts English, fits code)."""

TOOL_PROMPT_TOKENS: Final = 346
"""The tool-use system prompt the API adds when a request has tools and `tool_choice` is `auto` or `none`."""

FORCED_TOOL_PROMPT_TOKENS: Final = 313
"""The same prompt when `tool_choice` is `any` or names a tool."""

CONTEXT_1M_BETA: Final = "context-1m-2025-08-07"
"""The `anthropic-beta` value that gives the models in `ONE_MILLION_BETA_MODELS` a 1M-token window."""

ONE_MILLION: Final = 1_000_000

ONE_MILLION_BETA_MODELS: Final = ("claude-sonnet-4",)
"""Model-name prefixes whose 1M-token window is a beta the request opts into (Sonnet 4 and 4.5); later models
listed with 1M tokens in the table have it without a header."""

COUNTED_FIELDS: Final = ("model", "system", "tools", "tool_choice", "thinking", "messages")
"""The fields `POST /v1/messages/count_tokens` takes: what the prompt is made of (no `max_tokens`, no `stream`)."""

_MAX_HEADER_CHARS: Final = 350_000
"""Base64 characters of an image handed to the header reader: enough for any header it reads."""


def image_block_tokens(block: Mapping[str, Any]) -> int:
    """Tokens an `image` block costs (see the module docstring)."""
    source = block.get("source")
    if not isinstance(source, Mapping) or source.get("type") != "base64":
        return UNKNOWN_IMAGE_TOKENS
    media, data = source.get("media_type"), source.get("data")
    if not isinstance(data, str) or not isinstance(media, str):
        return UNKNOWN_IMAGE_TOKENS
    size = data_url_image_size(f"data:{media};base64," + data[:_MAX_HEADER_CHARS])
    return UNKNOWN_IMAGE_TOKENS if size is None else image_size_tokens(*size)


def image_size_tokens(width: int, height: int) -> int:
    """Tokens of an image of `width` x `height` pixels after the API's scaling."""
    if width <= 0 or height <= 0:
        return 1
    scale = min(1.0, MAX_IMAGE_EDGE / max(width, height), math.sqrt(MAX_IMAGE_PIXELS / (width * height)))
    return max(1, math.ceil(int(width * scale) * int(height * scale) / TOKEN_PIXELS))


def document_tokens(block: Mapping[str, Any]) -> int:
    """Tokens a `document` block costs, counted conservatively (see the module docstring)."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, Mapping) else None
    if kind == "text" and isinstance(source, Mapping) and isinstance(source.get("data"), str):
        return 1 + len(source["data"]) // DOCUMENT_CHARS_PER_TOKEN
    if kind == "content" and isinstance(source, Mapping) and isinstance(source.get("content"), (list, str)):
        return 1 + len(str(source["content"])) // DOCUMENT_CHARS_PER_TOKEN
    if kind == "base64" and isinstance(source, Mapping) and isinstance(source.get("data"), str):
        return _pdf_tokens(source["data"])
    return UNKNOWN_DOCUMENT_TOKENS


def _pdf_tokens(data: str) -> int:
    """A base64 PDF by its pages (each `/Type /Page` object), or by its size when none is found."""
    try:
        pdf = base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        return 1 + len(data) // PDF_BYTES_PER_TOKEN
    pages = sum(pdf.count(b"/Type%b/Page" % gap) - pdf.count(b"/Type%b/Pages" % gap) for gap in (b" ", b""))
    if pages > 0:
        return pages * PDF_PAGE_TOKENS
    return max(PDF_PAGE_TOKENS, 1 + len(pdf) // PDF_BYTES_PER_TOKEN)


def count_tokens_body(fields: Mapping[str, Any]) -> bytes:
    """The `count_tokens` body counting what a request with these fields sends, in the fields' own order."""
    return orjson.dumps({key: value for key, value in fields.items() if key in COUNTED_FIELDS})


def chat_tools(tools: Any) -> list[Any]:
    """The request's tools as the engine counts them: custom tools as Chat Completions functions, others as they are."""
    if not isinstance(tools, list):
        return []
    return [_chat_tool(tool) for tool in tools]


def _chat_tool(tool: Any) -> Any:
    if not isinstance(tool, Mapping) or "input_schema" not in tool or tool.get("type") not in (None, "custom"):
        return tool
    function = {"name": tool.get("name"), "description": tool.get("description"), "parameters": tool["input_schema"]}
    return {"type": "function", "function": {key: value for key, value in function.items() if value is not None}}


def tool_prompt_tokens(body: Mapping[str, Any]) -> int:
    """Tokens of the tool-use system prompt the API adds to a request with tools (0 without)."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return 0
    choice = body.get("tool_choice")
    forced = isinstance(choice, Mapping) and choice.get("type") in ("any", "tool")
    return FORCED_TOOL_PROMPT_TOKENS if forced else TOOL_PROMPT_TOKENS


def betas(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> frozenset[str]:
    """The beta names a request's `anthropic-beta` headers enable (comma-separated, any number of headers)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    return frozenset(
        name.strip()
        for key, value in pairs
        if key.lower() == "anthropic-beta"
        for name in value.split(",")
        if name.strip()
    )


def window_for(model: str | None, headers: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> int | None:
    """A Claude model's window for a request with these headers: 1M with the context beta where it applies."""
    name = (model or "").lower().rsplit("/", 1)[-1]
    if name.startswith(ONE_MILLION_BETA_MODELS) and CONTEXT_1M_BETA in betas(headers):
        return ONE_MILLION
    if model is None or len(model) > MAX_CACHED_NAME:
        return table_window(model)
    return _table_window(model)


@lru_cache(maxsize=1024)
def _table_window(model: str) -> int | None:
    """`table_window`, walked once per model name rather than on every request."""
    return table_window(model)
