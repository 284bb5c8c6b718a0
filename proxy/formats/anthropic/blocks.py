"""Messages API messages and their content blocks as the engine's messages, and the engine's messages back.

The engine works on Chat Completions messages; the Messages API sends a top-level `system` and `messages` whose
content is a string or a list of blocks. Each message maps onto the engine's units so that the rules the API enforces
are rules the strategies already keep:

- `system` (a string or text blocks) is a leading system message: the leading block every strategy keeps byte for
  byte. A mid-conversation `role: "system"` message is a system message where it stands.
- An assistant message is one assistant message: its `tool_use` blocks are its `tool_calls`, every other block a
  content part in order (text as text; `thinking`, `redacted_thinking`, images and documents as opaque parts counted
  by their size and never edited; `compaction` as a checkpoint; server tool blocks and blocks this module does not
  know as `item` parts counted by their JSON). An assistant message that carries on a turn whose first response
  thought (no thinking of its own, after tool results only) is marked `CONTINUES_STEP`: the API wants a tool-use
  turn's thinking with it, so the engine keeps or drops the turn's responses together.
- A user message holding `tool_result` blocks is one `tool` message per result (so the engine keeps each result with
  its `tool_use`), then one user message with the rest of its content, if any.

Every engine message made here carries `UNIT_KEY`, its position, so `Conversation.forwarded` can map what the engine
returns back: a kept message gives back the client's own message object, untouched; a message the engine rewrote (a
pruned result, a cut text) gives back the client's blocks with the new text; a message the engine created (an
omission note, a summary) becomes a new message. A user message rebuilt from what the engine kept of it has its
tool results first, and anything inserted after the results comes after them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import orjson
from xxhash import xxh3_64_hexdigest

from proxy.engine.messages import CHECKPOINT, CONTINUES_STEP, OPAQUE_PART, Message, content_parts, role_of
from proxy.formats.anthropic.tokens import document_tokens, image_block_tokens
from proxy.formats.rewritten_texts import rewritten_texts

Block = Mapping[str, Any]
"""One content block, as the client sent it."""

UNIT_KEY: Final = "_unit"
"""The engine-message field holding its position, so a rewritten message finds its blocks again."""

SYSTEM: Final = -1
"""`Source.message` of the engine message standing for the top-level `system`."""

THINKING: Final = frozenset({"thinking", "redacted_thinking"})
"""Blocks the model's reasoning comes back in: opaque, signed, never edited."""

CHARS_PER_OPAQUE_TOKEN: Final = 3
"""Characters of thinking (or of a redacted payload, a compaction summary) counted as one token: English runs about
4 characters a token and code about 3, so this over-counts a little, the safe side."""


class Source(NamedTuple):
    """What one engine message stands for: a message of the request (or `SYSTEM`) and which of its blocks.

    :param message: The position in `messages`, or `SYSTEM`.
    :param blocks: The positions of its blocks this engine message holds, in order (empty for string content).
    """

    message: int
    blocks: tuple[int, ...]


def block_type(block: Any) -> str:
    """The block's `type`, or an empty string."""
    kind = block.get("type") if type(block) is dict or isinstance(block, Mapping) else None
    return kind if isinstance(kind, str) else ""


def _text(block: Any) -> bool:
    return block_type(block) == "text" and isinstance(block.get("text"), str)


def content_blocks(message: Mapping[str, Any]) -> list[Any]:
    """The message's content blocks when its `content` is a list, else an empty list."""
    content = message.get("content")
    return content if isinstance(content, list) else []


def is_tool_results(message: Mapping[str, Any]) -> bool:
    """Whether `message` is a user message holding tool results only (the rest of a tool-use turn)."""
    blocks = content_blocks(message)
    return message.get("role") == "user" and bool(blocks) and all(block_type(b) == "tool_result" for b in blocks)


