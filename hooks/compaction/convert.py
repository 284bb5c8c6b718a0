"""Between Haystack's `ChatMessage`s and the engine's OpenAI dicts, both ways, remembering what was converted.

The engine reads OpenAI Chat Completions dicts. An Agent re-sends the same `ChatMessage` objects every step, so each
one is converted (with Haystack's own `to_openai_dict_format`) once and remembered by object identity, together
with its token count: a `before_llm` call then costs only the messages appended since the last one.

Going back, an `EditPlan` is applied to the caller's own list: kept messages are the caller's objects, meta intact;
only messages compaction created are built here, as proper `ChatMessage`s (a pruned tool result stays a tool result
answering the same `ToolCall`).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from haystack.dataclasses import ChatMessage, ChatRole, TextContent
from haystack.tools import ToolsType, flatten_tools_or_toolsets

from proxy.engine import COMPACTION_META_KEY, Created, EditPlan, Transcript
from proxy.engine import TokenCounter as EngineCounter
from proxy.engine.messages import Message, content_texts

DEFAULT_CACHE_SIZE = 20_000
"""How many converted messages a `MessageCache` remembers: a few hundred steps of several Agents at once."""


@dataclass
class _Entry:
    """One remembered conversion: the caller's object (held, so its `id` cannot be reused), its dict, its count."""

    message: ChatMessage
    openai: dict[str, Any]
    counter: EngineCounter | None = None
    tokens: int = 0


class MessageCache:
    """Remembers each `ChatMessage`'s OpenAI dict and token count by object identity, least recently used first out.

    `ChatMessage` is not meant to be mutated in place (Haystack warns when it is), so an object seen before converts
    to the same dict. Entries hold the message itself, so an identity can never be reused while it is remembered.

    :param max_size: How many messages to remember. An Agent's whole conversation should fit, or each call converts
        again whatever was forgotten.
    """

    def __init__(self, max_size: int = DEFAULT_CACHE_SIZE) -> None:
        self.max_size = max_size
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._by_dict: dict[int, ChatMessage] = {}
        self._lock = threading.Lock()
        with _LIVE_LOCK:
            _LIVE_CACHES.add(self)

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self, messages: Sequence[ChatMessage]) -> list[_Entry]:
        """The entries of `messages`, converting (and remembering) the ones not seen before."""
        found: list[_Entry] = []
        with self._lock:
            for message in messages:
                entry = self._entries.get(id(message))
                if entry is not None and entry.message is message:
                    self._entries.move_to_end(id(message))
                else:
                    entry = self._remember(message, to_openai(message))
                found.append(entry)
        return found

    def remember(self, message: ChatMessage, openai: dict[str, Any]) -> None:
        """Record `openai` as the dict of `message` (a message compaction just built from that dict)."""
        with self._lock:
            self._remember(message, openai)

    def original(self, openai: Message) -> ChatMessage | None:
        """The `ChatMessage` a remembered dict was converted from, or None for a dict this cache did not make."""
        with self._lock:
            message = self._by_dict.get(id(openai))
            if message is None:
                return None
            entry = self._entries.get(id(message))
            return message if entry is not None and entry.openai is openai else None

    def transcript(self, messages: Sequence[ChatMessage], counter: EngineCounter) -> tuple[Transcript, list[_Entry]]:
        """The engine's view of `messages`: their dicts, their meta and the token counts already known."""
        entries = self.entries(messages)
        known: list[int | None] = [entry.tokens if entry.counter is counter else None for entry in entries]
        transcript = Transcript(
            [entry.openai for entry in entries], counter, [message.meta for message in messages], known
        )
        return transcript, entries

    @staticmethod
    def record_tokens(transcript: Transcript, entries: Sequence[_Entry], indices: range) -> None:
        """Count the messages at `indices` not counted yet and remember the counts for the next call."""
        counter = transcript.counter
        for index in indices:
            entry = entries[index]
            if entry.counter is not counter:
                entry.tokens = transcript.tokens(index)
                entry.counter = counter

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._entries.clear()
            self._by_dict.clear()

    def _remember(self, message: ChatMessage, openai: dict[str, Any]) -> _Entry:
        entry = _Entry(message, openai)
        self._entries[id(message)] = entry
        self._by_dict[id(openai)] = message
        while len(self._entries) > self.max_size:
            _, evicted = self._entries.popitem(last=False)
            self._by_dict.pop(id(evicted.openai), None)
        return entry


_LIVE_CACHES: weakref.WeakSet[MessageCache] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


def original_message(openai: Message) -> ChatMessage | None:
    """The `ChatMessage` any live cache converted `openai` from, or None.

    A strategy sees only dicts, and some content (images, files, a tool result's error flag) exists only on the
    original.
    """
    with _LIVE_LOCK:
        caches = list(_LIVE_CACHES)
    for cache in caches:
        message = cache.original(openai)
        if message is not None:
            return message
    return None


