"""Token accounting for the fake upstream's Responses API: what a request costs, what the model sees, what is cut.

Built on `proxy.simulator.openai_tokens` (tiktoken encodings, tools as compact JSON, image tile costs, and the
`PromptCache` prefix rule) and, like it, independent of `proxy.engine`.

Counting rules (the chat rules carried over item by item; OpenAI publishes none for this API):

- `tools` count as the tokens of their compact JSON, first; `instructions` then count as one developer message;
- every input item costs 3 tokens of overhead plus the tokens of its fields:
  - a message: its `role` and the text of its `content` (a string, or each part's `text`/`refusal`); an
    `input_image` part costs what openai_tokens charges for an image (its `image_url`, `detail`); an
    `input_file` part costs its `filename` plus its `file_data` as opaque content (below), 0 for a `file_id`/
    `file_url` (the fake cannot know the file's length);
  - a function or custom tool call: its `name` and `arguments` (or `input`);
  - a tool output: its `call_id` and its `output` (a string, or the text of its parts);
  - a reasoning item: its summary texts, its `content` texts, and its `encrypted_content` as opaque content;
  - a compaction item: its `encrypted_content` as opaque content;
  - any other item (built-in tool calls): the compact JSON of the item without `id`, `type` and `status`, the
    conservative choice for content whose rendering is not published;
- opaque content (`encrypted_content`, `file_data`) costs one token per 4 bytes of its base64-decoded length,
  rounded up (its UTF-8 length if it is not base64);
- every answer is primed with 3 more tokens.

Simplified: OpenAI withholds reasoning items of earlier turns from the model (`input_transformations`); the fake
counts every reasoning item it is sent, which over-counts and so never hides an overflow.

The opaque content this fake issues (`opaque_blob`) is self-verifying: a header naming what it is, a NUL byte, and
bytes derived from the header, at least 4 per token it should cost. `opaque_header` reads the header back, or
says the content was not issued here or was altered, which `ResponsesService` refuses as OpenAI does.

As in openai_tokens, the request is rendered into a token *sequence* whose length is the count, with negative
marker ids for hidden tokens, so prompt caching compares prefixes the same way.

What the model sees: items before the latest `compaction` item are carried by it and not seen (nor counted).
A compaction item this fake issued from `/v1/responses/compact` says it keeps the user messages listed before it
(that endpoint returns them ahead of the compaction item), so those stay seen. `truncation: "auto"` then drops the
oldest seen items, a call always with its outputs, until the request fits.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.simulator.openai_tokens import encode, image_marker_tokens, tools_json
from proxy.simulator.responses_items import CALL_OUTPUT_TYPES, item_type

__all__ = [
    "COMPACTION_KEEPS_USER_MESSAGES",
    "compaction_blob",
    "item_token_sequence",
    "opaque_blob",
    "opaque_header",
    "opaque_token_count",
    "prompt_sequence",
    "truncate_to_fit",
    "visible_items",
]

_ITEM_MARKERS = (-21, -22, -23)
_PRIMING_MARKERS = (-25, -26, -27)
_OPAQUE_MARKER_BASE = -3_000_000_000
_COMPACTION_HEADER = "fake-compaction:"
COMPACTION_KEEPS_USER_MESSAGES = "w"
"""Kind byte of a compaction item from `/v1/responses/compact`: user messages before it stay seen."""
_COMPACTION_COVERS_ALL = "s"


def opaque_token_count(content: str) -> int:
    """Tokens of opaque content: ceil(decoded bytes / 4), the UTF-8 bytes if `content` is not base64."""
    return math.ceil(len(_decoded(content)) / 4)


def _decoded(content: str) -> bytes:
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        return content.encode()


def _opaque_tokens(content: str) -> list[int]:
    digest = int.from_bytes(hashlib.sha256(content.encode()).digest()[:4], "big")
    return [_OPAQUE_MARKER_BASE - digest] * opaque_token_count(content)


def opaque_blob(header: str, tokens: int) -> str:
    """Deterministic base64 content of `tokens` tokens (more if `header` needs it) that `opaque_header` verifies.

    It is `header`, a NUL byte, then bytes derived from both, so any change to it is detected.
    """
    head = header.encode() + b"\0"
    size = max(4 * tokens, len(head))
    return base64.b64encode(head + hashlib.shake_256(head).digest(size - len(head))).decode()


def opaque_header(content: str) -> str | None:
    """The header of opaque content this fake issued, or None if it did not issue it or it was altered."""
    head, separator, body = _decoded(content).partition(b"\0")
    if not separator or hashlib.shake_256(head + separator).digest(len(body)) != body:
        return None
    return head.decode(errors="replace")


def compaction_blob(seed: str, tokens: int, *, keeps_user_messages: bool) -> str:
    """The `encrypted_content` of a compaction item this fake issues, marked with what it stands for."""
    kind = COMPACTION_KEEPS_USER_MESSAGES if keeps_user_messages else _COMPACTION_COVERS_ALL
    return opaque_blob(f"{_COMPACTION_HEADER}{kind}:{seed}", tokens)


def _keeps_user_messages(compaction: Mapping[str, Any]) -> bool:
    header = opaque_header(str(compaction.get("encrypted_content") or "")) or ""
    return header.startswith(_COMPACTION_HEADER + COMPACTION_KEEPS_USER_MESSAGES)


def visible_items(items: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The items the model sees: from the latest compaction item on (see the module docstring)."""
    latest = max((i for i, item in enumerate(items) if item_type(item) == "compaction"), default=None)
    if latest is None:
        return list(items)
    kept: list[Mapping[str, Any]] = []
    if _keeps_user_messages(items[latest]):
        kept = [item for item in items[:latest] if item_type(item) == "message" and item.get("role") == "user"]
    return [*kept, *items[latest:]]