@dataclass(frozen=True)
class Conversation:
    """A request's `system` and `messages` as the engine's messages (see the module docstring).

    :param system: The top-level `system`, as sent (None when absent).
    :param messages: The `messages`, as sent.
    :param engine: One engine message per unit, the system first when present.
    :param sources: For each engine message, what it stands for.
    :param units: For each of `messages`, the engine messages standing for it (consecutive).
    """

    system: Any
    messages: Sequence[Mapping[str, Any]]
    engine: list[Message]
    sources: list[Source]
    units: list[range]

    @classmethod
    def of(cls, system: Any, messages: Sequence[Mapping[str, Any]]) -> Conversation:
        """Map `system` and `messages` onto engine messages."""
        engine: list[Message] = []
        sources: list[Source] = []

        def add(message: dict[str, Any], source: Source) -> None:
            message[UNIT_KEY] = len(engine)  # every message added here is made here: setting it copies nothing
            engine.append(message)
            sources.append(source)

        if system is not None:
            add({"role": "system", "content": _engine_content(system)}, Source(SYSTEM, ()))
        thought = False  # whether the current tool-use turn's first response thought
        units: list[range] = []
        for position, message in enumerate(messages):
            first = len(engine)
            blocks = content_blocks(message)
            kinds = [block_type(block) for block in blocks]
            role = message.get("role")
            if role == "assistant":
                reply = model_message(message.get("content"))
                own_thinking = not THINKING.isdisjoint(kinds)
                continues = thought and not own_thinking and "tool_calls" in reply
                if continues:
                    reply[CONTINUES_STEP] = True
                add(reply, Source(position, tuple(range(len(blocks)))))
                thought = (own_thinking or continues) and "tool_calls" in reply
            elif role == "user" and "tool_result" in kinds:
                for index, kind in enumerate(kinds):
                    if kind == "tool_result":
                        add(_tool_message(blocks[index]), Source(position, (index,)))
                rest = tuple([index for index, kind in enumerate(kinds) if kind != "tool_result"])
                if rest:
                    parts = [_engine_part(blocks[index]) for index in rest]
                    add({"role": "user", "content": parts}, Source(position, rest))
                thought = thought and not rest
            else:
                content = _engine_content(message.get("content"))
                add({"role": role, "content": content}, Source(position, tuple(range(len(blocks)))))
                thought = False
            units.append(range(first, len(engine)))
        return cls(system, messages, engine, sources, units)

    def forwarded(self, engine: Sequence[Message]) -> Mapped:
        """The `system` and `messages` for the engine's `engine` messages (made from this conversation)."""
        mapped = Mapped(self.system, [], [], [])
        pending: list[Message] = []
        for message in engine:
            unit = self._unit(message)
            if unit is not None and self.sources[unit].message == SYSTEM:
                mapped.system = self.system if message is self.engine[unit] else _rewritten_system(self.system, message)
                mapped.positions.append(None)
            elif role_of(message) == "assistant":
                self._flush(pending, mapped)
                mapped.add(self._assistant(unit, message), None if unit is None else self.sources[unit].message, 1)
            else:
                pending.append(message)
        self._flush(pending, mapped)
        return mapped

    def _unit(self, message: Message) -> int | None:
        unit = message.get(UNIT_KEY)
        if isinstance(unit, int) and not isinstance(unit, bool) and 0 <= unit < len(self.engine):
            return unit
        return None

    def _flush(self, pending: list[Message], mapped: Mapped) -> None:
        """Turn a run of non-assistant engine messages into messages: whole originals where nothing changed."""
        start = 0
        while start < len(pending):
            unit = self._unit(pending[start])
            end = start + 1
            if unit is None:
                mapped.add(_new_message(pending[start]), None, 1)
                start = end
                continue
            origin = self.sources[unit].message
            while end < len(pending) and (other := self._unit(pending[end])) is not None:
                if self.sources[other].message != origin:
                    break
                end += 1
            mapped.add(self._user_side(origin, pending[start:end]), origin, end - start)
            start = end
        pending.clear()

    def _user_side(self, origin: int, run: Sequence[Message]) -> Mapping[str, Any]:
        """The message `origin` as the engine kept it in `run`: the original when whole, else rebuilt results first."""
        units = [self._unit(message) for message in run]
        mine = list(self.units[origin])
        if units == mine and all(message is self.engine[index] for message, index in zip(run, mine, strict=True)):
            return self.messages[origin]
        source = self.messages[origin]
        original = source.get("content")
        if not isinstance(original, list):
            return {**source, "content": next(_texts(run[0]), original)}
        results: list[Any] = []
        rest: list[Any] = []
        for message, unit in zip(run, units, strict=True):
            indices = self.sources[unit].blocks if unit is not None else ()
            if role_of(message) == "tool" and len(indices) == 1:
                results.append(_rewritten_result(original[indices[0]], message))
            else:
                rest.extend(_with_texts([original[index] for index in indices], message))
        return {**source, "content": results + rest}

    def _assistant(self, unit: int | None, message: Message) -> Mapping[str, Any]:
        if unit is None:
            return _new_message(message)
        source = self.messages[self.sources[unit].message]
        if message is self.engine[unit]:
            return source
        original = source.get("content")
        if not isinstance(original, list):
            return {**source, "content": next(_texts(message), original)}
        drawn = [block for block in original if block_type(block) != "tool_use"]
        rewritten = iter(_aligned_texts(drawn, message))
        calls = iter(message.get("tool_calls") or ())
        blocks = [
            _rewritten_call(block, next(calls, None)) if block_type(block) == "tool_use" else next(rewritten)
            for block in original
        ]
        return {**source, "content": [block for block in blocks if block is not None]}


