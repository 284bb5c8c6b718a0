"""What the Messages API enforces on a request the proxy rewrote, as functions over the mapped messages.

**Thinking bound to its prefix.** On the models that run Anthropic's *prefix check* (`BINDING_MODELS`, from the
"Preserved thinking" pages of platform.claude.com), a `thinking` or `redacted_thinking` block sent back is valid
only if the `system`, the `tools` and every message before it are what was sent when the model produced it; if not,
that block and every later one fail, and the API answers 400 ("Invalid `signature` in `thinking` block. The block is
bound to a different conversation...") unless the request sets `thinking.block_binding.prefix_mismatch_behavior` to
`"drop_block"` (beta `thinking-binding-controls-2026-08-01`), which makes the API drop the failing blocks instead.
Moving `cache_control` is not a change (Claude Code moves its breakpoints every turn and needs no change).

The choice made here (`bind_thinking`): after a compaction changed the request at some message, the proxy itself
drops every thinking block from there on, so the request stays valid without relying on the beta, and counts what it
sends. The one exception is the turn being continued (`continued_turn`: the assistant turn whose tool results the
final user message holds): the API requires its thinking, unmodified, so it passes byte for byte, and since it was
produced before the change the request opts into `"drop_block"` (`with_drop_block`): the API then drops it, as the
documentation prescribes for a history that was rewritten, where a 400 would end the agent's session. On models that
do not bind (`binds_prefix` false), a thinking block is checked on its own content only, so nothing is dropped.

The baseline a change is measured against is what the blocks were produced with: the previous forwarded request
plus what the client appended since. Messages the previous forward stripped of their thinking match it stripped, so
replaying the same compaction turn after turn sends the same bytes (the prompt cache keeps hitting) and keeps every
thinking block the model produced after it. A block let through under `"drop_block"` stays bound to a prefix that is
gone, so once a conversation opted in, every later request does too (`forwarding.forward(kept_drop_block=True)`), as
the documentation prescribes; the API then drops that block and the later ones. Compacting between turns (when the
final message is not tool results) never needs the opt-in, so on a binding model that is the better moment whenever
the request still fits.

**At most four cache breakpoints** (`MAX_BREAKPOINTS`) in a request, the client's own included (`breakpoints`).
The proxy adds up to two of its own to a request it rewrote, each only while the request has fewer
(`with_breakpoint`): first at the end of the compacted prefix it replays turn after turn (`compacted_prefix_end`),
so every later request reads it from the cache; then at the end of the head the rewrite left as the client sent it
(`unchanged_head_end`: tools, system and the messages before the first one removed or rewritten, which the user
message window keeps byte for byte from one compaction to the next). The client's own breakpoints (Claude Code puts
its last on the newest message) serve what follows; they are never moved or changed, and a request the proxy does
not rewrite gets none.

Why the head needs one of its own (Anthropic's prompt caching page, platform.claude.com/docs/en/build-with-claude/
prompt-caching): a cache entry is written only for the prefix ending at a `cache_control` breakpoint, and a request
looks for hits only at its breakpoints and at the block boundaries up to about 20 blocks before each. A client whose
one moving breakpoint sits on its newest block never writes the head, and after a compaction rewrote the middle the
head lies far more than 20 blocks before that breakpoint: every compaction billed the head uncached. With a
breakpoint there, the compaction that first sends the head writes it (cache writes cost 1.25 times the base input
price for the 5-minute lifetime, 2 times for `"ttl": "1h"`; reads 0.1 times) and every later compaction and replay
reads it. When a request mixes lifetimes, the longer-lived entries must come before the shorter ones (an hour-long
breakpoint before any 5-minute one), so the proxy's is marked `"ttl": "1h"` only when a breakpoint after it is, and
the 5-minute default otherwise (the cheaper write).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson
from xxhash import xxh3_128_digest

from proxy.formats.anthropic.blocks import THINKING, block_type, content_blocks, is_tool_results

BINDING_MODELS: Final = (
    "claude-fable-5-1",
    "claude-fable-5-2",
    "claude-mythos-5-1",
    "claude-mythos-5-2",
    "claude-opus-5-5",
    "claude-sonnet-5-5",
    "claude-haiku-5-5",
)
"""Model-name prefixes of the models that run the prefix check (the "Prefix checks" page's supported models)."""

DROP_BLOCK: Final = "drop_block"
"""The `prefix_mismatch_behavior` that makes the API drop thinking blocks failing the prefix check."""

THINKING_BINDING_BETA: Final = "thinking-binding-controls-2026-08-01"
"""The `anthropic-beta` value a request setting `thinking.block_binding` must send."""

MAX_BREAKPOINTS: Final = 4
"""The most `cache_control` breakpoints a request may hold."""

EPHEMERAL: Final = {"type": "ephemeral"}


def binds_prefix(model: str | None) -> bool:
    """Whether `model` runs the prefix check on the thinking blocks sent back to it."""
    name = (model or "").lower().rsplit("/", 1)[-1]
    return name.startswith(BINDING_MODELS)


def continued_turn(messages: Sequence[Mapping[str, Any]]) -> frozenset[int]:
    """The positions of the assistant messages of the turn being continued (empty when none is).

    A turn is continued when the final message is a user message holding tool results that answer the assistant
    message before it; the turn goes back through every earlier assistant message answered by tool results alone.
    Mid-conversation system messages stand between them without ending the turn (Claude Code appends one after
    each tool result on the newest models).
    """
    order = [position for position, message in enumerate(messages) if message.get("role") != "system"]
    if len(order) < 2 or messages[order[-1]].get("role") != "user":
        return frozenset()
    if not any(block_type(block) == "tool_result" for block in content_blocks(messages[order[-1]])):
        return frozenset()
    turn: set[int] = set()
    step = len(order) - 2
    while step >= 0 and messages[order[step]].get("role") == "assistant":
        turn.add(order[step])
        if step < 2 or not is_tool_results(messages[order[step - 1]]):
            break
        step -= 2
    return frozenset(turn)


def without_cache_control(value: Any) -> Any:
    """`value` with every `cache_control` field left out, at any depth (what the prefix check compares)."""
    if isinstance(value, Mapping):
        return {key: without_cache_control(item) for key, item in value.items() if key != "cache_control"}
    if isinstance(value, list):
        return [without_cache_control(item) for item in value]
    return value


def same_message(one: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """Whether two messages read the same to the prefix check.

    The same object, or equal but for `cache_control` and for text given as a string or as one text block (the
    proxy's breakpoint turns the one into the other).
    """
    return one is other or _compared(one) == _compared(other)


DIGEST_BYTES: Final = 16
"""The length of a `message_digest`."""


def message_digest(message: Mapping[str, Any]) -> bytes:
    """What the prefix check reads of a message (`same_message`), as a digest: kept in place of a message sent."""
    return xxh3_128_digest(orjson.dumps(_compared(message), option=orjson.OPT_SORT_KEYS))


def _matches(message: Mapping[str, Any], was: Mapping[str, Any] | bytes) -> bool:
    """Whether `message` reads the same as `was`, a message or its `message_digest`."""
    return message_digest(message) == was if isinstance(was, bytes) else same_message(message, was)


def _compared(message: Mapping[str, Any]) -> Any:
    content = message.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    return without_cache_control({**message, "content": blocks})


@dataclass(frozen=True)
class Bound:
    """Messages made valid for a model that binds thinking to its prefix.

    :param messages: The messages to forward.
    :param origins: For each, its position in the client's messages (None for a message compaction created).
    :param drop_block: Whether the request must opt into `"drop_block"` (`with_drop_block`): the continued turn's
        thinking follows a change.
    :param dropped: How many thinking blocks the proxy dropped.
    """

    messages: list[Mapping[str, Any]]
    origins: list[int | None]
    drop_block: bool
    dropped: int


def bind_thinking(
    messages: Sequence[Mapping[str, Any]],
    origins: Sequence[int | None],
    source: Sequence[Mapping[str, Any]],
    model: str | None,
    *,
    baseline: Sequence[Mapping[str, Any] | bytes] | None = None,
    head_changed: bool = False,
) -> Bound:
    """`messages` with the thinking blocks that a change before them invalidates dropped (see the module docstring).

    Messages are compared with `baseline` in order while they match it, as they are or as the previous forward
    stripped them of thinking (then stripped again, so a replay sends the same bytes); from the first one that does
    not, every thinking block goes but the continued turn's.

    :param messages: The mapped messages (`Conversation.forwarded`).
    :param origins: For each, its position in `source` (None for a message compaction created).
    :param source: The client's messages, as it sent them.
    :param model: The requested model.
    :param baseline: What the thinking blocks were produced with: the previous forwarded messages plus what the
        client appended since (messages, or their `message_digest`); `source` when None (nothing was rewritten
        before).
    :param head_changed: Whether `system` or `tools` differ from what they were produced with: a change before all.
    """
    if not binds_prefix(model):
        return Bound(list(messages), list(origins), False, 0)
    reference: Sequence[Mapping[str, Any] | bytes] = source if baseline is None else baseline
    continued = continued_turn(source)
    kept: list[Mapping[str, Any]] = []
    kept_origins: list[int | None] = []
    changed, drop_block, dropped = head_changed, False, 0
    for position, (message, origin) in enumerate(zip(messages, origins, strict=True)):
        thinking = _thinking_count(message)
        stripped = without_thinking(message) if thinking else message
        was = reference[position] if position < len(reference) else None
        sent: Mapping[str, Any] | None = message
        if not changed and was is not None and _matches(message, was):
            pass
        elif not changed and was is not None and stripped is not None and _matches(stripped, was):
            sent, dropped = stripped, dropped + thinking
        elif thinking and origin is not None and origin in continued:
            changed, drop_block = True, True
        else:
            changed, sent, dropped = True, stripped, dropped + thinking
        if sent is not None:
            kept.append(sent)
            kept_origins.append(origin)
    return Bound(kept, kept_origins, drop_block, dropped)


def _thinking_count(message: Mapping[str, Any]) -> int:
    if message.get("role") != "assistant":
        return 0
    return sum(1 for block in content_blocks(message) if block_type(block) in THINKING)


def without_thinking(message: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The message without its thinking blocks (itself when it has none); None when nothing else is left of it."""
    if not _thinking_count(message):
        return message
    rest = [block for block in content_blocks(message) if block_type(block) not in THINKING]
    return {**message, "content": rest} if rest else None


def with_drop_block(thinking: Any) -> Any:
    """The request's `thinking` opting into `"drop_block"`; the client's own `block_binding` when it set one.

    A request without `thinking` gets `{"type": "adaptive"}`, which changes nothing else on the models that bind
    (they think adaptively by default). Send `THINKING_BINDING_BETA` with it (`with_beta`).
    """
    current = thinking if isinstance(thinking, Mapping) else {"type": "adaptive"}
    if isinstance(current.get("block_binding"), Mapping):
        return thinking
    return {**current, "block_binding": {"prefix_mismatch_behavior": DROP_BLOCK}}


def with_beta(header: str | None, beta: str) -> str:
    """An `anthropic-beta` header value that also names `beta` (the value as it was when it already does)."""
    names = [name.strip() for name in (header or "").split(",") if name.strip()]
    return header if header is not None and beta in names else ",".join([*names, beta])


def _breakpoint_blocks(fields: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every object that may carry `cache_control`: tools, system blocks, message blocks and tool results' blocks."""
    system = fields.get("system")
    found = [tool for tool in fields.get("tools") or () if isinstance(tool, Mapping)]
    found.extend(block for block in (system if isinstance(system, list) else ()) if isinstance(block, Mapping))
    for message in fields.get("messages") or ():
        for block in content_blocks(message) if isinstance(message, Mapping) else ():
            if not isinstance(block, Mapping):
                continue
            found.append(block)
            inner = block.get("content") if block_type(block) == "tool_result" else None
            found.extend(part for part in (inner if isinstance(inner, list) else ()) if isinstance(part, Mapping))
    return found


def breakpoints(fields: Mapping[str, Any]) -> int:
    """How many `cache_control` breakpoints a request's fields hold."""
    return sum(1 for block in _breakpoint_blocks(fields) if block.get("cache_control") is not None)


def compacted_prefix_end(
    messages: Sequence[Mapping[str, Any]], origins: Sequence[int | None], source: Sequence[Mapping[str, Any]]
) -> int | None:
    """The position of the last message compaction created or changed: where the replayed prefix ends (None: none)."""
    for position in reversed(range(len(messages))):
        origin = origins[position]
        if origin is None or messages[position] is not source[origin]:
            return position
    return None


def unchanged_head_end(
    messages: Sequence[Mapping[str, Any]], origins: Sequence[int | None], source: Sequence[Mapping[str, Any]]
) -> int | None:
    """The position of the last message of the head a rewrite left as the client sent it (None: no such message).

    The head is the messages before the first one compaction created, changed, or moved from its place in `source`.
    """
    for position, (message, origin) in enumerate(zip(messages, origins, strict=True)):
        if origin != position or message is not source[position]:
            return position - 1 if position > 0 else None
    return None


def with_breakpoint(fields: Mapping[str, Any], position: int) -> list[Mapping[str, Any]]:
    """The request's messages with a breakpoint at the end of message `position`, if the request has room for one.

    Unchanged when it already holds `MAX_BREAKPOINTS`, or the message already has one. The breakpoint goes on the
    message's last block that may carry one (not thinking, not empty text); its lifetime is an hour when a breakpoint
    after it has that lifetime (a longer-lived breakpoint may not follow a shorter one), the default 5 minutes else.
    """
    messages: list[Mapping[str, Any]] = list(fields.get("messages") or ())
    if breakpoints(fields) >= MAX_BREAKPOINTS or not 0 <= position < len(messages):
        return messages
    message = messages[position]
    content = message.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) and content else content_blocks(message)
    if any(isinstance(block, Mapping) and block.get("cache_control") is not None for block in blocks):
        return messages
    eligible = [index for index, block in enumerate(blocks) if _may_cache(block)]
    if not eligible:
        return messages
    last = eligible[-1]
    later = _breakpoint_blocks({"messages": [{"content": blocks[last + 1 :]}, *messages[position + 1 :]]})
    hour = any(
        block.get("cache_control", {}).get("ttl") == "1h"
        for block in later
        if isinstance(block.get("cache_control"), Mapping)
    )
    control = {**EPHEMERAL, "ttl": "1h"} if hour else EPHEMERAL
    marked = [{**block, "cache_control": control} if index == last else block for index, block in enumerate(blocks)]
    messages[position] = {**message, "content": marked}
    return messages


def _may_cache(block: Any) -> bool:
    if not isinstance(block, Mapping) or block_type(block) in THINKING:
        return False
    return not (block_type(block) == "text" and not block.get("text"))