def prompt_sequence(
    instructions: str | None, tools: Sequence[Any], items: Sequence[Mapping[str, Any]], encoding_name: str
) -> list[int]:
    """Render a request into the token sequence the fake counts and caches; its length is `input_tokens`."""
    return [*_head_tokens(instructions, tools, encoding_name), *_body_tokens(items, encoding_name), *_PRIMING_MARKERS]


def _head_tokens(instructions: str | None, tools: Sequence[Any], encoding_name: str) -> list[int]:
    tokens: list[int] = list(encode(tools_json(tools), encoding_name)) if tools else []
    if instructions:
        tokens.extend(item_token_sequence({"role": "developer", "content": instructions}, encoding_name))
    return tokens


def _body_tokens(items: Sequence[Mapping[str, Any]], encoding_name: str) -> list[int]:
    return [token for item in items for token in item_token_sequence(item, encoding_name)]


def item_token_sequence(item: Mapping[str, Any], encoding_name: str) -> list[int]:
    """One input item's tokens: 3 overhead markers, then its fields (see the module docstring)."""
    tokens = list(_ITEM_MARKERS)
    kind = item_type(item)
    if kind == "message":
        tokens.extend(encode(str(item.get("role") or ""), encoding_name))
        tokens.extend(_content_tokens(item.get("content"), encoding_name))
    elif kind in ("function_call", "custom_tool_call"):
        for field in ("name", "arguments", "input"):
            if isinstance(item.get(field), str):
                tokens.extend(encode(item[field], encoding_name))
    elif kind in CALL_OUTPUT_TYPES:
        tokens.extend(encode(str(item.get("call_id") or ""), encoding_name))
        tokens.extend(_content_tokens(item.get("output"), encoding_name))
    elif kind == "reasoning":
        tokens.extend(_content_tokens(item.get("summary"), encoding_name))
        tokens.extend(_content_tokens(item.get("content"), encoding_name))
        tokens.extend(_opaque_tokens(str(item.get("encrypted_content") or "")))
    elif kind == "compaction":
        tokens.extend(_opaque_tokens(str(item.get("encrypted_content") or "")))
    else:
        rest = {key: value for key, value in item.items() if key not in ("id", "type", "status")}
        tokens.extend(encode(json.dumps(rest, separators=(",", ":"), ensure_ascii=False), encoding_name))
    return tokens


def _content_tokens(content: Any, encoding_name: str) -> list[int]:
    """Tokens of a string, or of a list of parts (text, refusal, summary and reasoning text, images, files)."""
    if isinstance(content, str):
        return list(encode(content, encoding_name))
    tokens: list[int] = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind == "input_image":
            tokens.extend(image_marker_tokens(str(part.get("image_url") or ""), str(part.get("detail") or "auto")))
        elif kind == "input_file":
            tokens.extend(encode(str(part.get("filename") or ""), encoding_name))
            tokens.extend(_opaque_tokens(str(part.get("file_data") or "")))
        else:
            text = part.get("refusal") if kind == "refusal" else part.get("text")
            tokens.extend(encode(text if isinstance(text, str) else "", encoding_name))
    return tokens


def truncate_to_fit(
    instructions: str | None,
    tools: Sequence[Any],
    items: Sequence[Mapping[str, Any]],
    encoding_name: str,
    budget: int,
) -> list[Mapping[str, Any]]:
    """Drop the oldest items (a call with its outputs) until the rendered request fits `budget` tokens.

    Returns what is left, possibly nothing; the caller decides whether that still overflows.
    """
    fixed = len(_head_tokens(instructions, tools, encoding_name)) + len(_PRIMING_MARKERS)
    sizes = [len(item_token_sequence(item, encoding_name)) for item in items]
    kept = list(range(len(items)))
    total = fixed + sum(sizes)
    while kept and total > budget:
        first = items[kept[0]]
        dropped = {kept[0]}
        if item_type(first) in ("function_call", "custom_tool_call"):
            answers = (i for i in kept if item_type(items[i]) in CALL_OUTPUT_TYPES)
            dropped |= {i for i in answers if items[i].get("call_id") == first.get("call_id")}
        total -= sum(sizes[i] for i in dropped)
        kept = [i for i in kept if i not in dropped]
    return [items[i] for i in kept]
