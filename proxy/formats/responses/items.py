"""Responses API items as the engine's messages, and the engine's messages back as items.

The engine works on Chat Completions messages; the Responses API sends `instructions` and a list of `input` items.
Each item maps onto the engine's units so that the rules the upstream enforces are rules the strategies already keep:

- `instructions` is a leading system message; with the leading `system`/`developer` items (and a client's stated
  context among them, see `proxy.engine.grouping`) it is the leading block, which every strategy keeps byte for byte.
- A `user`, `system` or `developer` message item is one message of that role.
- Everything the model produced in one go (assistant messages, `reasoning`, `function_call`, `custom_tool_call`,
  built-in tool calls and their outputs, `compaction`, items this module does not know) is one *assistant unit*:
  consecutive such items become one assistant message whose `tool_calls` are the function calls. A reasoning item
  therefore stays with the calls that follow it, and no unknown item is ever dropped on its own.
- A `function_call_output` or `custom_tool_call_output` is a tool result answering its `call_id`: the engine keeps
  it with its call, and may replace its output (pruning) but never orphan it.
- An assistant unit that carries on a response after the results of its first calls (no reasoning of its own,
  following a unit that had some) is marked `CONTINUES_STEP`, so it is kept or dropped with that response.

What the engine cannot read is counted conservatively as opaque parts (`OPAQUE_PART`): encrypted reasoning and
compaction items by their size, unknown items by the tokens of their JSON. A compaction item is a checkpoint: the
`provider_compaction` strategy drops what it stands for first.

Every message made here carries `UNIT_KEY`, its position, so `Units.items_for` can turn what the engine returns
back into items: a kept message gives back the client's own items, untouched; a message the engine rewrote (a pruned
output, a cut text) gives back the same items with the new text; a message the engine created (an omission note, a
summary) becomes a message item. Fields the engine does not read (`UNIT_KEY`, opaque parts' data) never reach the
upstream.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from proxy.engine.messages import CHECKPOINT, CONTINUES_STEP, OPAQUE_PART, Message, content_parts, content_texts
from proxy.formats.rewritten_texts import rewritten_texts

Item = Mapping[str, Any]
"""One Responses API input (or output) item, as the client sent it."""

UNIT_KEY: Final = "_unit"
"""The engine-message field holding the unit's position, so a rewritten message finds its items again."""

INSTRUCTIONS: Final = -1
"""`UNIT_KEY` of the message standing for the request's `instructions`."""

ROLE_MESSAGES: Final = frozenset({"user", "system", "developer"})
"""Message roles that are units of their own (assistant messages belong to the model's units)."""

TOOL_OUTPUTS: Final = frozenset({"function_call_output", "custom_tool_call_output"})
"""Outputs the engine sees as tool results: their text can be replaced, their call must stay."""

CALLS: Final = frozenset({"function_call", "custom_tool_call"})
"""Calls the engine sees as tool calls, answered by a `TOOL_OUTPUTS` item with the same `call_id`."""

CHARS_PER_OPAQUE_TOKEN: Final = 4
"""Characters of an encrypted payload counted as one token: base64 of ciphertext of text runs about 1.33 bytes per
byte of text and text about 3 to 4 bytes per token, so this over-counts a little, the safe side."""


def item_type(item: Item) -> str:
    """The item's type: its `type`, or `message` for a role-only message (`{"role": "user", "content": ...}`)."""
    kind = item.get("type")
    if isinstance(kind, str):
        return kind
    return "message" if "role" in item else ""


def _role(item: Item) -> str:
    role = item.get("role")
    return role if isinstance(role, str) else ""


def _is_own_unit(item: Item) -> bool:
    """Whether the item is a unit on its own (a non-assistant message or a tool output), not part of a model unit."""
    kind = item_type(item)
    return (kind == "message" and _role(item) in ROLE_MESSAGES) or kind in TOOL_OUTPUTS