@dataclass
class Mapped:
    """What the engine's messages map back to.

    :param system: The `system` to send (the request's own unless the engine rewrote it).
    :param messages: The `messages` to send.
    :param origins: For each of `messages`, its position in the request's `messages` (None: compaction created it).
    :param positions: For each engine message, the position in `messages` it went into (None for the system).
    """

    system: Any
    messages: list[Mapping[str, Any]]
    origins: list[int | None]
    positions: list[int | None]

    def add(self, message: Mapping[str, Any], origin: int | None, engine_messages: int) -> None:
        """Append `message`, standing for the next `engine_messages` engine messages."""
        self.positions.extend([len(self.messages)] * engine_messages)
        self.messages.append(message)
        self.origins.append(origin)


def model_message(content: Any) -> dict[str, Any]:
    """The engine's assistant message for an assistant message's `content` (a reply's, or one sent back)."""
    if not isinstance(content, list):
        return {"role": "assistant", "content": content}
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for block in content:
        if block_type(block) == "tool_use":
            function = {"name": block.get("name"), "arguments": _compact_json(block.get("input", {}))}
            calls.append({"id": block.get("id"), "type": "function", "function": function})
        else:
            parts.append(_engine_part(block))
    message: dict[str, Any] = {"role": "assistant", "content": parts or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_message(block: Block) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": _engine_content(block.get("content"))}


def _engine_content(content: Any) -> Any:
    """Content in the engine's terms: text as it is, blocks as engine parts one for one, absent as empty text."""
    if isinstance(content, list):
        return [_engine_part(block) for block in content]
    return "" if content is None else content


def _engine_part(block: Any) -> dict[str, Any]:
    """One block as an engine part (see the module docstring); the same position, so a rewrite maps back."""
    kind = block_type(block)
    if kind == "text" and isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    if kind == "thinking":
        return _opaque(block, len(str(block.get("thinking", ""))))
    if kind == "redacted_thinking":
        return _opaque(block, len(str(block.get("data", ""))))
    if kind == "image":
        return {"type": OPAQUE_PART, "tokens": image_block_tokens(block), "data": _digest(block)}
    if kind == "document":
        return {"type": OPAQUE_PART, "tokens": document_tokens(block), "data": _digest(block)}
    if kind == "compaction":
        return {**_opaque(block, len(_compact_json(block))), CHECKPOINT: True}
    return {"type": "item", "text": _compact_json(block)}


def _opaque(block: Any, characters: int) -> dict[str, Any]:
    """An opaque part counted by `characters`; `data` tells two blocks apart in the engine's keys."""
    return {"type": OPAQUE_PART, "tokens": 1 + characters // CHARS_PER_OPAQUE_TOKEN, "data": _digest(block)}


def _digest(block: Any) -> str:
    return xxh3_64_hexdigest(_compact_json(block).encode("utf-8", "surrogatepass"))


def _compact_json(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return repr(value)


def _texts(message: Message) -> Iterator[str]:
    """The texts a rewrite may have changed, in order: the string content, or each text part's text."""
    content = message.get("content")
    if isinstance(content, str):
        yield content
    for part in content_parts(message):
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            yield part["text"]


def _with_texts(blocks: Sequence[Any], message: Message) -> list[Any]:
    """`blocks` with their text blocks' texts taken, in order, from the engine's rewrite `message`."""
    return [block for block in _aligned_texts(blocks, message) if block is not None]


def _aligned_texts(blocks: Sequence[Any], message: Message) -> list[Any]:
    """`blocks` with their text blocks' texts taken from the rewrite `message` (`rewritten_texts`): None past them."""
    return rewritten_texts(blocks, list(_texts(message)), _text)


def _rewritten_result(block: Block, message: Message) -> Block:
    """A `tool_result` block with the engine's new content: its text, or its text blocks' new texts."""
    content = message.get("content")
    if content == _engine_content(block.get("content")):
        return block
    original = block.get("content")
    if isinstance(content, list) and isinstance(original, list):
        return {**block, "content": _with_texts(original, message)}
    return {**block, "content": "".join(_texts(message))}


def _rewritten_call(block: Block, call: Any) -> Block:
    """A `tool_use` block with the arguments the engine gave its call (unchanged when they read the same)."""
    function = call.get("function") if isinstance(call, Mapping) else None
    arguments = function.get("arguments") if isinstance(function, Mapping) else None
    if not isinstance(arguments, str) or arguments == _compact_json(block.get("input", {})):
        return block
    try:
        return {**block, "input": orjson.loads(arguments)}
    except orjson.JSONDecodeError:
        return block


def _rewritten_system(system: Any, message: Message) -> Any:
    if isinstance(system, list):
        return _with_texts(system, message)
    return next(_texts(message), system)


def _new_message(message: Message) -> dict[str, Any]:
    """A message for one the engine created (an omission note, a summary): its text, as its role or the user's."""
    role = role_of(message)
    return {"role": role if role in ("user", "assistant", "system") else "user", "content": "".join(_texts(message))}
