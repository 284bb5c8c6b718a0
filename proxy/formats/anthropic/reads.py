"""The proxy's read tool in the Messages API: its calls in messages and streams, its results.

A read call is a `tool_use` content block naming the read tool (`READ_TOOL_DEFINITION`); its result goes back as a
`tool_result` block answering its `id`, in the user message that follows. In a stream, each block's events carry its
`index`: `content_block_start` names the block (a `tool_use` by name), its deltas and `content_block_stop` follow.
The answer is decided by its first `tool_use` or `text` block; thinking decides nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from proxy.formats.anthropic.answers import StreamAnswer
from proxy.formats.anthropic.blocks import THINKING, block_type
from proxy.formats.anthropic.summary import read_result
from proxy.pipeline.offload.rounds import drop_matching, kept_reads, names_read_tool
from proxy.pipeline.wire import Reads, StreamReport

ENDING_EVENTS: Final = frozenset({"message_delta", "message_stop", "error"})
"""Events after which no more content blocks come."""


def _is_read_call(block: Any) -> bool:
    return block_type(block) == "tool_use" and names_read_tool(block)


def _input_json(block: Mapping[str, Any]) -> str:
    return orjson.dumps(block.get("input", {})).decode()


def content_reads(content: Sequence[Any], limit: int) -> Reads | None:
    """The reads of a message's content blocks, when its first `tool_use` is the proxy's (at most `limit`)."""
    blocks = [block for block in content if isinstance(block, Mapping)]
    calls = [block for block in blocks if block_type(block) == "tool_use"]
    if not calls or not names_read_tool(calls[0]):
        return None
    reads = [block for block in calls if names_read_tool(block)]
    kept = kept_reads(reads, _input_json, limit)
    chosen = {id(block) for block, _ in kept}
    appended = [dict(block) for block in blocks if block_type(block) != "tool_use" or id(block) in chosen]
    ids = [(str(block.get("id", "")), reference) for block, reference in kept]
    return Reads(ids, [{"role": "assistant", "content": appended}], len(reads) - len(kept))


def reads(answer: Mapping[str, Any], limit: int) -> Reads | None:
    """The reads a whole message asks for."""
    content = answer.get("content")
    return content_reads(content, limit) if isinstance(content, list) else None


def stream_reads(report: StreamReport, limit: int) -> Reads | None:
    """The reads a streamed message asked for, from the blocks its events assembled."""
    stream = report.reply
    if not isinstance(stream, StreamAnswer):
        return None
    return content_reads([stream.blocks[index] for index in sorted(stream.blocks)], limit)


def decides_reads(event: Mapping[str, Any]) -> bool | None:
    """Decided by the first `tool_use` block (by name) or `text` block; thinking decides nothing."""
    kind = event.get("type")
    if isinstance(kind, str) and kind in ENDING_EVENTS:
        return False
    block = event.get("content_block") if kind == "content_block_start" else None
    if not isinstance(block, Mapping) or block_type(block) in THINKING:
        return None
    return _is_read_call(block)


def without_reads(answer: dict[str, Any]) -> bool:
    """Take the read calls out of a message's content."""
    return drop_matching(answer, "content", _is_read_call)


def hide_read(event: dict[str, Any], hidden: set[Any]) -> bool | None:
    """Drop every event of a read call's block (None); renumber the later blocks so the indexes stay consecutive."""
    index = event.get("index")
    if not isinstance(index, int) or isinstance(index, bool):
        return False
    if event.get("type") == "content_block_start" and _is_read_call(event.get("content_block")):
        hidden.add(index)
    if index in hidden:
        return None
    before = sum(1 for other in hidden if isinstance(other, int) and other < index)
    if before:
        event["index"] = index - before
    return bool(before)


def asked_again(fields: dict[str, Any], asked: Reads, results: Sequence[str]) -> None:
    """Append the model's message with its read calls, then one user message with a `tool_result` per call."""
    answered = [read_result(call_id, text) for (call_id, _), text in zip(asked.calls, results, strict=True)]
    fields["messages"] = [*fields.get("messages", []), *asked.appended, {"role": "user", "content": answered}]