@dataclass(frozen=True)
class Units:
    """A request's items grouped into the engine's messages (see the module docstring).

    :param items: The `input` items, as sent (a string input is one user message item).
    :param messages: One engine message per unit, `instructions` first when present.
    :param spans: For each message, the range of `items` it stands for (empty for the instructions).
    :param instructions: The request's `instructions` text, if it had one.
    """

    items: Sequence[Item]
    messages: list[Message]
    spans: list[range]
    instructions: str | None

    @classmethod
    def of(cls, items: Sequence[Item], instructions: str | None) -> Units:
        """Group `items` into units."""
        messages: list[Message] = []
        spans: list[range] = []
        if instructions is not None:
            messages.append({"role": "system", "content": instructions, UNIT_KEY: INSTRUCTIONS})
            spans.append(range(0))
        reasoned = False  # whether the current response (since the last message item) has reasoned
        start = 0
        while start < len(items):
            first = items[start]
            end = start + 1
            if _is_own_unit(first):
                messages.append({**own_message(first), UNIT_KEY: len(messages)})
                reasoned = reasoned and item_type(first) in TOOL_OUTPUTS
            else:
                while end < len(items) and not _is_own_unit(items[end]):
                    end += 1
                unit = [items[index] for index in range(start, end)]
                reply = model_message(unit)
                own_reasoning = any(item_type(item) == "reasoning" for item in unit)
                continues = reasoned and not own_reasoning and "tool_calls" in reply
                messages.append({**reply, UNIT_KEY: len(messages), **({CONTINUES_STEP: True} if continues else {})})
                reasoned = own_reasoning or continues
            spans.append(range(start, end))
            start = end
        return cls(items, messages, spans, instructions)

    def forwarded_items(self, messages: Sequence[Message]) -> tuple[list[Item], str | None]:
        """The `input` items and `instructions` for the engine's `messages` (made from these units).

        :returns: The items, and the instructions text (this request's own unless the engine rewrote it).
        """
        items, instructions, _positions = self.forwarded_positions(messages)
        return items, instructions

    def forwarded_positions(self, messages: Sequence[Message]) -> tuple[list[Item], str | None, list[range]]:
        """`forwarded_items`, with the positions in the items each message became (empty for the instructions)."""
        items: list[Item] = []
        positions: list[range] = []
        instructions = self.instructions
        for message in messages:
            start = len(items)
            unit = message.get(UNIT_KEY)
            if unit == INSTRUCTIONS:
                instructions = _text(message)
            elif isinstance(unit, int) and 0 <= unit < len(self.spans) and not isinstance(unit, bool):
                items.extend(self._unit_items(unit, message))
            else:
                items.append(_new_item(message))
            positions.append(range(start, len(items)))
        return items, instructions, positions

    def _unit_items(self, unit: int, message: Message) -> Iterator[Item]:
        """The items of `unit` as `message` (the unit's own message, or the engine's rewrite of it) has them."""
        span = self.spans[unit]
        if message is self.messages[unit]:
            yield from (self.items[index] for index in span)
            return
        first = self.items[span.start]
        if len(span) == 1 and _is_own_unit(first):
            yield _rewritten_own(first, message)
            return
        texts = iter(_part_texts(message))
        for index in span:
            yield _with_texts(self.items[index], texts)


def own_message(item: Item) -> dict[str, Any]:
    """The engine message of a unit that is one item: a user/system/developer message, or a tool output."""
    kind = item_type(item)
    if kind in TOOL_OUTPUTS:
        return {"role": "tool", "tool_call_id": item.get("call_id"), "content": _engine_content(item.get("output"))}
    return {"role": _role(item), "content": _engine_content(item.get("content"))}