def to_openai(message: ChatMessage) -> dict[str, Any]:
    """The message as an OpenAI Chat Completions dict, as Haystack's OpenAI generators send it.

    Tool call ids are not required (some OpenAI-compatible servers omit them). A message Haystack cannot express in
    Chat Completions (a multimodal tool result, an empty user message) is rendered as text, which is what compaction
    needs: its role and its size.
    """
    try:
        return message.to_openai_dict_format(require_tool_call_ids=False)
    except ValueError:
        return _text_only(message)


def _text_only(message: ChatMessage) -> dict[str, Any]:
    role = message.role.value
    results = message.tool_call_results
    if results:
        result = results[0]
        text = result.result if isinstance(result.result, str) else _parts_text(result.result)
        openai: dict[str, Any] = {"role": role, "content": text}
        if result.origin.id is not None:
            openai["tool_call_id"] = result.origin.id
        return openai
    return {"role": role, "content": "\n".join(message.texts)}


def _parts_text(parts: Sequence[Any]) -> str:
    return "".join(part.text if isinstance(part, TextContent) else f"<{type(part).__name__}>" for part in parts)


def from_openai(openai: Message, meta: Mapping[str, Any] | None = None) -> ChatMessage:
    """A `ChatMessage` for an OpenAI dict (Haystack's own `from_openai_dict_format`), carrying `meta`."""
    message = ChatMessage.from_openai_dict_format(dict(openai))
    if meta is None:
        return message
    return ChatMessage(_role=message.role, _content=list(message._content), _name=message.name, _meta=dict(meta))


def tool_specs(tools: ToolsType | None) -> list[dict[str, Any]]:
    """Haystack tools as the OpenAI `tools` entries a generator sends, so their schemas can be counted."""
    return [{"type": "function", "function": dict(tool.tool_spec)} for tool in flatten_tools_or_toolsets(tools)]


def apply_plan(plan: EditPlan, messages: Sequence[ChatMessage], cache: MessageCache | None = None) -> list[ChatMessage]:
    """The compacted conversation: the caller's own objects where kept, new `ChatMessage`s where compaction created.

    Each created message is remembered in `cache` with the dict the engine made, so the next call sees exactly what
    the engine produced.
    """

    def create(created: Created, original: ChatMessage | None) -> ChatMessage:
        message = created_message(created, original)
        if cache is not None:
            cache.remember(message, dict(created.message))
        return message

    return plan.apply(messages, create)


def created_message(created: Created, original: ChatMessage | None) -> ChatMessage:
    """Build the `ChatMessage` for a message compaction created, in place of `original` or inserted.

    - A replaced tool result (pruned, or cut down) stays a tool result answering the same `ToolCall`, with its error
      flag, so the call keeps its answer.
    - Another replaced message (the middle cut out of it) keeps its role, name and other content; only the text that
      was cut changes.
    - An inserted message (an omission note, a summary) is built from its dict.

    Every one carries the created meta, which holds `context_compaction` with the strategy's name.
    """
    meta = _plain(created.meta)
    text = "".join(content_texts(created.message))
    if original is not None and original.tool_call_result is not None:
        result = original.tool_call_result
        return ChatMessage.from_tool(tool_result=text, origin=result.origin, error=result.error, meta=meta)
    if original is not None:
        return _retexted(original, created.message, meta)
    role = created.message.get("role")
    if role == ChatRole.USER.value and isinstance(created.message.get("content"), str):
        return ChatMessage.from_user(text, meta=meta)
    if role in ("system", "developer"):
        return ChatMessage.from_system(text, meta=meta)
    return from_openai(created.message, meta)


def _retexted(original: ChatMessage, replacement: Message, meta: dict[str, Any]) -> ChatMessage:
    """`original` with the text that differs in `replacement` swapped in: role, name and other parts stay."""
    old_texts = list(content_texts(to_openai(original)))
    new_texts = list(content_texts(replacement))
    swaps = {old: new for old, new in zip(old_texts, new_texts, strict=False) if old != new}
    content = [
        TextContent(text=swaps[part.text]) if isinstance(part, TextContent) and part.text in swaps else part
        for part in original._content
    ]
    return ChatMessage(_role=original.role, _content=content, _name=original.name, _meta=meta)


def _plain(meta: Mapping[str, Any]) -> dict[str, Any]:
    """A plain-dict copy of created meta (the marker copied too, so messages never share one)."""
    copied = dict(meta)
    marker = copied.get(COMPACTION_META_KEY)
    if isinstance(marker, Mapping):
        copied[COMPACTION_META_KEY] = dict(marker)
    return copied


def last_assistant_index(messages: Sequence[ChatMessage]) -> int:
    """The index of the last assistant message, or -1."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == ChatRole.ASSISTANT:
            return index
    return -1