def model_message(items: Sequence[Item]) -> dict[str, Any]:
    """The assistant message standing for items the model produced (a response's output, or part of one)."""
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for item in items:
        kind = item_type(item)
        if kind == "message":
            parts.extend(_engine_parts(item.get("content")))
        elif kind == "reasoning":
            parts.extend(_reasoning_parts(item))
        elif kind in CALLS:
            arguments = item.get("arguments") if kind == "function_call" else item.get("input")
            function = {"name": item.get("name"), "arguments": arguments}
            calls.append({"id": item.get("call_id"), "type": "function", "function": function})
        elif kind == "compaction":
            parts.append(_opaque(item.get("encrypted_content"), checkpoint=True))
        else:
            parts.append({"type": "item", "text": _compact_json(item)})
    message: dict[str, Any] = {"role": "assistant", "content": parts or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _reasoning_parts(item: Item) -> list[dict[str, Any]]:
    summary = item.get("summary")
    texts = [part.get("text") for part in summary if isinstance(part, Mapping)] if isinstance(summary, list) else []
    parts: list[dict[str, Any]] = [
        {"type": "reasoning", "text": text} for text in texts if isinstance(text, str) and text
    ]
    encrypted = item.get("encrypted_content")
    if encrypted is not None:
        parts.append(_opaque(encrypted))
    elif not parts:
        parts.append({"type": "item", "text": _compact_json(item)})
    return parts


def _opaque(payload: Any, *, checkpoint: bool = False) -> dict[str, Any]:
    """An opaque part for an encrypted payload: counted by its size; `data` keeps two payloads apart in the key."""
    data = payload if isinstance(payload, str) else _compact_json(payload)
    part: dict[str, Any] = {"type": OPAQUE_PART, "tokens": 1 + len(data) // CHARS_PER_OPAQUE_TOKEN, "data": data}
    if checkpoint:
        part[CHECKPOINT] = True
    return part


_TEXT_PARTS: Final = frozenset({"input_text", "output_text", "text"})
_MEDIA_PARTS: Final = {"input_image": "image_url", "input_file": "file", "input_audio": "input_audio"}


def _engine_content(content: Any) -> Any:
    """A message's or output's content in the engine's terms: text as it is, parts as engine parts."""
    if isinstance(content, list):
        return _engine_parts(content)
    return content


def _engine_parts(content: Any) -> list[dict[str, Any]]:
    """Content parts in the engine's terms, one for one and in order (so a rewrite maps back by position)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        return []
    return [_engine_part(part) for part in content]


def _engine_part(part: Any) -> dict[str, Any]:
    if not isinstance(part, Mapping):
        return {"type": "item", "text": _compact_json(part)}
    kind = part.get("type")
    if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return {"type": "refusal", "refusal": part["refusal"]}
    if kind == "input_image":
        url = part.get("image_url")
        detail = part.get("detail")
        image = {"url": url if isinstance(url, str) else "", "detail": detail if isinstance(detail, str) else "auto"}
        return {"type": "image_url", "image_url": image, "id": part.get("file_id")}
    if isinstance(kind, str) and kind in _MEDIA_PARTS:
        return {"type": _MEDIA_PARTS[kind], "id": _compact_json(part)}
    return {"type": "item", "text": _compact_json(part)}


def _compact_json(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return repr(value)


def _text(message: Message) -> str:
    return "".join(content_texts(message))


def _part_texts(message: Message) -> list[str]:
    """The texts of the message's text parts, in order: what a rewrite may have changed."""
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    return [part["text"] for part in content_parts(message) if part.get("type") == "text"]


def _rewritten_own(item: Item, message: Message) -> Item:
    """A one-item unit with the engine's new text: a tool output's `output`, or a message's content."""
    if item_type(item) in TOOL_OUTPUTS:
        return {**item, "output": _text(message)}
    content = item.get("content")
    if item_type(item) == "message" and isinstance(content, list):
        parts = rewritten_texts(content, _part_texts(message), _is_text_part)
        return {**item, "content": [part for part in parts if part is not None]}
    return _with_texts(item, iter(_part_texts(message)))


def _is_text_part(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str)


def _with_texts(item: Item, texts: Iterator[str]) -> Item:
    """The item with its text parts' texts taken, in order, from `texts` (unchanged when it has none)."""
    if item_type(item) != "message":
        return item
    content = item.get("content")
    if isinstance(content, str):
        return {**item, "content": next(texts, content)}
    if not isinstance(content, list):
        return item
    parts = [{**part, "text": next(texts, part["text"])} if _is_text_part(part) else part for part in content]
    return {**item, "content": parts}


def _new_item(message: Message) -> Item:
    """A message item for a message the engine created (an omission note, a summary)."""
    role = message.get("role")
    return {
        "type": "message",
        "role": role if role in ("user", "system", "developer", "assistant") else "user",
        "content": _text(message),
    }
